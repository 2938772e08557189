r"""The sparse graph-random-feature matrix :math:`\Phi` as a :class:`~linear_operator.LinearOperator`.

Graph random features (paper, app:grf_approx) give every start node a sparse feature
vector :math:`\phi(v_i) \in \mathbb R^N` whose non-zero coordinates are the nodes its
walks visited. Stacking the rows gives the rectangular feature matrix

.. math::

    \Phi(\theta) = \sum_t f_\theta(t)\, \Phi_t \in \mathbb R^{R \times N},
    \qquad \widehat{\mathbf K} = \Phi \Phi^\top ,

whose *sparsity pattern* is fixed once the walks are sampled while its *values* depend
on the kernel hyperparameters :math:`\theta` through the modulation function.

:class:`CSRPattern` holds the pattern (CSR row pointer and column indices, plus lazily
cached derived index arrays such as the transposed pattern), and
:class:`SparseFeatureLinearOperator` is :math:`\Phi` (or :math:`\Phi^\top`): the
values are its only tensor argument, with optional leading batch dimensions that share
the pattern (e.g. a batch of hyperparameter samples under Pyro). Products are sparse
CSR products with a hand-written backward, so the gradient with respect to the values
is a sampled dense-dense product on the pattern and never an :math:`R \times N` dense
matrix.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import torch
from linear_operator.operators import LinearOperator
from linear_operator.utils.getitem import _is_noop_index, _noop_index
from linear_operator.utils.memoize import cached
from torch import Tensor

__all__ = ["CSRPattern", "SparseFeatureLinearOperator", "segment_sum"]


def _as_index(tensor: Any, name: str) -> Tensor:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{name} must be a torch tensor, got {type(tensor).__name__}")
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {tensor.dtype}")
    if tensor.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
    # int64 indices: torch's CPU CSR kernels are one to two orders of magnitude slower
    # with int32 indices (measured with torch 2.13), and gathers need int64 anyway.
    return tensor.to(torch.int64).contiguous()


def segment_sum(values: Tensor, segments: Tensor, num_segments: int) -> Tensor:
    """Sum ``values[..., u]`` into ``out[..., segments[u]]`` (shape ``(*batch, num_segments)``)."""
    out = values.new_zeros(*values.shape[:-1], num_segments)
    return out.index_add(-1, segments, values)


class CSRPattern:
    r"""Immutable CSR sparsity pattern of an :math:`R \times C` matrix.

    Column indices must be sorted and distinct within each row (the pattern of
    :class:`~gp_couple.features.grf.GraphRandomFeatures` is). Derived index arrays (the
    row of every stored entry, the linear keys, the transposed pattern) are computed
    on first use and cached, so one pattern object shared by many operators (e.g. one
    per training iteration) computes them once.

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
        self._cache: dict[str, Any] = {}
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
            if int(columns.min()) < 0 or int(columns.max()) >= self.num_columns:
                raise ValueError(f"columns must lie in [0, {self.num_columns})")
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

    # ---------------------------------------------------------------- derived indices
    def _cached(self, key: str, build: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    @property
    def row_counts(self) -> Tensor:
        """Stored entries per row (shape ``(R,)``)."""
        return self._cached("row_counts", lambda: self.row_pointer.diff())

    @property
    def row_indices(self) -> Tensor:
        """Row of every stored entry (shape ``(nnz,)``, sorted)."""
        return self._cached("row_indices", lambda: torch.repeat_interleave(
            torch.arange(self.num_rows, device=self.device), self.row_counts, output_size=self.nnz))

    @property
    def keys(self) -> Tensor:
        """Strictly increasing linear index ``row * C + column`` of every entry."""
        return self._cached("keys", lambda: self.row_indices * self.num_columns + self.columns)

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
            pattern_t._cache["transpose"] = (self, inverse)
            return pattern_t, permutation

        return self._cached("transpose", build)

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
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
            return torch.sparse_csr_tensor(self.row_pointer, self.columns, values,
                                           size=tuple(self.shape), check_invariants=False)

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


# -------------------------------------------------------------------- products
def _broadcast_batch(*shapes: torch.Size) -> torch.Size:
    try:
        return torch.broadcast_shapes(*shapes)
    except RuntimeError as error:
        raise ValueError(f"batch shapes {[tuple(s) for s in shapes]} do not broadcast") from error


def _spmm(pattern: CSRPattern, values: Tensor, rhs: Tensor) -> Tensor:
    """``Phi @ rhs`` for values ``(*vb, nnz)`` and ``rhs`` ``(*rb, C, k)`` (no autograd)."""
    num_rows = pattern.num_rows
    if values.ndim == 1:
        # One CSR product for every right-hand side: fold rhs batches into columns.
        lead, (inner, width) = rhs.shape[:-2], rhs.shape[-2:]
        flat = rhs.reshape(-1, inner, width).transpose(0, 1).reshape(inner, -1)
        out = pattern.csr(values) @ flat
        return out.reshape(num_rows, -1, width).transpose(0, 1).reshape(*lead, num_rows, width)
    batch = _broadcast_batch(values.shape[:-1], rhs.shape[:-2])
    values = values.expand(*batch, pattern.nnz)
    rhs = rhs.expand(*batch, *rhs.shape[-2:])
    out = rhs.new_empty(*batch, num_rows, rhs.shape[-1])
    for index in itertools.product(*(range(size) for size in batch)):
        out[index] = pattern.csr(values[index]) @ rhs[index]
    return out


def _sampled_dots(pattern: CSRPattern, left: Tensor, right: Tensor, shape: torch.Size) -> Tensor:
    r"""Gradient of :math:`\langle L, \Phi R\rangle` w.r.t. the values, reduced to ``shape``.

    Entry ``u = (r, c)`` is :math:`\sum_k L_{rk} R_{ck}` (summed over batches that the
    values broadcast over): a sampled dense-dense product that never forms the
    :math:`R \times C` matrix.
    """
    batch = _broadcast_batch(left.shape[:-2], right.shape[:-2])
    zeros = pattern.csr(left.new_zeros(pattern.nnz))
    if len(shape) == 1:
        # Unbatched values: the batch sum folds into the inner dimension.
        left = left.expand(*batch, *left.shape[-2:]).movedim(-2, 0).reshape(pattern.num_rows, -1)
        right = right.expand(*batch, *right.shape[-2:]).movedim(-2, 0).reshape(pattern.num_columns, -1)
        return torch.sparse.sampled_addmm(zeros, left.contiguous(), right.t().contiguous(), beta=0.0).values()
    batch = _broadcast_batch(batch, shape[:-1])
    left = left.expand(*batch, *left.shape[-2:])
    right = right.expand(*batch, *right.shape[-2:])
    out = left.new_empty(*batch, pattern.nnz)
    for index in itertools.product(*(range(size) for size in batch)):
        out[index] = torch.sparse.sampled_addmm(zeros, left[index].contiguous(),
                                                right[index].t().contiguous(), beta=0.0).values()
    return _reduce_to(out, shape)


def _reduce_to(tensor: Tensor, shape: torch.Size) -> Tensor:
    """Sum broadcast dimensions so that ``tensor`` has ``shape`` (expanding if needed)."""
    full = torch.broadcast_shapes(tensor.shape, shape)
    return tensor.expand(full).sum_to_size(shape)


class _SparseMatmul(torch.autograd.Function):
    """``Phi @ rhs`` with gradients w.r.t. both the values and ``rhs``."""

    @staticmethod
    def forward(ctx: Any, values: Tensor, rhs: Tensor, pattern: CSRPattern) -> Tensor:
        ctx.pattern = pattern
        ctx.save_for_backward(values, rhs)
        return _spmm(pattern, values, rhs)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        values, rhs = ctx.saved_tensors
        pattern = ctx.pattern
        grad_values = grad_rhs = None
        if ctx.needs_input_grad[0]:
            grad_values = _sampled_dots(pattern, grad_output, rhs, values.shape)
        if ctx.needs_input_grad[1]:
            pattern_t, permutation = pattern.transpose()
            # Through apply, so that a double backward stays differentiable in grad_output.
            grad_rhs = _reduce_to(_SparseMatmul.apply(values[..., permutation], grad_output, pattern_t),
                                  rhs.shape)
        return grad_values, grad_rhs, None


def sparse_matmul(pattern: CSRPattern, values: Tensor, rhs: Tensor) -> Tensor:
    """Differentiable product of the CSR matrix ``(pattern, values)`` with dense ``rhs``.

    :param pattern: The :math:`R \\times C` pattern.
    :param values: Values, shape ``(*batch, nnz)``.
    :param rhs: Dense ``(*batch2, C, k)`` or ``(*batch2, C)``.
    :return: ``(*broadcast, R, k)`` (or ``(*broadcast, R)`` for a vector ``rhs``).
    """
    if rhs.dtype != values.dtype:
        raise TypeError(f"rhs has dtype {rhs.dtype} but the sparse matrix has dtype {values.dtype}")
    vector = rhs.ndim == 1
    if vector:
        rhs = rhs.unsqueeze(-1)
    if rhs.shape[-2] != pattern.num_columns:
        raise ValueError(f"cannot multiply a {tuple(pattern.shape)} matrix with rhs of shape "
                         f"{tuple(rhs.shape)}")
    out = _SparseMatmul.apply(values, rhs, pattern)
    return out.squeeze(-1) if vector else out


# -------------------------------------------------------------------- the operator
class SparseFeatureLinearOperator(LinearOperator):
    r"""The sparse feature matrix :math:`\Phi \in \mathbb R^{R \times N}` (or its transpose).

    The values are the operator's only tensor argument (so they are what gradients
    flow to); the pattern is shared by every batch entry. Batch dimensions are leading
    dimensions of ``values``.

    :param values: Non-zero values, shape ``(*batch, nnz)``, floating point.
    :param pattern: The sparsity pattern of :math:`\Phi` (:class:`CSRPattern`).
    :param transposed: Represent :math:`\Phi^\top` (``N x R``) instead of :math:`\Phi`.
    """

    def __init__(self, values: Tensor, *, pattern: CSRPattern, transposed: bool = False) -> None:
        if not isinstance(pattern, CSRPattern):
            raise TypeError(f"pattern must be a CSRPattern, got {type(pattern).__name__}")
        if not isinstance(values, Tensor):
            raise TypeError(f"values must be a torch tensor, got {type(values).__name__}")
        if not values.dtype.is_floating_point:
            raise TypeError(f"values must be floating point, got dtype {values.dtype}")
        if values.ndim < 1 or values.shape[-1] != pattern.nnz:
            raise ValueError(f"values must have shape (*batch, {pattern.nnz}), got {tuple(values.shape)}")
        if values.device != pattern.device:
            raise ValueError(f"values are on {values.device} but the pattern is on {pattern.device}")
        super().__init__(values, pattern=pattern, transposed=bool(transposed))
        self.values = values
        self.pattern = pattern
        self.transposed = bool(transposed)

    @classmethod
    def from_csr(cls, row_pointer: Tensor, columns: Tensor, values: Tensor,
                 num_columns: int) -> SparseFeatureLinearOperator:
        """Build :math:`\\Phi` from CSR arrays (validated)."""
        return cls(values, pattern=CSRPattern(row_pointer, columns, num_columns))

    # ---------------------------------------------------------------- orientation
    def _stored(self) -> tuple[CSRPattern, Tensor]:
        """Pattern and values of the represented matrix in CSR (row-major) orientation."""
        if not self.transposed:
            return self.pattern, self.values
        pattern_t, permutation = self.pattern.transpose()
        return pattern_t, self.values[..., permutation]

    def as_csr(self) -> SparseFeatureLinearOperator:
        """The same matrix stored row-major (``transposed=False``)."""
        if not self.transposed:
            return self
        pattern, values = self._stored()
        return self.__class__(values, pattern=pattern)

    def _with_values(self, values: Tensor) -> SparseFeatureLinearOperator:
        return self.__class__(values, pattern=self.pattern, transposed=self.transposed)

    # ---------------------------------------------------------------- required hooks
    def _size(self) -> torch.Size:
        rows, cols = self.pattern.shape
        if self.transposed:
            rows, cols = cols, rows
        return torch.Size((*self.values.shape[:-1], rows, cols))

    def _transpose_nonbatch(self) -> SparseFeatureLinearOperator:
        return self.__class__(self.values, pattern=self.pattern, transposed=not self.transposed)

    def _matmul(self, rhs: Tensor) -> Tensor:
        if isinstance(rhs, LinearOperator):
            rhs = rhs.to_dense()
        pattern, values = self._stored()
        return sparse_matmul(pattern, values, rhs)

    def _t_matmul(self, rhs: Tensor | LinearOperator) -> Tensor:
        return self._transpose_nonbatch()._matmul(rhs)

    def _bilinear_derivative(self, left_vecs: Tensor, right_vecs: Tensor) -> tuple[Tensor | None, ...]:
        if not self.values.requires_grad:
            return (None,)
        if left_vecs.ndim == 1:
            left_vecs, right_vecs = left_vecs.unsqueeze(-1), right_vecs.unsqueeze(-1)
        if self.transposed:
            # u^T Phi^T v = v^T Phi u
            left_vecs, right_vecs = right_vecs, left_vecs
        return (_sampled_dots(self.pattern, left_vecs, right_vecs, self.values.shape),)

    # ---------------------------------------------------------------- batch handling
    def _expand_batch(self, batch_shape: torch.Size | list[int]) -> SparseFeatureLinearOperator:
        return self._with_values(self.values.expand(*batch_shape, self.pattern.nnz))

    def _sum_batch(self, dim: int) -> SparseFeatureLinearOperator:
        # The pattern is shared, so a batch sum is a sum of the values.
        return self._with_values(self.values.sum(dim))

    def _mul_constant(self, other: float | Tensor) -> SparseFeatureLinearOperator:
        if isinstance(other, Tensor) and other.ndim:
            other = other.unsqueeze(-1)
        return self._with_values(self.values * other)

    # ---------------------------------------------------------------- indexing
    def _select_rows(self, index: Any) -> SparseFeatureLinearOperator:
        """Rows ``index`` (slice or integer tensor) of the represented matrix, stored row-major."""
        pattern, permutation = (self.pattern, None) if not self.transposed else self.pattern.transpose()
        if isinstance(index, slice) and index.step in (None, 1):
            start, stop, _ = index.indices(pattern.num_rows)
            selected, slots = pattern.slice_rows(start, max(start, stop))
        else:
            rows = pattern.normalize_rows(index)
            if rows.numel() == pattern.num_rows and torch.equal(rows, torch.arange(rows.numel(), device=rows.device)):
                return self.as_csr()
            selected, slots = pattern.select_rows(rows)
        if permutation is not None:
            slots = permutation[slots]
        return self.__class__(self.values[..., slots], pattern=selected)

    def _getitem(self, row_index: Any, col_index: Any, *batch_indices: Any) -> LinearOperator:
        op: SparseFeatureLinearOperator = self
        if batch_indices and not all(_is_noop_index(index) for index in batch_indices):
            op = self._with_values(self.values[(*batch_indices, _noop_index)])
        if not _is_noop_index(row_index):
            op = op._select_rows(row_index)
        if not _is_noop_index(col_index):
            # Columns of Phi are rows of Phi^T.
            op = op._transpose_nonbatch()._select_rows(col_index)._transpose_nonbatch()
        return op

    def _get_indices(self, row_index: Tensor, col_index: Tensor, *batch_indices: Tensor) -> Tensor:
        shape = torch.broadcast_shapes(row_index.shape, col_index.shape,
                                       *(index.shape for index in batch_indices))
        rows = row_index.expand(shape).reshape(-1)
        cols = col_index.expand(shape).reshape(-1)
        if self.transposed:
            rows, cols = cols, rows
        found, slots = self._lookup(rows, cols)
        if batch_indices:
            flat_batch = tuple(index.expand(shape).reshape(-1) for index in batch_indices)
            picked = self.values[(*flat_batch, slots)]
        else:
            picked = self.values[..., slots]
        return torch.where(found, picked, torch.zeros_like(picked)).reshape(shape)

    def _lookup(self, rows: Tensor, cols: Tensor) -> tuple[Tensor, Tensor]:
        """Whether ``(rows[k], cols[k])`` is stored and, if so, its entry index."""
        pattern = self.pattern
        if pattern.nnz == 0:
            zeros = torch.zeros_like(rows)
            return zeros.bool(), zeros
        queries = rows.to(torch.int64) * pattern.num_columns + cols.to(torch.int64)
        slots = torch.searchsorted(pattern.keys, queries).clamp_(max=pattern.nnz - 1)
        return pattern.keys[slots] == queries, slots

    def _diagonal(self) -> Tensor:
        size = min(self.matrix_shape)
        index = torch.arange(size, device=self.device)
        found, slots = self._lookup(index, index)
        picked = self.values[..., slots]
        return torch.where(found, picked, torch.zeros_like(picked))

    # ---------------------------------------------------------------- dense
    @cached
    def to_dense(self) -> Tensor:
        pattern = self.pattern
        batch = self.values.shape[:-1]
        flat = self.values.new_zeros(*batch, pattern.num_rows * pattern.num_columns)
        flat = flat.scatter(-1, pattern.keys.expand(*batch, pattern.nnz), self.values)
        dense = flat.reshape(*batch, *pattern.shape)
        return dense.mT if self.transposed else dense

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(shape={tuple(self.shape)}, nnz={self.pattern.nnz}, "
                f"dtype={self.dtype})")
