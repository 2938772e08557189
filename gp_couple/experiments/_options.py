"""Every command's options, declared without importing torch, gpytorch or numba.

``gp-couple COMMAND --help`` and a mistyped option answer at once because the parser is
built from this module and :mod:`gp_couple.experiments._report` alone (the standard
library and NumPy); the command's module, which defines ``run(args)``, is imported only
when the command runs (:mod:`gp_couple.cli`). So the constants an option
shows (defaults, choices) live here, and the experiment modules import them from here.

Choices that come from a registry (walk-length couplings, neighbour proposals, direction
couplings, frequency couplings) are listed by their built-in names; once a registry's
module is imported, e.g. by a program that registered its own coupling before calling
:func:`gp_couple.cli.main`, the registry itself answers, so a user's class is accepted too.
``tests/experiments/test_options.py`` checks that these names and defaults are the library's.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._report import (
    MAX_REPEATS,
    add_common_arguments,
    add_json_argument,
    add_output_argument,
    add_plot_argument,
    bounded_int,
    draws_int,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
    probability_or_auto,
    repeats_int,
    seed_int,
    walkers_int,
)

__all__ = ["COMMAND_OPTIONS", "Columns", "add_dataset_arguments", "add_device_argument", "add_threads_argument",
           "add_walk_arguments", "dataset_label", "dataset_title", "registered_names"]

#: A command's table columns, or a function of its arguments giving them.
Columns = Sequence[str] | Callable[[argparse.Namespace], Sequence[str]]

# ----------------------------------------------------------------------------- shared constants
#: Threads of a Euclidean run unless ``--threads`` says otherwise: one thread was fastest for
#: the 256-point factorisations of the paper's protocol on a loaded 2-core machine (the
#: kernel-estimation benchmark in benchmarks/RESULTS.md).
DEFAULT_THREADS = 1
#: The three walk-length couplings of the paper's graph experiments (the default selection;
#: any registered walk-length coupling may be chosen).
COUPLINGS = ("iid", "antithetic", "sigma")
#: Direction couplings compared by default: the paper's independent walkers and repelling
#: random walks.
DIRECTIONS = ("independent", "repelling")
#: Kernel families the graph-GP commands train (those with an exact maximum-likelihood
#: baseline, :data:`gp_couple.experiments.exact_baseline.RANGE_HYPERPARAMETERS`).
GRAPH_KERNEL_FAMILIES = ("diffusion", "regularised-laplacian", "p-step")
#: I.i.d. walkers per node and Adam learning rate of the graph-GP protocol's training
#: (:class:`gp_couple.experiments.graph_gp.GraphGPProtocol`).
TRAIN_WALKERS = 8
TRAIN_LR = 0.05
#: The recommended GRF-GP's walk schedule, which ``gp-couple predict-graph`` follows: walkers per
#: node of its first training phase (:data:`gp_couple.kernels.grf_kernel.TRAIN_WALKERS`), most
#: walkers of later phases and most phases (:data:`gp_couple.kernels.walk_schedule.MAX_TRAIN_WALKERS`,
#: :data:`~gp_couple.kernels.walk_schedule.MAX_PHASES`).
RECIPE_TRAIN_WALKERS = 48
RECIPE_MAX_TRAIN_WALKERS = 1024
RECIPE_PHASES = 4
#: Most prediction walkers per node ``gp-couple predict-graph`` chooses for the GRF-GP.
RECIPE_MAX_PREDICT_WALKERS = 1024
#: The graph kernels ``gp-couple predict-graph`` trains (``auto`` chooses by
#: :func:`gp_couple.recipes.choose_graph_kernel` for predicting every node).
PREDICT_GRAPH_KERNELS = ("auto", "matrix_free", "grf")
#: The paper's meshes (``gp-couple mesh``).
PAPER_MESHES = ("teapot", "fuze", "sphere", "idler_riser", "busted", "torus")
#: Graph kernels of ``gp-couple grf-gram``.
GRF_GRAM_KERNELS = ("regularised-laplacian", "diffusion")
#: The largest NUTS tree depth ``gp-couple traffic-nuts`` accepts (2**depth leapfrog steps).
MAX_TREE_DEPTH = 20
#: The halting-inflation budget of ``--p-halt auto`` (:data:`gp_couple.halting.DEFAULT_MAX_INFLATION`).
DEFAULT_MAX_INFLATION = 2.0
#: UCI datasets of the paper's tables.
PAPER_DATASETS = ("concrete", "abalone", "cpu", "power", "airfoil", "boston")
#: Couplings compared per feature map by ``gp-couple kernel-estimation`` (Table 1, Section 3.3
#: [tab:rff], Table 2, Appendix B.2 [tab:kld], Table 3, Appendix B.2 [tab:pred-rmse], plus PM).
KERNEL_ESTIMATION_COUPLINGS: dict[str, tuple[str, ...]] = {
    "rff": ("iid", "halton", "sobol", "orthogonal", "pnc", "pm"),
    "rlf": ("iid", "halton", "sobol", "orthogonal", "orthogonal+antithetic", "pnc+antithetic", "pm"),
}
#: Posteriors whose KL divergence ``gp-couple kernel-estimation`` can report.
KL_POSTERIORS = ("predictive", "latent")
#: Default latent jitter of ``gp-couple kernel-estimation``, relative to the amplitude.
DEFAULT_LATENT_JITTER = 1e-6
#: Optimisers of the exact-GP fits (:data:`gp_couple.optimize.OPTIMIZERS`, the default first).
GP_OPTIMIZERS = ("lbfgs", "adam")
#: Stopping rule of the exact-GP fits: loss and parameter tolerances and the Adam window
#: (:data:`gp_couple.experiments._exact_gp.GP_CONVERGENCE`).
GP_LOSS_TOLERANCE, GP_PARAMETER_TOLERANCE, GP_WINDOW = 1e-7, 1e-4, 100
#: Frequency couplings ``gp-couple attention`` compares by default.
ATTENTION_COUPLINGS = ("orthogonal", "pnc", "pm")
#: Feature maps of the Euclidean commands.
FEATURE_MAPS = ("rff", "rlf")

#: Built-in names of each registry, by ``(module in gp_couple.couplings, registry)``.
_BUILTIN_NAMES: dict[tuple[str, str], tuple[str, ...]] = {
    ("walk_lengths", "WALK_LENGTH_COUPLINGS"): COUPLINGS,
    ("proposals", "NEIGHBOUR_PROPOSALS"): ("uniform", "weighted"),
    ("directions", "DIRECTION_COUPLINGS"): DIRECTIONS,
    ("frequency_interface", "FREQUENCY_COUPLINGS"): ("iid", "halton", "sobol", "orthogonal", "pnc", "pm", "copula",
                                                     "antithetic"),
}


def registered_names(module: str, registry: str) -> tuple[str, ...]:
    """The names a registry of :mod:`gp_couple.couplings` holds, without importing it.

    :param module: The registry's module in :mod:`gp_couple.couplings` (e.g. ``"walk_lengths"``).
    :param registry: Its name there (e.g. ``"WALK_LENGTH_COUPLINGS"``).
    :return: The registry's names when its module is imported (user classes included), else
        the built-in ones.
    """
    loaded = sys.modules.get(f"gp_couple.couplings.{module}")
    if loaded is not None:
        return tuple(getattr(loaded, registry).names())
    return _BUILTIN_NAMES[module, registry]


# ----------------------------------------------------------------------------- shared options
def device_option(text: str) -> str:
    """``--device`` value: ``cpu``, ``cuda`` or ``cuda:N``, refused at once when unavailable."""
    if text == "cpu":  # needs no torch to check
        return text
    from ..devices import resolve_device  # imports torch: only for a device other than the CPU

    try:
        resolve_device(text, "--device")
    except (TypeError, ValueError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--device`` (the torch device the command's models train and predict on)."""
    parser.add_argument("--device", type=device_option, default="cpu",
                        help="torch device of the models: cpu, cuda or cuda:N (walks and scipy "
                             "references stay on the CPU)")


def add_threads_argument(parser: argparse.ArgumentParser, *, default: int | None = DEFAULT_THREADS) -> None:
    """Add ``--threads``: the CLI runs the command inside :func:`gp_couple.settings.threads`.

    :param default: Threads of a run without the option; ``None`` leaves the pools as they are.
    """
    if default is None:
        # On a busy machine, thread pools larger than the CPU share a run gets spin-wait for
        # descheduled peers (benchmarks/bench_contention.py), so users sharing a machine should bound them.
        text = ("bound torch, numba and BLAS threads for this run, e.g. 1 on a busy machine "
                "(default: 1 if other work keeps every CPU busy when the run starts, else the thread "
                "pools as they are); give it for results equal to the last bit between runs, since "
                "threaded reductions sum in an order that follows the thread count")
    else:
        text = ("torch and BLAS threads for this run (default %(default)s: fastest for these small "
                "matrices, especially on a busy machine)")
    parser.add_argument("--threads", type=positive_int, default=default, help=text)


def add_walk_arguments(parser: argparse.ArgumentParser) -> None:
    """``--proposal``, ``--directions`` and ``--threads``: the options of every command that samples walks."""
    parser.add_argument("--proposal", choices=registered_names("proposals", "NEIGHBOUR_PROPOSALS"),
                        default="weighted",
                        help="neighbour proposal: weighted (choice in proportion to edge weight; the same "
                             "as uniform on unweighted graphs) or uniform (default %(default)s)")
    parser.add_argument("--directions", nargs="+", choices=registered_names("directions", "DIRECTION_COUPLINGS"),
                        default=list(DIRECTIONS),
                        help="direction couplings compared with every length coupling (default %(default)s)")
    add_threads_argument(parser, default=None)


def _add_coupling_arguments(parser: argparse.ArgumentParser, *, order: int, fit_samples: int) -> None:
    """``--couplings`` compared, the walk options and the sigma fit's ``--order`` and ``--fit-samples``."""
    parser.add_argument("--couplings", nargs="+", choices=registered_names("walk_lengths", "WALK_LENGTH_COUPLINGS"),
                        default=list(COUPLINGS), help="walk-length couplings compared")
    add_walk_arguments(parser)
    parser.add_argument("--order", type=positive_int, default=order, help="sigma permutation order n")
    parser.add_argument("--fit-samples", type=positive_int, default=fit_samples,
                        help="walks per node and quantile bin when fitting sigma")


def _add_data_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=None, help="dataset directory (default $GP_COUPLE_DATA)")


def add_dataset_arguments(parser: argparse.ArgumentParser, **dataset: Any) -> None:
    """``--dataset`` (a UCI name or a CSV file of your own), ``--target`` and ``--data-dir``.

    :param dataset: Passed to ``add_argument("--dataset", ...)`` (``default`` or ``required``).
    """
    parser.add_argument("--dataset", **dataset,
                        help=f"a UCI dataset ({', '.join(PAPER_DATASETS)}, also energy, yacht, kin8nm) or a "
                             "path to a CSV file of your own: one header line of column names, then numbers")
    parser.add_argument("--target", default=None,
                        help="the target column of a CSV --dataset, by its header name (default: the last "
                             "column; every other column is an input)")
    _add_data_dir_argument(parser)


def _is_path(dataset: str) -> bool:
    return os.sep in dataset or "/" in dataset or bool(Path(dataset).suffix)


def dataset_label(dataset: str) -> str:
    """``--dataset`` in file names: the UCI name, or a CSV file's stem."""
    return Path(dataset).stem if _is_path(dataset) else dataset


def dataset_title(dataset: str) -> str:
    """``--dataset`` in figure titles: ``UCI boston``, or a CSV file's name."""
    return Path(dataset).name if _is_path(dataset) else f"UCI {dataset}"


def _protocol_arguments(parser: argparse.ArgumentParser, *, walkers: list[int], train_iterations: int,
                        repeats: int, p_halt: Any = 0.4,
                        p_halt_help: str = "termination probability of every walk") -> None:
    """Options shared by the graph-GP experiments (``mesh``, ``traffic``).

    ``p_halt="auto"`` lets ``--p-halt`` also take ``auto`` (the command must resolve it).
    """
    parser.add_argument("--walkers", nargs="+", type=walkers_int, default=walkers,
                        help="walkers per node compared after training (default %(default)s)")
    _add_coupling_arguments(parser, order=50, fit_samples=100)
    parser.add_argument("--p-halt", type=probability_or_auto if p_halt == "auto" else probability,
                        default=p_halt, help=f"{p_halt_help} (default %(default)s)")
    parser.add_argument("--kernel", choices=GRAPH_KERNEL_FAMILIES, default="diffusion",
                        help="graph kernel family trained and used as the exact reference (default %(default)s)")
    parser.add_argument("--train-directions", choices=registered_names("directions", "DIRECTION_COUPLINGS"),
                        default="independent",
                        help="direction coupling of the training walkers (default %(default)s, the paper's)")
    parser.add_argument("--train-walkers", type=walkers_int, default=TRAIN_WALKERS,
                        help="i.i.d. walkers per node while training the hyperparameters")
    _add_training_arguments(parser, iterations=train_iterations)
    add_device_argument(parser)
    add_common_arguments(parser, repeats=repeats)


def _add_training_arguments(parser: argparse.ArgumentParser, *, iterations: int) -> None:
    """``--train-iterations`` and ``--lr``: Adam on the GP marginal likelihood."""
    parser.add_argument("--train-iterations", type=non_negative_int, default=iterations,
                        help="Adam iterations on the marginal likelihood (default %(default)s)")
    parser.add_argument("--lr", type=positive_float, default=TRAIN_LR,
                        help="Adam learning rate of the hyperparameter training")


# ----------------------------------------------------------------------------- the commands
_PROCEDURAL_HELP = ("a dataset name (karate, dolphins, football, polbooks, eurosis, cora, ...), "
                    "a path to an edge-list CSV, or grid:RxC, icosphere:K, erdos-renyi:N:P[:SEED]")


def _demo(parser: argparse.ArgumentParser) -> Columns:
    parser.add_argument("--walkers", nargs="+", type=positive_int, default=[16, 64],
                        help="walkers per node compared after training (even, for the paired couplings)")
    parser.add_argument("--train-iterations", type=non_negative_int, default=200,
                        help="most L-BFGS iterations of each training run (each stops on convergence)")
    parser.add_argument("--max-train-walkers", type=walkers_int, default=256,
                        help="most training walkers per node of the recommended GRF-GP (even)")
    parser.add_argument("--max-predict-walkers", type=walkers_int, default=1024,
                        help="most prediction walkers per node of the recommended GRF-GP (even)")
    parser.add_argument("--refits", type=non_negative_int, default=1,
                        help="most training rounds of the recommended GRF-GP on its prediction walks "
                             "(the library's default is 2; 1 keeps the demo fast)")
    add_walk_arguments(parser)
    add_device_argument(parser)
    add_common_arguments(parser, repeats=3)
    return "walkers", "coupling", "directions", "gram_error", "test_rmse", "kl"


def _grf_gram(parser: argparse.ArgumentParser) -> Columns:
    parser.add_argument("--graph", default="cora", help=f"graph: {_PROCEDURAL_HELP} (default %(default)s)")
    _add_data_dir_argument(parser)
    parser.add_argument("--largest-component", action="store_true", help="use the largest connected component")
    parser.add_argument("--kernels", nargs="+", choices=GRF_GRAM_KERNELS, default=list(GRF_GRAM_KERNELS),
                        help="graph kernels to estimate")
    parser.add_argument("--p-halt", nargs="+", type=probability, default=[0.1, 0.2, 0.3, 0.4, 0.5],
                        help="termination probabilities to sweep")
    parser.add_argument("--walkers", nargs="+", type=walkers_int, default=[2, 16],
                        help="walkers per node (even, for the paired couplings)")
    _add_coupling_arguments(parser, order=30, fit_samples=100)
    parser.add_argument("--sigma", type=positive_float, default=1.0, help="regularised Laplacian sigma")
    parser.add_argument("--degree", type=positive_float, default=2.0, help="regularised Laplacian power d")
    parser.add_argument("--gamma", type=positive_float, default=1.0, help="diffusion gamma")
    parser.add_argument("--two-sets", action="store_true",
                        help="unbiased diagonal: symmetrised product of two independent feature sets")
    add_output_argument(parser, "--save-couplings", kind="folder", default=None,
                        help="directory to save fitted sigma-couplings as JSON")
    add_common_arguments(parser, repeats=20)
    return "kernel", "p_halt", "walkers", "coupling", "directions", "error", "error_vs_iid"


def _pagerank(parser: argparse.ArgumentParser) -> Columns:
    parser.add_argument("--graphs", nargs="+", default=["karate", "dolphins", "polbooks", "football"],
                        help=f"graphs (largest component of each): {_PROCEDURAL_HELP}")
    _add_data_dir_argument(parser)
    parser.add_argument("--p-halt", nargs="+", type=probability,
                        default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
                        help="termination (teleport) probabilities to sweep")
    parser.add_argument("--walkers", type=walkers_int, default=2,
                        help="walkers per node (even, for the paired couplings)")
    _add_coupling_arguments(parser, order=10, fit_samples=1000)
    add_common_arguments(parser, repeats=1000)
    return "graph", "p_halt", "coupling", "directions", "error", "error_vs_iid"


def _mesh(parser: argparse.ArgumentParser) -> Columns:
    parser.add_argument("--mesh", nargs="+", default=["default"],
                        help="mesh files or names in <data-dir>/meshes "
                             f"(paper: {' '.join(PAPER_MESHES)}); 'default' is the built-in mesh")
    _add_data_dir_argument(parser)
    _protocol_arguments(parser, walkers=[16, 32, 64], train_iterations=1000, repeats=10)
    return "mesh", "walkers", "coupling", "directions", "gram_error", "test_rmse", "kl"


def _add_traffic_arguments(parser: argparse.ArgumentParser) -> None:
    """``--data-dir``, ``--train`` and ``--test``: the traffic commands' data and split."""
    _add_data_dir_argument(parser)
    parser.add_argument("--train", type=positive_int, default=250, help="training sensors")
    parser.add_argument("--test", type=positive_int, default=75, help="test sensors")


def _traffic(parser: argparse.ArgumentParser) -> Columns:
    _add_traffic_arguments(parser)
    parser.add_argument("--split-seed", type=seed_int, default=None,
                        help="seed of the train/test split (default: --seed, which also seeds the walks)")
    _protocol_arguments(parser, walkers=[4, 8, 16], train_iterations=1000, repeats=10, p_halt="auto",
                        p_halt_help="termination probability of every walk, or 'auto': the largest "
                                    "p_halt whose halting inflation (gp_couple.halting) at the exact "
                                    "maximum-likelihood kernel stays within --max-inflation")
    parser.add_argument("--max-inflation", type=positive_float, default=DEFAULT_MAX_INFLATION,
                        help="halting-inflation budget of --p-halt auto (default %(default)s)")
    parser.add_argument("--exact-starts", nargs="+", type=positive_float, default=None,
                        help="starting values of the range hyperparameter (gamma, sigma or alpha) for the "
                             "exact GP's maximum-likelihood restarts (default: the family's, "
                             "gp_couple.experiments.exact_baseline.RANGE_HYPERPARAMETERS)")
    return "walkers", "coupling", "directions", "gram_error", "test_rmse", "test_nlpd", "kl"


def _traffic_nuts(parser: argparse.ArgumentParser) -> Columns:
    _add_traffic_arguments(parser)
    parser.add_argument("--walkers", type=walkers_int, default=TRAIN_WALKERS,
                        help="walkers per node of the GRF kernel (default %(default)s)")
    parser.add_argument("--p-halt", type=probability_or_auto, default="auto",
                        help="walk termination probability, or 'auto': gp_couple.halting.suggest_p_halt at the "
                             "exact GP's marginal-likelihood estimate, as in 'gp-couple traffic'")
    parser.add_argument("--num-samples", type=draws_int, default=200, help="NUTS draws kept per chain")
    parser.add_argument("--warmup", type=non_negative_int, default=200, help="NUTS warm-up iterations per chain")
    parser.add_argument("--chains", type=positive_int, default=1, help="NUTS chains (run one after another)")
    parser.add_argument("--max-tree-depth", type=bounded_int(1, MAX_TREE_DEPTH), default=10,
                        help=f"largest NUTS tree depth (at most {MAX_TREE_DEPTH}: 2**depth leapfrog steps)")
    _add_training_arguments(parser, iterations=300)
    parser.add_argument("--no-exact", action="store_true", help="skip the exact GP (GRF-GP only)")
    parser.add_argument("--seed", type=seed_int, default=0, help="split, walks, fit and chain seed")
    add_json_argument(parser)
    add_plot_argument(parser)
    return "model", "test_rmse", "test_nlpd", "max_r_hat", "min_ess", "divergences", "seconds"


def _kernel_estimation(parser: argparse.ArgumentParser) -> Columns:
    add_dataset_arguments(parser, required=True)
    parser.add_argument("--features", nargs="+", choices=FEATURE_MAPS, default=list(FEATURE_MAPS),
                        help="random Fourier (rff) and/or random Laplace (rlf) features")
    known = ", ".join(registered_names("frequency_interface", "FREQUENCY_COUPLINGS"))
    parser.add_argument("--rff-couplings", nargs="+", default=list(KERNEL_ESTIMATION_COUPLINGS["rff"]),
                        help=f"couplings for RFFs, any registered frequency coupling ({known}), "
                             "optionally NAME+antithetic (default %(default)s)")
    parser.add_argument("--rlf-couplings", nargs="+", default=list(KERNEL_ESTIMATION_COUPLINGS["rlf"]),
                        help="couplings for RLFs, as for --rff-couplings (default %(default)s)")
    parser.add_argument("--rff-frequencies", type=positive_int, default=None, help="RFF frequencies (default d)")
    parser.add_argument("--rlf-frequencies", type=positive_int, default=None, help="RLF frequencies (default 2d)")
    parser.add_argument("--max-train", type=positive_int, default=256, help="most training points per split")
    parser.add_argument("--max-test", type=positive_int, default=256, help="most test points per split")
    parser.add_argument("--draws", type=draws_int, default=100, help="frequency draws per coupling and split")
    parser.add_argument("--gp-optimizer", choices=GP_OPTIMIZERS, default=GP_OPTIMIZERS[0],
                        help="exact-GP optimiser: L-BFGS (converges in tens of iterations) or the "
                             "paper's Adam (thousands of steps)")
    parser.add_argument("--gp-iterations", type=positive_int, default=5000,
                        help="most iterations (L-BFGS) or steps (Adam) of the exact-GP fit")
    parser.add_argument("--gp-lr", type=positive_float, default=1e-2, help="Adam learning rate of the exact GP")
    parser.add_argument("--gp-loss-tolerance", type=positive_float, default=GP_LOSS_TOLERANCE,
                        help="the exact-GP fit has converged when its loss per point changes by at most this "
                             f"(between L-BFGS iterations, or between means of {GP_WINDOW} Adam steps)")
    parser.add_argument("--gp-parameter-tolerance", type=positive_float, default=GP_PARAMETER_TOLERANCE,
                        help="... and only when no raw hyperparameter moves by more than this either")
    parser.add_argument("--rff-lengthscale", type=positive_float, default=None,
                        help="fix the RFF lengthscale (standardised inputs) instead of fitting it")
    parser.add_argument("--raw-targets", action="store_true",
                        help="fit the zero-mean exact GP to unstandardised targets (reproduces the "
                             "paper's airfoil RFF ratios, see benchmarks/RESULTS.md)")
    parser.add_argument("--kl-posterior", choices=KL_POSTERIORS, default="predictive",
                        help="posterior compared by the KL: predictive (noisy test targets) or latent "
                             "(the paper's eq. (43) in Appendix B.2, with --latent-jitter)")
    parser.add_argument("--latent-jitter", type=positive_float, default=DEFAULT_LATENT_JITTER,
                        help="jitter of both latent covariances, relative to the amplitude")
    parser.add_argument("--chunk", type=positive_int, default=100, help="draws evaluated together")
    add_threads_argument(parser)
    add_common_arguments(parser, repeats=20)
    parser.add_argument("--splits", type=repeats_int, dest="repeats", default=argparse.SUPPRESS,
                        help=f"alias of --repeats: random train/test splits (at most {MAX_REPEATS})")
    return "features", "coupling", "kernel_rmse_vs_iid", "kl_per_test_point", "predictive_rmse_vs_iid"


def _attention(parser: argparse.ArgumentParser) -> Columns:
    parser.add_argument("--tokens", type=positive_int, default=16, help="number of keys N")
    parser.add_argument("--dim", type=positive_int, default=16, help="key dimension d")
    parser.add_argument("--num-features", nargs="+", type=positive_int, default=[16, 32, 64, 128, 256],
                        help="numbers of random features m to sweep")
    parser.add_argument("--couplings", nargs="+", default=list(ATTENTION_COUPLINGS),
                        help="frequency couplings (default %(default)s)")
    parser.add_argument("--key-std", type=positive_float, default=None,
                        help="standard deviation of the key coordinates (default 1/sqrt(dim))")
    parser.add_argument("--draws", type=draws_int, default=1000, help="feature draws per key set")
    add_threads_argument(parser)
    add_common_arguments(parser, repeats=10)
    return lambda args: ("coupling", "num_features", "kernel_variance", "kernel_covariance", "attention_mse",
                         f"attention_mse_vs_{args.couplings[0]}")


def _copula_learning(parser: argparse.ArgumentParser) -> Columns:
    add_dataset_arguments(parser, default="boston")
    parser.add_argument("--features", nargs="+", choices=FEATURE_MAPS, default=list(FEATURE_MAPS),
                        help="random Fourier (rff) and/or random Laplace (rlf) features")
    parser.add_argument("--iterations", type=positive_int, default=1000, help="Adam steps on the copula")
    parser.add_argument("--lr", type=positive_float, default=0.05, help="Adam learning rate")
    parser.add_argument("--samples-per-step", type=positive_int, default=16,
                        help="noise draws per training step")
    parser.add_argument("--eval-draws", type=draws_int, default=2000,
                        help="draws estimating each coupling's expected loss")
    parser.add_argument("--log-every", type=positive_int, default=50, help="steps per training-curve point")
    parser.add_argument("--max-train", type=positive_int, default=256, help="most training points per split")
    parser.add_argument("--gp-iterations", type=positive_int, default=5000,
                        help="most L-BFGS iterations of the exact-GP lengthscale fit (RFF)")
    add_threads_argument(parser)
    add_device_argument(parser)
    add_common_arguments(parser, repeats=5)
    return "features", "coupling", "loss", "loss_vs_pnc", "loss_vs_pnc+antithetic"


def _predict_graph(parser: argparse.ArgumentParser) -> Columns:
    parser.add_argument("--graph", required=True, help=f"graph: {_PROCEDURAL_HELP}")
    _add_data_dir_argument(parser)
    parser.add_argument("--observations", required=True, metavar="CSV",
                        help="CSV file with a header line: a node column and a value column")
    parser.add_argument("--target", default=None,
                        help="the value column of --observations, by its header name (default: the last column)")
    add_output_argument(parser, "--output", kind="file", required=True, metavar="FILE.npy",
                        help="where to write the predictions: a float64 .npy array (nodes, 2) of means and "
                             "variances, row v for node v")
    parser.add_argument("--kernel", choices=PREDICT_GRAPH_KERNELS, default="auto",
                        help="the GP: matrix_free, the exact GP (a dense factor of the observed nodes' covariance, "
                             "at most 10,000 of them); grf, the GRF-GP (sharded walks; any size); auto (default): "
                             "matrix_free on graphs of at most 20,000 nodes or 15 nodes per observed node (50 "
                             "with at most 1,024 observed), with at most 10,000 observed, grf above or when a GRF "
                             "option (the walker options below) is given")
    parser.add_argument("--iterations", type=non_negative_int, default=200,
                        help="most L-BFGS iterations (of each training phase of the GRF-GP); stops on convergence")
    parser.add_argument("--train-walkers", type=walkers_int, default=None,
                        help="GRF: training walkers per node of the first phase (even; default "
                             f"{RECIPE_TRAIN_WALKERS})")
    parser.add_argument("--max-train-walkers", type=walkers_int, default=None,
                        help="GRF: most training walkers per node in later phases, which add walkers while the "
                             "estimated relative Gram error at the learnt hyperparameters exceeds 0.03 (default "
                             f"{RECIPE_MAX_TRAIN_WALKERS})")
    parser.add_argument("--phases", type=positive_int, default=None,
                        help="GRF: most training phases on walks redrawn for the learnt range (1: train on the first "
                             f"walks only; default {RECIPE_PHASES})")
    parser.add_argument("--predict-walkers", type=walkers_int, default=None,
                        help="GRF: prediction walkers per node (even; default: as many as a relative Gram error "
                             "of 0.01 needs, at most --max-predict-walkers); training ends with rounds on them")
    parser.add_argument("--max-predict-walkers", type=walkers_int, default=None,
                        help="GRF: most prediction walkers per node when choosing them (default "
                             f"{RECIPE_MAX_PREDICT_WALKERS})")
    parser.add_argument("--chunk-size", type=positive_int, default=4096,
                        help="prediction nodes per chunk, the unit shared among the processes")
    parser.add_argument("--latent", action="store_true",
                        help="variances of the latent function (default: of noisy observations)")
    parser.add_argument("--timeout", type=positive_float, default=300.0,
                        help="seconds a process waits for the others (rendezvous and every collective) "
                             "before failing")
    parser.add_argument("--seed", type=seed_int, default=0, help="seed of the walks and the CG probes")
    add_threads_argument(parser, default=None)
    add_json_argument(parser)
    return "quantity", "value"


#: Per command (the names of :data:`gp_couple.cli.COMMANDS`): adds its options to its
#: parser and returns the columns of its table.
COMMAND_OPTIONS: dict[str, Callable[[argparse.ArgumentParser], Columns]] = {
    "demo": _demo,
    "grf-gram": _grf_gram,
    "pagerank": _pagerank,
    "mesh": _mesh,
    "traffic": _traffic,
    "traffic-nuts": _traffic_nuts,
    "kernel-estimation": _kernel_estimation,
    "attention": _attention,
    "copula-learning": _copula_learning,
    "predict-graph": _predict_graph,
}
