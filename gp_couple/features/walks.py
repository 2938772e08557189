r"""Vectorised random-walk sampler for graph random features (paper, Appendix C.1 "Constructing
graph random features" [app:grf_approx]).

A walker leaving node :math:`v_0 = i` moves to a neighbour drawn from a neighbour
proposal :math:`P(v_{s+1} \mid v_s)` (:mod:`gp_couple.couplings.proposals`: uniform, as in
the paper, or weight-proportional, the default) at every step until it halts after
:math:`l` moves, with :math:`l` drawn by a :class:`~gp_couple.couplings.WalkLengthCoupling`.
The prefix ending at step :math:`t` carries the importance weight

.. math::

    \mathrm{load}_t = \prod_{s < t}
        \frac{\widetilde W(v_s, v_{s+1})}{(1 - p_\mathrm{halt})\,P(v_{s+1} \mid v_s)},

the product of normalised edge weights divided by the marginal probability of the
prefix (for uniform choice, :math:`1/P = \deg(v_s)`), and contributes
:math:`\mathrm{load}_t f(t)` to coordinate :math:`v_t` of the walker's projection.
Averaging the projections of :math:`m` walkers gives the feature vector :math:`\phi(i)`.
The :math:`m` walkers of a node choose their moves independently or, with repelling
directions (:mod:`gp_couple.couplings.directions`), jointly so that they spread out.

The sampler returns the **per-step decomposition** :class:`WalkSteps`: every entry
is ``(start node, visited node, step t, load / m)``, so that for any modulation
function :math:`f`

.. math::

    \Phi(f) = \sum_t f(t) \, \Phi_t

is rebuilt by one gather and one multiply (cheaply and differentiably when kernel
hyperparameters change) without resampling. All walkers of all start nodes advance in
a compiled parallel loop; no Python code runs per node or per walker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from .._checks import check_int, check_p_halt, is_int
from .._nodes import node_index_array
from .._random import SeedLike, as_numpy_generator, draw_seed
from ..couplings.directions import DirectionCoupling, get_direction_coupling
from ..couplings.proposals import NeighbourProposal, get_proposal
from ..couplings.walk_lengths import (
    IIDWalkLengthCoupling,
    WalkLengthCoupling,
    get_walk_length_coupling,
)
from ..devices import physical_memory
from ..graphs import Graph
from . import _walk_compiled as compiled

__all__ = ["WalkSteps", "sample_walks", "sample_walk_lengths", "walk_with_lengths",
           "sample_walk_endpoints", "walk_endpoints_with_lengths", "validated_lengths",
           "expected_walk_bytes", "expected_walk_entries", "BYTES_PER_WALK_LENGTH", "LENGTH_BLOCK",
           "LENGTH_DTYPE", "MAX_WALK_LENGTH", "MAX_WALK_NODES"]

#: Walk lengths are drawn for blocks of this many consecutive node ids (see
#: :func:`sample_walk_lengths`): a node's walks never depend on the other nodes sampled with it.
LENGTH_BLOCK = 64
#: Steps are stored as uint16; longer walks need an explicit ``max_length``.
MAX_WALK_LENGTH = np.iinfo(np.uint16).max
#: Most nodes of a graph the sampler walks on: coalescing packs a node index in 32 bits
#: (with its step and slot in one 64-bit key), and one packed value marks an empty slot.
MAX_WALK_NODES = 2**32 - 2
#: The dtype of every table of walk lengths the sampler holds: walks are at most
#: :data:`MAX_WALK_LENGTH` steps, so a length takes two bytes.
LENGTH_DTYPE = np.dtype(np.uint16)
#: Bytes a raw walk entry of :func:`sample_walks` costs (column, step and weight, and the copies
#: that coalesce them into features).
_BYTES_PER_ENTRY = 40
#: Bytes each walk's length costs while walks are sampled: its entry of the table of lengths.
BYTES_PER_WALK_LENGTH = LENGTH_DTYPE.itemsize
#: Bytes each walk of a block of :data:`LENGTH_BLOCK` start nodes costs while its lengths are drawn:
#: the coupling's int64 draw, its checked copy and the rows taken from it.
_BYTES_PER_DRAWN_LENGTH = 24
#: Bytes each walk's end point costs (:func:`sample_walk_endpoints`).
_BYTES_PER_ENDPOINT = 8


@dataclass(frozen=True)
class WalkSteps:
    r"""Per-step decomposition of graph random features.

    Row ``r`` (start node ``start_nodes[r]``) owns entries ``indptr[r]:indptr[r + 1]``
    of ``columns`` (visited node), ``steps`` (step :math:`t`) and ``weights``
    (:math:`\mathrm{load}_t / m`). Entries with the same ``(row, column, step)`` may
    repeat; summing them is implied.

    :ivar num_nodes: Number of graph nodes :math:`N` (columns of :math:`\Phi`).
    :ivar start_nodes: Start node of each row (int64).
    :ivar indptr: Row pointer (int64).
    :ivar columns: Visited node per entry (int32 or int64).
    :ivar steps: Step :math:`t` per entry (uint16).
    :ivar weights: :math:`\mathrm{load}_t / m` per entry (float64).
    :ivar num_walkers: Walkers per start node :math:`m`.
    :ivar p_halt: Termination probability.
    :ivar lengths: Walk lengths actually walked, :data:`LENGTH_DTYPE`, shape ``(rows, m)`` (after
        truncation at ``max_length`` and zeroed at isolated start nodes).
    """

    num_nodes: int
    start_nodes: np.ndarray
    indptr: np.ndarray
    columns: np.ndarray
    steps: np.ndarray
    weights: np.ndarray
    num_walkers: int
    p_halt: float
    lengths: np.ndarray = field(repr=False)

    @property
    def num_rows(self) -> int:
        """Number of start nodes (rows of :math:`\\Phi`)."""
        return int(self.start_nodes.size)

    @property
    def num_entries(self) -> int:
        """Number of stored per-step entries."""
        return int(self.columns.size)

    @property
    def max_step(self) -> int:
        """Largest step present (0 if every walk has length 0)."""
        return int(self.steps.max()) if self.steps.size else 0

    def feature_matrix(self, modulation: Any) -> sp.csr_matrix:
        r"""Assemble :math:`\Phi(f) = \sum_t f(t)\Phi_t` as a scipy CSR matrix (rows x N).

        :param modulation: Values :math:`f(0), f(1), \dots` (array-like, at least
            ``max_step + 1`` long; a torch tensor is detached).
        """
        f = _as_numpy_modulation(modulation, self.max_step)
        # copy=True: sum_duplicates() sorts indices in place, which would scramble
        # this decomposition's columns relative to its steps.
        matrix = sp.csr_matrix((self.weights * f[self.steps], self.columns, self.indptr),
                               shape=(self.num_rows, self.num_nodes), copy=True)
        matrix.sum_duplicates()
        return matrix

    def step_matrix(self, step: int) -> sp.csr_matrix:
        r"""The single-step matrix :math:`\Phi_t` (rows x N), summed over walkers."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        mask = self.steps == step
        matrix = sp.csr_matrix((self.weights * mask, self.columns, self.indptr),
                               shape=(self.num_rows, self.num_nodes), copy=True)
        matrix.eliminate_zeros()
        matrix.sum_duplicates()
        return matrix

    def nbytes(self) -> int:
        """Memory held by the entry arrays."""
        return int(self.indptr.nbytes + self.columns.nbytes + self.steps.nbytes
                   + self.weights.nbytes + self.lengths.nbytes + self.start_nodes.nbytes)


def _as_numpy_modulation(modulation: Any, max_step: int) -> np.ndarray:
    if isinstance(modulation, torch.Tensor):
        modulation = modulation.detach().cpu().numpy()
    f = np.asarray(modulation, dtype=np.float64)
    if f.ndim != 1:
        raise ValueError(f"modulation must be 1-D, got shape {f.shape}")
    if f.size < max_step + 1:
        raise ValueError(
            f"modulation has {f.size} terms but walks reach step {max_step}; "
            f"pass at least {max_step + 1} terms")
    return f


def _check_start_nodes(graph: Graph, start_nodes: Any) -> np.ndarray:
    """The ``start_nodes`` argument: every node for ``None``, else distinct node indices (maybe none)."""
    if start_nodes is None:
        return np.arange(graph.num_nodes, dtype=np.int64)
    # Distinct: a node's neighbour choices are keyed by (node, walker), so repeated rows
    # would share them and not be independent (sample repeats with different seeds).
    return node_index_array(start_nodes, "start_nodes", graph.num_nodes, unique=True, allow_empty=True)


def expected_walk_entries(num_rows: int, num_walkers: int, p_halt: float, max_length: int | None = None) -> float:
    r"""Expected raw entries of ``num_rows x num_walkers`` walks: one per move and one per row for step 0.

    A walk makes :math:`\mathbb E[\min(l, L)] = \frac{1-p}{p}(1 - (1-p)^L)` moves on
    average (:math:`L` = ``max_length``, infinite by default).
    """
    moves = (1.0 - p_halt) / p_halt
    if max_length is not None:
        moves *= -math.expm1(max_length * math.log1p(-p_halt))
    return num_rows * (1.0 + num_walkers * moves)


def expected_walk_bytes(num_rows: int, num_walkers: int, p_halt: float,
                        max_length: int | None = None) -> float:
    """Expected peak memory of :func:`sample_walks` for ``num_rows x num_walkers`` walks, in bytes.

    :func:`expected_walk_entries` raw entries and the table of lengths.
    """
    return (expected_walk_entries(num_rows, num_walkers, p_halt, max_length) * _BYTES_PER_ENTRY
            + float(num_rows) * num_walkers * BYTES_PER_WALK_LENGTH)


def _check_walk_memory(num_rows: int, num_walkers: int, p_halt: float, max_length: int | None,
                       needed: float, what: str) -> None:
    """Refuse walks whose ``needed`` bytes (of ``what``) exceed this machine's physical memory."""
    available = physical_memory()
    if available is not None and needed > available:
        raise ValueError(
            f"sampling {num_walkers} walkers from each of {num_rows} nodes at p_halt={p_halt} "
            f"(max_length={max_length}) needs about {needed / 2**30:.3g} GiB for the {what}, "
            f"more than this machine's {available / 2**30:.3g} GiB of memory; use fewer walkers or "
            "start nodes, a larger p_halt, or a max_length")


def validated_lengths(graph: Graph, lengths: Any, starts: np.ndarray) -> np.ndarray:
    """Check a ``(rows, m)`` length array and zero the rows of isolated start nodes.

    :return: A C-contiguous :data:`LENGTH_DTYPE` copy (or the input when nothing needs changing).
    """
    length_array = np.asarray(lengths)
    if length_array.ndim != 2 or length_array.shape[0] != starts.size:
        raise ValueError(
            f"lengths must have shape ({starts.size}, num_walkers), got {length_array.shape}")
    if length_array.shape[1] < 1:
        raise ValueError("lengths must have at least one walker per row")
    if not np.issubdtype(length_array.dtype, np.integer):
        raise TypeError(f"lengths must be integers, got dtype {length_array.dtype}")
    if length_array.size and length_array.min() < 0:
        raise ValueError("lengths must be non-negative")
    _check_longest(length_array)
    walked = np.ascontiguousarray(length_array, dtype=LENGTH_DTYPE)
    isolated = graph.degrees[starts] == 0
    if np.any(isolated):
        # A walker at a node without neighbours cannot move: its walk ends there.
        walked = walked.copy() if walked is length_array else walked
        walked[isolated] = 0
    return walked


def _check_longest(lengths: np.ndarray) -> None:
    """Refuse non-negative integer ``lengths`` above :data:`MAX_WALK_LENGTH` (before they are narrowed)."""
    if lengths.size and lengths.max() > MAX_WALK_LENGTH:
        raise ValueError(
            f"a walk of length {int(lengths.max())} exceeds the supported "
            f"{MAX_WALK_LENGTH} steps; pass max_length to truncate walks")


def walk_with_lengths(graph: Graph, lengths: Any, p_halt: float, *, seed: SeedLike = None,
                      start_nodes: Any = None, proposal: NeighbourProposal | str | None = None,
                      directions: DirectionCoupling | str | None = None) -> WalkSteps:
    """Walk with given lengths: the sampler's core, for couplings and fitting code.

    :param graph: The graph.
    :param lengths: Non-negative integer array of shape ``(rows, m)``: the length of
        walker ``k`` from ``start_nodes[r]``. Walkers from isolated nodes do not move.
    :param p_halt: Termination probability the importance weights assume.
    :param seed: Seed for the neighbour choices (an int gives reproducible walks).
    :param start_nodes: Start node of each row (default ``0, ..., N - 1``).
    :param proposal: Neighbour proposal (``"weighted"``, the default, or ``"uniform"``,
        or a :class:`~gp_couple.couplings.proposals.NeighbourProposal`).
    :param directions: Direction coupling (``"independent"``, the default, or
        ``"repelling"``, or a :class:`~gp_couple.couplings.directions.DirectionCoupling`).
    """
    _check_graph(graph)
    p = check_p_halt(p_halt)
    starts = _check_start_nodes(graph, start_nodes)
    proposal, directions = get_proposal(proposal), get_direction_coupling(directions)
    return _walk(graph, validated_lengths(graph, lengths, starts), p, seed, starts, proposal, directions)


def _walk(graph: Graph, walked: np.ndarray, p: float, seed: SeedLike, starts: np.ndarray,
          proposal: NeighbourProposal, directions: DirectionCoupling) -> WalkSteps:
    """:func:`walk_with_lengths` for checked arguments (validated lengths and start nodes, a float ``p``)."""
    tables = proposal.tables(graph)
    repelling = directions.repelling
    num_walkers = walked.shape[1]
    row_sizes = 1 + walked.sum(axis=1, dtype=np.int64)
    indptr = np.zeros(starts.size + 1, dtype=np.int64)
    np.cumsum(row_sizes, out=indptr[1:])
    total = int(indptr[-1])
    columns = np.empty(total, dtype=graph.indices.dtype)
    steps = np.empty(total, dtype=np.uint16)
    weights = np.empty(total, dtype=np.float64)
    with compiled.threads_for(total):
        compiled.walk_rows(graph.indptr, graph.indices, tables.ratios, tables.node_scales, tables.cumulative,
                          tables.choice_degrees, starts, walked, draw_seed(seed), 1.0 / (1.0 - p),
                          1.0 / num_walkers, repelling, indptr, columns, steps, weights, compiled.pool_size())
    return WalkSteps(num_nodes=graph.num_nodes, start_nodes=starts, indptr=indptr,
                     columns=columns, steps=steps, weights=weights, num_walkers=num_walkers,
                     p_halt=p, lengths=walked)


def _check_graph(graph: Any) -> None:
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a gp_couple.Graph, got {type(graph).__name__}")
    if graph.num_nodes > MAX_WALK_NODES:
        raise ValueError(f"the walk sampler handles graphs of at most {MAX_WALK_NODES} nodes (MAX_WALK_NODES: "
                         f"its coalesced entries pack a node index in 32 bits); this graph has {graph.num_nodes}")


def _draw_lengths(graph: Graph, num_walkers: int, p_halt: float,
                  coupling: WalkLengthCoupling | str, starts: np.ndarray,
                  max_length: int | None, seed: int) -> np.ndarray:
    """Walk lengths of every start node, drawn per block of :data:`LENGTH_BLOCK` node ids.

    The lengths of node ``v`` are row ``v % LENGTH_BLOCK`` of one call of the coupling's
    ``sample_lengths`` for the block ``v // LENGTH_BLOCK``, with a generator keyed by
    ``(seed, block)`` (drawn by ``sample_rows``, which draws only the rows of the nodes
    sampled). So they do not depend on which other nodes are sampled, in which order or in
    how many calls: chunked and sharded sampling give the same walks.
    """
    num_walkers = check_int("num_walkers", num_walkers)
    if max_length is not None:
        if not is_int(max_length):
            raise TypeError(f"max_length must be an int or None, got {type(max_length).__name__}")
        if not 0 <= max_length <= MAX_WALK_LENGTH:
            raise ValueError(f"max_length must lie in [0, {MAX_WALK_LENGTH}], got {max_length}")
    # The lengths table is all that every consumer holds at once, beside one block's draw while it is
    # made; the raw walk entries are checked by sample_walks, and feature builds coalesce them chunk by chunk.
    _check_walk_memory(starts.size, num_walkers, p_halt, max_length,
                       float(num_walkers) * (starts.size * BYTES_PER_WALK_LENGTH
                                             + LENGTH_BLOCK * _BYTES_PER_DRAWN_LENGTH), "walk lengths")
    instance = get_walk_length_coupling(coupling)
    lengths = np.empty((starts.size, num_walkers), dtype=LENGTH_DTYPE)
    order = np.argsort(starts // LENGTH_BLOCK, kind="stable")
    blocks, first = np.unique(starts[order] // LENGTH_BLOCK, return_index=True)
    bounds = np.append(first, starts.size)
    for block, lo, hi in zip(blocks.tolist(), bounds[:-1].tolist(), bounds[1:].tolist()):
        rows = order[lo:hi]
        rng = np.random.default_rng((seed, block))
        # Only the block's rows of the start nodes are drawn (WalkLengthCoupling.sample_rows): on a large
        # graph with scattered start nodes a block holds one or two of its 64 nodes. A user's coupling is an
        # edge: its lengths are checked there (and fancy indexing copies them, so capping them below never
        # writes into the coupling's own array).
        offsets, inverse = np.unique(starts[rows] % LENGTH_BLOCK, return_inverse=True)
        block = instance.sample_rows(offsets, LENGTH_BLOCK, num_walkers, p_halt, rng)[inverse]
        if max_length is not None:
            np.minimum(block, max_length, out=block)
        _check_longest(block)
        lengths[rows] = block
    return lengths


def sample_walk_lengths(graph: Graph, num_walkers: int, p_halt: float,
                        coupling: WalkLengthCoupling | str = IIDWalkLengthCoupling(), *,
                        max_length: int | None = None, seed: SeedLike = None,
                        start_nodes: Any = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Draw everything random about the walks except the neighbour choices.

    :return: ``(start_nodes, lengths, walk_seed)``: validated start nodes, the
        ``(rows, m)`` lengths to walk (:data:`LENGTH_DTYPE`, zero at isolated nodes, capped at
        ``max_length``) and the integer seed of the neighbour choices.
    :raises ValueError: Also when the walks would need more memory than the machine has.
    """
    _check_graph(graph)
    p = check_p_halt(p_halt)
    starts = _check_start_nodes(graph, start_nodes)
    rng = as_numpy_generator(seed)
    walk_seed = draw_seed(rng)
    lengths = _draw_lengths(graph, num_walkers, p, coupling, starts, max_length, draw_seed(rng))
    return starts, validated_lengths(graph, lengths, starts), walk_seed


def sample_walks(graph: Graph, num_walkers: int, p_halt: float,
                 coupling: WalkLengthCoupling | str = IIDWalkLengthCoupling(), *,
                 max_length: int | None = None, seed: SeedLike = None,
                 start_nodes: Any = None, proposal: NeighbourProposal | str | None = None,
                 directions: DirectionCoupling | str | None = None) -> WalkSteps:
    r"""Sample the per-step decomposition of graph random features.

    :param graph: The graph.
    :param num_walkers: Walkers per start node :math:`m` (even for paired couplings).
    :param p_halt: Termination probability :math:`p_\mathrm{halt} \in (0, 1)`.
    :param coupling: Walk-length coupling (instance, or ``"iid"`` / ``"antithetic"``).
    :param max_length: Optional cap on walk lengths. Truncation drops the series terms
        beyond it, so estimates are then unbiased for the truncated series only.
    :param seed: Seed or generator; the same int seed gives identical results
        whatever the thread count.
    :param start_nodes: Sample rows only for these nodes (default: all). A node's
        walks do not depend on which other nodes are sampled alongside it.
    :param proposal: Neighbour proposal (default ``"weighted"``: weight-proportional,
        identical to ``"uniform"`` on unweighted graphs).
    :param directions: Direction coupling (default ``"independent"``; ``"repelling"``
        spreads the walkers of a node over the neighbourhoods they share).
    :return: The :class:`WalkSteps` decomposition.
    :raises ValueError: For bad arguments, or when the walks would need more memory
        than the machine has.
    """
    proposal, directions = get_proposal(proposal), get_direction_coupling(directions)
    starts, lengths, walk_seed = sample_walk_lengths(
        graph, num_walkers, p_halt, coupling, max_length=max_length, seed=seed,
        start_nodes=start_nodes)
    # sample_walk_lengths checked p_halt and returned validated lengths and start nodes.
    _check_walk_memory(starts.size, num_walkers, p_halt, max_length,
                       float(starts.size + lengths.sum(dtype=np.int64)) * _BYTES_PER_ENTRY, "walk entries")
    return _walk(graph, lengths, float(p_halt), walk_seed, starts, proposal, directions)


def walk_endpoints_with_lengths(graph: Graph, lengths: Any, *, seed: SeedLike = None,
                                start_nodes: Any = None, proposal: NeighbourProposal | str | None = None,
                                directions: DirectionCoupling | str | None = None) -> np.ndarray:
    """Endpoints of walks with given lengths, int64 ``(rows, m)``; same walks as :func:`walk_with_lengths`."""
    _check_graph(graph)
    starts = _check_start_nodes(graph, start_nodes)
    proposal, directions = get_proposal(proposal), get_direction_coupling(directions)
    return _endpoints(graph, validated_lengths(graph, lengths, starts), seed, starts, proposal, directions)


def _endpoints(graph: Graph, walked: np.ndarray, seed: SeedLike, starts: np.ndarray,
               proposal: NeighbourProposal, directions: DirectionCoupling) -> np.ndarray:
    """:func:`walk_endpoints_with_lengths` for checked arguments (validated lengths and start nodes)."""
    tables = proposal.tables(graph)
    repelling = directions.repelling
    endpoints = np.empty(walked.shape, dtype=np.int64)
    with compiled.threads_for(int(walked.sum(dtype=np.int64)) + walked.size):
        compiled.walk_endpoints(graph.indptr, graph.indices, tables.ratios, tables.node_scales, tables.cumulative,
                               tables.choice_degrees, starts, walked, draw_seed(seed), repelling,
                               endpoints, compiled.pool_size())
    return endpoints


def sample_walk_endpoints(graph: Graph, num_walkers: int, p_halt: float,
                          coupling: WalkLengthCoupling | str = IIDWalkLengthCoupling(), *,
                          max_length: int | None = None, seed: SeedLike = None,
                          start_nodes: Any = None, proposal: NeighbourProposal | str | None = None,
                          directions: DirectionCoupling | str | None = None) -> np.ndarray:
    """Where each walk ends: int64 array ``(rows, m)`` (PageRank estimation, Appendix E "Estimating
    PageRank" [app:pagerank]).

    Arguments as in :func:`sample_walks`; the proposal is the Markov chain whose
    PageRank is estimated.
    """
    proposal, directions = get_proposal(proposal), get_direction_coupling(directions)
    starts, lengths, walk_seed = sample_walk_lengths(
        graph, num_walkers, p_halt, coupling, max_length=max_length, seed=seed,
        start_nodes=start_nodes)
    # sample_walk_lengths returned validated lengths and start nodes; the end points are held beside them.
    _check_walk_memory(starts.size, num_walkers, p_halt, max_length,
                       float(lengths.size) * (BYTES_PER_WALK_LENGTH + _BYTES_PER_ENDPOINT), "walk endpoints")
    return _endpoints(graph, lengths, walk_seed, starts, proposal, directions)
