r"""PageRank estimation with coupled random walks (paper, Appendix E "Estimating PageRank"
[app:pagerank]).

The PageRank vector of the chain :math:`\widetilde{\mathbf P} = (1 - p)\mathbf P + \frac{p}{N}\mathbf E`
(eq. (75), the PageRank transition matrix, Appendix E.1 [eq:def_p_tilde], with :math:`\mathbf P` the
walkers' transition matrix: the simple random walk of eq. (76), the random walk's transitions,
Appendix E.1 [eq:srw_transition] for the uniform neighbour proposal, :math:`D^{-1}W` for the
weighted one, which is the default and the same walk on unweighted graphs) is

.. math::

    \rho_i = \frac{p}{N}\sum_j \sum_{k \ge 0} (1 - p)^k (\mathbf P^k)_{ji},

the expected fraction of geometric-length walkers, one batch from every node, that end
at node :math:`i`. The estimator of Fogaras et al. counts where :math:`m` walkers per
node end; coupling their lengths (antithetic termination, or a :math:`\sigma`-coupling
fitted with :func:`~gp_couple.features.sigma_fit.fit_pagerank_sigma_coupling`) reduces
its variance without bias, and so do repelling directions (walkers that share a node
spread over its neighbours, :mod:`gp_couple.couplings.directions`).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import spsolve

from ._checks import check_p_halt
from ._random import SeedLike
from .couplings.directions import DirectionCoupling
from .couplings.proposals import NeighbourProposal, get_proposal
from .couplings.walk_lengths import IIDWalkLengthCoupling, WalkLengthCoupling
from .features.walks import sample_walk_endpoints
from .graphs import Graph

__all__ = ["exact_pagerank", "estimate_pagerank"]


def _check_graph(graph: Graph) -> Graph:
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a gp_couple.Graph, got {type(graph).__name__}")
    if graph.isolated_nodes.size:
        raise ValueError(
            f"PageRank needs every node to have a neighbour ({graph.isolated_nodes.size} "
            "isolated); restrict to graph.largest_component()")
    return graph


def exact_pagerank(graph: Graph, p_halt: float,
                   proposal: NeighbourProposal | str | None = None) -> np.ndarray:
    r"""Exact PageRank :math:`\rho` by one sparse solve of
    :math:`(\mathbf I - (1-p)\mathbf P^\top)\rho = \frac{p}{N}\mathbf 1`.

    :param graph: Graph without isolated nodes.
    :param p_halt: Termination (teleport) probability.
    :param proposal: The walk :math:`\mathbf P`: ``"weighted"`` (default, :math:`D^{-1}W`)
        or ``"uniform"`` (edge weights ignored, as in eq. (76), the random walk's transitions,
        Appendix E.1 [eq:srw_transition]).
    """
    graph = _check_graph(graph)
    p = check_p_halt(p_halt)
    n = graph.num_nodes
    transition = get_proposal(proposal).transition_matrix(graph)
    system = (sp.identity(n, format="csc") - (1 - p) * transition.T).tocsc()
    return spsolve(system, np.full(n, p / n))


def estimate_pagerank(graph: Graph, p_halt: float, num_walkers: int = 2,
                      coupling: WalkLengthCoupling | str = IIDWalkLengthCoupling(), *,
                      seed: SeedLike = None, proposal: NeighbourProposal | str | None = None,
                      directions: DirectionCoupling | str | None = None) -> np.ndarray:
    r"""Monte Carlo PageRank :math:`\widehat\rho_i = \frac{1}{Nm}\#\{\text{walks ending at } i\}`.

    :param graph: Graph without isolated nodes.
    :param p_halt: Termination (teleport) probability.
    :param num_walkers: Walkers per node :math:`m` (even for paired couplings).
    :param coupling: Walk-length coupling.
    :param seed: Seed.
    :param proposal: The walk whose PageRank is estimated (default ``"weighted"``, see
        :func:`exact_pagerank`).
    :param directions: Direction coupling of the walkers of a node (default
        ``"independent"``, or ``"repelling"``).
    """
    graph = _check_graph(graph)
    endpoints = sample_walk_endpoints(graph, num_walkers, p_halt, coupling, seed=seed, proposal=proposal,
                                      directions=directions)
    return np.bincount(endpoints.ravel(), minlength=graph.num_nodes) / endpoints.size
