r"""``gp-couple kernel-estimation``: coupled RFFs and RLFs on UCI data (paper, tab:rff, tab:kld, tab:pred-rmse).

Protocol of app:rff_rlf_expt_details. For every random split (20 by default) at most
256 training and 256 test points are drawn without replacement from a 50/50 split of the
shuffled dataset; inputs and targets are standardised with training statistics.

* **RFF hyperparameters**: lengthscale :math:`\ell`, amplitude :math:`\sigma_v^2` and
  noise :math:`\sigma_n^2` of an exact GP with the Gaussian kernel, maximising the
  marginal likelihood of the training set (L-BFGS by default; the paper's Adam with
  ``--gp-optimizer adam``, see :mod:`gp_couple.experiments._exact_gp`).
  ``--lengthscale`` fixes :math:`\ell` instead (fitting the other two).
* **RLF hyperparameters**: the lengthscale rule
  :math:`\ell = \frac{2}{N^2}\sum_{i,j}\|\boldsymbol x_i + \boldsymbol x_j\|` over the
  training set (it keeps :math:`\|\boldsymbol x + \boldsymbol y\| / \ell` small, where RLFs
  concentrate), then :math:`\sigma_v^2, \sigma_n^2` fitted as above with :math:`\ell` fixed.

With :math:`m = d` frequencies for RFFs and :math:`m = 2d` for RLFs, every coupling
is drawn ``--draws`` times per split, and each draw gives

* the **kernel RMSE** over the test Gram block,
  :math:`\sqrt{\mathrm{mean}_{ij}(\widehat k(\boldsymbol x_i, \boldsymbol x_j) - k(\boldsymbol x_i, \boldsymbol x_j))^2}`
  (unit amplitude), averaged as a mean square over draws (tab:rff);
* the **KL divergence** :math:`\mathrm{KL}(p_\mathrm{exact}\,\|\,p_\mathrm{approx})` between
  the exact and approximate GP posteriors over the test points (full covariances), in
  nats per test point (tab:kld). By default (``--kl-posterior predictive``) both are
  predictive posteriors of noisy test targets, i.e. the covariance of eq:approx_muandc
  plus :math:`\sigma_n^2 I`. The paper's equation itself is the latent posterior
  (``--kl-posterior latent``), whose approximate covariance has rank at most the number
  of feature columns, below the number of test points, so that KL is infinite without a
  jitter: the latent option adds ``--latent-jitter`` times :math:`\sigma_v^2` to both
  covariances and reports it;
* the **predictive RMSE** of the approximate posterior mean on the test targets
  (tab:pred-rmse).

Per split, RMSEs are also divided by the i.i.d. coupling's ("``*_vs_iid``", the
paper's normalisation); means and standard errors are over splits.

The random-feature posteriors are evaluated in low-rank form (Woodbury identity,
:func:`gp_couple.evaluation.posterior.low_rank_posterior`), a whole batch of draws at a
time, and the kernel RMSE through
:math:`\|\Phi\Phi^\top - K\|_F^2 = \|\Phi^\top\Phi\|_F^2 - 2\,\mathrm{tr}(\Phi^\top K \Phi) + \|K\|_F^2`,
so no draw builds a dense Gram matrix.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from dataclasses import asdict
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..couplings.frequencies import FREQUENCY_COUPLINGS, check_positive_int, get_frequency_coupling
from ..evaluation.metrics import rmse
from ..evaluation.posterior import GaussianPosterior, gp_posterior_from_blocks, low_rank_posterior
from ..features.fourier import feature_map, gaussian_kernel
from ._exact_gp import GP_OPTIMIZERS, GPHyperparameters, fit_gp_hyperparameters, rlf_lengthscale
from ._runtime import add_runtime_arguments, apply_runtime_arguments, with_bounded_threads
from ._splits import random_split, split_stream, standardise
from ..progress import progress as progress_bar
from ._report import add_common_arguments, emit, figure_folder, log_figures, positive_float, positive_int, summarize

__all__ = [
    "DEFAULT_COUPLINGS",
    "GPHyperparameters",
    "fit_gp_hyperparameters",
    "rlf_lengthscale",
    "random_split",
    "standardise",
    "run_kernel_estimation",
    "KL_POSTERIORS",
    "add_runtime_arguments",
    "apply_runtime_arguments",
    "register",
]

#: UCI datasets of the paper's tables.
PAPER_DATASETS: tuple[str, ...] = ("concrete", "abalone", "cpu", "power", "airfoil", "boston")
#: Couplings compared per feature map (tab:rff, tab:kld, tab:pred-rmse, plus PM).
DEFAULT_COUPLINGS: dict[str, tuple[str, ...]] = {
    "rff": ("iid", "halton", "sobol", "orthogonal", "pnc", "pm"),
    "rlf": ("iid", "halton", "sobol", "orthogonal", "orthogonal+antithetic", "pnc+antithetic", "pm"),
}
#: Frequencies per input dimension (m = d for RFFs, 2d for RLFs).
FREQUENCIES_PER_DIM: dict[str, int] = {"rff": 1, "rlf": 2}
#: Posteriors whose KL divergence can be reported (see the module docstring).
KL_POSTERIORS: tuple[str, ...] = ("predictive", "latent")
#: Default ``latent_jitter``: relative to the amplitude sigma_v^2.
DEFAULT_LATENT_JITTER = 1e-6
_BASELINE = "iid"


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def _evaluate_coupling(coupling_name: str, kind: str, scaled: torch.Tensor, exact_gram: torch.Tensor,
                       n_train: int, y_train: np.ndarray, y_test: np.ndarray,
                       hyper: GPHyperparameters, exact_posterior: GaussianPosterior,
                       num_frequencies: int, draws: int, chunk: int, rng: np.random.Generator, *,
                       include_noise: bool = True, jitter: float = 0.0) -> dict[str, float]:
    coupling = get_frequency_coupling(coupling_name, dim=scaled.shape[-1])
    fmap = feature_map(kind)
    n_test = len(y_test)
    exact_test = exact_gram[n_train:, n_train:]
    exact_test_norm = float(exact_test.square().sum())
    targets = torch.as_tensor(y_test, dtype=torch.float64)
    amplitude = math.sqrt(hyper.outputscale)
    squared_errors, kls, prediction_errors = [], [], []
    for start in range(0, draws, chunk):
        size = min(chunk, draws - start)
        frequencies = coupling.sample(num_frequencies, scaled.shape[-1], batch_shape=(size,),
                                      seed=rng, dtype=torch.float64)
        features = fmap(scaled, frequencies)
        train_features, test_features = features[..., :n_train, :], features[..., n_train:, :]
        # ||Phi Phi^T - K||_F^2 without forming Phi Phi^T (unit amplitude, test block).
        gram_in_feature_space = test_features.mT @ test_features
        cross = (test_features * (exact_test @ test_features)).sum((-2, -1))
        squared = gram_in_feature_space.square().sum((-2, -1)) - 2.0 * cross + exact_test_norm
        squared_errors.extend((squared.clamp_min(0.0) / n_test**2).tolist())
        approximate = low_rank_posterior(amplitude * train_features, amplitude * test_features, y_train,
                                         hyper.noise, include_noise=include_noise, jitter=jitter)
        kls.extend((approximate.kl_from(exact_posterior) / n_test).tolist())
        prediction_errors.extend((approximate.mean - targets).square().mean(-1).sqrt().tolist())
    return {"kernel_rmse": math.sqrt(float(np.mean(squared_errors))),
            "kl_per_test_point": float(np.mean(kls)),
            "predictive_rmse": float(np.mean(prediction_errors))}


@with_bounded_threads
def run_kernel_estimation(inputs: np.ndarray, targets: np.ndarray, *,
                          features: Sequence[str] = ("rff", "rlf"),
                          couplings: dict[str, Sequence[str]] | None = None,
                          splits: int = 20, max_train: int = 256, max_test: int = 256,
                          draws: int = 100, gp_steps: int = 5000, gp_learning_rate: float = 1e-2,
                          gp_tolerance: float = 1e-5, gp_optimizer: str = "lbfgs",
                          rff_lengthscale: float | None = None, standardise_targets: bool = True,
                          kl_posterior: str = "predictive",
                          latent_jitter: float = DEFAULT_LATENT_JITTER,
                          num_frequencies: dict[str, int] | None = None,
                          chunk: int = 100, seed: int = 0, dataset: str | None = None,
                          progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    r"""Run the kernel-estimation experiment on arrays (see the module docstring).

    :param inputs: Inputs ``(n, d)``.
    :param targets: Targets ``(n,)``.
    :param features: Feature maps to evaluate (``"rff"``, ``"rlf"``).
    :param couplings: Couplings per feature map (default :data:`DEFAULT_COUPLINGS`);
        ``iid`` must be among them for the normalised columns.
    :param splits: Random train/test splits.
    :param max_train: Most training points per split.
    :param max_test: Most test points per split.
    :param draws: Frequency draws per coupling and split.
    :param gp_steps: Most iterations of the exact-GP fit.
    :param gp_learning_rate: Adam learning rate of the exact-GP fit (``gp_optimizer="adam"``).
    :param gp_tolerance: Convergence threshold of the exact-GP fit.
    :param gp_optimizer: ``"lbfgs"`` (default) or ``"adam"`` (see
        :func:`~gp_couple.experiments._exact_gp.fit_gp_hyperparameters`).
    :param rff_lengthscale: Fix the RFF lengthscale (on standardised inputs) instead of
        fitting it; the amplitude and noise are still fitted.
    :param standardise_targets: Standardise the targets with training statistics before
        the exact-GP fit (default). ``False`` fits the zero-mean GP to the raw targets,
        which lengthens the fitted RFF lengthscale on data with a large mean offset
        (airfoil: about 4.6 instead of 1.4; see benchmarks/RESULTS.md).
    :param kl_posterior: ``"predictive"`` (noisy test targets, default) or ``"latent"``
        (eq:approx_muandc, with ``latent_jitter`` on both covariances).
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
        kind: {"predictive_rmse": [], "lengthscale": [], "outputscale": [], "noise": [], "gp_steps": [],
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
        fit_kwargs = dict(max_steps=gp_steps, learning_rate=gp_learning_rate, tolerance=gp_tolerance,
                          optimizer=gp_optimizer)
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
                record[{"steps": "gp_steps", "converged": "gp_converged"}.get(key, key)].append(float(value))
            for name in couplings[kind]:
                per_split[kind, name].append(_evaluate_coupling(
                    name, kind, scaled, gram, n_train, y_train, y_test, hyper, exact_posterior,
                    frequencies[kind], draws, chunk, split_stream(seed, split, kind, name),
                    include_noise=include_noise, jitter=jitter))
        if progress is not None:
            fits = ", ".join(f"{kind} GP {int(exact[kind]['gp_steps'][-1])} steps" for kind in features)
            progress(f"split {split + 1}/{splits} done ({fits})")

    results = []
    for (kind, name), rows in per_split.items():
        row: dict[str, Any] = {"features": kind, "coupling": name, "num_frequencies": frequencies[kind]}
        for metric in ("kernel_rmse", "kl_per_test_point", "predictive_rmse"):
            row[metric] = summarize(r[metric] for r in rows)
        if _BASELINE in couplings[kind]:
            baseline = per_split[kind, _BASELINE]
            for metric in ("kernel_rmse", "predictive_rmse"):
                row[f"{metric}_vs_iid"] = summarize(
                    r[metric] / b[metric] for r, b in zip(rows, baseline))
        results.append(row)
    kl_note = ("KL(exact || approximate) of the predictive posteriors (noise included), nats per test point"
               if include_noise else
               f"KL(exact || approximate) of the latent posteriors (eq:approx_muandc) with jitter "
               f"{latent_jitter:g} * outputscale on both covariances, nats per test point")
    notes = [
        "kernel_rmse: test Gram block, unit amplitude, root of the mean square over draws",
        f"kl_per_test_point: {kl_note}",
        "*_vs_iid: per-split ratio to the iid coupling; mean and se over splits",
        f"exact GP fitted by {gp_optimizer} to {'standardised' if standardise_targets else 'raw'} targets"
        + ("" if rff_lengthscale is None else f"; RFF lengthscale fixed at {rff_lengthscale:g}"),
    ]
    return {
        "experiment": "kernel-estimation",
        "dataset": dataset,
        "num_points": int(len(x_all)),
        "input_dim": int(dim),
        "settings": {"splits": splits, "num_train": sizes[0], "num_test": sizes[1], "draws": draws,
                     "gp_max_steps": gp_steps, "gp_learning_rate": gp_learning_rate,
                     "gp_tolerance": gp_tolerance, "gp_optimizer": gp_optimizer,
                     "rff_lengthscale": rff_lengthscale, "standardise_targets": standardise_targets,
                     "kl_posterior": kl_posterior,
                     "latent_jitter": None if include_noise else latent_jitter, "seed": seed,
                     "couplings": {k: list(v) for k, v in couplings.items()},
                     "num_frequencies": frequencies},
        "notes": notes,
        "exact_gp": {kind: {key: summarize(values) for key, values in record.items()}
                     for kind, record in exact.items()},
        "results": results,
    }


# --------------------------------------------------------------------------- CLI


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load the dataset named on the command line and run the experiment."""
    from ..datasets.uci import load_uci

    reporter = apply_runtime_arguments(args)
    folder = figure_folder(args)
    inputs, targets = load_uci(args.dataset, data_dir=args.data_dir)
    couplings = {"rff": args.rff_couplings, "rlf": args.rlf_couplings}
    num_frequencies = {kind: value for kind, value in
                       (("rff", args.rff_frequencies), ("rlf", args.rlf_frequencies)) if value is not None}
    start = time.perf_counter()
    with warnings.catch_warnings():
        # Jitter notices of near-singular exact covariances are expected for smooth kernels.
        warnings.simplefilter("ignore", RuntimeWarning)
        report = run_kernel_estimation(
            inputs, targets, features=args.features, couplings=couplings, splits=args.repeats,
            max_train=args.max_train, max_test=args.max_test, draws=args.draws,
            gp_steps=args.gp_steps, gp_learning_rate=args.gp_lr, gp_tolerance=args.gp_tolerance,
            gp_optimizer=args.gp_optimizer, rff_lengthscale=args.rff_lengthscale,
            standardise_targets=not args.raw_targets,
            kl_posterior=args.kl_posterior, latent_jitter=args.latent_jitter,
            num_frequencies=num_frequencies, chunk=args.chunk, seed=args.seed, dataset=args.dataset,
            progress=reporter, threads=args.threads)
    report["timing"] = {"seconds": round(time.perf_counter() - start, 2), "threads": args.threads}
    if folder is not None:
        from ..plotting import plot_metric_bars

        log_figures([plot_metric_bars(
            report["results"], folder / f"kernel_estimation_{args.dataset}.png", category="coupling",
            metrics=("kernel_rmse", "kl_per_test_point", "predictive_rmse"), panel=("features",),
            title=f"Coupled random features on UCI {args.dataset}")])
    return report


def register(subparsers: Any) -> None:
    """Add the ``kernel-estimation`` sub-command."""
    parser = subparsers.add_parser(
        "kernel-estimation", help="kernel RMSE, posterior KL and predictive RMSE of coupled RFFs/RLFs on UCI data",
        description=__doc__.split("\n\n")[0].strip("r\"` "))
    parser.add_argument("--dataset", required=True,
                        help=f"UCI dataset: {', '.join(PAPER_DATASETS)} (also energy, yacht, kin8nm)")
    parser.add_argument("--data-dir", default=None, help="dataset directory (default $GP_COUPLE_DATA)")
    parser.add_argument("--features", nargs="+", choices=("rff", "rlf"), default=["rff", "rlf"],
                        help="random Fourier (rff) and/or random Laplace (rlf) features")
    known = ", ".join(FREQUENCY_COUPLINGS.names())
    parser.add_argument("--rff-couplings", nargs="+", default=list(DEFAULT_COUPLINGS["rff"]),
                        help=f"couplings for RFFs, any registered frequency coupling ({known}), "
                             "optionally NAME+antithetic (default %(default)s)")
    parser.add_argument("--rlf-couplings", nargs="+", default=list(DEFAULT_COUPLINGS["rlf"]),
                        help="couplings for RLFs, as for --rff-couplings (default %(default)s)")
    parser.add_argument("--rff-frequencies", type=positive_int, default=None, help="RFF frequencies (default d)")
    parser.add_argument("--rlf-frequencies", type=positive_int, default=None, help="RLF frequencies (default 2d)")
    parser.add_argument("--max-train", type=positive_int, default=256, help="most training points per split")
    parser.add_argument("--max-test", type=positive_int, default=256, help="most test points per split")
    parser.add_argument("--draws", type=positive_int, default=100, help="frequency draws per coupling and split")
    parser.add_argument("--gp-optimizer", choices=GP_OPTIMIZERS, default="lbfgs",
                        help="exact-GP optimiser: L-BFGS (converges in tens of iterations) or the "
                             "paper's Adam (thousands of steps)")
    parser.add_argument("--gp-steps", type=positive_int, default=5000,
                        help="most iterations (L-BFGS) or steps (Adam) of the exact-GP fit")
    parser.add_argument("--gp-lr", type=positive_float, default=1e-2, help="Adam learning rate of the exact GP")
    parser.add_argument("--gp-tolerance", type=positive_float, default=1e-5,
                        help="L-BFGS: gradient tolerance; Adam: stop when the loss moves less than "
                             "this per 100 steps")
    parser.add_argument("--rff-lengthscale", type=positive_float, default=None,
                        help="fix the RFF lengthscale (standardised inputs) instead of fitting it")
    parser.add_argument("--raw-targets", action="store_true",
                        help="fit the zero-mean exact GP to unstandardised targets (reproduces the "
                             "paper's airfoil RFF ratios, see benchmarks/RESULTS.md)")
    parser.add_argument("--kl-posterior", choices=KL_POSTERIORS, default="predictive",
                        help="posterior compared by the KL: predictive (noisy test targets) or latent "
                             "(the paper's eq:approx_muandc, with --latent-jitter)")
    parser.add_argument("--latent-jitter", type=positive_float, default=DEFAULT_LATENT_JITTER,
                        help="jitter of both latent covariances, relative to the amplitude")
    parser.add_argument("--chunk", type=positive_int, default=100, help="draws evaluated together")
    add_runtime_arguments(parser)
    add_common_arguments(parser, repeats=20)
    parser.add_argument("--splits", type=positive_int, dest="repeats", default=argparse.SUPPRESS,
                        help="alias of --repeats: random train/test splits")
    parser.set_defaults(func=lambda args: emit(run(args), as_json=args.json, columns=(
        "features", "coupling", "kernel_rmse_vs_iid", "kl_per_test_point", "predictive_rmse_vs_iid")))
