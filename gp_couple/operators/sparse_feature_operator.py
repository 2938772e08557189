r"""The sparse graph-random-feature matrix :math:`\Phi` as a :class:`~linear_operator.LinearOperator`.

Stacking the feature vectors :math:`\phi(v_i)` of the start nodes (paper, appendix on
GRF approximation, Appendix C.1 "Constructing graph random features" [app:grf_approx]) gives the
rectangular feature matrix

.. math::

    \Phi(\theta) = \sum_t f_\theta(t)\, \Phi_t \in \mathbb R^{R \times N},
    \qquad \widehat{\mathbf K} = \Phi \Phi^\top ,

whose pattern (:class:`~gp_couple.sparse_pattern.CSRPattern`) is fixed once the
walks are sampled while its values follow :math:`\theta`.
:class:`SparseFeatureLinearOperator` is :math:`\Phi` (or :math:`\Phi^\top`): the values are
its only tensor argument, with optional leading batch dimensions that share the pattern
(e.g. a batch of hyperparameter samples under Pyro). Products run on the pattern's
compact column space (the nodes the rows' walks touched) through
:func:`~gp_couple.operators.sparse_products.sparse_matmul`, whose backward never forms an
:math:`R \times N` dense matrix.
"""

from __future__ import annotations

from typing import Any

import scipy.sparse as sp
import torch
from linear_operator.operators import LinearOperator
from linear_operator.utils.getitem import _is_noop_index, _noop_index
from linear_operator.utils.memoize import cached
from torch import Tensor

from ..sparse_pattern import CSRPattern
from .sparse_products import sampled_dots, sparse_matmul

__all__ = ["SparseFeatureLinearOperator"]


class SparseFeatureLinearOperator(LinearOperator):
    r"""The sparse feature matrix :math:`\Phi \in \mathbb R^{R \times N}` (or its transpose).

    The values are the operator's only tensor argument (so they are what gradients
    flow to); the pattern is shared by every batch entry. Batch dimensions are leading
    dimensions of ``values``.

    :param values: Non-zero values, shape ``(*batch, nnz)``, floating point.
    :param pattern: The sparsity pattern of :math:`\Phi` (:class:`CSRPattern`).
    :param transposed: Represent :math:`\Phi^\top` (``N x R``) instead of :math:`\Phi`.
    :raises TypeError: If ``pattern`` is not a :class:`CSRPattern` or the values are not
        a floating-point tensor.
    :raises ValueError: If the values do not fit the pattern.
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
        self._transposed_values: tuple[int, Tensor] | None = None

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

    def scipy_matrix(self) -> sp.csr_matrix:
        """The (unbatched) matrix as a float64 SciPy CSR matrix, detached and on the host."""
        if self.batch_shape:
            raise ValueError(f"scipy_matrix needs an unbatched operator, got batch shape {tuple(self.batch_shape)}")
        pattern, values = self.as_csr()._stored()
        return sp.csr_matrix((values.detach().to(torch.float64).cpu().numpy(), pattern.columns.cpu().numpy(),
                              pattern.row_pointer.cpu().numpy()), shape=tuple(self.shape))

    def _with_values(self, values: Tensor) -> SparseFeatureLinearOperator:
        return self.__class__(values, pattern=self.pattern, transposed=self.transposed)

    def transposed_values(self) -> Tensor:
        r"""``values[..., permutation]`` of the transposed pattern, gathered once per operator.

        CG and Lanczos multiply by :math:`\Phi^\top` many times with the same values
        (one operator per solve), so the gather is done once, untracked: products
        use it only inside autograd functions, whose backward differentiates with
        respect to the values themselves. An in-place change of the values (their
        version counter) gathers again.
        """
        version = self.values._version
        if self._transposed_values is None or self._transposed_values[0] != version:
            with torch.no_grad():
                permutation = self.pattern.compact()[0].transpose()[1]
                self._transposed_values = (version, self.values[..., permutation])
        return self._transposed_values[1]

    def compact_product(self, rhs: Tensor, *, transpose: bool, pattern: CSRPattern | None = None) -> Tensor:
        r""":math:`\Phi X` or :math:`\Phi^\top X` in a compact column space (differentiable).

        :param rhs: ``(*b, C', k)`` (``(*b, R, k)`` when ``transpose``), where ``C'`` is
            the number of columns of ``pattern``.
        :param transpose: Multiply by :math:`\Phi^\top` (the stored orientation's transpose).
        :param pattern: This operator's row-major pattern relabelled onto a column space
            (default: its own compact columns, :meth:`CSRPattern.compact`).
        :return: The product in that column space.
        """
        pattern = self.pattern.compact()[0] if pattern is None else pattern
        return sparse_matmul(pattern, self.values, rhs, transpose=transpose,
                             transposed_values=self.transposed_values() if transpose else None)

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
        compact, touched = self.pattern.compact()
        full = compact is self.pattern
        if not self.transposed:
            return self.compact_product(rhs if full else rhs[..., touched, :], transpose=False)
        out = self.compact_product(rhs, transpose=True)
        if full:
            return out
        # Columns that no row touches are zero rows of Phi^T x.
        return out.new_zeros(*out.shape[:-2], self.pattern.num_columns, out.shape[-1]).index_copy(-2, touched, out)

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
        compact, touched = self.pattern.compact()
        if compact is not self.pattern:
            right_vecs = right_vecs[..., touched, :]
        return (sampled_dots(compact, left_vecs, right_vecs, self.values.shape),)

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
