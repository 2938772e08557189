"""Reusable builders for the linear_operator peer suites of our operators.

Each mixin supplies ``create_linear_op`` / ``evaluate_linear_op`` for
:class:`linear_operator.test.linear_operator_test_case.RectangularLinearOperatorTestCase`
or ``LinearOperatorTestCase``. The dense references are built independently of the
operators' own ``to_dense`` (``index_put`` from the CSR arrays and plain matmuls), and
they are differentiable in the values so the suites can compare gradients.
"""

from __future__ import annotations

import numpy as np
import torch

from gp_couple.operators import CSRPattern, GRFGramLinearOperator, SparseFeatureLinearOperator


def random_pattern(num_rows: int, num_columns: int, *, density: float = 0.5, seed: int = 0,
                   diagonal: bool = False, untouched: int = 0) -> CSRPattern:
    """A random CSR pattern; ``diagonal`` guarantees entry ``(i, i)`` in every row ``i``.

    ``untouched`` columns (spread over the range) hold no entry, as most graph nodes in
    the features of a few training rows: the operators then work on a compact column space.
    """
    rng = np.random.default_rng(seed)
    mask = rng.random((num_rows, num_columns)) < density
    if untouched:
        empty = rng.choice(np.arange(num_rows, num_columns) if diagonal else num_columns, untouched, replace=False)
        mask[:, empty] = False
    if diagonal:
        mask[np.arange(num_rows), np.arange(num_rows) % num_columns] = True
    rows, cols = np.nonzero(mask)  # row-major, columns sorted within rows
    pointer = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=num_rows), out=pointer[1:])
    return CSRPattern(torch.from_numpy(pointer), torch.from_numpy(cols), num_columns)


def random_values(pattern: CSRPattern, batch_shape: torch.Size = torch.Size(), *, seed: int = 0,
                  diagonal_boost: float = 0.0, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Values for ``pattern``; ``diagonal_boost`` is added on the ``(i, i)`` entries."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(*batch_shape, pattern.nnz, generator=generator,
                         dtype=dtype or torch.get_default_dtype())
    if diagonal_boost:
        on_diagonal = pattern.columns == pattern.row_indices
        values = values + diagonal_boost * on_diagonal.to(values.dtype)
    return values


def dense_reference(op: SparseFeatureLinearOperator) -> torch.Tensor:
    """The dense matrix of a feature operator, built with ``index_put`` (differentiable)."""
    pattern, values = op.pattern, op.values
    dense = values.new_zeros(*values.shape[:-1], *pattern.shape)
    dense[..., pattern.row_indices, pattern.columns] = values
    return dense.mT if op.transposed else dense


def gram_reference(op: GRFGramLinearOperator) -> torch.Tensor:
    """The dense Gram matrix from dense feature references."""
    return dense_reference(op.left) @ dense_reference(op.right).mT


class SparseFeatureOperatorMixin:
    """Peer-suite setup for :class:`SparseFeatureLinearOperator` (random pattern, 5 x 7).

    ``untouched`` > 0 leaves that many columns empty (products on the compact columns).
    """

    seed = 0
    num_rows = 5
    num_columns = 7
    untouched = 0
    batch_shape = torch.Size()
    transposed = False

    def create_linear_op(self) -> SparseFeatureLinearOperator:
        pattern = random_pattern(self.num_rows, self.num_columns, seed=1, untouched=self.untouched)
        values = random_values(pattern, self.batch_shape, seed=2)
        return SparseFeatureLinearOperator(values, pattern=pattern, transposed=self.transposed)

    def evaluate_linear_op(self, linear_op: SparseFeatureLinearOperator) -> torch.Tensor:
        return dense_reference(linear_op)


class GRFGramOperatorMixin:
    """Peer-suite setup for a symmetric, well-conditioned :math:`\\Phi\\Phi^\\top` (5 x 5, 8 graph nodes).

    Every row has a dominant entry on its own column, so the Gram matrix is positive
    definite and well conditioned without any added diagonal.
    """

    seed = 0
    num_rows = 5
    num_columns = 8
    untouched = 0
    batch_shape = torch.Size()
    # The root decomposition is the exact feature matrix: Lanczos is never needed.
    should_call_lanczos = False

    def create_linear_op(self) -> GRFGramLinearOperator:
        pattern = random_pattern(self.num_rows, self.num_columns, density=0.4, seed=3, diagonal=True,
                                 untouched=self.untouched)
        values = random_values(pattern, self.batch_shape, seed=4, diagonal_boost=3.0) * 0.5
        return GRFGramLinearOperator(SparseFeatureLinearOperator(values, pattern=pattern))

    def evaluate_linear_op(self, linear_op: GRFGramLinearOperator) -> torch.Tensor:
        return gram_reference(linear_op)


class CrossGramOperatorMixin:
    """Peer-suite setup for a rectangular cross-covariance :math:`\\Phi_A\\Phi_B^\\top` (5 x 6).

    ``num_columns`` > 9 leaves columns empty on each side (different ones), so the
    product runs on the union of the two sides' touched columns.
    """

    seed = 0
    num_columns = 9
    batch_shape = torch.Size()

    def create_linear_op(self) -> GRFGramLinearOperator:
        untouched = self.num_columns - 9
        left = random_pattern(5, self.num_columns, seed=5, untouched=untouched)
        right = random_pattern(6, self.num_columns, seed=6, untouched=untouched)
        return GRFGramLinearOperator(
            SparseFeatureLinearOperator(random_values(left, self.batch_shape, seed=7), pattern=left),
            SparseFeatureLinearOperator(random_values(right, self.batch_shape, seed=8), pattern=right))

    def evaluate_linear_op(self, linear_op: GRFGramLinearOperator) -> torch.Tensor:
        return gram_reference(linear_op)
