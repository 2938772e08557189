r"""The GRF Gram matrix :math:`\widehat{\mathbf K} = \Phi_A \Phi_B^\top` as a :class:`~linear_operator.LinearOperator`.

With graph random features (paper, app:grf_approx, app:grfs_for_gps) the kernel
between two sets of nodes is estimated by

.. math::

    \widehat{\mathbf K}_{AB} = \Phi_A \Phi_B^\top,
    \qquad \widehat k(v_i, v_j) = \phi(v_i)^\top \phi(v_j),

where :math:`\Phi_A`, :math:`\Phi_B` are the (sparse) feature rows of the nodes in
:math:`A` and :math:`B`. :class:`GRFGramLinearOperator` never forms this matrix on its
hot paths: products are two sparse products, the diagonal and arbitrary entries are
sparse row dot products (or, for requests touching few distinct rows and columns such
as a pivoted-Cholesky row, the small block of those), row/column selection selects
feature rows, and when
:math:`A = B` the features themselves are an exact root decomposition
:math:`\widehat{\mathbf K} = \Phi\Phi^\top`. Only an explicit :meth:`to_dense` (which
Cholesky-based inference asks for) builds the dense matrix, block by block.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from linear_operator.operators import LinearOperator, RootLinearOperator, to_linear_operator
from linear_operator.utils.getitem import _equal_indices, _noop_index
from linear_operator.utils.memoize import cached
from torch import Tensor

from .sparse_features import CSRPattern, SparseFeatureLinearOperator, segment_sum, sparse_matmul

__all__ = ["GRFGramLinearOperator"]

#: Numbers in one densified block of feature rows in :func:`_dense_product` (bounds its memory).
_DENSE_CHUNK_ENTRIES = 1 << 22


def _pair_dots(left: SparseFeatureLinearOperator, right: SparseFeatureLinearOperator,
               rows_left: Tensor, rows_right: Tensor) -> Tensor:
    r"""Sparse row dot products :math:`\phi_A(r_k)^\top \phi_B(s_k)`, shape ``(*batch, P)``.

    Both operators must be stored row-major with the same number of columns and
    broadcastable batch shapes. Entries are matched by the key ``k * N + column``,
    which is sorted within the gathered rows of either side, so one binary search per
    entry of the left rows finds its partner: :math:`O(\mathrm{nnz} \log \mathrm{nnz})`
    work and memory for the gathered rows only.
    """
    num_pairs = rows_left.numel()
    slots_l, owner_l, _ = left.pattern.gather_rows(rows_left)
    slots_r, owner_r, _ = right.pattern.gather_rows(rows_right)
    width = left.pattern.num_columns
    batch = torch.broadcast_shapes(left.values.shape[:-1], right.values.shape[:-1])
    if slots_l.numel() == 0 or slots_r.numel() == 0:
        return left.values.new_zeros(*batch, num_pairs)
    keys_l = owner_l * width + left.pattern.columns[slots_l]
    keys_r = owner_r * width + right.pattern.columns[slots_r]
    position = torch.searchsorted(keys_r, keys_l).clamp_(max=keys_r.numel() - 1)
    match = keys_r[position] == keys_l
    products = left.values[..., slots_l[match]] * right.values[..., slots_r[position[match]]]
    return segment_sum(products.expand(*batch, products.shape[-1]), owner_l[match], num_pairs)


def _dense_product(left: SparseFeatureLinearOperator, right: SparseFeatureLinearOperator) -> Tensor:
    r"""Dense :math:`\Phi_A\Phi_B^\top` without densifying either feature matrix over all nodes.

    The side with fewer rows is densified block by block over only the graph nodes its
    features visit (a block holds at most about :data:`_DENSE_CHUNK_ENTRIES` numbers,
    whatever :math:`N`), and the other side is multiplied into it as a sparse matrix
    restricted to those nodes.
    """
    if left.size(-2) < right.size(-2):
        return _dense_product(right, left).mT
    num_dense = right.size(-2)
    per_row = max(1.0, right.pattern.nnz / max(num_dense, 1))
    chunk = max(1, min(num_dense, int(math.sqrt(_DENSE_CHUNK_ENTRIES / per_row))))
    blocks = [_dense_block(left, right, start, min(start + chunk, num_dense))
              for start in range(0, num_dense, chunk)]
    if not blocks:
        return left.values.new_zeros(*left.batch_shape, left.size(-2), 0)
    return torch.cat(blocks, dim=-1)


def _dense_block(left: SparseFeatureLinearOperator, right: SparseFeatureLinearOperator,
                 start: int, stop: int) -> Tensor:
    r"""Columns ``start:stop`` of :math:`\Phi_A\Phi_B^\top`."""
    batch = left.batch_shape
    device = left.device
    sub_pattern, slots = right.pattern.slice_rows(start, stop)
    nodes, compressed = torch.unique(sub_pattern.columns, sorted=True, return_inverse=True)
    width = stop - start
    if nodes.numel() == 0:
        return left.values.new_zeros(*batch, left.size(-2), width)
    # Phi_B[start:stop]^T restricted to the visited nodes, dense (nodes x width).
    keys = compressed * width + sub_pattern.row_indices
    block_t = right.values.new_zeros(*batch, nodes.numel() * width)
    block_t = block_t.scatter(-1, keys.expand(*batch, keys.numel()), right.values[..., slots])
    block_t = block_t.reshape(*batch, nodes.numel(), width)
    # Phi_A restricted to the same nodes: its entries elsewhere meet zeros.
    position = torch.searchsorted(nodes, left.pattern.columns).clamp_(max=nodes.numel() - 1)
    keep = nodes[position] == left.pattern.columns
    counts = segment_sum(keep.to(torch.int64), left.pattern.row_indices, left.pattern.num_rows)
    pointer = torch.zeros(left.pattern.num_rows + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=pointer[1:])
    restricted = CSRPattern(pointer, position[keep], nodes.numel(), validate=False)
    return sparse_matmul(restricted, left.values[..., keep], block_t)


def _entries(left: SparseFeatureLinearOperator, right: SparseFeatureLinearOperator,
             rows: Tensor, cols: Tensor) -> Tensor:
    r"""Entries :math:`\phi_A(r_k)^\top\phi_B(s_k)` for index pairs, shape ``(*batch, P)``.

    When the pairs touch few distinct rows and columns (e.g. a pivoted-Cholesky row
    ``K[i, :]``: one row against all columns), the dense block of the distinct indices
    is cheapest; otherwise sparse row dot products are used.
    """
    unique_rows, row_position = torch.unique(rows, return_inverse=True)
    unique_cols, col_position = torch.unique(cols, return_inverse=True)
    if unique_rows.numel() * unique_cols.numel() <= 4 * rows.numel():
        block = _dense_product(left._select_rows(unique_rows), right._select_rows(unique_cols))
        return block[..., row_position, col_position]
    return _pair_dots(left, right, rows, cols)


class GRFGramLinearOperator(LinearOperator):
    r"""Lazy GRF kernel matrix :math:`\Phi_A \Phi_B^\top` (symmetric :math:`\Phi\Phi^\top` when ``right`` is omitted).

    :param left: Feature rows :math:`\Phi_A` (:class:`SparseFeatureLinearOperator`, ``(*batch, R_A, N)``).
    :param right: Feature rows :math:`\Phi_B` (``(*batch, R_B, N)``); omit it (or pass
        ``left`` itself) for the symmetric Gram matrix of one set of rows, which then
        has the exact root decomposition :math:`\Phi_A`.
    :raises TypeError: If the features are not :class:`SparseFeatureLinearOperator`.
    :raises ValueError: If the feature widths or batch shapes are incompatible.
    """

    def __init__(self, left: SparseFeatureLinearOperator,
                 right: SparseFeatureLinearOperator | None = None) -> None:
        for name, features in (("left", left), ("right", right)):
            if features is not None and not isinstance(features, SparseFeatureLinearOperator):
                raise TypeError(f"{name} must be a SparseFeatureLinearOperator, got {type(features).__name__}")
        if right is left:
            right = None
        left = left.as_csr()
        if right is not None:
            right = right.as_csr()
            if right.size(-1) != left.size(-1):
                raise ValueError(f"left and right features have different widths "
                                 f"({left.size(-1)} and {right.size(-1)})")
            if right.dtype != left.dtype:
                raise TypeError(f"left and right features have different dtypes ({left.dtype}, {right.dtype})")
            try:
                batch = torch.broadcast_shapes(left.batch_shape, right.batch_shape)
            except RuntimeError as error:
                raise ValueError(f"feature batch shapes {tuple(left.batch_shape)} and "
                                 f"{tuple(right.batch_shape)} do not broadcast") from error
            left = left if left.batch_shape == batch else left._expand_batch(batch)
            right = right if right.batch_shape == batch else right._expand_batch(batch)
            super().__init__(left, right)
        else:
            super().__init__(left)
        self.left = left
        self.right = left if right is None else right

    @property
    def is_symmetric(self) -> bool:
        """Whether this is :math:`\\Phi\\Phi^\\top` for a single set of feature rows."""
        return len(self._args) == 1

    def _new(self, left: SparseFeatureLinearOperator,
             right: SparseFeatureLinearOperator | None) -> GRFGramLinearOperator:
        return self.__class__(left) if right is None else self.__class__(left, right)

    # ---------------------------------------------------------------- required hooks
    def _size(self) -> torch.Size:
        return torch.Size((*self.left.batch_shape, self.left.size(-2), self.right.size(-2)))

    def _matmul(self, rhs: Tensor) -> Tensor:
        return self.left._matmul(self.right._t_matmul(rhs))

    def _t_matmul(self, rhs: Tensor | LinearOperator) -> Tensor:
        return self.right._matmul(self.left._t_matmul(rhs))

    def _transpose_nonbatch(self) -> GRFGramLinearOperator:
        return self if self.is_symmetric else self.__class__(self.right, self.left)

    def _bilinear_derivative(self, left_vecs: Tensor, right_vecs: Tensor) -> tuple[Tensor | None, ...]:
        # d(U^T Phi_A Phi_B^T V) = <U (V^T Phi_B), dPhi_A> + <V (U^T Phi_A), dPhi_B>
        if left_vecs.ndim == 1:
            left_vecs, right_vecs = left_vecs.unsqueeze(-1), right_vecs.unsqueeze(-1)
        (grad_left,) = self.left._bilinear_derivative(left_vecs, self.right._t_matmul(right_vecs))
        (grad_right,) = self.right._bilinear_derivative(right_vecs, self.left._t_matmul(left_vecs))
        if not self.is_symmetric:
            return grad_left, grad_right
        if grad_left is None:
            return (None,)
        return (grad_left + grad_right,)

    # ---------------------------------------------------------------- batch handling
    def _expand_batch(self, batch_shape: torch.Size | list[int]) -> GRFGramLinearOperator:
        left = self.left._expand_batch(batch_shape)
        return self._new(left, None if self.is_symmetric else self.right._expand_batch(batch_shape))

    def _mul_constant(self, other: float | Tensor) -> LinearOperator:
        other_t = torch.as_tensor(other, dtype=self.dtype, device=self.device)
        if not self.is_symmetric:
            # c * A B^T = (c A) B^T, whatever the sign of c.
            return self.__class__(self.left._mul_constant(other_t), self.right)
        if bool((other_t > 0).all()):
            # c * Phi Phi^T = (sqrt(c) Phi)(sqrt(c) Phi)^T keeps the exact root (e.g. ScaleKernel).
            return self.__class__(self.left._mul_constant(other_t.sqrt()))
        return super()._mul_constant(other)

    # ---------------------------------------------------------------- entries
    def _diagonal(self) -> Tensor:
        if self.is_symmetric:
            pattern = self.left.pattern
            return segment_sum(self.left.values.square(), pattern.row_indices, pattern.num_rows)
        size = min(self.matrix_shape)
        index = torch.arange(size, device=self.device)
        return _pair_dots(self.left, self.right, index, index)

    def _get_indices(self, row_index: Tensor, col_index: Tensor, *batch_indices: Tensor) -> Tensor:
        shape = torch.broadcast_shapes(row_index.shape, col_index.shape,
                                       *(index.shape for index in batch_indices))
        rows = row_index.expand(shape).reshape(-1)
        cols = col_index.expand(shape).reshape(-1)
        dots = _entries(self.left, self.right, rows, cols)  # (*batch, P)
        if batch_indices:
            flat_batch = tuple(index.expand(shape).reshape(-1) for index in batch_indices)
            dots = dots[(*flat_batch, torch.arange(rows.numel(), device=self.device))]
        return dots.reshape(shape)

    def _getitem(self, row_index: Any, col_index: Any, *batch_indices: Any) -> LinearOperator:
        left = self.left._getitem(row_index, _noop_index, *batch_indices)
        if self.is_symmetric and _equal_indices(row_index, col_index):
            return self.__class__(left)
        right = self.right._getitem(col_index, _noop_index, *batch_indices)
        return self.__class__(left, right)

    # ---------------------------------------------------------------- decompositions
    @cached(name="root_decomposition")
    def root_decomposition(self, method: str | None = None) -> LinearOperator:
        r"""Exact root :math:`\Phi` of a symmetric Gram matrix (unless ``method`` asks otherwise).

        The root is :math:`R \times N` (wider than tall when the graph has more nodes
        than there are rows), which is exact and free, e.g. for sampling.
        """
        if self.is_symmetric and method is None:
            return RootLinearOperator(self.left)
        return super().root_decomposition(method=method)

    def _square_root_method(self, method: str | None) -> str:
        # The root updates of add_low_rank/cat_rows need a square root L paired with its
        # inverse root M (L M^T = I); the wide exact root Phi has no such inverse.
        return method if method is not None else self._choose_root_method()

    def add_low_rank(self, low_rank_mat: Tensor | LinearOperator, root_decomp_method: str | None = None,
                     root_inv_decomp_method: str | None = None, generate_roots: bool | None = True,
                     **root_decomp_kwargs: Any) -> LinearOperator:
        return super().add_low_rank(low_rank_mat, root_decomp_method=self._square_root_method(root_decomp_method),
                                    root_inv_decomp_method=root_inv_decomp_method,
                                    generate_roots=generate_roots, **root_decomp_kwargs)

    def cat_rows(self, cross_mat: Tensor, new_mat: Tensor, generate_roots: bool = True,
                 generate_inv_roots: bool = True, **root_decomp_kwargs: Any) -> LinearOperator:
        root_decomp_kwargs["method"] = self._square_root_method(root_decomp_kwargs.get("method"))
        return super().cat_rows(cross_mat, new_mat, generate_roots=generate_roots,
                                generate_inv_roots=generate_inv_roots, **root_decomp_kwargs)

    def _prod_batch(self, dim: int) -> LinearOperator:
        # linear_operator's product over a batch dimension pads odd batches with a
        # constant root that is only neutral for square roots, so it cannot use the wide
        # exact root Phi. The Hadamard product of n x n Grams is dense in general anyway.
        return to_linear_operator(self.to_dense())._prod_batch(dim)

    # ---------------------------------------------------------------- dense
    @cached
    def to_dense(self) -> Tensor:
        r"""The dense matrix (see :func:`_dense_product`: memory stays proportional to the output)."""
        return _dense_product(self.left, self.right)

    def __repr__(self) -> str:
        kind = "symmetric" if self.is_symmetric else "cross"
        return f"{type(self).__name__}({kind}, shape={tuple(self.shape)}, dtype={self.dtype})"
