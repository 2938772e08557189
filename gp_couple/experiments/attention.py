r"""``gp-couple attention``: norm couplings for Performer attention (paper, Appendix B.3
"Norm-coupled RLFs in Performers" [app:performers], Figure 7, Appendix B.3 [fig:var_fig]).

Attention with the softmax kernel,
:math:`a_{ij} = k(\boldsymbol x_i, \boldsymbol x_j) / \sum_l k(\boldsymbol x_i, \boldsymbol x_l)`
with :math:`k(\boldsymbol x, \boldsymbol y) = \exp(\boldsymbol x^\top \boldsymbol y)`, is
estimated with positive random features
:math:`\phi(\boldsymbol x) = \exp(\|\boldsymbol x\|^2/2)\,\phi_\mathrm{RLF}(\boldsymbol x)`
(:func:`~gp_couple.features.fourier.softmax_kernel_features`) whose frequencies are
orthogonal with i.i.d., pairwise norm-coupled (PNC) or positive monotone (PM) norms.
On ``N`` synthetic keys with i.i.d. :math:`\mathcal N(0, s^2)` coordinates (``N = d = 16``),
for each number of features, the experiment estimates from ``--draws`` independent
feature draws:

* the **kernel variance**, the mean of :math:`\mathrm{Var}(\widehat k(\boldsymbol x_i, \boldsymbol x_j))`
  over pairs :math:`i \ne j`;
* the **kernel covariance**, the mean of
  :math:`\mathrm{Cov}(\widehat k(\boldsymbol x_i, \boldsymbol x_j), \widehat k(\boldsymbol x_i, \boldsymbol x_l))`
  over distinct :math:`i, j, l`;
* the **attention MSE** :math:`\frac1{N^2}\sum_{i,j}\mathbb E(\widehat a_{ij} - a_{ij})^2`
  of the row-normalised estimates.

By eq. (8), the attention error, Section 3.3 [eq:biased_attn_approx] the attention error is driven
by variance *minus* covariance:
PNC lowers both, PM raises both, and the covariance wins. The variance and covariance
leave out the diagonal estimates :math:`\widehat k(\boldsymbol x_i, \boldsymbol x_i)`: their
variance grows like :math:`\exp(6\|\boldsymbol x_i\|^2)` (about :math:`e^{24}` here), far too
heavy-tailed for a Monte Carlo estimate, while the attention MSE includes them through
the normalisation. Means and standard errors are over ``--repeats`` independent sets
of keys; the ``*_vs_<baseline>`` columns are ratios to the first coupling on the same
keys (paired, so differences between key sets cancel).

The paper writes the keys as :math:`\mathcal N(0, \frac{1}{\sqrt d}\mathbf I_d)`. Read with
:math:`1/\sqrt d` as the standard deviation (the default, :math:`s = 1/4`), every
statistic is well estimated; read as the variance (``--key-std`` :math:`d^{-1/4}`), the
estimator's second moments grow like :math:`\exp(2\|\boldsymbol x_i + \boldsymbol x_j\|^2)`
and Monte Carlo variance and covariance estimates become unreliable (the attention MSE
stays well estimated and ranks the couplings the same way).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._checks import check_positive_int
from ..couplings.frequencies import get_frequency_coupling
from ..features.fourier import softmax_kernel_features
from ..progress import progress
from ._options import ATTENTION_COUPLINGS
from ._report import figure_folder, log_figures, summarize
from ._runtime import with_bounded_threads

__all__ = ["DEFAULT_COUPLINGS", "attention_statistics", "run_attention"]

#: Norm couplings of Figure 7, Appendix B.3 [fig:var_fig] (all with orthogonal directions).
DEFAULT_COUPLINGS: tuple[str, ...] = ATTENTION_COUPLINGS


def attention_statistics(keys: torch.Tensor, frequencies: torch.Tensor) -> dict[str, float]:
    """Kernel variance, kernel covariance and attention MSE from a batch of frequency draws.

    :param keys: Keys ``(N, d)`` (also the queries).
    :param frequencies: Independent draws ``(R, m, d)``, ``R >= 2``.
    :return: ``kernel_variance``, ``kernel_covariance`` and ``attention_mse`` (see the
        module docstring), estimated over the ``R`` draws.
    """
    if frequencies.dim() != 3 or frequencies.shape[0] < 2:
        raise ValueError(f"frequencies must be (R >= 2, m, d), got {tuple(frequencies.shape)}")
    exact = torch.exp(keys @ keys.T)
    attention = exact / exact.sum(-1, keepdim=True)
    features = softmax_kernel_features(keys, frequencies)
    estimates = features @ features.mT
    estimated_attention = estimates / estimates.sum(-1, keepdim=True)
    draws, tokens = estimates.shape[0], estimates.shape[-1]
    if tokens < 3:
        raise ValueError("at least 3 keys are needed for the covariance between distinct pairs")
    deviations = estimates - estimates.mean(0)
    # Cov(k_ij, k_il) for every row i: (N, N, N); its diagonal in (j, l) is the variance.
    covariance = torch.einsum("rij,ril->ijl", deviations, deviations) / (draws - 1)
    eye = torch.eye(tokens, dtype=torch.bool)
    distinct_pair = ~eye
    distinct_triple = ~(eye[:, :, None] | eye[:, None, :] | eye[None, :, :])
    variance = torch.diagonal(covariance, dim1=-2, dim2=-1)[distinct_pair]
    off_diagonal = covariance[distinct_triple]
    return {"kernel_variance": float(variance.mean()),
            "kernel_covariance": float(off_diagonal.mean()),
            "attention_mse": float(((estimated_attention - attention) ** 2).mean())}


@with_bounded_threads
def run_attention(*, tokens: int = 16, dim: int = 16, num_features: Sequence[int] = (16, 32, 64, 128, 256),
                  couplings: Sequence[str] = DEFAULT_COUPLINGS, draws: int = 1000, repeats: int = 10,
                  key_std: float | None = None, seed: int = 0) -> dict[str, Any]:
    r"""Run the attention experiment (see the module docstring).

    :param tokens: Number of keys :math:`N`.
    :param dim: Key dimension :math:`d`.
    :param num_features: Numbers of random features :math:`m`.
    :param couplings: Frequency couplings to compare.
    :param draws: Feature draws per key set (estimate the variances and MSE).
    :param repeats: Independent key sets (means and standard errors are over these).
    :param key_std: Standard deviation of the key coordinates (default :math:`1/\sqrt d`).
    :param seed: Base seed.
    :param threads: Keyword only: torch and BLAS threads during the run (default 1, see
        :func:`~gp_couple.experiments._runtime.bounded_threads`); restored afterwards.
    """
    tokens = check_positive_int("tokens", tokens)
    dim = check_positive_int("dim", dim)
    draws = check_positive_int("draws", draws)
    repeats = check_positive_int("repeats", repeats)
    if draws < 2:
        raise ValueError("draws must be at least 2 to estimate variances")
    counts = [check_positive_int("num_features", m) for m in num_features]
    key_std = dim ** -0.5 if key_std is None else float(key_std)
    if not (np.isfinite(key_std) and key_std > 0):
        raise ValueError(f"key_std must be positive and finite, got {key_std}")
    if not couplings:
        raise ValueError("couplings must name at least one coupling")
    resolved = {name: get_frequency_coupling(name, dim=dim) for name in couplings}
    samples: dict[tuple[str, int], list[dict[str, float]]] = {
        (name, m): [] for name in resolved for m in counts}
    for repeat in progress(range(repeats), description="key sets", unit="repeat"):
        key_rng = np.random.default_rng(np.random.SeedSequence([seed, repeat]))
        keys = torch.as_tensor(key_rng.standard_normal((tokens, dim)) * key_std)
        for index, (name, coupling) in enumerate(resolved.items()):
            for m in counts:
                rng = np.random.default_rng(np.random.SeedSequence([seed, repeat, index, m]))
                with torch.no_grad():
                    frequencies = coupling.sample(m, dim, batch_shape=(draws,), seed=rng, dtype=torch.float64)
                    samples[name, m].append(attention_statistics(keys, frequencies))
    metrics = ("kernel_variance", "kernel_covariance", "attention_mse")
    baseline = next(iter(resolved))
    results = []
    for (name, m), rows in samples.items():
        row: dict[str, Any] = {"coupling": name, "num_features": m}
        row.update({metric: summarize(r[metric] for r in rows) for metric in metrics})
        row.update({f"{metric}_vs_{baseline}": summarize(r[metric] / b[metric]
                                                         for r, b in zip(rows, samples[baseline, m]))
                    for metric in metrics})
        results.append(row)
    return {
        "experiment": "attention",
        "settings": {"tokens": tokens, "dim": dim, "key_std": key_std, "draws": draws, "repeats": repeats,
                     "seed": seed, "baseline": baseline,
                     "couplings": list(resolved), "num_features": counts},
        "notes": [f"keys: iid N(0, {key_std:.4g}^2) coordinates; softmax kernel exp(x.y) estimated with "
                  "positive random features",
                  "kernel_variance: mean over i != j of Var(k_ij); kernel_covariance: mean over "
                  "distinct i, j, l of Cov(k_ij, k_il) (diagonal estimates are too heavy-tailed)",
                  "mean and se over independent key sets; each value estimated from `draws` feature draws",
                  f"*_vs_{baseline}: ratio to {baseline} on the same keys"],
        "results": results,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run with the command-line arguments."""
    folder = figure_folder(args)
    report = run_attention(tokens=args.tokens, dim=args.dim, num_features=args.num_features,
                           couplings=args.couplings, draws=args.draws, repeats=args.repeats,
                           key_std=args.key_std, seed=args.seed, threads=args.threads)
    if folder is not None:
        from .plotting import plot_metric_curves

        log_figures([plot_metric_curves(
            report["results"], folder / "attention_vs_features.png", x="num_features",
            metrics=("kernel_variance", "kernel_covariance", "attention_mse"), log_x=True, log_y=True,
            title="Performer attention with norm-coupled positive random features")])
    return report
