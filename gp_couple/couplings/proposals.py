r"""Neighbour proposals: how a walker picks its next node (the direction law of graph random features).

A walker standing on node :math:`u` moves to neighbour :math:`v` with probability
:math:`P(v \mid u)`. Whatever the proposal, graph random features stay unbiased when
every move multiplies the walker's load by the importance ratio of the normalised edge
weight to the proposal probability (appendix on GRF approximation, the load of a walk),

.. math::

    \frac{\widetilde W(u, v)}{(1 - p_\mathrm{halt})\,P(v \mid u)}, \qquad
    \widetilde W = D^{-1/2} W D^{-1/2},

provided :math:`P(v \mid u) > 0` on every edge. The proposal decides the variance:

* :class:`UniformProposal` (the paper's walks): :math:`P(v \mid u) = 1/\deg(u)`, ratio
  :math:`\widetilde W(u, v)\deg(u)`. On a weighted graph these ratios spread widely
  and the load of a long walk becomes heavy-tailed (product of many of them).
* :class:`WeightedProposal` (the default): :math:`P(v \mid u) = W_{uv}/d_u` with
  :math:`d` the weighted degree, ratio

  .. math::

      \frac{\widetilde W(u, v)}{P(v \mid u)} = \sqrt{d_u / d_v},

  which telescopes along a walk: the load of a prefix :math:`v_0 \dots v_t` is
  :math:`\sqrt{d_{v_0}/d_{v_t}}\,(1 - p_\mathrm{halt})^{-t}` whatever the path.

At a node whose incident weights are all equal the two proposals coincide, and the
compiled sampler then uses the uniform draw and the uniform ratio formula, so on an
unweighted graph the weighted proposal gives the uniform sampler's features bit for bit.

Writing your own proposal
-------------------------
Subclass :class:`NeighbourProposal`, set a unique ``name`` (it registers itself in
:data:`NEIGHBOUR_PROPOSALS`, so kernels saved with it reload) and return one probability
per CSR edge from :meth:`~NeighbourProposal.edge_probabilities`::

    class SquareRootProposal(NeighbourProposal):
        name = "sqrt-weight"

        def edge_probabilities(self, graph):
            root = np.sqrt(graph.weights)
            rows = np.repeat(np.arange(graph.num_nodes), graph.degrees)
            return root / np.bincount(rows, root, graph.num_nodes)[rows]

The base class turns the probabilities into the tables the compiled loop reads
(:class:`ProposalTables`), checks them, and caches them on the graph.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from numba import njit

from ..graphs import Graph
from ..registry import Registered, Registry
from ._named import ValueEquality

__all__ = ["NEIGHBOUR_PROPOSALS", "NeighbourProposal", "UniformProposal", "WeightedProposal",
           "ProposalTables", "DEFAULT_PROPOSAL", "get_proposal", "proposal_from_dict",
           "uniform_ratios"]

#: Registry of neighbour proposals (names used by the command line and saved kernels).
NEIGHBOUR_PROPOSALS: Registry[NeighbourProposal] = Registry("neighbour proposal")

#: Largest deviation of a row of proposal probabilities from summing to one.
_ROW_SUM_TOLERANCE = 1e-9


@dataclass(frozen=True)
class ProposalTables:
    r"""Per-node and per-edge tables that the compiled walk loop reads (CSR order).

    :ivar ratios: Importance ratio :math:`\widetilde W(u, v)/P(v \mid u)` of every edge
        (float64, shape ``(E,)``; the factor :math:`1/(1 - p_\mathrm{halt})` is applied
        by the sampler), or an empty array when the sampler computes them from
        :attr:`node_scales`.
    :ivar node_scales: On a graph whose weights are all 1 with a proposal uniform on
        every row, :math:`d_u^{-1/2}` per node (float64, shape ``(N,)``): the ratio of
        edge :math:`(u, v)` is then :math:`(d_u^{-1/2} d_v^{-1/2}) \deg(u)`, bit for bit
        :func:`uniform_ratios`, at 8 bytes per node instead of per edge. Empty otherwise.
    :ivar cumulative: Within-row cumulative probabilities (float64, shape ``(E,)``, the
        last entry of every row exactly 1), read only on rows that are not uniform; an
        empty array when every row is uniform.
    :ivar choice_degrees: ``deg(u)`` where the proposal is uniform on ``u``'s
        neighbours (the walker takes edge ``indptr[u] + floor(U deg(u))``) and
        ``-deg(u)`` where it samples the cumulative table by binary search (the
        dtype of :attr:`~gp_couple.graphs.Graph.degrees`, shape ``(N,)``; the graph's
        own ``degrees`` array when every row is uniform).

    When every row is uniform, ``ratios`` is :func:`uniform_ratios` (or ``node_scales``
    on unit weights) and ``choice_degrees`` the graph's degrees, shared (not copied) with
    the graph and every uniform proposal.
    """

    ratios: np.ndarray
    cumulative: np.ndarray
    choice_degrees: np.ndarray
    node_scales: np.ndarray = field(default_factory=lambda: _EMPTY)


#: The empty table (read-only).
_EMPTY = np.empty(0, dtype=np.float64)
_EMPTY.setflags(write=False)


def uniform_ratios(graph: Graph) -> np.ndarray:
    r"""Importance ratios :math:`\widetilde W(u, v)\deg(u)` of uniform neighbour choice (CSR order, cached).

    Computed without :meth:`~gp_couple.graphs.Graph.normalized_weights`, which is therefore
    not kept with the graph for the walks' sake (bit for bit its product with the degrees).
    """

    def build() -> np.ndarray:
        ratios = graph.compute_normalized_weights(times_degree=True)
        ratios.setflags(write=False)
        return ratios

    return graph.derived("walk_ratios", build)


def _uniform_rows(graph: Graph, values: np.ndarray) -> np.ndarray:
    """Whether each row's ``values`` (one per CSR edge) are all equal; rows without edges count as uniform."""
    uniform = np.ones(graph.num_nodes, dtype=bool)
    occupied = np.flatnonzero(graph.degrees)
    if occupied.size:
        # Segments from one occupied row's start to the next's are exactly that row's edges.
        starts = graph.indptr[occupied]
        uniform[occupied] = np.maximum.reduceat(values, starts) == np.minimum.reduceat(values, starts)
    return uniform


def _uniform_tables(graph: Graph) -> ProposalTables:
    """The tables of a proposal that is uniform on every row (shared with the graph, nothing copied).

    On unit weights the sampler computes the ratios from per-node scales (no per-edge array).
    """
    if graph.has_unit_weights:
        return ProposalTables(ratios=_EMPTY, cumulative=_EMPTY, choice_degrees=graph.degrees,
                              node_scales=graph.derived("inverse_sqrt_degrees", lambda: _inverse_sqrt_degrees(graph)))
    return ProposalTables(ratios=uniform_ratios(graph), cumulative=_EMPTY, choice_degrees=graph.degrees)


def _inverse_sqrt_degrees(graph: Graph) -> np.ndarray:
    """:math:`d_u^{-1/2}` (0 on isolated nodes), formed as
    :meth:`~gp_couple.graphs.Graph.compute_normalized_weights` forms it."""
    degrees = graph.degrees.astype(np.float64)  # the weighted degrees of unit weights, exactly
    scales = np.zeros_like(degrees)
    positive = degrees > 0
    scales[positive] = 1.0 / np.sqrt(degrees[positive])
    scales.setflags(write=False)
    return scales


@njit(cache=True)
def _row_cumulative(indptr, probabilities, out):  # pragma: no cover - compiled
    # Row by row (not one global cumsum) so that rounding does not accumulate across rows.
    for row in range(indptr.size - 1):
        lo, hi = indptr[row], indptr[row + 1]
        total = 0.0
        for edge in range(lo, hi):
            total += probabilities[edge]
            out[edge] = total
        if hi > lo:
            out[hi - 1] = 1.0


class NeighbourProposal(ValueEquality, Registered, ABC, registry=NEIGHBOUR_PROPOSALS):
    """Interface: the probability of each move of a walker, and the tables the sampler reads.

    Subclasses implement :meth:`edge_probabilities`; they may override
    :meth:`importance_ratios` with an exact closed form. Instances are immutable and
    compare equal when their :meth:`to_dict` descriptions do.
    """

    @abstractmethod
    def edge_probabilities(self, graph: Graph) -> np.ndarray:
        r""":math:`P(v \mid u)` for every edge ``(u, v)`` in CSR order (float64, shape ``(E,)``).

        Each row must sum to one and be positive on every edge (otherwise the
        importance weights could not keep the estimates unbiased).
        """

    def importance_ratios(self, graph: Graph, probabilities: np.ndarray) -> np.ndarray:
        r""":math:`\widetilde W(u, v)/P(v \mid u)` per edge (used on rows that are not uniform)."""
        return graph.compute_normalized_weights() / probabilities

    def tables(self, graph: Graph) -> ProposalTables:
        """The sampler's tables for ``graph`` (validated once, cached on the graph).

        :raises TypeError: If ``graph`` is not a :class:`~gp_couple.graphs.Graph`.
        :raises ValueError: If :meth:`edge_probabilities` returns an invalid table.
        """
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be a gp_couple.Graph, got {type(graph).__name__}")
        cls = type(self)
        key = f"proposal_tables:{cls.__module__}.{cls.__qualname__}:{json.dumps(self.params(), sort_keys=True)}"
        return graph.derived(key, lambda: self._build_tables(graph))

    def transition_matrix(self, graph: Graph) -> sp.csr_matrix:
        r"""The walkers' transition matrix :math:`P` (row-stochastic on non-isolated nodes)."""
        probabilities = self._checked_probabilities(graph)
        return sp.csr_matrix((probabilities, graph.indices, graph.indptr),
                             shape=(graph.num_nodes, graph.num_nodes))

    def _checked_probabilities(self, graph: Graph) -> np.ndarray:
        probabilities = np.asarray(self.edge_probabilities(graph), dtype=np.float64)
        if probabilities.shape != graph.weights.shape:
            raise ValueError(f"{self.name}: edge_probabilities must return one value per edge, shape "
                             f"{graph.weights.shape}, got {probabilities.shape}")
        if not np.all(np.isfinite(probabilities)) or np.any(probabilities <= 0):
            raise ValueError(f"{self.name}: edge probabilities must be finite and positive on every "
                             "edge, or the importance weights cannot keep estimates unbiased")
        sums = np.add.reduceat(probabilities, graph.indptr[:-1][graph.degrees > 0])
        if sums.size and np.max(np.abs(sums - 1.0)) > _ROW_SUM_TOLERANCE:
            raise ValueError(f"{self.name}: edge probabilities of every node must sum to 1 (worst row "
                             f"sums to {sums[np.argmax(np.abs(sums - 1.0))]!r})")
        return probabilities

    def _build_tables(self, graph: Graph) -> ProposalTables:
        probabilities = self._checked_probabilities(graph)
        # A row is uniform when its probabilities are exactly equal: there the sampler
        # uses the uniform draw and the uniform ratio, bit for bit as UniformProposal.
        uniform_rows = _uniform_rows(graph, probabilities)
        if np.all(uniform_rows):
            return _uniform_tables(graph)
        # Some rows are not uniform: these tables hold their own ratios (the uniform ones,
        # computed afresh rather than kept with the graph, then overwritten on those rows).
        degrees = graph.degrees
        weighted_edges = np.repeat(~uniform_rows, degrees)
        ratios = graph.compute_normalized_weights(times_degree=True)
        ratios[weighted_edges] = self.importance_ratios(graph, probabilities)[weighted_edges]
        del weighted_edges
        cumulative = np.empty_like(probabilities)
        _row_cumulative(graph.indptr, probabilities, cumulative)
        choice_degrees = degrees.copy()
        choice_degrees[~uniform_rows] *= -1
        for array in (ratios, cumulative, choice_degrees):
            array.setflags(write=False)
        return ProposalTables(ratios=ratios, cumulative=cumulative, choice_degrees=choice_degrees)


class UniformProposal(NeighbourProposal):
    r"""Uniform choice among neighbours, :math:`P(v \mid u) = 1/\deg(u)` (the paper's walks)."""

    name = "uniform"

    def edge_probabilities(self, graph: Graph) -> np.ndarray:
        return 1.0 / np.repeat(graph.degrees, graph.degrees).astype(np.float64)

    def tables(self, graph: Graph) -> ProposalTables:
        # Every row is uniform: no probability table needs building or checking.
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be a gp_couple.Graph, got {type(graph).__name__}")
        return graph.derived("proposal_tables:uniform", lambda: _uniform_tables(graph))


class WeightedProposal(NeighbourProposal):
    r"""Choice in proportion to edge weight, :math:`P(v \mid u) = W_{uv}/d_u` (the default).

    The importance ratio is :math:`\sqrt{d_u/d_v}` (module docstring), so a walk's
    load depends only on its end points and length. Identical to
    :class:`UniformProposal` on unweighted graphs (and at every node whose incident
    weights are equal), down to the bits of the sampled features.
    """

    name = "weighted"

    def edge_probabilities(self, graph: Graph) -> np.ndarray:
        return graph.weights / np.repeat(graph.weighted_degrees, graph.degrees)

    def importance_ratios(self, graph: Graph, probabilities: np.ndarray) -> np.ndarray:
        weighted_degrees = graph.weighted_degrees
        return np.sqrt(np.repeat(weighted_degrees, graph.degrees) / weighted_degrees[graph.indices])

    def _build_tables(self, graph: Graph) -> ProposalTables:
        # Equal weights on a row make its probabilities W_uv / d_u equal (and valid: positive,
        # finite, summing to one), so a graph whose rows all have equal weights (every
        # unweighted graph, which holds no weights to compare) gets the uniform tables without an
        # edge-sized probability table.
        if graph.has_unit_weights or np.all(_uniform_rows(graph, graph.weights)):
            return _uniform_tables(graph)
        return super()._build_tables(graph)


#: The proposal used when none is given: weight-proportional, which equals uniform on
#: unweighted graphs.
DEFAULT_PROPOSAL: NeighbourProposal = WeightedProposal()


def get_proposal(proposal: NeighbourProposal | str | None) -> NeighbourProposal:
    """Resolve a proposal name (``"uniform"``, ``"weighted"``, a registered one), instance or ``None`` (default).

    :raises ValueError: For an unknown name.
    :raises TypeError: For anything else.
    """
    return NEIGHBOUR_PROPOSALS.resolve(proposal, NeighbourProposal, "proposal", default=DEFAULT_PROPOSAL)


def proposal_from_dict(data: dict[str, Any]) -> NeighbourProposal:
    """Inverse of :meth:`NeighbourProposal.to_dict` for every registered proposal."""
    return NEIGHBOUR_PROPOSALS.from_dict(data)
