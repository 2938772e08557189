r"""Graph GPs in one call: :func:`fit_graph_gp` (the model chosen by size) and :func:`fit_grf_gp`.

A :class:`~gp_couple.kernels.grf_kernel.GRFKernel` with its default
:class:`~gp_couple.kernels.walk_schedule.WalkSchedule`, trained by
:func:`gp_couple.models.fit_gp`, is the recommended model: training runs to convergence on
walks that follow the learnt range, and ends with :math:`\sigma`-coupled prediction walkers
(the module docstring of :mod:`gp_couple.kernels.walk_schedule` gives the schedule).
:func:`fit_grf_gp` builds that model from a graph and observations, samples walks only from
the observed and predicted nodes, and trains it with L-BFGS under
:func:`gp_couple.settings.grf_gp_settings`. ``benchmarks/RESULTS.md`` has the measurements
against the exact GP trained to the same convergence criterion.

:func:`fit_graph_gp` is the entry point for users who do not want to choose: it trains the
exact GP with the matrix-free kernel
(:class:`~gp_couple.kernels.matrix_free.MatrixFreeGraphKernel`) wherever that is the cheaper
model at the same accuracy: on any graph with up to :data:`MATRIX_FREE_OBSERVED` observed nodes
(its dense blocks then run on the nodes near the observed and predicted ones), and with more
observed nodes where the graph is small against them; and the GRF recipe on graphs much larger
than more observed nodes, where the GRF-GP's cost grows with the observed and predicted nodes
and not with the graph (:func:`choose_graph_kernel` says which, and why).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

import gpytorch
import numpy as np
import torch

from ._checks import check_int
from ._nodes import node_index_array
from ._random import SeedLike, draw_seed
from .devices import resolve_device
from .graphs import Graph
from .kernel_families import Diffusion, KernelFamily
from .kernels.exact_graph import ExactGraphKernel
from .kernels.graph_node import GraphNodeKernel
from .kernels.grf_kernel import TRAIN_P_HALT, TRAIN_WALKERS, GRFKernel
from .kernels.matrix_free import MatrixFreeGraphKernel
from .kernels.walk_schedule import (
    EXPANSION_TARGET,
    MAX_PHASES,
    MAX_PREDICT_WALKERS,
    MAX_TRAIN_WALKERS,
    PREDICT_ERROR_TOLERANCE,
    PREDICT_GRAM_TOLERANCE,
    REFIT_TOLERANCE,
    REFITS,
    SIGMA_FIT_SAMPLES,
    TRAIN_GRAM_TOLERANCE,
    WalkSchedule,
)
from .models import GraphGP, fit_gp
from .operators.chebyshev_basis import kept_terms_entries
from .optimize import Convergence, TrainingHistory
from .predictive_variance import DENSE_VARIANCE_SIZE
from .settings import GRFGPSettings, grf_gp_settings, kept_chebyshev_terms

__all__ = ["GRAPH_KERNELS", "KEPT_TERMS_DEGREE", "MATRIX_FREE_MIN_NODES", "MATRIX_FREE_NODES_PER_OBSERVED",
           "MATRIX_FREE_NODES_PER_OBSERVED_KEPT", "MATRIX_FREE_OBSERVED", "choose_graph_kernel",
           "matrix_free_nodes_per_observed",
           "fit_graph_gp", "fit_graph_kernel", "fit_grf_gp"]

_logger = logging.getLogger(__name__)

#: Graph nodes per observed node up to which :func:`choose_graph_kernel` picks the
#: matrix-free exact kernel rather than the GRF recipe.
MATRIX_FREE_NODES_PER_OBSERVED = 15
#: The same for predicting every node where the matrix-free kernel's training keeps its terms
#: (:data:`KEPT_TERMS_DEGREE`); for training alone there is then no limit.
MATRIX_FREE_NODES_PER_OBSERVED_KEPT = 50
#: Chebyshev degree up to which the terms of the observed nodes' covariance (its symmetric half where
#: every observed node reaches every other, about :math:`(J + 1)n^2/2` numbers,
#: :func:`~gp_couple.operators.chebyshev_basis.kept_terms_entries`) must fit
#: :class:`~gp_couple.settings.kept_chebyshev_terms` for the matrix-free kernel's training to count as
#: keeping them wherever the observed nodes lie (1,024 observed nodes at the default bound).
KEPT_TERMS_DEGREE = 123
#: Graphs of at most this many nodes get the matrix-free exact kernel however few nodes are observed.
MATRIX_FREE_MIN_NODES = 20_000
#: Observed nodes up to which :func:`choose_graph_kernel` trains the matrix-free exact kernel on any graph:
#: the dense limit of :func:`~gp_couple.settings.grf_gp_settings` (``max_cholesky_size``), up to which its
#: training covariance is factored densely from terms kept on the rows each block of observed nodes
#: reaches; above it, training would solve by conjugate gradients, each product a recurrence
#: (``benchmarks/RESULTS.md``, "Kept terms on the rows each block reaches", "The matrix-free training
#: covariance: summed in place").
MATRIX_FREE_OBSERVED = GRFGPSettings.max_cholesky_size
#: Observed nodes whose covariance terms to :data:`KEPT_TERMS_DEGREE`, wherever they lie, must fit
#: :class:`~gp_couple.settings.kept_chebyshev_terms` for :data:`MATRIX_FREE_OBSERVED` to apply (as at the
#: default bound).
_KEPT_OBSERVED = 1024


def fit_grf_gp(graph: Graph, train_nodes: Any, train_targets: Any, *, predict_nodes: Any,
               iterations: int = 200, optimizer: str = "lbfgs", lr: float = 0.05,
               convergence: Convergence | None = None, kernel_family: KernelFamily | None = None,
               train_walkers: int = TRAIN_WALKERS, max_train_walkers: int = MAX_TRAIN_WALKERS,
               train_tolerance: float = TRAIN_GRAM_TOLERANCE, predict_walkers: int | None = None,
               max_predict_walkers: int = MAX_PREDICT_WALKERS, predict_tolerance: float = PREDICT_GRAM_TOLERANCE,
               p_halt: float = TRAIN_P_HALT, phases: int = MAX_PHASES, sigma_fit_samples: int = SIGMA_FIT_SAMPLES,
               refits: int = REFITS, refit_tolerance: float = REFIT_TOLERANCE, bias_correction: bool = True,
               predict_error_tolerance: float = PREDICT_ERROR_TOLERANCE,
               expansion_target: float | None = EXPANSION_TARGET, seed: SeedLike = 0,
               device: torch.device | str | None = None) -> tuple[GraphGP, gpytorch.likelihoods.Likelihood]:
    r"""Train a GRF-GP to convergence with walks that follow the learnt range, and make it ready to predict.

    ``ScaleKernel(GRFKernel(graph, ..., schedule=WalkSchedule(...)))`` on the training and
    prediction nodes, trained by :func:`gp_couple.models.fit_gp` inside
    :func:`gp_couple.settings.grf_gp_settings`; the walk arguments are those of
    :class:`~gp_couple.kernels.walk_schedule.WalkSchedule`.

    :param graph: The graph.
    :param train_nodes: Observed node indices.
    :param train_targets: Observations (standardise them: the mean is zero).
    :param predict_nodes: Nodes that will be predicted (walks are drawn only from the
        training and these nodes).
    :param iterations: Most optimiser iterations per phase.
    :param optimizer: ``"lbfgs"`` (default) or ``"adam"`` (:func:`gp_couple.optimize.minimize`).
    :param lr: Adam learning rate.
    :param convergence: Stopping rule of each phase (default :class:`gp_couple.optimize.Convergence`).
    :param kernel_family: Kernel family and initial hyperparameters (default
        :class:`~gp_couple.kernel_families.Diffusion` with :math:`\gamma = 1`).
    :param train_walkers: Walkers per node of the first phase (even: antithetic pairs).
    :param max_train_walkers: Most walkers per node in later phases.
    :param train_tolerance: Estimated relative Gram error the training walks aim for.
    :param predict_walkers: Walkers per node for prediction; ``None`` chooses them for
        ``predict_tolerance``.
    :param max_predict_walkers: Most prediction walkers per node when choosing.
    :param predict_tolerance: Estimated relative Gram error the prediction walks aim for.
    :param p_halt: Termination probability of the first phase (later phases lower it
        to the learnt range's need).
    :param phases: Most training phases (1: train once on the first walks).
    :param sigma_fit_samples: Walks per node and bin when fitting the sigma-coupling.
    :param refits: Most training rounds on the prediction walks (0: none).
    :param refit_tolerance: Relative change of the kernel's hyperparameters in such a round
        above which the prediction walks are redrawn for the new ones.
    :param bias_correction: Train those rounds on the likelihood corrected for the
        estimate's second-order bias (:mod:`gp_couple.kernels.walk_schedule`).
    :param predict_error_tolerance: Largest estimated error the prediction walks add to the
        predictive mean at held-out rows, relative to the latent predictive variance there,
        when training ends on a bias-corrected round; more walkers are drawn above it
        (unless ``predict_walkers`` is given).
    :param expansion_target: Whitened error for which a bias-corrected round that ended above
        :data:`~gp_couple.kernels.walk_schedule.BIAS_EXPANSION_LIMIT` redraws the prediction
        walkers once and trains again (kept only if it ends with a smaller one); ``None``: never.
    :param seed: Seed of the walks, the CG probes, the error estimates and the sigma fit.
    :param device: Torch device of the model (default the CPU; walks are sampled on the CPU
        and moved there once).
    :return: ``(model, likelihood)``; predict with :func:`gp_couple.models.predict`
        inside :func:`gp_couple.settings.grf_gp_settings`.
    :raises TypeError: If ``graph`` is not a :class:`~gp_couple.graphs.Graph` (e.g. a networkx graph).
    :raises ValueError: If a walker count is odd or an argument is out of range.
    """
    _check_graph(graph)
    schedule = WalkSchedule(train_tolerance=train_tolerance, max_train_walkers=max_train_walkers, phases=phases,
                            predict_walkers=predict_walkers, predict_tolerance=predict_tolerance,
                            max_predict_walkers=max_predict_walkers, sigma_fit_samples=sigma_fit_samples,
                            refits=refits, refit_tolerance=refit_tolerance, bias_correction=bias_correction,
                            predict_error_tolerance=predict_error_tolerance, expansion_target=expansion_target)
    base_seed = draw_seed(seed)
    train = node_index_array(train_nodes, "train_nodes", graph.num_nodes)
    rows = np.union1d(train, node_index_array(predict_nodes, "predict_nodes", graph.num_nodes))
    base = GRFKernel(graph, num_walkers=train_walkers, p_halt=p_halt, coupling="antithetic",
                     directions="repelling", kernel_family=Diffusion(1.0) if kernel_family is None else kernel_family,
                     nodes=rows, seed=base_seed, schedule=schedule)
    return fit_graph_kernel(base, train, train_targets, iterations=iterations, optimizer=optimizer, lr=lr,
                            convergence=convergence, seed=base_seed, device=device)[:2]


def choose_graph_kernel(graph: Graph, num_observed: int, *, predict_all_nodes: bool = False) -> str:
    r"""The graph kernel :func:`fit_graph_gp` trains when asked for ``kernel="auto"``.

    ``"matrix_free"`` (:class:`~gp_couple.kernels.matrix_free.MatrixFreeGraphKernel`, the
    exact GP) or ``"grf"`` (the GRF recipe, :func:`fit_grf_gp`); the rule picks the cheaper
    at the exact GP's accuracy, as measured with both trained to convergence
    (``benchmarks/RESULTS.md``, "One call for every graph size", "The crossover with 10³
    observed nodes", "Dense blocks on the nodes each column reaches", "Kept terms on the rows each block
    reaches", "The matrix-free training covariance: summed in place").

    * With at most :data:`MATRIX_FREE_OBSERVED` observed nodes (8,192), the matrix-free
      kernel, whatever the graph's size: its training runs one recurrence in all (more only
      where the learnt degree outgrows the terms kept), on the nodes within the degree's hops
      of the observed and predicted nodes, and keeps the terms only on the rows each block of
      observed nodes reaches, so its cost no longer grows with the graph; it stays exact at
      long ranges, where the GRF-GP's estimate drifts. Every evaluation is a dense factor of the
      observed nodes' covariance and a sum over the kept terms; above the dense limit of
      :func:`~gp_couple.settings.grf_gp_settings` it would solve by conjugate gradients instead,
      each product a recurrence, hence the limit. This
      needs the terms of 1,024 observed nodes (or of all of them, if fewer), to degree
      :data:`KEPT_TERMS_DEGREE` wherever they lie, to fit
      :class:`~gp_couple.settings.kept_chebyshev_terms`, as they do at the default bound.
    * With more observed nodes, the matrix-free kernel where the graph has at most
      :data:`MATRIX_FREE_NODES_PER_OBSERVED` nodes per observed node, or at most
      :data:`MATRIX_FREE_MIN_NODES` nodes; the GRF recipe on larger graphs. Its products
      (conjugate gradients above the dense limit) then cost the graph's edges times the
      Chebyshev degree per evaluation, while the GRF-GP's cost grows with the observed and
      predicted nodes and the walks' reach.

    With ``predict_all_nodes`` the model will predict every node of the graph (streamed,
    :mod:`gp_couple.streaming`): the exact GP then needs a dense factor of the observed
    nodes' covariance (:class:`~gp_couple.streaming.ExactStreamedPredictor`), so it is
    chosen with at most :data:`~gp_couple.predictive_variance.DENSE_VARIANCE_SIZE` observed
    nodes, and its cross-covariance with every node is one recurrence on the whole graph:
    the limit is :data:`MATRIX_FREE_NODES_PER_OBSERVED_KEPT` nodes per observed node where
    the terms fit, :data:`MATRIX_FREE_NODES_PER_OBSERVED` elsewhere, or
    :data:`MATRIX_FREE_MIN_NODES` nodes (``benchmarks/RESULTS.md``, "Predicting every node:
    the crossover", "The crossover with kept terms").

    :param graph: The graph.
    :param num_observed: Number of observed (training) nodes.
    :param predict_all_nodes: Choose for predicting every node of the graph.
    :return: ``"matrix_free"`` or ``"grf"``.
    :raises TypeError: If ``graph`` is not a :class:`~gp_couple.graphs.Graph`,
        ``num_observed`` is not an int or ``predict_all_nodes`` not a bool.
    :raises ValueError: If ``num_observed`` is below 1.
    """
    _check_graph(graph)
    num_observed = check_int("num_observed", num_observed, 1)
    if not isinstance(predict_all_nodes, bool):
        raise TypeError(f"predict_all_nodes must be a bool, got {type(predict_all_nodes).__name__}")
    per_observed = matrix_free_nodes_per_observed(num_observed, predict_all_nodes=predict_all_nodes)
    if per_observed is None:
        return "matrix_free"
    limit = max(MATRIX_FREE_MIN_NODES, per_observed * num_observed)
    exact = graph.num_nodes <= limit and (not predict_all_nodes or num_observed <= DENSE_VARIANCE_SIZE)
    return "matrix_free" if exact else "grf"


def matrix_free_nodes_per_observed(num_observed: int, *, predict_all_nodes: bool = False) -> int | None:
    """Graph nodes per observed node up to which :func:`choose_graph_kernel` picks the matrix-free exact kernel.

    :param num_observed: Number of observed nodes (at least 1; not checked).
    :param predict_all_nodes: For predicting every node of the graph.
    :return: For training, ``None`` (no limit) with at most :data:`MATRIX_FREE_OBSERVED` observed nodes
        where the covariance terms of ``min(num_observed, 1024)`` of them (wherever they lie) up to degree
        :data:`KEPT_TERMS_DEGREE` fit :class:`~gp_couple.settings.kept_chebyshev_terms`; with
        ``predict_all_nodes``, :data:`MATRIX_FREE_NODES_PER_OBSERVED_KEPT` where all of their terms fit;
        else :data:`MATRIX_FREE_NODES_PER_OBSERVED`.
    """
    bound = kept_chebyshev_terms.value()
    if predict_all_nodes:
        kept = kept_terms_entries(num_observed, KEPT_TERMS_DEGREE) <= bound
        return MATRIX_FREE_NODES_PER_OBSERVED_KEPT if kept else MATRIX_FREE_NODES_PER_OBSERVED
    if (num_observed <= MATRIX_FREE_OBSERVED
            and kept_terms_entries(min(num_observed, _KEPT_OBSERVED), KEPT_TERMS_DEGREE) <= bound):
        return None
    return MATRIX_FREE_NODES_PER_OBSERVED


def fit_graph_gp(graph: Graph, train_nodes: Any, train_targets: Any, *, predict_nodes: Any,
                 kernel: str = "auto", kernel_family: KernelFamily | None = None, iterations: int = 200,
                 optimizer: str = "lbfgs", lr: float = 0.05, convergence: Convergence | None = None,
                 grf_options: Mapping[str, Any] | None = None, seed: SeedLike = 0,
                 device: torch.device | str | None = None) -> tuple[GraphGP, gpytorch.likelihoods.Likelihood]:
    r"""Train the graph GP that is cheapest at the exact GP's accuracy for this graph, and make it ready to predict.

    A :class:`~gp_couple.models.GraphGP` with a ``ScaleKernel`` around the chosen graph
    kernel and a Gaussian likelihood, trained to convergence by
    :func:`gp_couple.models.fit_gp` (L-BFGS by default) under
    :func:`gp_couple.settings.grf_gp_settings`, from gpytorch's initial hyperparameters
    (output scale and noise about 0.69) and ``kernel_family``'s. Predict with
    :func:`gp_couple.models.predict` inside :func:`gp_couple.settings.grf_gp_settings`.

    :param graph: The graph.
    :param train_nodes: Observed node indices.
    :param train_targets: Observations (standardise them: the mean is zero).
    :param predict_nodes: Nodes that will be predicted (the GRF kernel draws walks only from
        the training and these nodes; the exact kernels predict any node).
    :param kernel: ``"auto"`` (:func:`choose_graph_kernel`), ``"matrix_free"``
        (:class:`~gp_couple.kernels.matrix_free.MatrixFreeGraphKernel`), ``"exact"``
        (:class:`~gp_couple.kernels.exact_graph.ExactGraphKernel`, a dense
        eigendecomposition: graphs of at most :data:`gp_couple.exact.DENSE_LIMIT` nodes)
        or ``"grf"`` (:func:`fit_grf_gp`).
    :param kernel_family: Kernel family and initial hyperparameters (default
        :class:`~gp_couple.kernel_families.Diffusion` with :math:`\gamma = 1`).
    :param iterations: Most optimiser iterations (per phase for the GRF kernel).
    :param optimizer: ``"lbfgs"`` (default) or ``"adam"``.
    :param lr: Adam learning rate.
    :param convergence: Stopping rule (default :class:`gp_couple.optimize.Convergence`).
    :param grf_options: Further keyword arguments of :func:`fit_grf_gp` (walker counts,
        tolerances, ...), used when the GRF kernel is trained; only with ``kernel`` ``"grf"``
        or ``"auto"``.
    :param seed: Seed of the CG probes (and of the GRF kernel's walks).
    :param device: Torch device of the model (default the CPU).
    :return: ``(model, likelihood)``; ``model.covar_module.base_kernel`` is the kernel trained.
    :raises TypeError: If ``graph`` is not a :class:`~gp_couple.graphs.Graph`, or
        ``grf_options`` is not a mapping.
    :raises ValueError: If ``kernel`` is not one of :data:`GRAPH_KERNELS`, ``grf_options``
        names an argument :func:`fit_grf_gp` does not take (or is given with an exact kernel),
        ``kernel="exact"`` is asked for on a graph above the dense limit, or an argument is
        out of range.
    """
    _check_graph(graph)
    if kernel not in GRAPH_KERNELS:
        raise ValueError(f"kernel must be one of {GRAPH_KERNELS}, got {kernel!r}")
    options = _grf_options(grf_options, kernel)
    train = node_index_array(train_nodes, "train_nodes", graph.num_nodes)
    node_index_array(predict_nodes, "predict_nodes", graph.num_nodes)
    chosen = choose_graph_kernel(graph, train.size) if kernel == "auto" else kernel
    if kernel == "auto":
        per_observed = matrix_free_nodes_per_observed(train.size)
        _logger.info("fit_graph_gp: the %s kernel for a graph of %d nodes with %d observed (matrix-free %s)", chosen,
                     graph.num_nodes, train.size, f"on any graph with at most {MATRIX_FREE_OBSERVED} observed nodes"
                     if per_observed is None else f"up to {per_observed} nodes per observed node, or "
                     f"{MATRIX_FREE_MIN_NODES} nodes")
    family = Diffusion(1.0) if kernel_family is None else kernel_family
    if chosen == "grf":
        return fit_grf_gp(graph, train_nodes, train_targets, predict_nodes=predict_nodes, iterations=iterations,
                          optimizer=optimizer, lr=lr, convergence=convergence, kernel_family=family, seed=seed,
                          device=device, **options)
    base = (MatrixFreeGraphKernel(graph, family) if chosen == "matrix_free"
            else ExactGraphKernel(graph, family))
    return fit_graph_kernel(base, train, train_targets, iterations=iterations, optimizer=optimizer, lr=lr,
                            convergence=convergence, seed=draw_seed(seed), device=device)[:2]


def _check_graph(graph: Any) -> None:
    if not isinstance(graph, Graph):
        hint = (" (convert a networkx graph with gp_couple.Graph.from_networkx(graph); its nodes are numbered "
                "in graph.nodes order)" if type(graph).__module__.startswith("networkx") else "")
        raise TypeError(f"graph must be a gp_couple Graph, got {type(graph).__name__}{hint}")


def _grf_options(grf_options: Mapping[str, Any] | None, kernel: str) -> dict[str, Any]:
    """``grf_options`` checked against :func:`fit_grf_gp`'s keyword arguments that :func:`fit_graph_gp` leaves open."""
    if grf_options is None:
        return {}
    if not isinstance(grf_options, Mapping):
        raise TypeError(f"grf_options must be a mapping of fit_grf_gp arguments, got {type(grf_options).__name__}")
    if grf_options and kernel not in ("auto", "grf"):
        raise ValueError(f"grf_options are arguments of the GRF kernel's training; kernel={kernel!r} does not use "
                         f"them")
    unknown = sorted(set(grf_options) - set(GRF_OPTIONS))
    if unknown:
        raise ValueError(f"grf_options has arguments fit_grf_gp does not take here: {unknown} (it takes "
                         f"{sorted(GRF_OPTIONS)})")
    return dict(grf_options)


def fit_graph_kernel(kernel: GraphNodeKernel, train_nodes: Any, train_targets: Any, *, iterations: int = 200,
                     optimizer: str = "lbfgs", lr: float = 0.05, convergence: Convergence | None = None,
                     seed: SeedLike = 0, device: torch.device | str | None = None,
                     ) -> tuple[GraphGP, gpytorch.likelihoods.Likelihood, TrainingHistory]:
    r"""Train a graph GP on a kernel you built: the training :func:`fit_graph_gp` and :func:`fit_grf_gp` run.

    A :class:`~gp_couple.models.GraphGP` with a ``ScaleKernel`` around ``kernel``, a zero
    mean and a Gaussian likelihood, trained to convergence by :func:`gp_couple.models.fit_gp`
    under :func:`gp_couple.settings.grf_gp_settings`, from gpytorch's initial output scale
    and noise and ``kernel``'s hyperparameters.

    :param kernel: The graph kernel (e.g. a
        :class:`~gp_couple.kernels.matrix_free.MatrixFreeGraphKernel`).
    :param train_nodes: Observed node indices.
    :param train_targets: Observations (standardise them: the mean is zero).
    :param iterations: Most optimiser iterations (per phase for a GRF kernel with a walk schedule).
    :param optimizer: ``"lbfgs"`` (default) or ``"adam"``.
    :param lr: Adam learning rate.
    :param convergence: Stopping rule (default :class:`gp_couple.optimize.Convergence`).
    :param seed: Seed of the CG probes.
    :param device: Torch device of the model (default the CPU).
    :return: ``(model, likelihood, history)``.
    :raises TypeError: If ``kernel`` is not a :class:`~gp_couple.kernels.graph_node.GraphNodeKernel`.
    :raises ValueError: For node indices outside the graph or an argument out of range.
    """
    if not isinstance(kernel, GraphNodeKernel):
        raise TypeError(f"kernel must be a graph kernel (a GraphNodeKernel), got {type(kernel).__name__}")
    train = node_index_array(train_nodes, "train_nodes", kernel.num_nodes)
    device = resolve_device(device)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(device)
    model = GraphGP(train, train_targets, likelihood, gpytorch.kernels.ScaleKernel(kernel).to(device))
    with grf_gp_settings():
        history = fit_gp(model, likelihood, iterations=iterations, lr=lr, optimizer=optimizer,
                         convergence=Convergence() if convergence is None else convergence, seed=draw_seed(seed))
    return model, likelihood, history


#: The kernels :func:`fit_graph_gp` trains (``"auto"`` chooses by :func:`choose_graph_kernel`).
GRAPH_KERNELS = ("auto", "matrix_free", "exact", "grf")

#: :func:`fit_grf_gp`'s arguments that :func:`fit_graph_gp` passes on from ``grf_options``.
GRF_OPTIONS = tuple(name for name, parameter in inspect.signature(fit_grf_gp).parameters.items()
                    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
                    and name not in ("predict_nodes", "iterations", "optimizer", "lr", "convergence", "kernel_family",
                                     "seed", "device"))
