r"""Fitting :math:`\sigma`-couplings from simulated walks (paper, Section 4.1 "Approximating and
solving the OT problem for GRFs" [sec:approximating_and_solving_grfs_ot]).

The matching costs of :mod:`gp_couple.couplings.sigma_matching` are estimated here by
Monte Carlo with the walk sampler (:mod:`gp_couple.features.walks`), then the
assignment is solved exactly: for graph random features (paper,
eq. (56), the tractable matching problem, Appendix C.3 [eq:tractable_ot_formulation]) and for
PageRank (paper, eq. (82), the PageRank matching problem, Appendix E.2 [eq:matching_pagerank]).
"""

from __future__ import annotations

import numpy as np
import torch

from .._checks import check_int, check_p_halt
from .._random import SeedLike, as_numpy_generator, draw_seed
from ..couplings.proposals import NeighbourProposal, get_proposal
from ..couplings.sigma_matching import (
    default_fitting_graph,
    grf_matching_cost,
    quantile_bin_lengths,
    sigma_coupling_from_cost,
)
from ..couplings.walk_lengths import SigmaCoupling
from ..graphs import Graph
from ..kernel_families import KernelFamily
from ..progress import progress
from .walks import walk_endpoints_with_lengths, walk_with_lengths

__all__ = ["fit_sigma_coupling", "fit_pagerank_sigma_coupling", "pagerank_matching_cost"]


def _fitting_graph(graph: Graph | None) -> Graph:
    graph = graph if graph is not None else default_fitting_graph()
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a gp_couple.Graph, got {type(graph).__name__}")
    return graph


def _bin_projections(graph: Graph, kernel_family: KernelFamily, p_halt: float, order: int,
                     samples_per_bin: int, rng: np.random.Generator,
                     proposal: NeighbourProposal | None = None) -> np.ndarray:
    r"""Monte Carlo :math:`\widehat\Psi_q` for every bin, shape ``(order, N, N)``."""
    n = graph.num_nodes
    projections = np.empty((order, n, n))
    for q in progress(range(order), description="fitting sigma (GRF)", unit="bin"):
        lengths = quantile_bin_lengths(q, order, (n, samples_per_bin), p_halt, rng)
        steps = walk_with_lengths(graph, lengths, p_halt, seed=draw_seed(rng), proposal=proposal)
        with torch.no_grad():
            f = kernel_family.modulation(steps.max_step + 1).detach().to(torch.float64).reshape(-1)
        projections[q] = steps.feature_matrix(f).toarray()
    return projections


def fit_sigma_coupling(kernel_family: KernelFamily, p_halt: float, order: int = 30, *,
                       graph: Graph | None = None, samples_per_bin: int = 100,
                       seed: SeedLike = 0, proposal: NeighbourProposal | str | None = None) -> SigmaCoupling:
    r"""Fit a :math:`\sigma`-coupling for graph random features (paper, Definition 4.2, Section 4.1
    [def:coupled_grfs_def]).

    :param kernel_family: The kernel the features estimate (its modulation defines
        :math:`\psi`), e.g. ``RegularisedLaplacian(1.0, 2)`` as in Figure 3, Section 4.2
        [fig:permuton_grf].
    :param p_halt: Termination probability.
    :param order: Permutation order :math:`n` (paper: 30 for Gram estimation, 50 for GPs).
    :param graph: Fitting graph (default :func:`~gp_couple.couplings.sigma_matching.default_fitting_graph`,
        ER with N = 100). The cost sums over all node pairs, so keep it small (it is
        O(n^2 N^3)).
    :param samples_per_bin: Walks per node and bin used to estimate :math:`\widehat\psi`.
    :param seed: Seed.
    :param proposal: Neighbour proposal of the fitting walks (default ``"weighted"``;
        see :mod:`gp_couple.couplings.proposals`).
    :return: The fitted coupling, with provenance in ``metadata``.
    """
    p = check_p_halt(p_halt)
    order = check_int("order", order, 2)
    samples = check_int("samples_per_bin", samples_per_bin, 1)
    if not isinstance(kernel_family, KernelFamily):
        raise TypeError(f"kernel_family must be a KernelFamily, got {type(kernel_family).__name__}")
    if kernel_family.batch_shape != torch.Size():
        raise ValueError("fit_sigma_coupling needs unbatched kernel hyperparameters")
    graph = _fitting_graph(graph)
    rng = as_numpy_generator(seed)
    proposal = get_proposal(proposal)
    cost = grf_matching_cost(_bin_projections(graph, kernel_family, p, order, samples, rng, proposal))
    return sigma_coupling_from_cost(cost, p, {
        "objective": "grf", "kernel": type(kernel_family).__name__,
        "hyperparameters": kernel_family.hyperparameters(), "fit_graph_nodes": graph.num_nodes,
        "fit_graph_edges": graph.num_edges, "samples_per_bin": samples, "proposal": proposal.name})


def pagerank_matching_cost(graph: Graph, p_halt: float, order: int, samples_per_bin: int,
                           rng: np.random.Generator, proposal: NeighbourProposal | None = None) -> np.ndarray:
    r"""PageRank matching cost :math:`C[q, q'] = \langle H_q, H_{q'} \rangle_F` (paper, eq. (82),
    the PageRank matching problem, Appendix E.2 [eq:matching_pagerank])."""
    n = graph.num_nodes
    histograms = np.empty((order, n * n))
    starts = np.repeat(np.arange(n, dtype=np.int64), samples_per_bin)
    for q in progress(range(order), description="fitting sigma (PageRank)", unit="bin"):
        lengths = quantile_bin_lengths(q, order, (n, samples_per_bin), p_halt, rng)
        endpoints = walk_endpoints_with_lengths(graph, lengths, seed=draw_seed(rng), proposal=proposal)
        histograms[q] = np.bincount(starts * n + endpoints.ravel(), minlength=n * n) / samples_per_bin
    return histograms @ histograms.T


def fit_pagerank_sigma_coupling(p_halt: float, order: int = 10, *, graph: Graph | None = None,
                                samples_per_bin: int = 1000, seed: SeedLike = 0,
                                proposal: NeighbourProposal | str | None = None) -> SigmaCoupling:
    r"""Fit a :math:`\sigma`-coupling for PageRank estimation with two walkers (paper, eq. (82), the
    PageRank matching problem, Appendix E.2 [eq:matching_pagerank]).

    :param p_halt: Termination (teleport) probability.
    :param order: Permutation order :math:`n` (paper: 10).
    :param graph: Fitting graph without isolated nodes (default: ER with N = 100).
    :param samples_per_bin: Walks per node and bin for the endpoint probabilities.
    :param seed: Seed.
    :param proposal: Neighbour proposal of the fitting walks, i.e. the chain whose PageRank
        is estimated (default ``"weighted"``).
    """
    p = check_p_halt(p_halt)
    order = check_int("order", order, 2)
    samples = check_int("samples_per_bin", samples_per_bin, 1)
    graph = _fitting_graph(graph)
    rng = as_numpy_generator(seed)
    proposal = get_proposal(proposal)
    cost = pagerank_matching_cost(graph, p, order, samples, rng, proposal)
    return sigma_coupling_from_cost(cost, p, {
        "objective": "pagerank", "fit_graph_nodes": graph.num_nodes, "proposal": proposal.name,
        "fit_graph_edges": graph.num_edges, "samples_per_bin": samples})
