r"""The GRF Gram matrix :math:`\widehat{\mathbf K} = \Phi_A \Phi_B^\top` as a :class:`~linear_operator.LinearOperator`.

With graph random features (paper, Appendix C.1 "Constructing graph random features"
[app:grf_approx], Appendix F "GRFs for GPs: additional details and experimental results"
[app:grfs_for_gps]) the kernel between two sets of nodes is estimated by

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
Cholesky-based inference asks for) builds the dense matrix, by a compiled sparse loop or
block by block.

One exception pays on the hot path itself. Where the rows' walks overlap little (training
nodes far apart against the walks' reach, as on large graphs with scattered observations),
the symmetric :math:`\Phi\Phi^\top` is itself sparse, with fewer stored entries than
:math:`\Phi`, and a solver that multiplies by it many times (CG and Lanczos, tens to
hundreds of products per solve) does better to assemble it once as a sparse matrix and
multiply by that: each product then costs :math:`\operatorname{nnz}(\widehat{\mathbf K})`
multiply-adds per column instead of :math:`2\operatorname{nnz}(\Phi)`. Assembling costs
:math:`\sum_c n_c^2` multiply-adds (:math:`n_c` the rows whose walks visit node :math:`c`)
and is done for an operator's untracked products once they have cost as much as that
(``_ASSEMBLY_COST``), so that a few products never pay for it and many pay at most twice
the cheaper way's cost.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import scipy.sparse as sp
import torch
from linear_operator.operators import LinearOperator, RootLinearOperator, to_linear_operator
from linear_operator.utils.getitem import _equal_indices, _noop_index
from linear_operator.utils.memoize import cached
from torch import Tensor

from ..settings import preconditioner_pivot_reuse
from ..sparse_pattern import CSRPattern, segment_sum
from ._gram_compiled import sparse_gram, sparse_gram_entries, sparse_gram_gradient
from .preconditioner import PivotMemo, nystrom_factor
from .sparse_feature_operator import SparseFeatureLinearOperator
from .sparse_products import on_scipy, sampled_dots, scipy_matrix, sparse_matmul, spmm

__all__ = ["GRFGramLinearOperator"]

#: Numbers in one densified block of feature rows in :func:`_dense_product` (bounds its memory).
_DENSE_CHUNK_ENTRIES = 1 << 23
#: How many more multiply-adds a dense matrix product may do than the compiled sparse loop
#: of :class:`_CompiledGram` for the same :math:`\Phi_A\Phi_B^\top` and still be
#: faster (vectorised BLAS against scattered scalar updates; the crossover measured on one
#: core, ``benchmarks/RESULTS.md``).
_DENSE_PRODUCT_ADVANTAGE = 64
#: Value dtypes the compiled loops of :class:`_CompiledGram` take.
_COMPILED_DTYPES = (torch.float32, torch.float64)
#: Numbers in the densified feature rows of :func:`_gram_columns` (room for the 15
#: pivots of gpytorch's preconditioner on ~5 * 10^5 touched nodes).
_DENSE_COLUMN_ENTRIES = 1 << 23
#: Cost of one multiply-add of assembling the sparse :math:`\Phi\Phi^\top` (SciPy's sparse
#: product: scattered scalar updates and index bookkeeping) in multiply-adds of a product of
#: :math:`\Phi` with a block of columns, on one core (``benchmarks/bench_scattered_starts.py``;
#: the lower end of the measured range, so that assembly comes early rather than late).
_ASSEMBLY_COST = 16


def _gram_entries(pattern: CSRPattern, limit: int | None = None) -> int | None:
    r"""Stored entries of the sparse :math:`\Phi\Phi^\top` of ``pattern`` if at most ``limit``, else ``None``.

    ``limit`` defaults to ``pattern.nnz``. Counted once per pattern (one set of walks) and
    limit, by a compiled loop that stops at the limit, so a dense-ish Gram costs no more than
    the count up to it, and never any memory. The rows sharing a column are pairwise
    entries, so a column shared by more than :math:`\sqrt{\text{limit}}` rows rejects the
    Gram before any counting (the count's work grows with those shares).
    """
    bound = pattern.nnz if limit is None else int(limit)

    def count() -> int | None:
        if pattern.nnz and int(_column_counts(pattern).max()) ** 2 > bound:
            return None
        transposed, _ = pattern.transpose()
        # On the host whatever the walks' device (the count is a compiled CPU loop).
        entries = int(sparse_gram_entries(pattern.row_pointer.cpu().numpy(), pattern.columns.cpu().numpy(),
                                          transposed.row_pointer.cpu().numpy(), transposed.columns.cpu().numpy(),
                                          bound))
        return entries if entries <= bound else None

    return pattern.derived("gram_entries" if limit is None else f"gram_entries_{bound}", count)


def _assembly_multiply_adds(pattern: CSRPattern) -> int:
    r""":math:`\sum_c n_c^2`, the multiply-adds of assembling :math:`\Phi\Phi^\top` (kept with the pattern)."""
    return pattern.derived("assembly_multiply_adds",
                           lambda: int(_column_counts(pattern).square().sum()))


def _assembled_gram(features: SparseFeatureLinearOperator) -> tuple[CSRPattern, Tensor]:
    r"""The sparse :math:`\Phi\Phi^\top` of unbatched CPU features, as a pattern and its values (untracked)."""
    pattern = features.pattern.compact()[0]
    transposed = pattern.transpose()[0]
    with torch.no_grad():
        product = scipy_matrix(pattern, features.values) @ scipy_matrix(transposed, features.transposed_values())
        product = product.tocsr()
    product.sort_indices()
    gram_pattern = CSRPattern(torch.from_numpy(product.indptr.astype("int64")),
                              torch.from_numpy(product.indices.astype("int64")), pattern.num_rows, validate=False)
    return gram_pattern, torch.from_numpy(product.data)


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


def _densified(values: Tensor, pattern: CSRPattern) -> Tensor:
    """Feature values on ``pattern`` as a dense matrix (the compact patterns of :meth:`CSRPattern.joint_compact`)."""
    batch = values.shape[:-1]
    flat = values.new_zeros(*batch, pattern.num_rows * pattern.num_columns)
    flat = flat.scatter(-1, pattern.keys.expand(*batch, pattern.nnz), values)
    return flat.reshape(*batch, *pattern.shape)


class _SymmetricGram(torch.autograd.Function):
    r""":math:`\Phi\Phi^\top` for a dense :math:`\Phi`, whose backward is one product,
    :math:`(\mathbf G + \mathbf G^\top)\Phi`, where autograd would form two."""

    @staticmethod
    def forward(ctx: Any, dense: Tensor) -> Tensor:
        ctx.save_for_backward(dense)
        return dense @ dense.mT

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (dense,) = ctx.saved_tensors
        return (grad + grad.mT) @ dense


class _CompiledGram(torch.autograd.Function):
    r""":math:`\Phi_A\Phi_B^\top` of sparse CPU features by the compiled loops of
    :mod:`._gram_compiled`, :math:`\sum_c n^A_c n^B_c` multiply-adds for the column counts of
    the two sides. Without ``right_values`` it is the symmetric Gram :math:`\Phi\Phi^\top`,
    whose values' gradient is :math:`(\mathbf G + \mathbf G^\top)\Phi` at the stored
    entries; otherwise the two sides' gradients are :math:`\mathbf G\Phi_B` and
    :math:`\mathbf G^\top\Phi_A`, by the same loop. The two sides share their batch
    shape and their column space."""

    @staticmethod
    def forward(ctx: Any, left_values: Tensor, left_pattern: CSRPattern, right_values: Tensor | None,
                right_pattern: CSRPattern | None) -> Tensor:
        ctx.symmetric = right_values is None
        if right_values is None or right_pattern is None:
            right_values, right_pattern = left_values, left_pattern
        ctx.patterns = (left_pattern, right_pattern)
        ctx.save_for_backward(left_values, right_values)
        transposed, permutation = right_pattern.transpose()
        batch = left_values.shape[:-1]
        out = left_values.new_zeros(*batch, left_pattern.num_rows, right_pattern.num_rows)
        for index in itertools.product(*(range(size) for size in batch)):
            row_values = left_values[index].detach().contiguous()
            sparse_gram(left_pattern.row_pointer.numpy(), left_pattern.columns.numpy(), row_values.numpy(),
                        transposed.row_pointer.numpy(), transposed.columns.numpy(),
                        right_values[index].detach()[permutation].numpy(), out[index].numpy())
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, Tensor | None, None]:
        left_values, right_values = ctx.saved_tensors
        left_pattern, right_pattern = ctx.patterns
        if ctx.symmetric:
            weights = grad + grad.mT
            # Symmetric: its transpose is the same matrix, and contiguous where a transposed grad made it not.
            weights = weights if weights.is_contiguous() else weights.mT
            return _gram_gradient(left_pattern, right_pattern, right_values, weights), None, None, None
        grad_left = _gram_gradient(left_pattern, right_pattern, right_values, grad) \
            if ctx.needs_input_grad[0] else None
        grad_right = _gram_gradient(right_pattern, left_pattern, left_values, grad.mT) \
            if ctx.needs_input_grad[2] else None
        return grad_left, None, grad_right, None


def _gram_gradient(pattern: CSRPattern, other_pattern: CSRPattern, other_values: Tensor, weights: Tensor) -> Tensor:
    r""":math:`\mathbf W\Phi_B` at the stored entries of :math:`\Phi_A` (``pattern``): the values' gradient of
    :math:`\langle\mathbf W, \Phi_A\Phi_B^\top\rangle`."""
    transposed, permutation = other_pattern.transpose()
    out = other_values.new_empty(*other_values.shape[:-1], pattern.nnz)
    for index in itertools.product(*(range(size) for size in other_values.shape[:-1])):
        sparse_gram_gradient(pattern.row_pointer.numpy(), pattern.columns.numpy(),
                             transposed.row_pointer.numpy(), transposed.columns.numpy(),
                             other_values[index].detach()[permutation].numpy(),
                             weights[index].contiguous().numpy(), out[index].numpy())
    return out


def _column_counts(pattern: CSRPattern) -> Tensor:
    r"""Stored entries per column of ``pattern`` (kept with the pattern): :math:`\sum_c n^A_c n^B_c` of two
    patterns is the multiply-adds of the compiled :math:`\Phi_A\Phi_B^\top`."""
    return pattern.derived("column_counts", lambda: torch.bincount(pattern.columns, minlength=pattern.num_columns))


def _dense_product(left: SparseFeatureLinearOperator, right: SparseFeatureLinearOperator) -> Tensor:
    r"""Dense :math:`\Phi_A\Phi_B^\top` without densifying either feature matrix over all nodes.

    Products of CPU features on one column space (the training Gram, whose Cholesky factor
    follows, and the cross-covariance of prediction) are summed column by column by a
    compiled loop (:class:`_CompiledGram`), unless the features are dense enough for one
    dense matrix product to be faster.
    When both sides fit densely over the graph nodes their features visit (at most
    :data:`_DENSE_CHUNK_ENTRIES` numbers), they are densified there and multiplied by one
    dense matrix product. Otherwise the side with fewer rows is densified block by block over
    only the nodes its features visit (a block holds at most about
    :data:`_DENSE_CHUNK_ENTRIES` numbers, whatever :math:`N`), and the other side is
    multiplied into it as a sparse matrix restricted to those nodes.
    """
    symmetric = left is right
    left_counts, right_counts = _column_counts(left.pattern), _column_counts(right.pattern)
    # The nodes either side visits, counted without relabelling the patterns onto them.
    union_size = int(((left_counts > 0) | (right_counts > 0)).sum())
    fits = (left.size(-2) + (0 if symmetric else right.size(-2))) * union_size <= _DENSE_CHUNK_ENTRIES
    compiled = left.values.device.type == "cpu" and left.values.dtype in _COMPILED_DTYPES and (symmetric or (
        right.values.device == left.values.device and right.values.dtype == left.values.dtype
        and right.values.shape[:-1] == left.values.shape[:-1]))
    if compiled and not (fits and left.size(-2) * right.size(-2) * union_size
                         <= _DENSE_PRODUCT_ADVANTAGE * int((left_counts * right_counts).sum())):
        return _CompiledGram.apply(left.values, left.pattern, None if symmetric else right.values,
                                   None if symmetric else right.pattern)
    if fits:
        left_compact, right_compact, _ = left.pattern.joint_compact(right.pattern)
        dense_left = _densified(left.values, left_compact)
        if symmetric:
            return _SymmetricGram.apply(dense_left)
        return dense_left @ _densified(right.values, right_compact).mT
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
    restricted, keep = left.pattern.restrict_columns(nodes)
    return sparse_matmul(restricted, left.values[..., keep], block_t)


def _gram_columns(rows_side: SparseFeatureLinearOperator, rows_pattern: CSRPattern,
                  cols_side: SparseFeatureLinearOperator, cols_pattern: CSRPattern, cols: Tensor) -> Tensor:
    r"""Columns :math:`\Phi_A\Phi_B[J]^\top` for a few distinct rows ``J`` of :math:`\Phi_B`, ``(*batch, R_A, |J|)``.

    The rows ``J`` are densified on the shared compact inner space (a
    :math:`C' \times |J|` block) and :math:`\Phi_A` multiplies them in one sparse
    product: a pivoted-Cholesky row costs one sparse matrix-vector product.
    ``rows_pattern`` and ``cols_pattern`` are the two patterns relabelled onto that space.
    """
    slots, owner, _ = cols_pattern.gather_rows(cols)
    width, inner = cols.numel(), cols_pattern.num_columns
    batch = cols_side.values.shape[:-1]
    keys = (cols_pattern.columns[slots] * width + owner).expand(*batch, slots.numel())
    dense = cols_side.values.new_zeros(*batch, inner * width).scatter(-1, keys, cols_side.values[..., slots])
    return rows_side.compact_product(dense.reshape(*batch, inner, width), transpose=False, pattern=rows_pattern)


def _block(gram: GRFGramLinearOperator, rows: Tensor, cols: Tensor) -> Tensor:
    r"""The block :math:`\Phi_A[I]\Phi_B[J]^\top` (``(*batch, |I|, |J|)``; repeats allowed).

    When one side asks for few rows and the other for most of its rows (a
    pivoted-Cholesky row ``K[i, :]``, or its backward's ``K[:, pivots]``), the few rows
    are densified on the compact inner space and multiplied by the other side's features
    in one sparse product; otherwise both selections are multiplied block by block over
    the nodes they visit (:func:`_dense_product`).
    """
    left, right = gram.left, gram.right
    left_pattern, right_pattern = gram._inner_patterns()
    inner = left_pattern.num_columns
    if cols.numel() * inner <= _DENSE_COLUMN_ENTRIES and 4 * rows.numel() >= left.size(-2) \
            and cols.numel() <= rows.numel():
        return _gram_columns(left, left_pattern, right, right_pattern, cols)[..., rows, :]
    if rows.numel() * inner <= _DENSE_COLUMN_ENTRIES and 4 * cols.numel() >= right.size(-2):
        return _gram_columns(right, right_pattern, left, left_pattern, rows)[..., cols, :].mT
    return _dense_product(left._select_rows(rows), right._select_rows(cols))


def _entries(gram: GRFGramLinearOperator, rows: Tensor, cols: Tensor) -> Tensor:
    r"""Entries :math:`\phi_A(r_k)^\top\phi_B(s_k)` for index pairs, shape ``(*batch, P)``.

    When the pairs touch few distinct rows and columns, the block of the distinct
    indices is cheapest (:func:`_block`); otherwise sparse row dot products are used.
    """
    unique_rows, row_position = torch.unique(rows, return_inverse=True)
    unique_cols, col_position = torch.unique(cols, return_inverse=True)
    if unique_rows.numel() * unique_cols.numel() <= 4 * rows.numel():
        return _block(gram, unique_rows, unique_cols)[..., row_position, col_position]
    return _pair_dots(gram.left, gram.right, rows, cols)


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
        # Untracked products of the symmetric Gram: (values version, multiply-adds spent on
        # products with Phi, the assembled sparse Gram or None); see the module docstring.
        self._assembly: tuple[int, int, tuple[CSRPattern, Tensor] | None] | None = None

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

    def _inner_patterns(self) -> tuple[CSRPattern, CSRPattern]:
        r"""Both feature patterns on one compact inner column space (cached on the patterns).

        :math:`\Phi_A\Phi_B^\top` only sums over graph nodes that the rows' walks
        touched, so the intermediate :math:`\Phi_B^\top X` of a product lives on those
        columns (the union of both sides' for a cross product), never on all :math:`N`.
        """
        if self.is_symmetric:
            compact = self.left.pattern.compact()[0]
            return compact, compact
        left, right, _ = self.left.pattern.joint_compact(self.right.pattern)
        return left, right

    def _product_factors(self) -> tuple[SparseFeatureLinearOperator, SparseFeatureLinearOperator]:
        r"""The two feature matrices on the inner space of a product, on their compact columns.

        A cross product :math:`\Phi_A\Phi_B^\top X` only sums over the nodes that both
        sides' walks visited (test and training rows share a small part of the graph),
        so each side keeps only its entries there (``benchmarks/bench_products.py`` measures
        the gain). The restricted values are gathered once per operator (again after an
        in-place change of the values) when no gradient is tracked; a tracked gather
        belongs to one product's autograd graph.
        """
        if self.is_symmetric:
            return self.left, self.left
        if self.left.pattern is self.right.pattern:  # e.g. (c Phi) Phi^T: one compact space already
            return self.left, self.right
        tracked = torch.is_grad_enabled() and (self.left.values.requires_grad or self.right.values.requires_grad)
        versions = (self.left.values._version, self.right.values._version)
        cached_factors = None if tracked else getattr(self, "_restricted_factors", None)
        if cached_factors is None or cached_factors[0] != versions:
            (left_pattern, left_slots), (right_pattern, right_slots) = \
                self.left.pattern.joint_restricted(self.right.pattern)
            factors = (SparseFeatureLinearOperator(self.left.values[..., left_slots], pattern=left_pattern),
                       SparseFeatureLinearOperator(self.right.values[..., right_slots], pattern=right_pattern))
            if tracked:
                return factors
            cached_factors = self._restricted_factors = (versions, factors)
        return cached_factors[1]

    def _matmul(self, rhs: Tensor) -> Tensor:
        assembled = self._assembled(rhs)
        if assembled is not None:
            return spmm(*assembled, rhs)
        left, right = self._product_factors()
        return left.compact_product(right.compact_product(rhs, transpose=True), transpose=False)

    def _assembled(self, rhs: Tensor) -> tuple[CSRPattern, Tensor] | None:
        r"""The sparse :math:`\Phi\Phi^\top` for this untracked product, assembled once the products with
        :math:`\Phi` have cost as much as assembling it, where it has fewer entries than :math:`\Phi`."""
        values = self.left.values
        if (not self.is_symmetric or values.ndim != 1 or not on_scipy(values)
                or (torch.is_grad_enabled() and (values.requires_grad or rhs.requires_grad))):
            return None
        version = values._version
        spent, assembled = (0, None) if self._assembly is None or self._assembly[0] != version else self._assembly[1:]
        if assembled is None:
            pattern = self.left.pattern.compact()[0]
            if spent >= _ASSEMBLY_COST * _assembly_multiply_adds(pattern) and _gram_entries(pattern) is not None:
                assembled = _assembled_gram(self.left)
            else:
                spent += 2 * pattern.nnz * math.prod(rhs.shape[:-2]) * rhs.shape[-1]
        self._assembly = (version, spent, assembled)
        return assembled

    def _t_matmul(self, rhs: Tensor | LinearOperator) -> Tensor:
        if isinstance(rhs, LinearOperator):
            rhs = rhs.to_dense()
        left, right = self._product_factors()
        return right.compact_product(left.compact_product(rhs, transpose=True), transpose=False)

    def _transpose_nonbatch(self) -> GRFGramLinearOperator:
        return self if self.is_symmetric else self.__class__(self.right, self.left)

    def _bilinear_derivative(self, left_vecs: Tensor, right_vecs: Tensor) -> tuple[Tensor | None, ...]:
        # d(U^T Phi_A Phi_B^T V) = <U (V^T Phi_B), dPhi_A> + <V (U^T Phi_A), dPhi_B>
        # Both terms are sampled products on the compact inner space (no autograd: this
        # is called from inside gpytorch's backward passes).
        if left_vecs.ndim == 1:
            left_vecs, right_vecs = left_vecs.unsqueeze(-1), right_vecs.unsqueeze(-1)
        left_pattern, right_pattern = self._inner_patterns()

        def gradient(features: SparseFeatureLinearOperator, pattern: CSRPattern, vecs: Tensor,
                     other: SparseFeatureLinearOperator, other_pattern: CSRPattern,
                     other_vecs: Tensor) -> Tensor | None:
            if not features.values.requires_grad:
                return None
            inner = spmm(other_pattern, other.values.detach(), other_vecs, transpose=True,
                         transposed_values=other.transposed_values())
            return sampled_dots(pattern, vecs, inner, features.values.shape)

        grad_left = gradient(self.left, left_pattern, left_vecs, self.right, right_pattern, right_vecs)
        grad_right = gradient(self.right, right_pattern, right_vecs, self.left, left_pattern, left_vecs)
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

    def __getitem__(self, index: Any) -> LinearOperator | Tensor:
        # An outer-product tensor index ``K[rows[:, None], cols[None, :]]`` (how
        # linear_operator's apply_permutation reads pivoted-Cholesky rows) is a block:
        # computed as one, instead of as flattened index pairs.
        if (self.dim() == 2 and isinstance(index, tuple) and len(index) == 2
                and all(isinstance(part, Tensor) and part.ndim == 2 and not part.dtype.is_floating_point
                        and part.dtype != torch.bool for part in index)
                and index[0].shape[-1] == 1 and index[1].shape[-2] == 1):
            rows, cols = index[0][:, 0], index[1][0]
            size_rows, size_cols = self.matrix_shape
            return _block(self, torch.where(rows < 0, rows + size_rows, rows),
                          torch.where(cols < 0, cols + size_cols, cols))
        return super().__getitem__(index)

    def _get_indices(self, row_index: Tensor, col_index: Tensor, *batch_indices: Tensor) -> Tensor:
        shape = torch.broadcast_shapes(row_index.shape, col_index.shape,
                                       *(index.shape for index in batch_indices))
        rows = row_index.expand(shape).reshape(-1)
        cols = col_index.expand(shape).reshape(-1)
        dots = _entries(self, rows, cols)  # (*batch, P)
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

    def pivoted_cholesky(self, rank: int, error_tol: float | None = None,
                         return_pivots: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """linear_operator's pivoted Cholesky, whose pivots may be reused across training steps.

        See :mod:`gp_couple.operators.preconditioner` (off unless
        :class:`~gp_couple.settings.preconditioner_pivot_reuse` is on). A Gram matrix of
        zeros gets the zero factor of rank one (linear_operator's would be NaN).
        """
        with torch.no_grad():
            diagonal = self._diagonal()
        if not bool((diagonal.amax(-1) > 0).all()):
            # A Gram matrix of zeros (the kernel vanished, e.g. at a line search's trial point of
            # a huge range) has no positive pivot, and linear_operator would divide by its zero
            # diagonal. The zero factor is exact there, and still a valid preconditioner
            # (sigma^2 I) for any other matrix of a batch.
            factor = diagonal.new_zeros(*diagonal.shape, 1)
            permutation = torch.arange(diagonal.shape[-1], device=diagonal.device).expand(diagonal.shape).clone()
            return (factor, permutation) if return_pivots else factor
        memo = self._pivot_memo()
        reused = None if memo is None else memo.reusable(diagonal, rank, error_tol)
        if reused is not None:
            pivots, permutation = reused
            factor = nystrom_factor(_block(self, torch.arange(self.size(-2), device=self.device), pivots), pivots)
        else:
            factor, permutation = super().pivoted_cholesky(rank, error_tol, return_pivots=True)
            if memo is not None:
                memo.remember(diagonal, rank, error_tol, factor, permutation)
        return (factor, permutation) if return_pivots else factor

    def _pivot_memo(self) -> PivotMemo | None:
        """The feature pattern's :class:`~gp_couple.operators.preconditioner.PivotMemo`, where pivots may be reused.

        Only symmetric, unbatched Gram matrices reuse pivots, and only under
        :class:`~gp_couple.settings.preconditioner_pivot_reuse`.
        """
        if not self.is_symmetric or len(self.batch_shape) or preconditioner_pivot_reuse.value() is None:
            return None
        return self.left.pattern.derived("preconditioner_pivots", PivotMemo)

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

    def scipy_matrix(self) -> sp.csr_matrix:
        r""":math:`\Phi_A\Phi_B^\top` as a float64 SciPy CSR matrix (unbatched; detached, on the host).

        Sparse wherever the walks of two rows never meet: the exact sparse factorisation
        behind large-scale predictive variances (:mod:`gp_couple.sparse_factor`) starts here.
        """
        left = self.left.scipy_matrix()
        product = left @ (left if self.is_symmetric else self.right.scipy_matrix()).T
        return sp.csr_matrix(product)

    def sparse_entries(self, limit: int | None = None) -> int | None:
        r"""Stored entries of :meth:`scipy_matrix`, counted without assembling it, where they are few.

        Pairs of rows whose walks share a node, counted by a compiled loop that stops at the
        limit and allocates nothing (once per set of walks and limit).

        :param limit: The most entries worth counting (default: the entries of :math:`\Phi`).
        :return: The count for an unbatched symmetric Gram whose :math:`\Phi\Phi^\top` has
            at most ``limit`` entries; ``None`` otherwise (denser Grams, cross covariances,
            batches).
        """
        if not self.is_symmetric or self.batch_shape:
            return None
        return _gram_entries(self.left.pattern.compact()[0], limit)

    # ---------------------------------------------------------------- dense
    @cached
    def to_dense(self) -> Tensor:
        r"""The dense matrix (see :func:`_dense_product`: memory stays proportional to the output)."""
        return _dense_product(self.left, self.right)

    def __repr__(self) -> str:
        kind = "symmetric" if self.is_symmetric else "cross"
        return f"{type(self).__name__}({kind}, shape={tuple(self.shape)}, dtype={self.dtype})"
