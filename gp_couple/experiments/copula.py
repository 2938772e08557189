r"""``gp-couple copula-learning``: learning a Gaussian-copula norm coupling (paper, Appendix A.5
"Copulas as numerical OT solvers" [app:copulas], Figure 5, Appendix A.5 [fig:boston-losses]).

On random splits of a UCI dataset (Boston by default), the norms of orthogonal frequency
ensembles are coupled by a Gaussian copula whose correlation matrix is learned by Adam
on the kernel RMSE of the training set (eq. (35), the copula's RMSE loss, Appendix A.5
[eq:rmseloss]), with the reparameterisation trick through
:func:`~gp_couple.couplings.normal_to_chi`, starting from independent norms
(:math:`\boldsymbol\Sigma = \mathbf I`, i.e. orthogonal features). The training curve is
reported against the same loss for i.i.d., orthogonal and PNC frequencies (with
antithetic pairs for RLFs, as in Table 1, Section 3.3 [tab:rff]), each estimated with
``--eval-draws`` draws; the learned copula is evaluated the same way after training.

Lengthscales follow Appendix B.1 "Details for RFF and RLF experiments" [app:rff_rlf_expt_details]:
fitted by an exact GP for RFFs, the RLF rule for RLFs. ``m = d`` frequencies for RFFs and ``2d``
(antithetic) for RLFs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .._checks import check_positive_int
from ..couplings.frequencies import AntitheticFrequencyCoupling, FrequencyCoupling, GaussianCopulaCoupling
from ..devices import resolve_device
from ..kernels.random_features import CoupledRFFKernel, CoupledRLFKernel, fit_coupling, gram_rmse
from ..progress import progress as progress_bar
from ._exact_gp import fit_gp_hyperparameters, rlf_lengthscale
from ._options import dataset_title
from ._report import figure_folder, log_figures, summarize
from ._runtime import with_bounded_threads
from ._splits import random_split, split_stream, standardise
from .kernel_estimation import FREQUENCIES_PER_DIM

__all__ = ["BASELINES", "run_copula_learning"]

#: Fixed couplings the learned copula is compared with, per feature map.
BASELINES: dict[str, tuple[str, ...]] = {
    "rff": ("iid", "orthogonal", "pnc"),
    "rlf": ("iid", "orthogonal+antithetic", "pnc+antithetic"),
}
_LEARNED = "copula (learned)"
_REFERENCE = {"rff": "pnc", "rlf": "pnc+antithetic"}


def _learnable(kind: str, dim: int) -> FrequencyCoupling:
    copula = GaussianCopulaCoupling(dim).double()
    return AntitheticFrequencyCoupling(copula) if kind == "rlf" else copula


@with_bounded_threads
def run_copula_learning(inputs: np.ndarray, targets: np.ndarray, *, features: Sequence[str] = ("rff", "rlf"),
                        iterations: int = 1000, lr: float = 0.05, samples_per_step: int = 16,
                        eval_draws: int = 2000, log_every: int = 50, repeats: int = 5,
                        max_train: int = 256, gp_iterations: int = 5000, seed: int = 0,
                        dataset: str | None = None, device: str = "cpu",
                        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the copula-learning experiment (see the module docstring).

    :param inputs: Inputs ``(n, d)``.
    :param targets: Targets ``(n,)`` (used to fit the RFF lengthscale).
    :param features: Feature maps (``"rff"``, ``"rlf"``).
    :param iterations: Adam steps on the copula parameters
        (:func:`~gp_couple.kernels.random_features.fit_coupling`).
    :param lr: Adam learning rate.
    :param samples_per_step: Noise draws per step (reparameterisation trick).
    :param eval_draws: Draws estimating each coupling's expected loss.
    :param log_every: Steps per point of the reported training curve (window means).
    :param repeats: Random splits.
    :param max_train: Most training points per split.
    :param gp_iterations: Most L-BFGS iterations of the exact-GP lengthscale fit (RFFs).
    :param seed: Base seed.
    :param threads: Keyword only: torch and BLAS threads during the run (default 1, see
        :func:`~gp_couple.experiments._runtime.bounded_threads`); restored afterwards.
    :param dataset: Name recorded in the report.
    :param device: Torch device of the kernels and the copula training (``cpu``, ``cuda`` or
        ``cuda:N``; the exact-GP lengthscale fit stays on the CPU).
    :param progress: Called with a message after every split and feature map.
    """
    x_all = np.asarray(inputs, dtype=np.float64)
    y_all = np.asarray(targets, dtype=np.float64)
    if x_all.ndim != 2 or y_all.shape != (len(x_all),):
        raise ValueError(f"inputs must be (n, d) and targets (n,), got {x_all.shape} and {y_all.shape}")
    iterations = check_positive_int("iterations", iterations)
    log_every = min(check_positive_int("log_every", log_every), iterations)
    repeats = check_positive_int("repeats", repeats)
    eval_draws = check_positive_int("eval_draws", eval_draws)
    for kind in features:
        if kind not in BASELINES:
            raise ValueError(f"unknown feature map {kind!r}; choose from {sorted(BASELINES)}")
    dim = x_all.shape[1]
    device = resolve_device(device)
    kernel_classes = {"rff": CoupledRFFKernel, "rlf": CoupledRLFKernel}
    losses: dict[tuple[str, str], list[float]] = {}
    curves: dict[str, list[np.ndarray]] = {kind: [] for kind in features}
    for repeat in progress_bar(range(repeats), description="splits", unit="split"):
        train, _ = random_split(len(x_all), max_train, 1, seed=split_stream(seed, repeat, "split"))
        x_train, _ = standardise(x_all[train], x_all[train[:1]])
        y_train, _ = standardise(y_all[train, None], y_all[train[:1], None])
        for kind in features:
            if kind == "rlf":
                lengthscale = rlf_lengthscale(x_train)
            else:
                lengthscale = fit_gp_hyperparameters(x_train, y_train[:, 0], iterations=gp_iterations).lengthscale
            num_frequencies = FREQUENCIES_PER_DIM[kind] * dim
            kernel = kernel_classes[kind](num_frequencies, dim, coupling=_learnable(kind, dim),
                                          seed=split_stream(seed, repeat, kind, "kernel")).double().to(device)
            kernel.lengthscale = lengthscale
            history = fit_coupling(kernel, torch.as_tensor(x_train), iterations=iterations,
                                   lr=lr, samples_per_step=samples_per_step,
                                   seed=split_stream(seed, repeat, kind, "training"))
            windows = len(history) // log_every
            curves[kind].append(np.asarray(history[:windows * log_every]).reshape(windows, log_every).mean(1))
            scaled = torch.as_tensor(x_train, device=device) / lengthscale
            candidates: dict[str, FrequencyCoupling | str] = {name: name for name in BASELINES[kind]}
            candidates[_LEARNED] = kernel.coupling
            for name, coupling in candidates.items():
                with torch.no_grad():
                    values = gram_rmse(coupling, scaled, num_frequencies, kind, num_draws=eval_draws,
                                       seed=split_stream(seed, repeat, kind, "evaluation", name))
                losses.setdefault((kind, name), []).append(float(values.mean()))
            if progress is not None:
                progress(f"split {repeat + 1}/{repeats} {kind} done")

    results = []
    for (kind, name), values in losses.items():
        reference = losses[kind, _REFERENCE[kind]]
        results.append({"features": kind, "coupling": name, "loss": summarize(values),
                        f"loss_vs_{_REFERENCE[kind]}": summarize(v / r for v, r in zip(values, reference))})
    curve_report = {
        kind: [{"step": (index + 1) * log_every, **summarize(curve[index] for curve in runs)}
               for index in range(len(runs[0]))]
        for kind, runs in curves.items()}
    return {
        "experiment": "copula-learning",
        "dataset": dataset,
        "settings": {"iterations": iterations, "lr": lr, "samples_per_step": samples_per_step,
                     "eval_draws": eval_draws, "log_every": log_every, "repeats": repeats,
                     "max_train": max_train, "seed": seed,
                     "num_frequencies": {kind: FREQUENCIES_PER_DIM[kind] * dim for kind in features}},
        "notes": ["loss: kernel RMSE on the training set (the paper's eq. (35), Appendix A.5), expectation over "
                  "eval_draws draws",
                  "training_curve: window means of the per-step training loss; mean and se over splits",
                  "copula starts from independent norms (identity correlation = orthogonal)"],
        "training_curve": curve_report,
        "results": results,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load the dataset named on the command line (a UCI name or a CSV file) and run the experiment."""
    from ..datasets.uci import load_regression

    folder = figure_folder(args)
    inputs, targets = load_regression(args.dataset, data_dir=args.data_dir, target=args.target)
    report = run_copula_learning(
        inputs, targets, features=args.features, iterations=args.iterations, lr=args.lr,
        samples_per_step=args.samples_per_step, eval_draws=args.eval_draws, log_every=args.log_every,
        repeats=args.repeats, max_train=args.max_train, gp_iterations=args.gp_iterations, seed=args.seed,
        dataset=args.dataset, device=args.device, threads=args.threads)
    if folder is not None:
        from .plotting import plot_metric_bars, plot_training_curves

        curves = {f"{kind.upper()} copula": ([point["step"] for point in points], [point["mean"] for point in points])
                  for kind, points in report["training_curve"].items()}
        log_figures([
            plot_training_curves(curves, folder / "copula_training.png", ylabel="training kernel RMSE",
                                 title=f"Learning a Gaussian-copula coupling on {dataset_title(args.dataset)}"),
            plot_metric_bars(report["results"], folder / "copula_loss.png", category="coupling",
                             metrics=("loss",), panel=("features",))])
    return report
