r"""Fitting :math:`\sigma`-couplings by bipartite matching (paper, sec:approximating_and_solving_grfs_ot).

Both objectives approximate the variance of an estimator built from a pair of walkers
whose length quantiles are matched by a permutation :math:`\sigma` of :math:`n` bins,
and reduce to a linear assignment problem solved exactly by
``scipy.optimize.linear_sum_assignment``.

**Graph random features** (eq:tractable_ot_formulation, the :math:`q_1 = q_2`
approximation of app:what_are_the_approximations). With
:math:`\widehat\psi(q, i)` the average projection of walks from node :math:`i` whose
length lies in quantile bin :math:`q`, estimated by simulation,

.. math::

    C[q, q'] = \sum_{i, j} \Big[\big(\widehat\psi(q, i) + \widehat\psi(q', i)\big)^\top
               \big(\widehat\psi(q, j) + \widehat\psi(q', j)\big)\Big]^2
             = \big\| A_{qq'} A_{qq'}^\top \big\|_F^2,
    \qquad A_{qq'} = \widehat\Psi_q + \widehat\Psi_{q'},

and :math:`\sigma = \arg\min_\sigma \sum_q C[q, \sigma(q)]`.

**PageRank** (eq:matching_pagerank): with :math:`H_q[j, i]` the probability that a walk
from :math:`j` with length in bin :math:`q` ends at :math:`i`,
:math:`C[q, q'] = \sum_{i, j} H_q[j, i]\, H_{q'}[j, i]`.

The paper fits on an Erdős–Rényi graph with :math:`N = 100` nodes and transfers the
permutation to other graphs (:func:`default_fitting_graph`).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from .._random import SeedLike, as_numpy_generator, draw_seed
from ..graphs import Graph, erdos_renyi_graph
from ..modulation import GraphKernelSeries
from ..progress import progress
from .proposals import NeighbourProposal, get_proposal
from .walk_lengths import SigmaCoupling, check_p_halt, geometric_quantile

__all__ = [
    "fit_sigma_coupling",
    "fit_pagerank_sigma_coupling",
    "grf_matching_cost",
    "pagerank_matching_cost",
    "quantile_bin_lengths",
    "default_fitting_graph",
]


def default_fitting_graph(num_nodes: int = 100, edge_probability: float = 0.1, seed: int = 0) -> Graph:
    """The paper's fitting graph: an Erdős–Rényi graph (:func:`gp_couple.graphs.erdos_renyi_graph`)."""
    return erdos_renyi_graph(num_nodes, edge_probability, seed)


def quantile_bin_lengths(bin_index: int, order: int, shape: tuple[int, ...], p_halt: float,
                         rng: np.random.Generator) -> np.ndarray:
    r"""Geometric lengths :math:`F^{-1}(u)` with :math:`u \sim U((q-1)/n, q/n]` for 0-based bin ``q - 1``."""
    u = (bin_index + rng.random(shape)) / order
    return geometric_quantile(np.minimum(u, np.nextafter(1.0, 0.0)), p_halt)


def _check_order(order: int) -> int:
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)):
        raise TypeError(f"order must be an int, got {type(order).__name__}")
    if order < 2:
        raise ValueError(f"order must be >= 2, got {order}")
    return int(order)


def _check_samples(samples_per_bin: int) -> int:
    if isinstance(samples_per_bin, bool) or not isinstance(samples_per_bin, (int, np.integer)):
        raise TypeError(f"samples_per_bin must be an int, got {type(samples_per_bin).__name__}")
    if samples_per_bin < 1:
        raise ValueError(f"samples_per_bin must be >= 1, got {samples_per_bin}")
    return int(samples_per_bin)


def _bin_projections(graph: Graph, graph_kernel: GraphKernelSeries, p_halt: float, order: int,
                     samples_per_bin: int, rng: np.random.Generator,
                     proposal: NeighbourProposal | None = None) -> np.ndarray:
    r"""Monte Carlo :math:`\widehat\Psi_q` for every bin, shape ``(order, N, N)``."""
    from ..features.walks import walk_with_lengths

    n = graph.num_nodes
    projections = np.empty((order, n, n))
    for q in progress(range(order), description="fitting sigma (GRF)", unit="bin"):
        lengths = quantile_bin_lengths(q, order, (n, samples_per_bin), p_halt, rng)
        steps = walk_with_lengths(graph, lengths, p_halt, seed=draw_seed(rng), proposal=proposal)
        with torch.no_grad():
            f = graph_kernel.modulation(steps.max_step + 1).detach().to(torch.float64).reshape(-1)
        projections[q] = steps.feature_matrix(f).toarray()
    return projections


def grf_matching_cost(projections: np.ndarray) -> np.ndarray:
    r"""The linear matching cost :math:`C[q, q'] = \|A_{qq'}A_{qq'}^\top\|_F^2` (eq:tractable_ot_formulation).

    :param projections: :math:`\widehat\Psi_q`, shape ``(order, rows, N)``.
    """
    psi = torch.as_tensor(projections, dtype=torch.float64)
    order = psi.shape[0]
    cost = torch.empty(order, order, dtype=torch.float64)
    for q in range(order):
        summed = psi[q].unsqueeze(0) + psi  # A_{q q'} for every q'
        gram = summed @ summed.transpose(1, 2)
        cost[q] = (gram**2).sum(dim=(1, 2))
    return cost.numpy()


def fit_sigma_coupling(graph_kernel: GraphKernelSeries, p_halt: float, order: int = 30, *,
                       graph: Graph | None = None, samples_per_bin: int = 100,
                       seed: SeedLike = 0, proposal: NeighbourProposal | str | None = None) -> SigmaCoupling:
    r"""Fit a :math:`\sigma`-coupling for graph random features (def:coupled_grfs_def).

    :param graph_kernel: The kernel the features estimate (its modulation defines
        :math:`\psi`), e.g. ``RegularisedLaplacian(1.0, 2)`` as in fig:permuton_grf.
    :param p_halt: Termination probability.
    :param order: Permutation order :math:`n` (paper: 30 for Gram estimation, 50 for GPs).
    :param graph: Fitting graph (default :func:`default_fitting_graph`, ER with N = 100).
        The cost sums over all node pairs, so keep it small (it is O(n^2 N^3)).
    :param samples_per_bin: Walks per node and bin used to estimate :math:`\widehat\psi`.
    :param seed: Seed.
    :param proposal: Neighbour proposal of the fitting walks (default ``"weighted"``;
        see :mod:`gp_couple.couplings.proposals`).
    :return: The fitted coupling, with provenance in ``metadata``.
    """
    p = check_p_halt(p_halt)
    order = _check_order(order)
    samples = _check_samples(samples_per_bin)
    if not isinstance(graph_kernel, GraphKernelSeries):
        raise TypeError(f"graph_kernel must be a GraphKernelSeries, got {type(graph_kernel).__name__}")
    if graph_kernel.batch_shape != torch.Size():
        raise ValueError("fit_sigma_coupling needs unbatched kernel hyperparameters")
    graph = graph if graph is not None else default_fitting_graph()
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a gp_couple.Graph, got {type(graph).__name__}")
    rng = as_numpy_generator(seed)
    proposal = get_proposal(proposal)
    cost = grf_matching_cost(_bin_projections(graph, graph_kernel, p, order, samples, rng, proposal))
    rows, permutation = linear_sum_assignment(cost)
    return SigmaCoupling(permutation[np.argsort(rows)], p_halt=p, metadata={
        "objective": "grf", "kernel": type(graph_kernel).__name__,
        "hyperparameters": graph_kernel.hyperparameters(), "fit_graph_nodes": graph.num_nodes,
        "fit_graph_edges": graph.num_edges, "samples_per_bin": samples, "proposal": proposal.name,
        "cost": float(cost[rows, permutation].sum()),
        "identity_cost": float(np.trace(cost))})


def pagerank_matching_cost(graph: Graph, p_halt: float, order: int, samples_per_bin: int,
                           rng: np.random.Generator, proposal: NeighbourProposal | None = None) -> np.ndarray:
    r"""PageRank matching cost :math:`C[q, q'] = \langle H_q, H_{q'} \rangle_F` (eq:matching_pagerank)."""
    from ..features.walks import walk_endpoints_with_lengths

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
    r"""Fit a :math:`\sigma`-coupling for PageRank estimation with two walkers (eq:matching_pagerank).

    :param p_halt: Termination (teleport) probability.
    :param order: Permutation order :math:`n` (paper: 10).
    :param graph: Fitting graph without isolated nodes (default: ER with N = 100).
    :param samples_per_bin: Walks per node and bin for the endpoint probabilities.
    :param seed: Seed.
    :param proposal: Neighbour proposal of the fitting walks, i.e. the chain whose PageRank
        is estimated (default ``"weighted"``).
    """
    p = check_p_halt(p_halt)
    order = _check_order(order)
    samples = _check_samples(samples_per_bin)
    graph = graph if graph is not None else default_fitting_graph()
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a gp_couple.Graph, got {type(graph).__name__}")
    rng = as_numpy_generator(seed)
    proposal = get_proposal(proposal)
    cost = pagerank_matching_cost(graph, p, order, samples, rng, proposal)
    rows, permutation = linear_sum_assignment(cost)
    return SigmaCoupling(permutation[np.argsort(rows)], p_halt=p, metadata={
        "objective": "pagerank", "fit_graph_nodes": graph.num_nodes, "proposal": proposal.name,
        "fit_graph_edges": graph.num_edges, "samples_per_bin": samples,
        "cost": float(cost[rows, permutation].sum()), "identity_cost": float(np.trace(cost))})
