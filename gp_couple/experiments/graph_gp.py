r"""The GRF-GP protocol of the paper's graph GP experiments (Appendix F.2 "Scalable GPs on graphs",
paragraph "Training GRF-GPs: technical details" [app:grf_gp_details], Appendix F.3 "Probabilistic
traffic interpolation" [sec:traffic_expt]).

1. Train the hyperparameters :math:`\kappa, \gamma, \sigma_n` of a GRF-GP with the
   diffusion kernel :math:`\kappa \exp(-\gamma^2\widetilde{\mathbf L})` (or another
   ``kernel`` family of :func:`gp_couple.kernel_families.get_kernel_family`) and ``train_walkers``
   i.i.d. walkers by maximising the marginal likelihood (Adam, the paper's optimiser, or
   L-BFGS to convergence: ``train_optimizer``).
2. Freeze them and compute the exact kernel *at these GRF-trained hyperparameters* and its
   posterior over the test nodes (reported as ``exact_at_trained``: the reference the GRF
   estimates are compared with, not an exact GP fitted by its own likelihood; for that see
   :mod:`gp_couple.experiments.exact_baseline`).
3. For every number of walkers and coupling (i.i.d., antithetic, :math:`\sigma`-coupled with
   a permutation of order ``sigma_order`` fitted for this kernel), draw fresh GRFs
   ``repeats`` times and report the relative Frobenius error of the Gram matrix, the test
   RMSE of the approximate posterior mean, and :math:`\mathrm{KL}(p_\mathrm{exact}\,\|\,p_\mathrm{approx})`
   over the test nodes with full covariances (a total, not per point), in float64.

There is one path from the graph to every number: the trained model itself. Step 2 swaps
its GRF kernel for :class:`~gp_couple.kernels.ExactGraphKernel` with the same
``kernel_family`` submodule; step 3 redraws the trained kernel's walks with
:meth:`~gp_couple.kernels.GRFKernel.resample` (over every node) and the evaluators
(:func:`~gp_couple.evaluation.model_posterior`, :func:`~gp_couple.evaluation.relative_frobenius_error`)
read the model's own Gram estimate, in float64 (the model is converted with ``double()``
after training).

Targets are standardised with the training mean and standard deviation for training and
inference; RMSEs are reported in the targets' original units. Posteriors are those of
the noisy test observations (the likelihood noise is included in both covariances).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from copy import deepcopy
from dataclasses import asdict, dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import gpytorch
import numpy as np
import torch

from .._checks import check_int, check_p_halt
from .._nodes import node_index_array
from .._random import as_numpy_generator
from ..couplings.directions import get_direction_coupling
from ..couplings.proposals import get_proposal
from ..couplings.walk_lengths import WalkLengthCoupling
from ..devices import resolve_device
from ..evaluation import model_marginals, model_posterior, nlpd, posterior_kl, relative_frobenius_error, rmse
from ..evaluation.sources import gram_source
from ..features.sigma_fit import fit_sigma_coupling
from ..graphs import Graph
from ..kernel_families import KernelFamily, get_kernel_family
from ..kernels import ExactGraphKernel, GraphNodeKernel, GRFKernel
from ..models import GraphGP, fit_gp
from ..optimize import OPTIMIZERS
from ..progress import progress
from ..settings import grf_gp_settings
from ._couplings import COUPLINGS, DIRECTIONS, coupling_choices, walk_length_couplings
from ._report import summarize


@dataclass
class GraphGPProtocol:
    """Settings of the protocol (defaults: the paper's mesh experiment)."""

    train_walkers: int = 8
    train_iterations: int = 1000
    learning_rate: float = 0.05
    #: Optimiser of step 1 (:func:`gp_couple.optimize.minimize`): the paper's ``"adam"`` for
    #: ``train_iterations`` steps, or ``"lbfgs"`` to convergence (at most ``train_iterations``).
    train_optimizer: str = "adam"
    walkers: Sequence[int] = (16, 32, 64)
    couplings: Sequence[str] = COUPLINGS
    #: Neighbour proposal of every walk (training and comparison).
    proposal: str = "weighted"
    #: Direction couplings compared with every length coupling.
    directions: Sequence[str] = DIRECTIONS
    p_halt: float = 0.4
    sigma_order: int = 50
    sigma_fit_samples: int = 100
    repeats: int = 10
    initial_gamma: float = 1.0
    #: Kernel family (:func:`gp_couple.kernel_families.get_kernel_family`); training starts
    #: from the family's default hyperparameters (``initial_gamma`` for the diffusion).
    family_name: str = "diffusion"
    #: Direction coupling of the training walkers (the paper's: independent).
    train_directions: str = "independent"
    seed: int = 0
    #: Torch device of the models (``cpu``, ``cuda`` or ``cuda:N``; walks are sampled on the CPU).
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)

    def validate(self) -> None:
        for name in ("train_walkers", "train_iterations", "repeats", "sigma_order", "sigma_fit_samples"):
            check_int(name, getattr(self, name), 0 if name == "train_iterations" else 1)
        if not self.walkers or any(not isinstance(m, int) or m < 1 for m in self.walkers):
            raise ValueError(f"walkers must be positive integers, got {list(self.walkers)}")
        unknown = set(self.couplings) - set(coupling_choices())
        if unknown or not self.couplings:
            raise ValueError(f"couplings must be chosen from {coupling_choices()}, got {list(self.couplings)}")
        get_proposal(self.proposal)
        if not self.directions:
            raise ValueError("directions must name at least one direction coupling")
        for directions in self.directions:
            get_direction_coupling(directions)
        if any(m % 2 for m in self.walkers) and set(self.couplings) - {"iid"}:
            raise ValueError("paired couplings need an even number of walkers")
        check_p_halt(self.p_halt)
        if self.train_optimizer not in OPTIMIZERS:
            raise ValueError(f"train_optimizer must be one of {list(OPTIMIZERS)}, got {self.train_optimizer!r}")
        get_kernel_family(self.family_name)
        get_direction_coupling(self.train_directions)
        resolve_device(self.device)


@dataclass(frozen=True)
class TrainedHyperparameters:
    """Frozen GP hyperparameters after training."""

    outputscale: float
    #: Kernel family and its hyperparameters (e.g. ``{"gamma": 8.0}`` for the diffusion).
    family_name: str
    hyperparameters: dict[str, Any]
    noise: float
    final_loss: float
    seconds: float
    #: Negative marginal log-likelihood per point before each optimiser step (the training curve).
    losses: tuple[float, ...] = ()


def train_model(graph: Graph, train_nodes: np.ndarray, train_targets: np.ndarray,
                protocol: GraphGPProtocol) -> tuple[GraphGP, TrainedHyperparameters]:
    """Step 1: fit κ, the kernel's hyperparameters and σ_n² of a GRF-GP by marginal likelihood.

    :return: The trained model (``ScaleKernel(GRFKernel)`` with walks from the training
        nodes only) and its hyperparameters.
    """
    start = time.perf_counter()
    initial = {"gamma": protocol.initial_gamma} if protocol.family_name == "diffusion" else {}
    kernel = gpytorch.kernels.ScaleKernel(GRFKernel(
        graph, num_walkers=protocol.train_walkers, p_halt=protocol.p_halt, coupling="iid",
        kernel_family=get_kernel_family(protocol.family_name, **initial), seed=protocol.seed, nodes=train_nodes,
        proposal=protocol.proposal, directions=protocol.train_directions, schedule=None,
    )).to(resolve_device(protocol.device))
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(resolve_device(protocol.device))
    model = GraphGP(torch.as_tensor(train_nodes), torch.as_tensor(train_targets, dtype=torch.float32),
                    likelihood, kernel)
    with grf_gp_settings():
        losses = fit_gp(model, likelihood, iterations=protocol.train_iterations, lr=protocol.learning_rate,
                        optimizer=protocol.train_optimizer, seed=protocol.seed)
    return model, TrainedHyperparameters(
        outputscale=float(kernel.outputscale.detach()), family_name=protocol.family_name,
        hyperparameters=kernel.base_kernel.kernel_family.hyperparameters(),
        noise=float(likelihood.noise.detach()),
        final_loss=float(losses[-1]) if losses else float("nan"),
        seconds=time.perf_counter() - start, losses=tuple(losses))


def exact_counterpart(model: GraphGP) -> GraphGP:
    """The same GP (data, likelihood, mean, outputscale, graph-kernel hyperparameters) with the exact kernel.

    The graph kernel inside ``model.covar_module`` (the GRF kernel here) is replaced by an
    :class:`~gp_couple.kernels.ExactGraphKernel` sharing a copy of its ``kernel_family``
    submodule; ``model`` itself is left unchanged.

    :param model: A GP whose ``covar_module`` is a graph kernel
        (:class:`~gp_couple.kernels.GraphNodeKernel`, e.g. a
        :class:`~gp_couple.kernels.GRFKernel`) or a ``ScaleKernel`` of one.
    :raises TypeError: For another covariance.
    """
    covariance = deepcopy(model.covar_module)
    holder = covariance if isinstance(covariance, gpytorch.kernels.ScaleKernel) else None
    estimate = holder.base_kernel if holder is not None else covariance
    if not isinstance(estimate, GraphNodeKernel):
        raise TypeError("model.covar_module must be a graph kernel (e.g. a GRFKernel) or a ScaleKernel of one, "
                        f"got {type(model.covar_module).__name__}")
    exact = ExactGraphKernel(estimate.graph, estimate.kernel_family, batch_shape=estimate.batch_shape)
    if holder is None:
        covariance = exact
    else:
        holder.base_kernel = exact
    return GraphGP(model.train_inputs[0], model.train_targets, deepcopy(model.likelihood), covariance,
                   deepcopy(model.mean_module))


def build_couplings(kernel_family: KernelFamily, protocol: GraphGPProtocol) -> dict[str, WalkLengthCoupling]:
    """i.i.d., antithetic and a σ-coupling fitted for the trained kernel (order ``sigma_order``)."""
    return walk_length_couplings(protocol.couplings, lambda: fit_sigma_coupling(
        kernel_family, protocol.p_halt, protocol.sigma_order, samples_per_bin=protocol.sigma_fit_samples,
        seed=protocol.seed))


def run_protocol(graph: Graph, targets: np.ndarray, train_nodes: np.ndarray, test_nodes: np.ndarray,
                 protocol: GraphGPProtocol, *, node_posterior: bool = False) -> dict[str, Any]:
    """Run steps 1-3 and return a report with one row per (walkers, coupling).

    :param graph: The graph.
    :param targets: One value per node (NaN where unobserved).
    :param train_nodes: Nodes observed for training.
    :param test_nodes: Held-out nodes.
    :param protocol: Settings.
    :param node_posterior: Also report (key ``node_posterior``) the predictive mean and
        standard deviation at *every* node from one GRF estimate with the most walkers and
        the last coupling (the σ-coupling by default), in the targets' units: what the
        mesh and traffic figures draw. Costs one dense solve with the training block.
    """
    protocol.validate()
    values = np.asarray(targets, dtype=np.float64)
    # Distinct: the training nodes are also the GRF kernel's `nodes`.
    train_nodes = node_index_array(train_nodes, "train_nodes", graph.num_nodes, unique=True)
    test_nodes = node_index_array(test_nodes, "test_nodes", graph.num_nodes)
    if values.shape != (graph.num_nodes,):
        raise ValueError(f"targets must hold one value per graph node ({graph.num_nodes}), "
                         f"got shape {values.shape}; unobserved nodes may be NaN")
    if np.intersect1d(train_nodes, test_nodes).size:
        raise ValueError("train_nodes and test_nodes overlap")
    if not np.all(np.isfinite(values[np.concatenate([train_nodes, test_nodes])])):
        raise ValueError("targets must be finite at the train and test nodes")
    shift, scale = float(values[train_nodes].mean()), float(values[train_nodes].std()) or 1.0
    standardised = (values - shift) / scale

    model, trained = train_model(graph, train_nodes, standardised[train_nodes], protocol)
    # The comparisons are in float64, as the exact reference (the trained values are kept).
    model.double()
    grf: GRFKernel = model.covar_module.base_kernel
    exact_model = exact_counterpart(model)
    every_node = np.arange(graph.num_nodes)
    # Read once: the reference of every Gram error below.
    exact_gram = gram_source(exact_model).block(every_node, every_node)
    exact = model_posterior(exact_model, test_nodes)
    exact_at_trained = {
        "test_rmse": rmse(exact.mean * scale + shift, values[test_nodes]),
        "test_nlpd": nlpd(exact.mean * scale + shift, exact.variance * scale**2, values[test_nodes])}

    couplings = build_couplings(grf.kernel_family, protocol)
    rng = as_numpy_generator(protocol.seed)
    rows: list[dict[str, Any]] = []
    for walkers in protocol.walkers:
        for (name, coupling), directions in product(couplings.items(), protocol.directions):
            gram_errors, rmses, nlpds, kls = [], [], [], []
            for _ in progress(range(protocol.repeats), description=f"{walkers} {name} {directions} walkers",
                              unit="repeat"):
                grf.resample(rng, nodes=None, num_walkers=walkers, coupling=coupling, directions=directions)
                gram_errors.append(relative_frobenius_error(exact_gram, model))
                approx = model_posterior(model, test_nodes)
                rmses.append(rmse(approx.mean * scale + shift, values[test_nodes]))
                nlpds.append(nlpd(approx.mean * scale + shift, approx.variance * scale**2, values[test_nodes]))
                kls.append(posterior_kl(exact, approx))
            rows.append({"walkers": walkers, "coupling": name, "directions": directions,
                         "gram_error": summarize(gram_errors),
                         "test_rmse": summarize(rmses), "test_nlpd": summarize(nlpds),
                         "kl": summarize(kls)})
    extra: dict[str, Any] = {}
    if node_posterior:
        walkers, name, directions = max(protocol.walkers), list(couplings)[-1], protocol.directions[-1]
        grf.resample(rng, nodes=None, num_walkers=walkers, coupling=couplings[name], directions=directions)
        mean, variance = model_marginals(model, every_node)
        extra["node_posterior"] = {"walkers": walkers, "coupling": name, "directions": directions,
                                   "mean": mean * scale + shift, "std": np.sqrt(variance) * scale}
    return {
        "trained": asdict(trained),
        "exact_at_trained": exact_at_trained,
        "nodes": graph.num_nodes, "train": int(train_nodes.size), "test": int(test_nodes.size),
        "protocol": {key: (list(value) if isinstance(value, tuple) else value)
                     for key, value in asdict(protocol).items() if key != "notes"},
        "notes": ["gram_error = ||K - K_hat||_F / ||K||_F over all nodes",
                  "exact_at_trained = the exact kernel at the GRF-trained hyperparameters (the "
                  "reference of gram_error and kl), not an exact GP fitted by its own likelihood",
                  "kl = KL(exact || approximate) over the test nodes (full covariances, total, nats)",
                  "test_rmse in the targets' units, test_nlpd per test point; "
                  "mean ± standard error over repeats"] + protocol.notes,
        "results": rows,
        **extra,
    }


def protocol_figures(report: dict[str, Any], folder: Path, stem: str) -> list[Path]:
    """Write the figures of a protocol report: metrics against walkers, and the training curve.

    :param report: What :func:`run_protocol` returned (rows may carry extra keys, e.g. ``mesh``).
    :param folder: Output folder.
    :param stem: File-name prefix (e.g. the mesh name).
    :return: The PNG files written.
    """
    from . import plotting

    metrics = [key for key in ("gram_error", "test_rmse", "test_nlpd", "kl") if key in report["results"][0]]
    return [
        plotting.plot_metric_curves(report["results"], folder / f"{stem}_metrics_vs_walkers.png",
                                    x="walkers", metrics=metrics, log_x=True, log_y=False,
                                    title=f"{stem}: GRF-GP accuracy against walkers per node"),
        plotting.plot_training_curves({"GRF-GP (i.i.d. walkers)": report["trained"]["losses"]},
                                      folder / f"{stem}_training.png",
                                      ylabel="negative log marginal likelihood per point",
                                      title=f"{stem}: hyperparameter training"),
    ]
