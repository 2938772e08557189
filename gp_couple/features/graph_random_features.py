r"""Graph random features :math:`\Phi(\theta) = \sum_t f_\theta(t)\,\Phi_t` in torch.

:class:`GraphRandomFeatures` holds the walk decomposition on the fixed sparsity
pattern of :math:`\Phi`: the distinct ``(row, column)`` slots of the features, and for
each slot the per-step weights that land on it. Rebuilding the feature values for new
hyperparameters is then one sparse product,

.. math::

    \mathrm{vec}(\Phi(\theta)) = \mathbf S \, f_\theta,
    \qquad \mathbf S \in \mathbb R^{\mathrm{nnz}(\Phi) \times T},
    \quad \mathbf S_{u, t} = \sum_{\text{entries of slot } u \text{ at step } t} \mathrm{load}_t / m,

which is differentiable in :math:`f_\theta` (and so in the kernel hyperparameters)
and never touches the graph or resamples walks.
"""

from __future__ import annotations

import functools
import math
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from .._checks import check_even_walkers, check_fraction, check_int, check_memory
from .._random import SeedLike, draw_seed
from ..couplings.directions import DirectionCoupling, get_direction_coupling
from ..couplings.proposals import NeighbourProposal, get_proposal
from ..couplings.walk_lengths import IIDWalkLengthCoupling, WalkLengthCoupling
from ..devices import physical_memory
from ..graphs import Graph
from ..progress import progress
from ..sparse_pattern import CSRPattern, sparse_csr
from . import _walk_compiled as compiled
from ._step_compiled import gather_slots, step_product, step_transpose_product
from .walks import BYTES_PER_WALK_LENGTH, WalkSteps, expected_walk_entries, sample_walk_lengths

__all__ = ["FEATURE_KEYS", "GraphRandomFeatures", "StepMatrix", "expected_feature_bytes", "gram_estimate",
           "training_bytes_per_entry", "walkers_within_memory"]

#: Names of the tensors that define :class:`GraphRandomFeatures` (:meth:`~GraphRandomFeatures.tensors`),
#: in their order; kernels store them as buffers ``features_<name>``.
FEATURE_KEYS = ("start_nodes", "row_pointer", "columns", "slot_pointer", "steps", "weights")


@dataclass(frozen=True)
class GraphRandomFeatures:
    r"""Coalesced per-step decomposition of graph random features (rows x N).

    :ivar num_nodes: Number of graph nodes :math:`N` (columns).
    :ivar start_nodes: Start node of each row (int64, shape ``(R,)``).
    :ivar row_pointer: CSR row pointer of :math:`\Phi` (shape ``(R + 1,)``).
    :ivar columns: Distinct column of every slot, sorted within rows (shape ``(U,)``).
    :ivar slot_pointer: CSR row pointer of :math:`\mathbf S` (shape ``(U + 1,)``).
    :ivar steps: Step of every entry (column index of :math:`\mathbf S`, shape ``(E,)``).
    :ivar weights: :math:`\mathrm{load}_t / m` of every entry (shape ``(E,)``).
    :ivar num_terms: :math:`T`, the number of modulation terms :math:`f(0), \dots, f(T-1)` the features
        use: one more than the longest walk.
    :ivar pattern: The sparsity pattern of :math:`\Phi` (from ``row_pointer`` and
        ``columns``), which the operators multiply on and whose derived index arrays are
        computed once; built here when not given.
    """

    num_nodes: int
    start_nodes: torch.Tensor
    row_pointer: torch.Tensor
    columns: torch.Tensor
    slot_pointer: torch.Tensor
    steps: torch.Tensor
    weights: torch.Tensor
    num_terms: int
    pattern: CSRPattern = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.pattern is None:
            object.__setattr__(self, "pattern", CSRPattern(self.row_pointer, self.columns, self.num_nodes,
                                                           validate=False))

    # ---------------------------------------------------------------- construction
    @classmethod
    def sample(cls, graph: Graph, num_walkers: int, p_halt: float,
               coupling: WalkLengthCoupling | str = IIDWalkLengthCoupling(), *, max_length: int | None = None,
               seed: SeedLike = None, start_nodes: Any = None,
               dtype: torch.dtype | None = None, proposal: NeighbourProposal | str | None = None,
               directions: DirectionCoupling | str | None = None) -> GraphRandomFeatures:
        """Sample walks and build the coalesced features in one compiled pass.

        Each row is walked and coalesced while it is in cache, in chunks of rows, so
        the raw per-walk entries never exist all at once. The result equals
        ``from_walk_steps(sample_walks(...))`` for the same arguments.

        :param dtype: Floating dtype of the weights (default: torch's default dtype).
        :param proposal: Neighbour proposal (default ``"weighted"``, which equals
            ``"uniform"`` on unweighted graphs; :mod:`gp_couple.couplings.proposals`).
        :param directions: Direction coupling (default ``"independent"``, or
            ``"repelling"``; :mod:`gp_couple.couplings.directions`).

        Other parameters as in :func:`~gp_couple.features.walks.sample_walks`.
        """
        proposal, repelling = get_proposal(proposal), get_direction_coupling(directions).repelling
        starts, lengths, walk_seed = sample_walk_lengths(
            graph, num_walkers, p_halt, coupling, max_length=max_length, seed=seed,
            start_nodes=start_nodes)
        tables = proposal.tables(graph)
        p = float(p_halt)  # checked by sample_walk_lengths
        raw_sizes = 1 + lengths.sum(axis=1, dtype=np.int64)
        builder = _Assembler(graph.num_nodes, starts, raw_sizes, graph.indices.dtype, dtype)
        # Same key derivation as walk_with_lengths, so both paths walk identically.
        neighbour_key = draw_seed(walk_seed)
        chunks = builder.chunks()
        if raw_sizes.sum() > builder.chunk_entries:  # large graphs only: several chunks of rows
            chunks = progress(chunks, description="sampling walks", unit="chunk")
        with compiled.threads_for(int(raw_sizes.sum())):
            for lo, hi, raw_indptr, scratch in chunks:
                entry_counts, distinct_counts = builder.counts(hi - lo)
                compiled.walk_and_coalesce_rows(
                    graph.indptr, graph.indices, tables.ratios, tables.node_scales, tables.cumulative,
                    tables.choice_degrees, starts[lo:hi], lengths[lo:hi], neighbour_key,
                    1.0 / (1.0 - p), 1.0 / lengths.shape[1], repelling, raw_indptr, *scratch,
                    entry_counts, distinct_counts, compiled.pool_size())
                builder.gather(lo, hi, raw_indptr, scratch, entry_counts, distinct_counts)
        return builder.finish()

    @classmethod
    def from_walk_steps(cls, walk_steps: WalkSteps, *, dtype: torch.dtype | None = None) -> GraphRandomFeatures:
        """Coalesce a raw :class:`WalkSteps` decomposition (which is left unchanged)."""
        if not isinstance(walk_steps, WalkSteps):
            raise TypeError(f"expected WalkSteps, got {type(walk_steps).__name__}")
        raw_sizes = np.diff(walk_steps.indptr)
        builder = _Assembler(walk_steps.num_nodes, walk_steps.start_nodes, raw_sizes,
                             walk_steps.columns.dtype, dtype, chunked=False)
        scratch = (walk_steps.columns.copy(), walk_steps.steps.copy(), walk_steps.weights.copy())
        entry_counts, distinct_counts = builder.counts(walk_steps.num_rows)
        with compiled.threads_for(walk_steps.num_entries):
            compiled.coalesce_rows(walk_steps.indptr, *scratch, entry_counts, distinct_counts,
                                   compiled.pool_size())
            builder.gather(0, walk_steps.num_rows, walk_steps.indptr, scratch, entry_counts,
                           distinct_counts)
        return builder.finish()

    # ---------------------------------------------------------------- properties
    @property
    def num_rows(self) -> int:
        """Number of feature rows :math:`R`."""
        return int(self.start_nodes.numel())

    @property
    def nnz(self) -> int:
        r"""Stored entries of :math:`\Phi` (distinct ``(row, column)`` pairs)."""
        return int(self.columns.numel())

    @property
    def num_entries(self) -> int:
        """Stored ``(row, column, step)`` entries."""
        return int(self.weights.numel())

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the weights."""
        return self.weights.dtype

    def nbytes(self) -> int:
        """Memory held by the tensors."""
        return sum(t.element_size() * t.numel() for t in self.tensors().values())

    # ---------------------------------------------------------------- feature values
    def values(self, modulation: torch.Tensor, slots: torch.Tensor | None = None) -> torch.Tensor:
        r"""Values of :math:`\Phi(f)` on the fixed pattern, shape ``(*batch, nnz)``, or only at ``slots``.

        One sparse product :math:`\mathbf S f` (:class:`StepMatrix`), whose backward is
        one product with :math:`\mathbf S^\top`.

        :param modulation: :math:`f(0), \dots` along the last dimension (at least
            :attr:`num_terms` terms; extra terms are ignored), any batch shape.
        :param slots: Slots (entries of the pattern) to compute, e.g. the ``slots`` of
            :meth:`~gp_couple.sparse_pattern.CSRPattern.select_rows`; default every slot.
            The step matrix of a selection is rebuilt per call: callers that evaluate
            the same selection repeatedly keep :meth:`step_matrix` instead.
        """
        return self.step_matrix(slots).values(self._checked_modulation(modulation))

    def _checked_modulation(self, modulation: Any) -> torch.Tensor:
        if not isinstance(modulation, torch.Tensor):
            raise TypeError(f"modulation must be a tensor, got {type(modulation).__name__}")
        if modulation.ndim == 0 or modulation.shape[-1] < self.num_terms:
            raise ValueError(
                f"modulation needs at least {self.num_terms} terms (walks reach step "
                f"{self.num_terms - 1}), got shape {tuple(modulation.shape)}")
        return modulation

    def step_matrix(self, slots: torch.Tensor | None = None) -> StepMatrix:
        r"""The step matrix :math:`\mathbf S` (slots x steps) of every slot (cached), or of ``slots``."""
        if slots is None:
            return self._all_steps
        first = self.slot_pointer[slots].long()
        counts = self.slot_pointer[slots + 1].long() - first
        pointer = torch.zeros(slots.numel() + 1, dtype=torch.int64, device=slots.device)
        torch.cumsum(counts, 0, out=pointer[1:])
        total = int(pointer[-1])
        if self.steps.device.type == "cpu":
            steps, weights = self.steps.new_empty(total), self.weights.new_empty(total)
            gather_slots(self.slot_pointer.numpy(), self.steps.numpy(), self.weights.numpy(),
                         slots.long().contiguous().numpy(), pointer.numpy(), steps.numpy(), weights.numpy())
            return StepMatrix(pointer, steps, weights, self.num_terms)
        entries = torch.arange(total, device=slots.device) - torch.repeat_interleave(
            pointer[:-1] - first, counts, output_size=total)
        return StepMatrix(pointer, self.steps[entries], self.weights[entries], self.num_terms)

    @functools.cached_property
    def _all_steps(self) -> StepMatrix:
        return StepMatrix(self.slot_pointer, self.steps, self.weights, self.num_terms)

    def feature_matrix(self, modulation: torch.Tensor) -> torch.Tensor:
        r""":math:`\Phi(f)` as a torch CSR tensor (rows x N); unbatched ``modulation`` only."""
        if modulation.ndim != 1:
            raise ValueError("feature_matrix takes an unbatched (1-D) modulation; use values() for batches")
        return self.pattern.csr(self.values(modulation))

    def scipy_feature_matrix(self, modulation: Any, rows: np.ndarray | None = None) -> sp.csr_matrix:
        r""":math:`\Phi(f)` as a float64 scipy CSR matrix (detached), or only its rows ``rows``.

        The values are those of :meth:`values`, summed per slot in a compiled loop over the
        selected rows only (no per-entry array).

        :param modulation: :math:`f(0), \dots` (at least :attr:`num_terms` terms, no batch).
        :param rows: Row positions to keep, in this order (default: every row).
        """
        f = torch.as_tensor(modulation).detach().to(torch.float64).cpu().numpy()
        if f.ndim != 1 or f.size < self.num_terms:
            raise ValueError(f"modulation must be 1-D with at least {self.num_terms} terms (walks reach step "
                             f"{self.num_terms - 1}), got shape {f.shape}")
        row_pointer = self.row_pointer.cpu().numpy()
        rows = np.arange(self.num_rows) if rows is None else np.asarray(rows, dtype=np.int64)
        indptr = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(row_pointer[rows + 1] - row_pointer[rows], out=indptr[1:])
        columns = self.columns.cpu().numpy()
        out_columns, values = np.empty(int(indptr[-1]), dtype=columns.dtype), np.empty(int(indptr[-1]))
        compiled.feature_rows(row_pointer, columns, self.slot_pointer.cpu().numpy(), self.steps.cpu().numpy(),
                              self.weights.cpu().numpy().astype(np.float64, copy=False), f, rows, indptr,
                              out_columns, values)
        return sp.csr_matrix((values, out_columns, indptr), shape=(rows.size, self.num_nodes))

    # ---------------------------------------------------------------- (de)serialisation
    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors that define the features (for module buffers / state dicts)."""
        return {name: getattr(self, name) for name in FEATURE_KEYS}

    def to(self, device: torch.device | str) -> GraphRandomFeatures:
        """These features on ``device`` (``self`` when they are there already; nothing is validated again)."""
        device = torch.device(device)
        if self.weights.device == device:
            return self
        return GraphRandomFeatures(num_nodes=self.num_nodes, num_terms=self.num_terms,
                                   pattern=self.pattern.to(device),
                                   **{name: tensor.to(device) for name, tensor in self.tensors().items()})

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], num_nodes: int) -> GraphRandomFeatures:
        r"""Inverse of :meth:`tensors`, validating shapes, index ranges and row pointers.

        The pattern of :math:`\Phi` is validated as a :class:`~gp_couple.sparse_pattern.CSRPattern`
        (columns in range, sorted and distinct within rows) and kept as :attr:`pattern`.

        :param tensors: The tensors named by :data:`FEATURE_KEYS`.
        :param num_nodes: Number of graph nodes.
        :raises ValueError: If a tensor is missing, or the tensors do not describe valid
            features on ``num_nodes`` nodes (e.g. a corrupt state dict).
        """
        missing = set(FEATURE_KEYS) - set(tensors)
        if missing:
            raise ValueError(f"missing feature tensors: {sorted(missing)}")
        rows = tensors["start_nodes"].numel()
        if tensors["row_pointer"].numel() != rows + 1:
            raise ValueError("row_pointer does not match start_nodes")
        if tensors["slot_pointer"].numel() != tensors["columns"].numel() + 1:
            raise ValueError("slot_pointer does not match columns")
        if tensors["steps"].numel() != tensors["weights"].numel():
            raise ValueError("steps and weights differ in length")
        _check_pointer(tensors["slot_pointer"], tensors["steps"].numel(), "slot_pointer")
        _check_range(tensors["start_nodes"], num_nodes, "start_nodes")
        pattern = CSRPattern(tensors["row_pointer"], tensors["columns"], int(num_nodes))
        if tensors["steps"].numel() and int(tensors["steps"].min()) < 0:
            raise ValueError("steps contains negative steps")
        num_terms = int(tensors["steps"].max()) + 1 if tensors["steps"].numel() else 1
        return cls(num_nodes=int(num_nodes), num_terms=num_terms, pattern=pattern,
                   **{name: tensors[name] for name in FEATURE_KEYS})


def _check_pointer(pointer: torch.Tensor, total: int, name: str) -> None:
    if int(pointer[0]) != 0 or int(pointer[-1]) != total:
        raise ValueError(f"{name} must run from 0 to {total}, got {int(pointer[0])} to {int(pointer[-1])}")
    if pointer.numel() > 1 and bool((pointer[1:] < pointer[:-1]).any()):
        raise ValueError(f"{name} is not non-decreasing")


def _check_range(index: torch.Tensor, num_nodes: int, name: str) -> None:
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= num_nodes):
        raise ValueError(f"{name} holds node indices outside [0, {num_nodes}) (from {int(index.min())} "
                         f"to {int(index.max())})")


class StepMatrix:
    r"""The step matrix :math:`\mathbf S` of some slots, with :math:`\mathrm{vec}(\Phi) = \mathbf S f`.

    Held as its CSR parts, in the features' own index types. On the CPU both products,
    :math:`\mathbf S f` and the backward pass's :math:`\mathbf S^\top\mathbf g`, are compiled
    passes over the entries (:mod:`._step_compiled`) that need no other copy. Elsewhere,
    and for double backward passes, they are torch's sparse products, with the torch CSR
    matrix and its transpose built on first use and kept. Each slot's value sums its
    entries in order, whatever other slots are computed with it.

    :param slot_pointer: Entry range of every slot (``(U + 1,)``, any integer type).
    :param steps: Step of every entry (``(E,)``, any integer type).
    :param weights: Weight of every entry (``(E,)``).
    :param num_terms: :math:`T`.
    """

    def __init__(self, slot_pointer: torch.Tensor, steps: torch.Tensor, weights: torch.Tensor,
                 num_terms: int) -> None:
        self.slot_pointer, self.steps, self.weights = slot_pointer, steps, weights
        self.num_slots = slot_pointer.numel() - 1
        self.num_terms = int(num_terms)

    def __deepcopy__(self, memo: dict[int, Any]) -> StepMatrix:
        # The parts only: the torch matrices are rebuilt on use (torch cannot deep-copy sparse CSR tensors).
        return StepMatrix(*deepcopy((self.slot_pointer, self.steps, self.weights), memo), self.num_terms)

    @functools.cached_property
    def matrix(self) -> torch.Tensor:
        r""":math:`\mathbf S` as a torch CSR matrix (slots x steps, int64 indices)."""
        return sparse_csr(self.slot_pointer.long(), self.steps.long(), self.weights,
                          (self.num_slots, self.num_terms))

    @functools.cached_property
    def transpose(self) -> torch.Tensor:
        r""":math:`\mathbf S^\top` as a torch CSR matrix (steps x slots)."""
        columns = self.matrix.to_sparse_csc()
        return sparse_csr(columns.ccol_indices(), columns.row_indices(), columns.values(),
                          (self.num_terms, self.num_slots))

    def _product(self, f: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathbf S f` for ``f`` ``(*batch, T)`` in the weights' dtype: shape ``(*batch, slots)`` (the
        forward of :meth:`values`)."""
        if self.weights.device.type != "cpu":
            return _right_product(self.matrix, f)
        flat = f.detach().reshape(-1, self.num_terms).contiguous()
        out = torch.zeros(flat.shape[0], self.num_slots, dtype=self.weights.dtype)
        step_product(self.slot_pointer.numpy(), self.steps.numpy(), self.weights.numpy(), flat.numpy(), out.numpy())
        return out.reshape(*f.shape[:-1], self.num_slots)

    def _transpose_product(self, grad: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathbf S^\top\mathbf g` for ``grad`` ``(*batch, slots)``: shape ``(*batch, T)`` (the backward
        of :meth:`values`)."""
        if self.weights.device.type != "cpu" or (grad.requires_grad and torch.is_grad_enabled()):
            return _right_product(self.transpose, grad)
        flat = grad.detach().reshape(-1, self.num_slots).to(self.weights.dtype).contiguous()
        out = torch.zeros(flat.shape[0], self.num_terms, dtype=self.weights.dtype)
        step_transpose_product(self.slot_pointer.numpy(), self.steps.numpy(), self.weights.numpy(), flat.numpy(),
                               out.numpy())
        return out.reshape(*grad.shape[:-1], self.num_terms)

    def values(self, modulation: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathbf S f` for ``modulation`` ``(*batch, >= T)``: shape ``(*batch, slots)``, differentiable."""
        f = modulation[..., : self.num_terms].to(self.weights.dtype)
        return _StepProduct.apply(f, self)


class _StepProduct(torch.autograd.Function):
    r""":math:`\mathbf S f` over the last dimension of ``f``; the backward is :math:`\mathbf S^\top g`."""

    @staticmethod
    def forward(ctx: Any, f: torch.Tensor, steps: StepMatrix) -> torch.Tensor:
        ctx.steps = steps
        return steps._product(f)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None
        return ctx.steps._transpose_product(grad), None


def _right_product(matrix: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``matrix @ right[..., :]`` for every batch entry of ``right`` ``(*batch, k)``: ``(*batch, rows)``."""
    flat = right.reshape(-1, right.shape[-1])
    return (matrix @ flat.mT.contiguous()).mT.reshape(*right.shape[:-1], matrix.shape[0])


def gram_estimate(features: GraphRandomFeatures, modulation: Any,
                  independent: GraphRandomFeatures | None = None) -> sp.csr_matrix:
    r"""Sparse Gram estimate :math:`\widehat K` from one or two independent feature sets.

    With one set, :math:`\widehat K = \Phi\Phi^\top` (positive semi-definite, unbiased
    off the diagonal; the diagonal is biased upwards). With an independent second set,
    :math:`\widehat K = \tfrac12(\Phi_A\Phi_B^\top + \Phi_B\Phi_A^\top)`, unbiased everywhere
    (the footnote of Appendix C.1 "Constructing graph random features" [app:grf_approx]) but not
    necessarily positive semi-definite.

    :param features: Feature set :math:`A`.
    :param modulation: :math:`f(0), f(1), \dots` (detached; float64 is used).
    :param independent: Optional feature set :math:`B` over the same rows, sampled with
        another seed.
    """
    phi = features.scipy_feature_matrix(modulation)
    if independent is None:
        return (phi @ phi.T).tocsr()
    if not torch.equal(independent.start_nodes, features.start_nodes) or independent.num_nodes != features.num_nodes:
        raise ValueError("the two feature sets must have the same rows and graph")
    cross = phi @ independent.scipy_feature_matrix(modulation).T
    return ((cross + cross.T) * 0.5).tocsr()


#: Copies of a coalesced ``(row, column, step)`` entry's step and weight that a GP holds while it trains
#: on the features: their own, and their copy in the step matrix of the training rows (the products
#: of the step matrix make no other copy on the CPU, :class:`StepMatrix`). Predicting from them holds
#: no more (``benchmarks/bench_feature_memory.py --use predict``).
TRAINING_ENTRY_COPIES = 2
#: Bytes a ``(row, column)`` slot of :math:`\Phi` costs while a GP trains on the features, or predicts
#: from them: its column and entry pointer, the patterns' derived index arrays, feature values and
#: their gradients (measured, ``benchmarks/bench_feature_memory.py``).
TRAINING_BYTES_PER_SLOT = 80
#: Bytes a GP's training on walks holds whatever their number (the sampler's chunk buffers, the
#: allocators' pools): the intercept of ``benchmarks/bench_feature_memory.py``'s rows, rounded up.
#: :func:`walkers_within_memory` sets it aside.
TRAINING_FIXED_BYTES = 10**9
#: Rows whose walks :func:`expected_feature_bytes` samples.
PILOT_ROWS = 64


def training_bytes_per_entry(dtype: torch.dtype | None = None, raw_entries: float = 0.0) -> int:
    """Bytes a coalesced entry costs while a GP trains on features whose weights are ``dtype``.

    :data:`TRAINING_ENTRY_COPIES` of its step (int32, or int64 where the raw walk steps
    outnumber int32, as the sampler stores them) and its weight.

    :param dtype: Floating dtype of the weights (default: torch's default dtype).
    :param raw_entries: The raw walk steps sampled at once.
    :raises TypeError: If ``dtype`` is not a floating torch dtype.
    """
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch dtype, got {dtype}")
    index_bytes = 4 if raw_entries < np.iinfo(np.int32).max else 8
    return TRAINING_ENTRY_COPIES * (index_bytes + dtype.itemsize)


def expected_feature_bytes(graph: Graph, num_walkers: int, p_halt: float,
                           coupling: WalkLengthCoupling | str = IIDWalkLengthCoupling(), *, start_nodes: np.ndarray,
                           max_length: int | None = None, proposal: NeighbourProposal | str | None = None,
                           directions: DirectionCoupling | str | None = None, pilot_rows: int = PILOT_ROWS,
                           seed: SeedLike = 0, dtype: torch.dtype | None = None) -> float:
    r"""Memory a GP needs to train on the features of ``start_nodes``, estimated from a sample of them.

    The coalesced entries of a row, its distinct ``(column, step)`` pairs, have no closed
    form: the :math:`m` walkers of a node revisit the same nodes at the same steps, more so
    the more walkers there are, so they number several times fewer than the raw walk
    steps :math:`m(1-p_\mathrm{halt})/p_\mathrm{halt}`. This samples the walks of
    ``pilot_rows`` of the rows, drawn at random, and scales their mean entries and slots
    per row, each plus two standard errors, to every row:

    .. math::

        R\,\bigl(\bar e\,b_\mathrm{entry} + \bar u\,b_\mathrm{slot}\bigr) + R\,m\,b_\mathrm{length},

    with :func:`training_bytes_per_entry` in the weights' ``dtype``,
    :data:`TRAINING_BYTES_PER_SLOT` and the walk lengths' table.

    :param graph: The graph.
    :param num_walkers: Walkers per node.
    :param p_halt: Termination probability.
    :param coupling: Walk-length coupling.
    :param start_nodes: The rows' start nodes (validated, distinct).
    :param max_length: Longest walk (``None``: unbounded).
    :param proposal: Neighbour proposal.
    :param directions: Direction coupling.
    :param pilot_rows: Rows sampled, at least 1 (all of them when there are fewer).
    :param seed: Seed of the sample of rows and of their walks.
    :param dtype: Floating dtype of the features' weights (default: torch's default dtype).
    :return: The estimate in bytes.
    """
    pilot_rows = check_int("pilot_rows", pilot_rows)
    rows = int(np.asarray(start_nodes).size)
    if rows == 0:
        return 0.0
    rng = np.random.default_rng(draw_seed(seed))
    pilot = np.sort(rng.choice(np.asarray(start_nodes), size=min(int(pilot_rows), rows), replace=False))
    features = GraphRandomFeatures.sample(graph, num_walkers, p_halt, coupling, max_length=max_length,
                                          seed=draw_seed(rng), start_nodes=pilot, dtype=torch.float64,
                                          proposal=proposal, directions=directions)
    row_pointer = features.row_pointer.long()
    slots = torch.diff(row_pointer).double()
    entries = torch.diff(features.slot_pointer.long()[row_pointer]).double()
    per_row = 0.0
    entry_bytes = training_bytes_per_entry(dtype, expected_walk_entries(rows, num_walkers, p_halt, max_length))
    for counts, size in ((entries, entry_bytes), (slots, TRAINING_BYTES_PER_SLOT)):
        spread = 2.0 * float(counts.std()) / math.sqrt(counts.numel()) if counts.numel() > 1 else 0.0
        per_row += (float(counts.mean()) + spread) * size
    return rows * (per_row + num_walkers * BYTES_PER_WALK_LENGTH)


def walkers_within_memory(graph: Graph, start_nodes: np.ndarray, p_halt: float,
                          coupling: WalkLengthCoupling | str = IIDWalkLengthCoupling(), *, upto: int,
                          max_length: int | None = None, proposal: NeighbourProposal | str | None = None,
                          directions: DirectionCoupling | str | None = None, fraction: float = 0.5,
                          seed: SeedLike = 0, dtype: torch.dtype | None = None) -> int | None:
    """The most walkers per node, even and at most ``upto``, whose features a GP can train on in ``fraction`` of memory.

    The memory is :func:`expected_feature_bytes`'s estimate, within ``fraction`` of the
    machine's memory less :data:`TRAINING_FIXED_BYTES`. Where even the raw walk steps
    fit (an upper bound of the coalesced entries and slots), no walks are sampled;
    otherwise the count is found by bisection on sampled estimates, to within 1/32.

    :param graph: The graph.
    :param start_nodes: The rows' start nodes (validated, distinct).
    :param p_halt: Termination probability.
    :param coupling: Walk-length coupling.
    :param upto: Most walkers considered (even).
    :param max_length: Longest walk (``None``: unbounded).
    :param proposal: Neighbour proposal.
    :param directions: Direction coupling.
    :param fraction: Share of the machine's physical memory the features may take, in (0, 1).
    :param seed: Seed of the estimates.
    :param dtype: Floating dtype of the features' weights (default: torch's default dtype).
    :return: The walker count (at least 2), or ``None`` where the memory is unknown.
    :raises TypeError: If ``upto`` is not an int or ``fraction`` not a number.
    :raises ValueError: If ``upto`` is odd or below 2, or ``fraction`` is not in (0, 1).
    """
    upto = check_even_walkers("upto", upto)
    fraction = check_fraction("fraction", fraction)
    available = physical_memory()
    rows = int(np.asarray(start_nodes).size)
    if available is None or rows == 0:
        return None
    budget = max(fraction * available - TRAINING_FIXED_BYTES, 0.0)
    raw_entries = expected_walk_entries(rows, upto, p_halt, max_length)
    raw_bound = (raw_entries * (training_bytes_per_entry(dtype, raw_entries) + TRAINING_BYTES_PER_SLOT)
                 + float(rows) * upto * BYTES_PER_WALK_LENGTH)
    if raw_bound <= budget:
        return upto

    def fits(walkers: int) -> bool:
        return expected_feature_bytes(graph, walkers, p_halt, coupling, start_nodes=start_nodes, max_length=max_length,
                                      proposal=proposal, directions=directions, seed=seed, dtype=dtype) <= budget

    if fits(upto):
        return upto
    low, high = 2, upto  # fits(high) is False; low is returned even when it does not fit
    while high - low > max(2, low // 32):
        middle = 2 * ((low + high) // 4)
        if middle <= low:
            break
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


class _Assembler:
    """Collects coalesced rows chunk by chunk into contiguous arrays.

    The output arrays grow with what the chunks coalesce to (by a factor of
    :attr:`GROWTH` at a time, never beyond the raw entry count) and are shrunk to it at
    the end. So the features' memory follows the coalesced entries, several times fewer
    than the raw walk steps when many walkers revisit the same nodes at the same steps,
    and a build that would not fit in the available memory stops with a ``ValueError``
    before it allocates, not in the middle of an allocation.
    """

    #: Raw entries per chunk of rows (bounds the scratch memory to ~230 MB).
    CHUNK_ENTRIES = 1 << 24

    def __init__(self, num_nodes: int, starts: np.ndarray, raw_sizes: np.ndarray,
                 column_dtype: np.dtype, dtype: torch.dtype | None, chunked: bool = True) -> None:
        dtype = dtype or torch.get_default_dtype()
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch dtype, got {dtype}")
        self.dtype = dtype
        self.num_nodes = int(num_nodes)
        self.starts = np.asarray(starts, dtype=np.int64)
        self.raw_sizes = np.asarray(raw_sizes, dtype=np.int64)
        self.raw_entries = int(self.raw_sizes.sum())
        self.entry_index = np.int32 if self.raw_entries < np.iinfo(np.int32).max else np.int64
        self.column_index = np.int32 if max(num_nodes, self.raw_entries) < np.iinfo(np.int32).max else np.int64
        # Read at construction (not bound as a default), so that tests can shrink the chunks.
        self.chunk_entries = self.CHUNK_ENTRIES if chunked else None
        numpy_dtype = torch.empty((), dtype=dtype).numpy().dtype
        capacity = min(self.raw_entries, self.chunk_entries or self.raw_entries)
        self.steps = np.empty(capacity, dtype=self.entry_index)
        self.weights = np.empty(capacity, dtype=numpy_dtype)
        self.columns = np.empty(capacity, dtype=np.dtype(column_dtype))
        self.slot_pointer = np.empty(capacity + 1, dtype=self.entry_index)
        self.row_pointer = np.zeros(self.starts.size + 1, dtype=np.int64)
        self.entries_done = 0
        self.slots_done = 0
        self.max_step = 0

    def chunks(self):
        """Yield ``(lo, hi, raw_indptr, scratch)`` for consecutive row ranges."""
        rows = self.starts.size
        if rows == 0:
            return
        cumulative = np.cumsum(self.raw_sizes)
        limit = self.chunk_entries or int(cumulative[-1])
        scratch_size = 0
        bounds = [0]
        while bounds[-1] < rows:
            lo = bounds[-1]
            base = cumulative[lo - 1] if lo else 0
            hi = int(np.searchsorted(cumulative, base + limit, side="right"))
            hi = max(hi, lo + 1)
            scratch_size = max(scratch_size, int(cumulative[hi - 1] - base))
            bounds.append(hi)
        scratch = (np.empty(scratch_size, dtype=self.columns.dtype),
                   np.empty(scratch_size, dtype=np.uint16),
                   np.empty(scratch_size, dtype=np.float64))
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            raw_indptr = np.zeros(hi - lo + 1, dtype=np.int64)
            np.cumsum(self.raw_sizes[lo:hi], out=raw_indptr[1:])
            yield lo, hi, raw_indptr, scratch

    @staticmethod
    def counts(rows: int) -> tuple[np.ndarray, np.ndarray]:
        return np.empty(rows, dtype=np.int64), np.empty(rows, dtype=np.int64)

    #: Factor by which the output arrays grow when a chunk does not fit.
    GROWTH = 1.25

    def _reserve(self, entries: int, slots: int) -> None:
        """Grow the entry arrays to hold ``entries`` entries and the slot arrays ``slots`` slots, where they do not."""
        entry_capacity = self._grown(self.steps.size, entries)
        slot_capacity = self._grown(self.columns.size, slots)
        added = ((entry_capacity - self.steps.size) * (self.steps.itemsize + self.weights.itemsize)
                 + (slot_capacity - self.columns.size) * (self.columns.itemsize + self.slot_pointer.itemsize))
        if added == 0:
            return
        check_memory(f"graph random features of {self.starts.size} rows ({entries} entries so far)", added,
                     "; use fewer walkers or start nodes, a larger p_halt, or a max_length")
        # In place where the allocator can (realloc); the new tail is zero-filled.
        self.steps.resize(entry_capacity, refcheck=False)
        self.weights.resize(entry_capacity, refcheck=False)
        self.columns.resize(slot_capacity, refcheck=False)
        self.slot_pointer.resize(slot_capacity + 1, refcheck=False)

    def _grown(self, capacity: int, needed: int) -> int:
        """``capacity`` if it holds ``needed``, else grown by :attr:`GROWTH` (at least to ``needed``, at most
        the raw entries)."""
        if needed <= capacity:
            return capacity
        return min(self.raw_entries, max(needed, int(capacity * self.GROWTH)))

    def gather(self, lo: int, hi: int, raw_indptr: np.ndarray, scratch: tuple[np.ndarray, ...],
               entry_counts: np.ndarray, distinct_counts: np.ndarray) -> None:
        entry_offsets = np.empty(hi - lo + 1, dtype=np.int64)
        entry_offsets[0] = self.entries_done
        np.cumsum(entry_counts, out=entry_offsets[1:])
        entry_offsets[1:] += self.entries_done
        slot_offsets = np.empty(hi - lo + 1, dtype=np.int64)
        slot_offsets[0] = self.slots_done
        np.cumsum(distinct_counts, out=slot_offsets[1:])
        slot_offsets[1:] += self.slots_done
        self._reserve(int(entry_offsets[-1]), int(slot_offsets[-1]))
        compiled.gather_coalesced(raw_indptr, *scratch, entry_offsets, slot_offsets, self.steps,
                                 self.weights, self.columns, self.slot_pointer)
        self.row_pointer[lo + 1: hi + 1] = slot_offsets[1:]
        self.entries_done = int(entry_offsets[-1])
        self.slots_done = int(slot_offsets[-1])
        if self.entries_done:
            self.max_step = max(self.max_step, int(self.steps[int(entry_offsets[0]):self.entries_done].max(initial=0)))

    def finish(self) -> GraphRandomFeatures:
        self.slot_pointer[self.slots_done] = self.entries_done
        # Shrink in place: realloc returns the untouched tail without copying.
        self.steps.resize(self.entries_done, refcheck=False)
        self.weights.resize(self.entries_done, refcheck=False)
        self.columns.resize(self.slots_done, refcheck=False)
        self.slot_pointer.resize(self.slots_done + 1, refcheck=False)
        structure = self.column_index
        return GraphRandomFeatures(
            num_nodes=self.num_nodes,
            start_nodes=torch.from_numpy(self.starts),
            row_pointer=torch.from_numpy(self.row_pointer.astype(structure)),
            columns=torch.from_numpy(self.columns.astype(structure, copy=False)),
            slot_pointer=torch.from_numpy(self.slot_pointer),
            steps=torch.from_numpy(self.steps),
            weights=torch.from_numpy(self.weights),
            num_terms=self.max_step + 1,
        )
