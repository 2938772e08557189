r"""``gp-couple kernel-estimation``: coupled RFFs and RLFs on UCI data (paper, tab:rff, tab:kld, tab:pred-rmse).

Protocol of app:rff_rlf_expt_details. For every random split (20 by default) at most
256 training and 256 test points are drawn without replacement from a 50/50 split of the
shuffled dataset; inputs and targets are standardised with training statistics.

* **RFF hyperparameters**: lengthscale :math:`\ell`, amplitude :math:`\sigma_v^2` and
  noise :math:`\sigma_n^2` of an exact GP with the Gaussian kernel, fitted by Adam
  (learning rate :math:`10^{-2}`) on the marginal likelihood of the training set, until
  convergence or at most 5000 steps.
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
  the exact and approximate GP predictive posteriors over the test points (full
  covariances, observation noise included, eq:approx_muandc), in nats per test point
  (tab:kld);
* the **predictive RMSE** of the approximate posterior mean on the test targets
  (tab:pred-rmse).

Per split, RMSEs are also divided by the i.i.d. coupling's ("``*_vs_iid``", the
paper's normalisation); means and standard errors are over splits.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
import zlib
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import gpytorch
import numpy as np
import torch

from .._random import SeedLike, as_numpy_generator
from ..couplings.frequencies import check_positive_int, get_frequency_coupling
from ..evaluation.metrics import rmse
from ..evaluation.posterior import GaussianPosterior, gp_posterior_from_blocks, posterior_kl
from ..features.fourier import feature_map, gaussian_kernel
from ._report import add_common_arguments, emit, positive_int, summarize

__all__ = [
    "DEFAULT_COUPLINGS",
    "GPHyperparameters",
    "fit_gp_hyperparameters",
    "rlf_lengthscale",
    "random_split",
    "standardise",
    "run_kernel_estimation",
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
_BASELINE = "iid"


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--threads`` and ``--progress`` (shared by the Euclidean experiments)."""
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch threads for this run (default: torch's default); 1 is often "
                             "fastest for these small matrices on a busy machine")
    parser.add_argument("--progress", action="store_true", help="report progress on stderr")


def apply_runtime_arguments(args: argparse.Namespace) -> Callable[[str], None] | None:
    """Apply ``--threads`` (this CLI process only) and return the ``--progress`` reporter."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if not args.progress:
        return None
    start = time.perf_counter()

    def report(message: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f} s] {message}", file=sys.stderr, flush=True)

    return report


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


# --------------------------------------------------------------------------- data


def random_split(num_points: int, max_train: int, max_test: int,
                 seed: SeedLike = None) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint random train/test indices: a shuffled 50/50 split, each half capped.

    :param num_points: Dataset size (at least 2).
    :param max_train: Most training points.
    :param max_test: Most test points.
    :param seed: Seed or generator.
    """
    num_points = check_positive_int("num_points", num_points)
    if num_points < 2:
        raise ValueError("a train/test split needs at least 2 points")
    max_train = check_positive_int("max_train", max_train)
    max_test = check_positive_int("max_test", max_test)
    order = as_numpy_generator(seed).permutation(num_points)
    half = num_points // 2
    train = order[:min(half, max_train)]
    test = order[half:half + min(num_points - half, max_test)]
    return np.sort(train), np.sort(test)


def standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Centre and scale both arrays with the training mean and standard deviation (per column).

    Columns constant on the training set are only centred.
    """
    mean = train.mean(axis=0)
    scale = train.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    return (train - mean) / scale, (test - mean) / scale


def rlf_lengthscale(inputs: np.ndarray) -> float:
    r"""The RLF lengthscale rule :math:`\ell = \frac{2}{N^2}\sum_{i,j}\|\boldsymbol x_i + \boldsymbol x_j\|` (app:rff_rlf_expt_details)."""
    x = np.asarray(inputs, dtype=np.float64)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError("inputs must be a non-empty (N, d) array")
    sums = np.linalg.norm(x[:, None, :] + x[None, :, :], axis=-1)
    value = 2.0 * float(sums.mean())
    if value <= 0:
        raise ValueError("the RLF lengthscale rule gave 0: all inputs are zero")
    return value


# --------------------------------------------------------------------------- exact GP


@dataclass(frozen=True)
class GPHyperparameters:
    """Gaussian-kernel GP hyperparameters: :math:`\\ell`, :math:`\\sigma_v^2`, :math:`\\sigma_n^2`."""

    lengthscale: float
    outputscale: float
    noise: float
    steps: int


class _ExactGP(gpytorch.models.ExactGP):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def fit_gp_hyperparameters(inputs: np.ndarray, targets: np.ndarray, *, max_steps: int = 5000,
                           learning_rate: float = 1e-2, tolerance: float = 1e-5,
                           lengthscale: float | None = None,
                           check_every: int = 100) -> GPHyperparameters:
    r"""Fit an exact zero-mean GP with a Gaussian kernel by Adam on the marginal likelihood.

    Starts from gpytorch's defaults and stops after ``max_steps`` or when the negative
    marginal log-likelihood per point changed by less than ``tolerance`` over the last
    ``check_every`` steps.

    :param inputs: Training inputs ``(N, d)`` (standardised).
    :param targets: Training targets ``(N,)`` (standardised).
    :param max_steps: Most Adam steps.
    :param learning_rate: Adam learning rate.
    :param tolerance: Convergence threshold on the loss change per ``check_every`` steps.
    :param lengthscale: Fix :math:`\ell` to this value (the RLF rule) instead of fitting it.
    :param check_every: Steps between convergence checks.
    """
    max_steps = check_positive_int("max_steps", max_steps)
    x = torch.as_tensor(np.asarray(inputs, dtype=np.float64))
    y = torch.as_tensor(np.asarray(targets, dtype=np.float64))
    model = _ExactGP(x, y).double()
    if lengthscale is not None:
        model.covar_module.base_kernel.lengthscale = float(lengthscale)
        model.covar_module.base_kernel.raw_lengthscale.requires_grad_(False)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(parameters, lr=learning_rate)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()
    previous = math.inf
    step = 0
    # N <= a few hundred: a dense Cholesky is exact and cheaper than CG.
    with gpytorch.settings.max_cholesky_size(max(len(y), 800) + 1):
        for step in range(1, max_steps + 1):
            optimizer.zero_grad()
            loss = -mll(model(x), y)
            loss.backward()
            optimizer.step()
            if step % check_every == 0:
                value = float(loss.detach())
                if abs(previous - value) < tolerance:
                    break
                previous = value
    kernel = model.covar_module
    return GPHyperparameters(lengthscale=float(kernel.base_kernel.lengthscale.detach()),
                             outputscale=float(kernel.outputscale.detach()),
                             noise=float(model.likelihood.noise.detach()), steps=step)


# --------------------------------------------------------------------------- evaluation


def _stream(seed: int, split: int, *labels: str) -> np.random.Generator:
    # Stable per-(split, feature map, coupling) streams: adding or reordering couplings
    # on the command line does not change any other coupling's draws.
    words = [seed, split, *(zlib.crc32(label.encode()) for label in labels)]
    return np.random.default_rng(np.random.SeedSequence(words))


def _evaluate_coupling(coupling_name: str, kind: str, scaled: torch.Tensor, exact_gram: torch.Tensor,
                       n_train: int, y_train: np.ndarray, y_test: np.ndarray,
                       hyper: GPHyperparameters, exact_posterior: GaussianPosterior,
                       num_frequencies: int, draws: int, chunk: int,
                       rng: np.random.Generator) -> dict[str, float]:
    coupling = get_frequency_coupling(coupling_name, dim=scaled.shape[-1])
    fmap = feature_map(kind)
    n_test = len(y_test)
    squared_errors, kls, prediction_errors = [], [], []
    exact_test = exact_gram[n_train:, n_train:]
    for start in range(0, draws, chunk):
        size = min(chunk, draws - start)
        with torch.no_grad():
            frequencies = coupling.sample(num_frequencies, scaled.shape[-1], batch_shape=(size,),
                                          seed=rng, dtype=torch.float64)
            features = fmap(scaled, frequencies)
            grams = (features @ features.mT).numpy()
        squared_errors.extend(((grams[:, n_train:, n_train:] - exact_test.numpy()) ** 2)
                              .mean(axis=(-2, -1)).tolist())
        for gram in grams:
            scaled_gram = hyper.outputscale * gram
            approximate = gp_posterior_from_blocks(
                scaled_gram[:n_train, :n_train], scaled_gram[n_train:, :n_train],
                scaled_gram[n_train:, n_train:], y_train, hyper.noise)
            kls.append(posterior_kl(exact_posterior, approximate) / n_test)
            prediction_errors.append(rmse(approximate.mean, y_test))
    return {"kernel_rmse": math.sqrt(float(np.mean(squared_errors))),
            "kl_per_test_point": float(np.mean(kls)),
            "predictive_rmse": float(np.mean(prediction_errors))}


def run_kernel_estimation(inputs: np.ndarray, targets: np.ndarray, *,
                          features: Sequence[str] = ("rff", "rlf"),
                          couplings: dict[str, Sequence[str]] | None = None,
                          splits: int = 20, max_train: int = 256, max_test: int = 256,
                          draws: int = 100, gp_steps: int = 5000, gp_learning_rate: float = 1e-2,
                          gp_tolerance: float = 1e-5, num_frequencies: dict[str, int] | None = None,
                          chunk: int = 25, seed: int = 0, dataset: str | None = None,
                          progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the kernel-estimation experiment on arrays (see the module docstring).

    :param inputs: Inputs ``(n, d)``.
    :param targets: Targets ``(n,)``.
    :param features: Feature maps to evaluate (``"rff"``, ``"rlf"``).
    :param couplings: Couplings per feature map (default :data:`DEFAULT_COUPLINGS`);
        ``iid`` must be among them for the normalised columns.
    :param splits: Random train/test splits.
    :param max_train: Most training points per split.
    :param max_test: Most test points per split.
    :param draws: Frequency draws per coupling and split.
    :param gp_steps: Most Adam steps of the exact-GP fit.
    :param gp_learning_rate: Adam learning rate of the exact-GP fit.
    :param gp_tolerance: Convergence threshold of the exact-GP fit.
    :param num_frequencies: Frequencies per feature map (default ``d`` for RFF, ``2d`` for RLF).
    :param chunk: Draws evaluated together (memory: ``chunk * (max_train + max_test)^2`` floats).
    :param seed: Base seed.
    :param dataset: Name recorded in the report.
    :param progress: Called with a message after every split (e.g. to print progress).
    :return: The report: ``results`` rows per (feature map, coupling) with mean, standard
        error and number of splits of every metric, and the exact GPs' hyperparameters.
    """
    x_all = np.asarray(inputs, dtype=np.float64)
    y_all = np.asarray(targets, dtype=np.float64)
    if x_all.ndim != 2 or y_all.shape != (len(x_all),):
        raise ValueError(f"inputs must be (n, d) and targets (n,), got {x_all.shape} and {y_all.shape}")
    if not (np.all(np.isfinite(x_all)) and np.all(np.isfinite(y_all))):
        raise ValueError("inputs and targets must be finite")
    for kind in features:
        feature_map(kind)
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

    per_split: dict[tuple[str, str], list[dict[str, float]]] = {
        (kind, name): [] for kind in features for name in couplings[kind]}
    exact: dict[str, dict[str, list[float]]] = {
        kind: {"predictive_rmse": [], "lengthscale": [], "outputscale": [], "noise": [], "gp_steps": []}
        for kind in features}
    for split in range(splits):
        train, test = random_split(len(x_all), max_train, max_test, seed=_stream(seed, split, "split"))
        sizes = (len(train), len(test))
        x_train, x_test = standardise(x_all[train], x_all[test])
        y_train, y_test = standardise(y_all[train, None], y_all[test, None])
        y_train, y_test = y_train[:, 0], y_test[:, 0]
        points = torch.as_tensor(np.concatenate([x_train, x_test]))
        fit_kwargs = dict(max_steps=gp_steps, learning_rate=gp_learning_rate, tolerance=gp_tolerance)
        for kind in features:
            fixed = rlf_lengthscale(x_train) if kind == "rlf" else None
            hyper = fit_gp_hyperparameters(x_train, y_train, lengthscale=fixed, **fit_kwargs)
            scaled = points / hyper.lengthscale
            gram = gaussian_kernel(scaled)
            n_train = len(train)
            scaled_gram = hyper.outputscale * gram.numpy()
            exact_posterior = gp_posterior_from_blocks(
                scaled_gram[:n_train, :n_train], scaled_gram[n_train:, :n_train],
                scaled_gram[n_train:, n_train:], y_train, hyper.noise)
            record = exact[kind]
            record["predictive_rmse"].append(rmse(exact_posterior.mean, y_test))
            for key, value in asdict(hyper).items():
                record["gp_steps" if key == "steps" else key].append(float(value))
            for name in couplings[kind]:
                per_split[kind, name].append(_evaluate_coupling(
                    name, kind, scaled, gram, n_train, y_train, y_test, hyper, exact_posterior,
                    frequencies[kind], draws, chunk, _stream(seed, split, kind, name)))
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
    notes = [
        "kernel_rmse: test Gram block, unit amplitude, root of the mean square over draws",
        "kl_per_test_point: KL(exact || approximate) predictive posterior incl. noise, nats per test point",
        "*_vs_iid: per-split ratio to the iid coupling; mean and se over splits",
    ]
    return {
        "experiment": "kernel-estimation",
        "dataset": dataset,
        "num_points": int(len(x_all)),
        "input_dim": int(dim),
        "settings": {"splits": splits, "num_train": sizes[0], "num_test": sizes[1], "draws": draws,
                     "gp_max_steps": gp_steps, "gp_learning_rate": gp_learning_rate,
                     "gp_tolerance": gp_tolerance, "seed": seed,
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

    progress = apply_runtime_arguments(args)
    inputs, targets = load_uci(args.dataset, data_dir=args.data_dir)
    couplings = {"rff": args.rff_couplings, "rlf": args.rlf_couplings}
    num_frequencies = {kind: value for kind, value in
                       (("rff", args.rff_frequencies), ("rlf", args.rlf_frequencies)) if value is not None}
    with warnings.catch_warnings():
        # Jitter notices of near-singular approximate covariances are expected at m << N.
        warnings.simplefilter("ignore", RuntimeWarning)
        return run_kernel_estimation(
            inputs, targets, features=args.features, couplings=couplings, splits=args.repeats,
            max_train=args.max_train, max_test=args.max_test, draws=args.draws,
            gp_steps=args.gp_steps, gp_learning_rate=args.gp_lr, gp_tolerance=args.gp_tolerance,
            num_frequencies=num_frequencies, chunk=args.chunk, seed=args.seed, dataset=args.dataset,
            progress=progress)


def register(subparsers: Any) -> None:
    """Add the ``kernel-estimation`` sub-command."""
    parser = subparsers.add_parser(
        "kernel-estimation", help="kernel RMSE, posterior KL and predictive RMSE of coupled RFFs/RLFs on UCI data",
        description=__doc__.split("\n\n")[0].strip("r\"` "))
    parser.add_argument("--dataset", required=True,
                        help=f"UCI dataset: {', '.join(PAPER_DATASETS)} (also energy, yacht, kin8nm)")
    parser.add_argument("--data-dir", default=None, help="dataset directory (default $GP_COUPLE_DATA)")
    parser.add_argument("--features", nargs="+", choices=("rff", "rlf"), default=["rff", "rlf"])
    parser.add_argument("--rff-couplings", nargs="+", default=list(DEFAULT_COUPLINGS["rff"]),
                        help="couplings for RFFs (default %(default)s)")
    parser.add_argument("--rlf-couplings", nargs="+", default=list(DEFAULT_COUPLINGS["rlf"]),
                        help="couplings for RLFs (default %(default)s)")
    parser.add_argument("--rff-frequencies", type=positive_int, default=None, help="RFF frequencies (default d)")
    parser.add_argument("--rlf-frequencies", type=positive_int, default=None, help="RLF frequencies (default 2d)")
    parser.add_argument("--max-train", type=positive_int, default=256)
    parser.add_argument("--max-test", type=positive_int, default=256)
    parser.add_argument("--draws", type=positive_int, default=100, help="frequency draws per coupling and split")
    parser.add_argument("--gp-steps", type=positive_int, default=5000, help="most Adam steps of the exact GP")
    parser.add_argument("--gp-lr", type=positive_float, default=1e-2, help="Adam learning rate of the exact GP")
    parser.add_argument("--gp-tolerance", type=positive_float, default=1e-5,
                        help="stop the GP fit when the loss moves less than this per 100 steps")
    parser.add_argument("--chunk", type=positive_int, default=25, help="draws evaluated together")
    add_runtime_arguments(parser)
    add_common_arguments(parser, repeats=20)
    parser.add_argument("--splits", type=positive_int, dest="repeats", default=argparse.SUPPRESS,
                        help="alias of --repeats: random train/test splits")
    parser.set_defaults(func=lambda args: emit(run(args), as_json=args.json, columns=(
        "features", "coupling", "kernel_rmse_vs_iid", "kl_per_test_point", "predictive_rmse_vs_iid")))
