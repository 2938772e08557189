r"""The GRF-GP protocol of the paper's graph GP experiments (app:grf_gp_details, sec:traffic_expt).

1. Train the hyperparameters :math:`\kappa, \gamma, \sigma_n` of a GRF-GP with the
   diffusion kernel :math:`\kappa \exp(-\gamma^2\widetilde{\mathbf L})` (or another
   ``kernel`` family of :func:`gp_couple.modulation.get_graph_kernel`) and ``train_walkers``
   i.i.d. walkers by maximising the marginal likelihood with Adam.
2. Freeze them and compute the exact kernel *at these GRF-trained hyperparameters* and its
   posterior over the test nodes (reported as ``exact_at_trained``: the reference the GRF
   estimates are compared with, not an exact GP fitted by its own likelihood; for that see
   :mod:`gp_couple.experiments.exact_baseline`).
3. For every number of walkers and coupling (i.i.d., antithetic, :math:`\sigma`-coupled with
   a permutation of order ``sigma_order`` fitted for this kernel), draw fresh GRFs
   ``repeats`` times and report the relative Frobenius error of the Gram matrix, the test
   RMSE of the approximate posterior mean, and :math:`\mathrm{KL}(p_\mathrm{exact}\,\|\,p_\mathrm{approx})`
   over the test nodes with full covariances (a total, not per point), in float64.

Targets are standardised with the training mean and standard deviation for training and
inference; RMSEs are reported in the targets' original units. Posteriors are those of
the noisy test observations (the likelihood noise is included in both covariances).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from itertools import product
from pathlib import Path
from typing import Any, Sequence

import gpytorch
import numpy as np
import scipy.sparse as sp
import torch

from .._random import SeedLike, as_numpy_generator
from ..couplings.sigma_fit import fit_sigma_coupling
from ..couplings.walk_lengths import WalkLengthCoupling
from ..evaluation import nlpd, posterior_kl, relative_frobenius_error, rmse
from ..evaluation.posterior import GaussianPosterior, gp_posterior, gp_posterior_from_blocks
from ..exact import exact_kernel_matrix
from ..features.grf import GraphRandomFeatures
from ..graphs import Graph
from ..kernels.grf import GRFKernel
from ..models import GraphGP, fit_gp
from ..modulation import GraphKernelSeries, get_graph_kernel
from ..progress import progress
from ..settings import grf_gp_settings
from ..couplings.directions import get_direction_coupling
from ..couplings.proposals import get_proposal
from ._couplings import COUPLINGS, DIRECTIONS, coupling_choices, walk_length_couplings
from ._report import summarize
from .exact_baseline import graph_kernel_at



@dataclass
class GraphGPProtocol:
    """Settings of the protocol (defaults: the paper's mesh experiment)."""

    train_walkers: int = 8
    train_iterations: int = 1000
    learning_rate: float = 0.05
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
    #: Graph kernel family (:func:`gp_couple.modulation.get_graph_kernel`); training starts
    #: from the family's default hyperparameters (``initial_gamma`` for the diffusion).
    kernel: str = "diffusion"
    #: Direction coupling of the training walkers (the paper's: independent).
    train_directions: str = "independent"
    seed: int = 0
    notes: list[str] = field(default_factory=list)

    def validate(self) -> None:
        for name in ("train_walkers", "train_iterations", "repeats", "sigma_order", "sigma_fit_samples"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (0 if name == "train_iterations" else 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
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
        if not 0 < self.p_halt < 1:
            raise ValueError(f"p_halt must lie in (0, 1), got {self.p_halt}")
        get_graph_kernel(self.kernel)
        get_direction_coupling(self.train_directions)


@dataclass(frozen=True)
class TrainedHyperparameters:
    """Frozen GP hyperparameters after training."""

    outputscale: float
    #: Kernel family and its hyperparameters (e.g. ``{"gamma": 8.0}`` for the diffusion).
    kernel: str
    hyperparameters: dict[str, Any]
    noise: float
    final_loss: float
    seconds: float
    #: Negative marginal log-likelihood per point before each Adam step (the training curve).
    losses: tuple[float, ...] = ()


def train_hyperparameters(graph: Graph, train_nodes: np.ndarray, train_targets: np.ndarray,
                          protocol: GraphGPProtocol) -> TrainedHyperparameters:
    """Step 1: fit κ, the kernel's hyperparameters and σ_n² of a GRF-GP by marginal likelihood (Adam)."""
    start = time.perf_counter()
    initial = {"gamma": protocol.initial_gamma} if protocol.kernel == "diffusion" else {}
    kernel = gpytorch.kernels.ScaleKernel(GRFKernel(
        graph, num_walkers=protocol.train_walkers, p_halt=protocol.p_halt, coupling="iid",
        graph_kernel=get_graph_kernel(protocol.kernel, **initial), seed=protocol.seed, nodes=train_nodes,
        proposal=protocol.proposal, directions=protocol.train_directions))
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(torch.as_tensor(train_nodes), torch.as_tensor(train_targets, dtype=torch.float32),
                    likelihood, kernel)
    with grf_gp_settings():
        losses = fit_gp(model, likelihood, iterations=protocol.train_iterations, lr=protocol.learning_rate,
                        seed=protocol.seed)
    return TrainedHyperparameters(
        outputscale=float(kernel.outputscale.detach()), kernel=protocol.kernel,
        hyperparameters=kernel.base_kernel.graph_kernel.hyperparameters(),
        noise=float(likelihood.noise.detach()),
        final_loss=float(losses[-1]) if losses else float("nan"),
        seconds=time.perf_counter() - start, losses=tuple(losses))


def build_couplings(series: GraphKernelSeries, protocol: GraphGPProtocol) -> dict[str, WalkLengthCoupling]:
    """i.i.d., antithetic and a σ-coupling fitted for the trained kernel (order ``sigma_order``)."""
    return walk_length_couplings(protocol.couplings, lambda: fit_sigma_coupling(
        series, protocol.p_halt, protocol.sigma_order, samples_per_bin=protocol.sigma_fit_samples,
        seed=protocol.seed))


def grf_gram(graph: Graph, series: GraphKernelSeries, outputscale: float, walkers: int, p_halt: float,
             coupling: WalkLengthCoupling, seed: SeedLike, *, proposal: str | None = None,
             directions: str | None = None) -> sp.csr_matrix:
    r"""A fresh sparse estimate :math:`\kappa\,\Phi\Phi^\top` of the full Gram matrix."""
    features = GraphRandomFeatures.sample(graph, walkers, p_halt, coupling, seed=seed, dtype=torch.float64,
                                          proposal=proposal, directions=directions)
    with torch.no_grad():
        f = series.modulation(features.num_steps).reshape(-1)
    phi = features.scipy_feature_matrix(f)
    return (outputscale * (phi @ phi.T)).tocsr()


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
    train_nodes = np.asarray(train_nodes, dtype=np.int64)
    test_nodes = np.asarray(test_nodes, dtype=np.int64)
    if values.shape != (graph.num_nodes,):
        raise ValueError(f"targets must hold one value per graph node ({graph.num_nodes}), "
                         f"got shape {values.shape}; unobserved nodes may be NaN")
    if np.intersect1d(train_nodes, test_nodes).size:
        raise ValueError("train_nodes and test_nodes overlap")
    if not np.all(np.isfinite(values[np.concatenate([train_nodes, test_nodes])])):
        raise ValueError("targets must be finite at the train and test nodes")
    shift, scale = float(values[train_nodes].mean()), float(values[train_nodes].std()) or 1.0
    standardised = (values - shift) / scale

    trained = train_hyperparameters(graph, train_nodes, standardised[train_nodes], protocol)
    series = graph_kernel_at(trained.kernel, trained.hyperparameters)
    with torch.no_grad():
        exact_gram = trained.outputscale * exact_kernel_matrix(series, graph).numpy()
    exact = gp_posterior(exact_gram, train_nodes, test_nodes, standardised[train_nodes], trained.noise)
    exact_at_trained = {
        "test_rmse": rmse(exact.mean * scale + shift, values[test_nodes]),
        "test_nlpd": nlpd(exact.mean * scale + shift, exact.variance * scale**2, values[test_nodes])}

    couplings = build_couplings(series, protocol)
    rng = as_numpy_generator(protocol.seed)
    rows: list[dict[str, Any]] = []
    for walkers in protocol.walkers:
        for (name, coupling), directions in product(couplings.items(), protocol.directions):
            gram_errors, rmses, nlpds, kls = [], [], [], []
            for _ in progress(range(protocol.repeats), description=f"{walkers} {name} {directions} walkers",
                              unit="repeat"):
                estimate = grf_gram(graph, series, trained.outputscale, walkers, protocol.p_halt,
                                    coupling, rng, proposal=protocol.proposal, directions=directions)
                gram_errors.append(relative_frobenius_error(exact_gram, estimate))
                approx = _posterior_from_sparse(estimate, train_nodes, test_nodes,
                                                standardised[train_nodes], trained.noise)
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
        estimate = grf_gram(graph, series, trained.outputscale, walkers, protocol.p_halt,
                            couplings[name], rng, proposal=protocol.proposal, directions=directions)
        mean, std = posterior_mean_std(estimate, train_nodes, standardised[train_nodes], trained.noise)
        extra["node_posterior"] = {"walkers": walkers, "coupling": name, "directions": directions,
                                   "mean": mean * scale + shift, "std": std * scale}
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
    from .. import plotting

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


def posterior_mean_std(gram: sp.spmatrix | np.ndarray, train: np.ndarray, targets: np.ndarray,
                       noise: float, *, chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    r"""Predictive mean and standard deviation of noisy observations at every node.

    .. math::

        \mu = K_{\cdot t}(K_{tt} + \sigma_n^2 I)^{-1}\mathbf y, \qquad
        v_i = K_{ii} + \sigma_n^2 - K_{it}(K_{tt} + \sigma_n^2 I)^{-1}K_{ti}

    (only the marginal variances: columns are processed ``chunk`` nodes at a time, so
    memory stays at the training block plus ``chunk`` columns).

    :param gram: Full Gram matrix, dense or sparse ``(N, N)``.
    :param train: Training node indices.
    :param targets: Training targets.
    :param noise: Likelihood noise variance :math:`\sigma_n^2`.
    :param chunk: Nodes per block of the variance computation.
    :return: ``(mean, std)``, each ``(N,)``.
    """
    import scipy.linalg

    matrix = sp.csr_matrix(gram) if sp.issparse(gram) else np.asarray(gram)
    num_nodes = matrix.shape[0]
    block = matrix[train][:, train]
    block = block.toarray() if sp.issparse(block) else block
    factor = scipy.linalg.cho_factor(block + noise * np.eye(len(train)), lower=True)
    weights = scipy.linalg.cho_solve(factor, np.asarray(targets, dtype=np.float64))
    train_rows = matrix[train]
    mean = np.asarray(train_rows.T @ weights).reshape(-1)
    diagonal = np.asarray(matrix.diagonal()).reshape(-1)
    variance = np.empty(num_nodes)
    for start in range(0, num_nodes, chunk):
        columns = train_rows[:, start:start + chunk]
        columns = columns.toarray() if sp.issparse(columns) else columns
        solved = scipy.linalg.solve_triangular(factor[0], columns, lower=True)
        variance[start:start + chunk] = diagonal[start:start + chunk] + noise - (solved**2).sum(axis=0)
    # Rounding can leave tiny negatives where a node is fully determined by its neighbours.
    return mean, np.sqrt(np.maximum(variance, noise))


def _posterior_from_sparse(gram: sp.csr_matrix, train: np.ndarray, test: np.ndarray,
                           targets: np.ndarray, noise: float) -> GaussianPosterior:
    """Posterior from the train/test blocks of a sparse Gram estimate (dense float64 solves)."""
    return gp_posterior_from_blocks(gram[train][:, train].toarray(), gram[test][:, train].toarray(),
                                    gram[test][:, test].toarray(), targets, noise)
