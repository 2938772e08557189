r"""The GRF-GP protocol of the paper's graph GP experiments (app:grf_gp_details, sec:traffic_expt).

1. Train the hyperparameters :math:`\kappa, \gamma, \sigma_n` of a GRF-GP with the
   diffusion kernel :math:`\kappa \exp(-\gamma^2\widetilde{\mathbf L})` and ``train_walkers``
   i.i.d. walkers by maximising the marginal likelihood with Adam.
2. Freeze them and compute the exact kernel and the exact posterior over the test nodes.
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
from typing import Any, Sequence

import gpytorch
import numpy as np
import scipy.sparse as sp
import torch

from .._random import SeedLike, as_numpy_generator
from ..couplings.sigma_fit import fit_sigma_coupling
from ..couplings.walk_lengths import WalkLengthCoupling
from ..evaluation import posterior_kl, relative_frobenius_error, rmse
from ..evaluation.posterior import GaussianPosterior, gp_posterior, gp_posterior_from_blocks
from ..exact import exact_kernel_matrix
from ..features.grf import GraphRandomFeatures
from ..graphs import Graph
from ..kernels.grf import GRFKernel
from ..models import GraphGP, fit_gp
from ..modulation import Diffusion
from ..settings import grf_gp_settings
from ._couplings import COUPLINGS, walk_length_couplings
from ._report import summarize



@dataclass
class GraphGPProtocol:
    """Settings of the protocol (defaults: the paper's mesh experiment)."""

    train_walkers: int = 8
    train_iterations: int = 1000
    learning_rate: float = 0.05
    walkers: Sequence[int] = (16, 32, 64)
    couplings: Sequence[str] = COUPLINGS
    p_halt: float = 0.4
    sigma_order: int = 50
    sigma_fit_samples: int = 100
    repeats: int = 10
    initial_gamma: float = 1.0
    seed: int = 0
    notes: list[str] = field(default_factory=list)

    def validate(self) -> None:
        for name in ("train_walkers", "train_iterations", "repeats", "sigma_order", "sigma_fit_samples"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (0 if name == "train_iterations" else 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.walkers or any(not isinstance(m, int) or m < 1 for m in self.walkers):
            raise ValueError(f"walkers must be positive integers, got {list(self.walkers)}")
        unknown = set(self.couplings) - set(COUPLINGS)
        if unknown or not self.couplings:
            raise ValueError(f"couplings must be chosen from {COUPLINGS}, got {list(self.couplings)}")
        if any(m % 2 for m in self.walkers) and set(self.couplings) - {"iid"}:
            raise ValueError("paired couplings need an even number of walkers")
        if not 0 < self.p_halt < 1:
            raise ValueError(f"p_halt must lie in (0, 1), got {self.p_halt}")


@dataclass(frozen=True)
class TrainedHyperparameters:
    """Frozen GP hyperparameters after training."""

    outputscale: float
    gamma: float
    noise: float
    final_loss: float
    seconds: float


def train_hyperparameters(graph: Graph, train_nodes: np.ndarray, train_targets: np.ndarray,
                          protocol: GraphGPProtocol) -> TrainedHyperparameters:
    """Step 1: fit κ, γ, σ_n² of a GRF-GP with i.i.d. walkers by marginal likelihood (Adam)."""
    start = time.perf_counter()
    kernel = gpytorch.kernels.ScaleKernel(GRFKernel(
        graph, num_walkers=protocol.train_walkers, p_halt=protocol.p_halt, coupling="iid",
        graph_kernel=Diffusion(protocol.initial_gamma), seed=protocol.seed, nodes=train_nodes))
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(torch.as_tensor(train_nodes), torch.as_tensor(train_targets, dtype=torch.float32),
                    likelihood, kernel)
    with grf_gp_settings():
        losses = fit_gp(model, likelihood, iterations=protocol.train_iterations, lr=protocol.learning_rate,
                        seed=protocol.seed)
    return TrainedHyperparameters(
        outputscale=float(kernel.outputscale.detach()),
        gamma=float(kernel.base_kernel.graph_kernel.gamma.detach()),
        noise=float(likelihood.noise.detach()),
        final_loss=float(losses[-1]) if losses else float("nan"),
        seconds=time.perf_counter() - start)


def build_couplings(series: Diffusion, protocol: GraphGPProtocol) -> dict[str, WalkLengthCoupling]:
    """i.i.d., antithetic and a σ-coupling fitted for the trained kernel (order ``sigma_order``)."""
    return walk_length_couplings(protocol.couplings, lambda: fit_sigma_coupling(
        series, protocol.p_halt, protocol.sigma_order, samples_per_bin=protocol.sigma_fit_samples,
        seed=protocol.seed))


def grf_gram(graph: Graph, series: Diffusion, outputscale: float, walkers: int, p_halt: float,
             coupling: WalkLengthCoupling, seed: SeedLike) -> sp.csr_matrix:
    r"""A fresh sparse estimate :math:`\kappa\,\Phi\Phi^\top` of the full Gram matrix."""
    features = GraphRandomFeatures.sample(graph, walkers, p_halt, coupling, seed=seed, dtype=torch.float64)
    with torch.no_grad():
        f = series.modulation(features.num_steps).reshape(-1)
    phi = features.scipy_feature_matrix(f)
    return (outputscale * (phi @ phi.T)).tocsr()


def run_protocol(graph: Graph, targets: np.ndarray, train_nodes: np.ndarray, test_nodes: np.ndarray,
                 protocol: GraphGPProtocol) -> dict[str, Any]:
    """Run steps 1-3 and return a report with one row per (walkers, coupling).

    :param graph: The graph.
    :param targets: One value per node (NaN where unobserved).
    :param train_nodes: Nodes observed for training.
    :param test_nodes: Held-out nodes.
    :param protocol: Settings.
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
    series = Diffusion().double()
    series.gamma = trained.gamma
    with torch.no_grad():
        exact_gram = trained.outputscale * exact_kernel_matrix(series, graph).numpy()
    exact = gp_posterior(exact_gram, train_nodes, test_nodes, standardised[train_nodes], trained.noise)
    exact_rmse = rmse(exact.mean * scale + shift, values[test_nodes])

    couplings = build_couplings(series, protocol)
    rng = as_numpy_generator(protocol.seed)
    rows: list[dict[str, Any]] = []
    for walkers in protocol.walkers:
        for name, coupling in couplings.items():
            gram_errors, rmses, kls = [], [], []
            for _ in range(protocol.repeats):
                estimate = grf_gram(graph, series, trained.outputscale, walkers, protocol.p_halt,
                                    coupling, rng)
                gram_errors.append(relative_frobenius_error(exact_gram, estimate))
                approx = _posterior_from_sparse(estimate, train_nodes, test_nodes,
                                                standardised[train_nodes], trained.noise)
                rmses.append(rmse(approx.mean * scale + shift, values[test_nodes]))
                kls.append(posterior_kl(exact, approx))
            rows.append({"walkers": walkers, "coupling": name, "gram_error": summarize(gram_errors),
                         "test_rmse": summarize(rmses), "kl": summarize(kls)})
    return {
        "trained": asdict(trained),
        "exact_test_rmse": exact_rmse,
        "nodes": graph.num_nodes, "train": int(train_nodes.size), "test": int(test_nodes.size),
        "protocol": {key: (list(value) if isinstance(value, tuple) else value)
                     for key, value in asdict(protocol).items() if key != "notes"},
        "notes": ["gram_error = ||K - K_hat||_F / ||K||_F over all nodes",
                  "kl = KL(exact || approximate) over the test nodes (full covariances, total, nats)",
                  "test_rmse in the targets' units; mean ± standard error over repeats"] + protocol.notes,
        "results": rows,
    }


def _posterior_from_sparse(gram: sp.csr_matrix, train: np.ndarray, test: np.ndarray,
                           targets: np.ndarray, noise: float) -> GaussianPosterior:
    """Posterior from the train/test blocks of a sparse Gram estimate (dense float64 solves)."""
    return gp_posterior_from_blocks(gram[train][:, train].toarray(), gram[test][:, train].toarray(),
                                    gram[test][:, test].toarray(), targets, noise)
