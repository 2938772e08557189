r"""The sparsity pattern of a graph-random-feature matrix, the index arrays derived from it, and segment sums.

Graph random features (paper, appendix on GRF approximation, Appendix C.1 "Constructing graph random
features" [app:grf_approx]) give every start node a sparse feature vector :math:`\phi(v_i) \in
\mathbb R^N` whose non-zero coordinates are the nodes its walks visited. Stacking the rows gives
:math:`\Phi(\theta) = \sum_t f_\theta(t)\,\Phi_t`, whose *pattern* is fixed once the walks
are sampled while its *values* follow the hyperparameters :math:`\theta`. Everything
here depends on the pattern only, so it is computed once per pattern and kept with it
(:meth:`~gp_couple._derived.DerivedCache.derived`): the
transposed pattern with the permutation that gathers the transposed values, and the
*compact column space* (the columns the rows touch, relabelled :math:`0..C'-1`), in
which products skip the :math:`N - C'` graph nodes that no walk of these rows visited.

The pattern sits below the sampler in the layers, so the features carry the one pattern
that the operators and kernels then use.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch
from torch import Tensor

from ._derived import DerivedCache

__all__ = ["CSRPattern", "segment_sum", "sparse_csr"]


def _as_index(tensor: Any, name: str) -> Tensor:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{name} must be a torch tensor, got {type(tensor).__name__}")
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {tensor.dtype}")
    if tensor.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
    # int64 indices: torch's CPU CSR routines are one to two orders of magnitude slower
    # with int32 indices (measured with torch 2.13), and gathers need int64 anyway.
    return tensor.to(torch.int64).contiguous()


def sparse_csr(row_pointer: Tensor, columns: Tensor, values: Tensor, size: tuple[int, int]) -> Tensor:
    """A torch CSR tensor built without invariant checks (the callers' patterns satisfy them).

    :param row_pointer: Row pointer (shape ``(R + 1,)``).
    :param columns: Column of every stored entry, sorted within rows.
    :param values: Value of every stored entry.
    :param size: ``(R, C)``.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
        return torch.sparse_csr_tensor(row_pointer, columns, values, size=size, check_invariants=False)


def segment_sum(values: Tensor, segments: Tensor, num_segments: int) -> Tensor:
    """Sum ``values[..., u]`` into ``out[..., segments[u]]`` (shape ``(*batch, num_segments)``)."""
    out = values.new_zeros(*values.shape[:-1], num_segments)
    return out.index_add(-1, segments, values)


class CSRPattern(DerivedCache):
    r"""Immutable CSR sparsity pattern of an :math:`R \times C` matrix.

    Column indices must be sorted and distinct within each row (the pattern of
    :class:`~gp_couple.features.graph_random_features.GraphRandomFeatures` is). Derived index arrays (the
    row of every stored entry, the linear keys, the transposed pattern, the compact
    column space) are computed on first use and cached, so one pattern object shared by
    many operators (e.g. one per training iteration) computes them once.

    :param row_pointer: Row pointer (shape ``(R + 1,)``, integer).
    :param columns: Column index of every stored entry (shape ``(nnz,)``, integer).
    :param num_columns: Number of columns :math:`C`.
    :param validate: Check the CSR invariants (one vectorised pass; builders that
        guarantee them pass ``False``).
    :raises TypeError: If the indices are not integer tensors.
    :raises ValueError: If the arrays do not form a valid CSR pattern.
    """

    def __init__(self, row_pointer: Tensor, columns: Tensor, num_columns: int, *,
                 validate: bool = True) -> None:
        self.row_pointer = _as_index(row_pointer, "row_pointer")
        self.columns = _as_index(columns, "columns")
        if isinstance(num_columns, bool) or not isinstance(num_columns, int) or num_columns < 0:
            raise ValueError(f"num_columns must be a non-negative int, got {num_columns!r}")
        self.num_columns = int(num_columns)
        if self.row_pointer.numel() < 1:
            raise ValueError("row_pointer must have at least one entry")
        if self.row_pointer.device != self.columns.device:
            raise ValueError("row_pointer and columns must be on the same device")
        if validate:
            self._validate()

    def _validate(self) -> None:
        pointer, columns = self.row_pointer, self.columns
        if int(pointer[0]) != 0 or int(pointer[-1]) != columns.numel():
            raise ValueError(
                f"row_pointer must start at 0 and end at nnz={columns.numel()}, got "
                f"{int(pointer[0])} and {int(pointer[-1])}")
        if torch.any(pointer[1:] < pointer[:-1]):
            raise ValueError("row_pointer must be non-decreasing")
        if columns.numel():
            low, high = int(columns.min()), int(columns.max())
            if low < 0 or high >= self.num_columns:
                raise ValueError(f"columns must lie in [0, {self.num_columns}); they run from {low} to {high}, "
                                 "outside it")
            if torch.any(self.keys[1:] <= self.keys[:-1]):
                raise ValueError("columns must be sorted and distinct within each row")

    # ---------------------------------------------------------------- sizes
    @property
    def num_rows(self) -> int:
        """Number of rows :math:`R`."""
        return self.row_pointer.numel() - 1

    @property
    def nnz(self) -> int:
        """Number of stored entries."""
        return self.columns.numel()

    @property
    def shape(self) -> torch.Size:
        """``(R, C)``."""
        return torch.Size((self.num_rows, self.num_columns))

    @property
    def device(self) -> torch.device:
        """Device of the index tensors."""
        return self.columns.device

    def __repr__(self) -> str:
        return f"CSRPattern(shape={tuple(self.shape)}, nnz={self.nnz})"

    # ---------------------------------------------------------------- derived indices (kept by derived())
    @property
    def row_counts(self) -> Tensor:
        """Stored entries per row (shape ``(R,)``)."""
        return self.derived("row_counts", lambda: self.row_pointer.diff())

    @property
    def row_indices(self) -> Tensor:
        """Row of every stored entry (shape ``(nnz,)``, sorted)."""
        return self.derived("row_indices", lambda: torch.repeat_interleave(
            torch.arange(self.num_rows, device=self.device), self.row_counts, output_size=self.nnz))

    @property
    def keys(self) -> Tensor:
        """Strictly increasing linear index ``row * C + column`` of every entry."""
        return self.derived("keys", lambda: self.row_indices * self.num_columns + self.columns)

    def transpose(self) -> tuple[CSRPattern, Tensor]:
        r"""The pattern of :math:`\Phi^\top` and the permutation of the values.

        :return: ``(pattern_t, permutation)`` with ``values_t = values[..., permutation]``.
        """
        def build() -> tuple[CSRPattern, Tensor]:
            # A stable sort by column keeps rows ascending within every column, so the
            # transposed pattern is sorted as CSR requires.
            _, permutation = torch.sort(self.columns, stable=True)
            counts = torch.bincount(self.columns, minlength=self.num_columns)
            pointer = torch.zeros(self.num_columns + 1, dtype=torch.int64, device=self.device)
            torch.cumsum(counts, 0, out=pointer[1:])
            pattern_t = CSRPattern(pointer, self.row_indices[permutation], self.num_rows,
                                   validate=False)
            # Transposing twice gives back this pattern with the inverse permutation.
            inverse = torch.empty_like(permutation)
            inverse[permutation] = torch.arange(self.nnz, device=self.device)
            pattern_t.derived("transpose", lambda: (self, inverse))
            return pattern_t, permutation

        return self.derived("transpose", build)

    # ---------------------------------------------------------------- compact column space
    def touched_columns(self) -> Tensor:
        """The distinct columns that hold at least one entry (sorted, int64)."""
        return self.derived("touched", lambda: torch.unique(self.columns, sorted=True))

    def relabel_columns(self, space: Tensor) -> CSRPattern:
        r"""This pattern with every column ``c`` replaced by its position in ``space``.

        Relabelling is monotone, so rows stay sorted and the transposed-values
        permutation of the result equals this pattern's.

        :param space: Sorted distinct columns that include every touched column.
        :return: The pattern over ``space.numel()`` columns.
        """
        columns = torch.searchsorted(space, self.columns)
        relabelled = CSRPattern(self.row_pointer, columns, space.numel(), validate=False)
        # Row-side index arrays do not depend on the column labels.
        kept = self.__dict__.get("_derived", {})
        for key in ("row_counts", "row_indices"):
            if key in kept:
                relabelled.derived(key, lambda key=key: kept[key])
        return relabelled

    def compact(self) -> tuple[CSRPattern, Tensor]:
        r"""The pattern over its touched columns only, and those columns.

        For :math:`\Phi` with :math:`C'` touched columns out of :math:`C`,
        :math:`\Phi x = \Phi' x[\mathrm{touched}]` and
        :math:`\Phi^\top y` is zero outside the touched rows, so products (and above all
        the Gram products :math:`\Phi\Phi^\top x`) never touch the :math:`C - C'`
        untouched columns.

        :return: ``(pattern_c, touched)``: an :math:`R \times C'` pattern and the sorted
            original column of each of its columns.
        """
        def build() -> tuple[CSRPattern, Tensor]:
            touched = self.touched_columns()
            if touched.numel() == self.num_columns:
                return self, touched
            return self.relabel_columns(touched), touched

        return self.derived("compact", build)

    def joint_compact(self, other: CSRPattern) -> tuple[CSRPattern, CSRPattern, Tensor]:
        r"""This pattern and ``other`` relabelled onto the union of their touched columns.

        The shared inner space of a cross product :math:`\Phi_A\Phi_B^\top`. Cached per
        ``other`` (held weakly), so repeated cross products with the same pair of
        patterns (the kernel caches its row selections) build it once.

        :param other: A pattern with the same number of columns.
        :return: ``(self_c, other_c, union)``.
        """
        if other is self:
            compact, touched = self.compact()
            return compact, compact, touched
        pairs: dict[int, Any] = self.derived("joint", dict)
        hit = pairs.get(id(other))
        if hit is not None and hit[0]() is other:
            return hit[1]
        union = torch.unique(torch.cat((self.touched_columns(), other.touched_columns())), sorted=True)
        result = (self.relabel_columns(union), other.relabel_columns(union), union)
        pairs[id(other)] = (weakref.ref(other), result)
        return result

    def restrict_columns(self, space: Tensor) -> tuple[CSRPattern, Tensor]:
        r"""The entries whose column lies in ``space``, relabelled onto ``space``.

        In a product :math:`\Phi x` with :math:`x` zero outside ``space`` the other
        entries meet zeros, so they can be dropped: the cross covariance of test and
        training rows only needs the nodes that both sides' walks visited.

        :param space: Sorted distinct columns.
        :return: ``(pattern, slots)``: an :math:`R \times |\mathrm{space}|` pattern and the
            entry index of each of its entries (``new_values = values[..., slots]``).
        """
        if space.numel() == 0:
            empty = torch.zeros(0, dtype=torch.int64, device=self.device)
            return CSRPattern(torch.zeros(self.num_rows + 1, dtype=torch.int64, device=self.device),
                              empty, 0, validate=False), empty
        position = torch.searchsorted(space, self.columns).clamp_(max=space.numel() - 1)
        keep = space[position] == self.columns
        slots = keep.nonzero().squeeze(-1)
        counts = segment_sum(keep.to(torch.int64), self.row_indices, self.num_rows)
        pointer = torch.zeros(self.num_rows + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(counts, 0, out=pointer[1:])
        return CSRPattern(pointer, position[slots], space.numel(), validate=False), slots

    def joint_restricted(self, other: CSRPattern) -> tuple[tuple[CSRPattern, Tensor], tuple[CSRPattern, Tensor]]:
        r"""This pattern and ``other`` restricted to the columns that both touch.

        The inner space of the products of a cross product :math:`\Phi_A\Phi_B^\top`
        (its intersection, not the union of :meth:`joint_compact`: an entry of either
        side outside it is multiplied by zero). Cached per ``other`` (held weakly).

        :param other: A pattern with the same number of columns.
        :return: ``((self_r, self_slots), (other_r, other_slots))`` as in :meth:`restrict_columns`.
        """
        pairs: dict[int, Any] = self.derived("joint_restricted", dict)
        hit = pairs.get(id(other))
        if hit is not None and hit[0]() is other:
            return hit[1]
        mine, theirs = self.touched_columns(), other.touched_columns()
        shared = theirs
        if theirs.numel():
            position = torch.searchsorted(theirs, mine).clamp_(max=theirs.numel() - 1)
            shared = mine[theirs[position] == mine]
        result = (self.restrict_columns(shared), other.restrict_columns(shared))
        pairs[id(other)] = (weakref.ref(other), result)
        return result

    # ---------------------------------------------------------------- row selection
    def gather_rows(self, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Stored entries of the given rows, in order.

        :param rows: Row indices (1-D int64, in range; repeats allowed).
        :return: ``(slots, owner, counts)``: the entry index of every gathered entry,
            the position in ``rows`` it belongs to, and the entries per requested row.
        """
        counts = self.row_counts[rows]
        total = int(counts.sum()) if counts.numel() else 0
        owner = torch.repeat_interleave(torch.arange(rows.numel(), device=self.device), counts,
                                        output_size=total)
        first = torch.cumsum(counts, 0) - counts
        slots = self.row_pointer[rows][owner] + (torch.arange(total, device=self.device) - first[owner])
        return slots, owner, counts

    def select_rows(self, rows: Tensor) -> tuple[CSRPattern, Tensor]:
        """Pattern of the selected rows and the entry index of each of its entries.

        :param rows: Row indices (1-D int64, in range; repeats allowed).
        :return: ``(pattern, slots)`` with ``new_values = values[..., slots]``.
        """
        slots, _, counts = self.gather_rows(rows)
        pointer = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(counts, 0, out=pointer[1:])
        return CSRPattern(pointer, self.columns[slots], self.num_columns, validate=False), slots

    def slice_rows(self, start: int, stop: int) -> tuple[CSRPattern, slice]:
        """Pattern of the contiguous rows ``start:stop`` (no gather: the values are a slice).

        :return: ``(pattern, entries)`` with ``new_values = values[..., entries]``.
        """
        first, last = int(self.row_pointer[start]), int(self.row_pointer[stop])
        pattern = CSRPattern(self.row_pointer[start:stop + 1] - first, self.columns[first:last],
                             self.num_columns, validate=False)
        return pattern, slice(first, last)

    def normalize_rows(self, index: Any) -> Tensor:
        """Turn a slice or integer tensor over the rows into in-range int64 row indices."""
        return torch.arange(self.num_rows, device=self.device)[index].reshape(-1)

    # ---------------------------------------------------------------- torch tensors
    def csr(self, values: Tensor) -> Tensor:
        """A torch CSR tensor with this pattern and the given 1-D values."""
        return sparse_csr(self.row_pointer, self.columns, values, tuple(self.shape))

    def to(self, device: torch.device | str | None = None, dtype: Any = None,
           **kwargs: Any) -> CSRPattern:
        """Move to ``device``; ``dtype`` is ignored (the pattern holds only indices)."""
        if device is None or torch.device(device) == self.device:
            return self
        return CSRPattern(self.row_pointer.to(device), self.columns.to(device), self.num_columns,
                          validate=False)

    def cpu(self) -> CSRPattern:
        """The pattern on the CPU."""
        return self.to("cpu")

    def cuda(self, device_id: Any = None) -> CSRPattern:
        """The pattern on a CUDA device."""
        return self.to(torch.device("cuda" if device_id is None else f"cuda:{int(device_id)}"))
