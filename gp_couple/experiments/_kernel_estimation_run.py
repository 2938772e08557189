"""The kernel-estimation experiment on arrays: validation, splits, exact GPs and the couplings' draws.

See :mod:`gp_couple.experiments.kernel_estimation` for the protocol.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from .._checks import check_positive_int
from ..couplings.frequencies import get_frequency_coupling
from ..evaluation.metrics import rmse
from ..evaluation.posterior import GaussianPosterior, gp_posterior_from_blocks
from ..features.fourier import feature_map, gaussian_kernel
from ..optimize import Convergence
from ..progress import progress as progress_bar
from ._coupling_draws import evaluate_coupling
from ._exact_gp import GP_CONVERGENCE, GP_OPTIMIZERS, fit_gp_hyperparameters, rlf_lengthscale
from ._kernel_estimation_report import kernel_estimation_report
from ._options import (
    DEFAULT_LATENT_JITTER,
    KERNEL_ESTIMATION_COUPLINGS as DEFAULT_COUPLINGS,
    KL_POSTERIORS,
    PAPER_DATASETS,
)
from ._runtime import with_bounded_threads
from ._splits import random_split, split_stream, standardise

__all__ = ["DEFAULT_COUPLINGS", "FREQUENCIES_PER_DIM", "KL_POSTERIORS", "DEFAULT_LATENT_JITTER",
           "PAPER_DATASETS", "run_kernel_estimation"]

#: Frequencies per input dimension (m = d for RFFs, 2d for RLFs).
FREQUENCIES_PER_DIM: dict[str, int] = {"rff": 1, "rlf": 2}


@with_bounded_threads
def run_kernel_estimation(inputs: np.ndarray, targets: np.ndarray, *,
                          features: Sequence[str] = ("rff", "rlf"),
                          couplings: dict[str, Sequence[str]] | None = None,
                          splits: int = 20, max_train: int = 256, max_test: int = 256,
                          draws: int = 100, gp_iterations: int = 5000, gp_lr: float = 1e-2,
                          gp_optimizer: str = "lbfgs", gp_convergence: Convergence = GP_CONVERGENCE,
                          rff_lengthscale: float | None = None, standardise_targets: bool = True,
                          kl_posterior: str = "predictive",
                          latent_jitter: float = DEFAULT_LATENT_JITTER,
                          num_frequencies: dict[str, int] | None = None,
                          chunk: int = 100, seed: int = 0, dataset: str | None = None,
                          progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    r"""Run the kernel-estimation experiment on arrays (protocol: :mod:`gp_couple.experiments.kernel_estimation`).

    :param inputs: Inputs ``(n, d)``.
    :param targets: Targets ``(n,)``.
    :param features: Feature maps to evaluate (``"rff"``, ``"rlf"``).
    :param couplings: Couplings per feature map (default :data:`DEFAULT_COUPLINGS`);
        ``iid`` must be among them for the normalised columns.
    :param splits: Random train/test splits.
    :param max_train: Most training points per split.
    :param max_test: Most test points per split.
    :param draws: Frequency draws per coupling and split.
    :param gp_iterations: Most iterations of the exact-GP fit.
    :param gp_lr: Adam learning rate of the exact-GP fit (``gp_optimizer="adam"``).
    :param gp_optimizer: ``"lbfgs"`` (default) or ``"adam"`` (see
        :func:`~gp_couple.experiments._exact_gp.fit_gp_hyperparameters`).
    :param gp_convergence: Stopping rule of the exact-GP fit (default
        :data:`~gp_couple.experiments._exact_gp.GP_CONVERGENCE`).
    :param rff_lengthscale: Fix the RFF lengthscale (on standardised inputs) instead of
        fitting it; the amplitude and noise are still fitted.
    :param standardise_targets: Standardise the targets with training statistics before
        the exact-GP fit (default). ``False`` fits the zero-mean GP to the raw targets,
        which lengthens the fitted RFF lengthscale on data with a large mean offset
        (airfoil: about 4.6 instead of 1.4; see benchmarks/RESULTS.md).
    :param kl_posterior: ``"predictive"`` (noisy test targets, default) or ``"latent"``
        (eq. (43), the approximate posterior, Appendix B.2 [eq:approx_muandc], with
        ``latent_jitter`` on both covariances).
    :param latent_jitter: Jitter of the latent posteriors, relative to the amplitude
        :math:`\sigma_v^2` (used only with ``kl_posterior="latent"``).
    :param num_frequencies: Frequencies per feature map (default ``d`` for RFF, ``2d`` for RLF).
    :param chunk: Draws evaluated together (memory: ``chunk * (max_train + max_test) * F``
        floats for ``F`` feature columns).
    :param seed: Base seed.
    :param dataset: Name recorded in the report.
    :param progress: Called with a message after every split (e.g. to print progress).
    :param threads: Keyword only: torch and BLAS threads during the run (default 1, see
        :func:`~gp_couple.experiments._runtime.bounded_threads`); restored afterwards.
    :return: The report: ``results`` rows per (feature map, coupling) with mean, standard
        error and number of splits of every metric, and the exact GPs' hyperparameters.
    :raises ValueError: For inconsistent or non-finite data, unknown couplings, feature
        maps or posteriors, and non-positive counts.
    """
    x_all = np.asarray(inputs, dtype=np.float64)
    y_all = np.asarray(targets, dtype=np.float64)
    if x_all.ndim != 2 or y_all.shape != (len(x_all),):
        raise ValueError(f"inputs must be (n, d) and targets (n,), got {x_all.shape} and {y_all.shape}")
    if not (np.all(np.isfinite(x_all)) and np.all(np.isfinite(y_all))):
        raise ValueError("inputs and targets must be finite")
    for kind in features:
        feature_map(kind)
    if kl_posterior not in KL_POSTERIORS:
        raise ValueError(f"kl_posterior must be one of {list(KL_POSTERIORS)}, got {kl_posterior!r}")
    if not (math.isfinite(latent_jitter) and latent_jitter > 0):
        raise ValueError(f"latent_jitter must be positive and finite, got {latent_jitter}")
    if rff_lengthscale is not None and not (math.isfinite(rff_lengthscale) and rff_lengthscale > 0):
        raise ValueError(f"rff_lengthscale must be positive and finite, got {rff_lengthscale}")
    couplings = {kind: tuple((couplings or DEFAULT_COUPLINGS).get(kind, DEFAULT_COUPLINGS[kind]))
                 for kind in features}
    if gp_optimizer not in GP_OPTIMIZERS:
        raise ValueError(f"gp_optimizer must be one of {list(GP_OPTIMIZERS)}, got {gp_optimizer!r}")
    if not isinstance(gp_convergence, Convergence):
        raise TypeError(f"gp_convergence must be a gp_couple.optimize.Convergence, got {type(gp_convergence).__name__}")
    splits = check_positive_int("splits", splits)
    draws = check_positive_int("draws", draws)
    chunk = check_positive_int("chunk", chunk)
    dim = x_all.shape[1]
    frequencies = {kind: (num_frequencies or {}).get(kind, FREQUENCIES_PER_DIM[kind] * dim)
                   for kind in features}
    for kind, count in frequencies.items():
        check_positive_int(f"num_frequencies[{kind!r}]", count)
        for name in couplings[kind]:
            get_frequency_coupling(name, dim=dim)
    include_noise = kl_posterior == "predictive"

    per_split: dict[tuple[str, str], list[dict[str, float]]] = {
        (kind, name): [] for kind in features for name in couplings[kind]}
    exact: dict[str, dict[str, list[float]]] = {
        kind: {"predictive_rmse": [], "lengthscale": [], "outputscale": [], "noise": [], "gp_iterations": [],
               "gp_converged": []}
        for kind in features}
    for split in progress_bar(range(splits), description="splits", unit="split"):
        train, test = random_split(len(x_all), max_train, max_test, seed=split_stream(seed, split, "split"))
        sizes = (len(train), len(test))
        x_train, x_test = standardise(x_all[train], x_all[test])
        if standardise_targets:
            y_train, y_test = standardise(y_all[train, None], y_all[test, None])
            y_train, y_test = y_train[:, 0], y_test[:, 0]
        else:
            y_train, y_test = y_all[train], y_all[test]
        points = torch.as_tensor(np.concatenate([x_train, x_test]))
        fit_kwargs = dict(iterations=gp_iterations, lr=gp_lr, optimizer=gp_optimizer, convergence=gp_convergence)
        for kind in features:
            fixed = rlf_lengthscale(x_train) if kind == "rlf" else rff_lengthscale
            hyper = fit_gp_hyperparameters(x_train, y_train, lengthscale=fixed, **fit_kwargs)
            scaled = points / hyper.lengthscale
            gram = gaussian_kernel(scaled)
            n_train = len(train)
            scaled_gram = hyper.outputscale * gram.numpy()
            jitter = 0.0 if include_noise else latent_jitter * hyper.outputscale
            exact_posterior = gp_posterior_from_blocks(
                scaled_gram[:n_train, :n_train], scaled_gram[n_train:, :n_train],
                scaled_gram[n_train:, n_train:], y_train, hyper.noise, include_noise=include_noise)
            exact_posterior = GaussianPosterior(
                exact_posterior.mean, exact_posterior.covariance + jitter * np.eye(len(test)))
            record = exact[kind]
            record["predictive_rmse"].append(rmse(exact_posterior.mean, y_test))
            for key, value in asdict(hyper).items():
                record[key if key in record else f"gp_{key}"].append(float(value))
            for name in couplings[kind]:
                per_split[kind, name].append(evaluate_coupling(
                    name, kind, scaled, gram, n_train, y_train, y_test, hyper, exact_posterior,
                    frequencies[kind], draws, chunk, split_stream(seed, split, kind, name),
                    include_noise=include_noise, jitter=jitter))
        if progress is not None:
            fits = ", ".join(f"{kind} GP {int(exact[kind]['gp_iterations'][-1])} iterations" for kind in features)
            progress(f"split {split + 1}/{splits} done ({fits})")

    summary = kernel_estimation_report(
        per_split, exact, couplings=couplings, frequencies=frequencies, include_noise=include_noise,
        latent_jitter=latent_jitter, gp_optimizer=gp_optimizer, standardise_targets=standardise_targets,
        rff_lengthscale=rff_lengthscale, settings={
            "splits": splits, "num_train": sizes[0], "num_test": sizes[1], "draws": draws,
            "gp_iterations": gp_iterations, "gp_lr": gp_lr, "gp_optimizer": gp_optimizer,
            "gp_convergence": asdict(gp_convergence),
            "rff_lengthscale": rff_lengthscale, "standardise_targets": standardise_targets,
            "kl_posterior": kl_posterior,
            "latent_jitter": None if include_noise else latent_jitter, "seed": seed,
            "couplings": {k: list(v) for k, v in couplings.items()},
            "num_frequencies": frequencies})
    return {"experiment": "kernel-estimation", "dataset": dataset, "num_points": int(len(x_all)),
            "input_dim": int(dim), **summary}
