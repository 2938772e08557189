"""SparseFeatureLinearOperator: the linear_operator peer suite plus our own checks."""

from __future__ import annotations

import unittest

import pytest
import torch
from linear_operator.test.linear_operator_test_case import RectangularLinearOperatorTestCase

from gp_couple.operators import CSRPattern, SparseFeatureLinearOperator, sparse_matmul

from .mixins import SparseFeatureOperatorMixin, dense_reference, random_pattern, random_values


class TestSparseFeatureLinearOperator(SparseFeatureOperatorMixin, RectangularLinearOperatorTestCase,
                                      unittest.TestCase):
    pass


class TestBatchSparseFeatureLinearOperator(SparseFeatureOperatorMixin, RectangularLinearOperatorTestCase,
                                           unittest.TestCase):
    batch_shape = torch.Size([2, 3])


class TestTransposedSparseFeatureLinearOperator(SparseFeatureOperatorMixin,
                                                RectangularLinearOperatorTestCase, unittest.TestCase):
    transposed = True


class TestBatchTransposedSparseFeatureLinearOperator(SparseFeatureOperatorMixin,
                                                     RectangularLinearOperatorTestCase, unittest.TestCase):
    batch_shape = torch.Size([3])
    transposed = True


class TestCompactSparseFeatureLinearOperator(SparseFeatureOperatorMixin, RectangularLinearOperatorTestCase,
                                             unittest.TestCase):
    # Five of twelve columns hold no entry: products run on the seven touched ones.
    num_columns = 12
    untouched = 5


class TestBatchTransposedCompactSparseFeatureLinearOperator(SparseFeatureOperatorMixin,
                                                            RectangularLinearOperatorTestCase, unittest.TestCase):
    num_columns = 12
    untouched = 5
    batch_shape = torch.Size([2])
    transposed = True


# ------------------------------------------------------------------ our own checks
def test_pattern_validation_errors():
    pointer, columns = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1])
    CSRPattern(pointer, columns, 3)
    with pytest.raises(ValueError, match="sorted"):
        CSRPattern(pointer, torch.tensor([2, 0, 1]), 3)
    with pytest.raises(ValueError, match=r"columns must lie"):
        CSRPattern(pointer, columns, 2)
    with pytest.raises(ValueError, match="row_pointer"):
        CSRPattern(torch.tensor([0, 2, 4]), columns, 3)
    with pytest.raises(TypeError, match="integer"):
        CSRPattern(pointer.float(), columns, 3)
    with pytest.raises(ValueError, match="values must have shape"):
        SparseFeatureLinearOperator(torch.zeros(4), pattern=CSRPattern(pointer, columns, 3))
    with pytest.raises(TypeError, match="pattern"):
        SparseFeatureLinearOperator(torch.zeros(3), pattern=(pointer, columns))


def test_transposed_pattern_round_trip():
    pattern = random_pattern(6, 9, seed=4)
    values = random_values(pattern, seed=5)
    pattern_t, permutation = pattern.transpose()
    dense = dense_reference(SparseFeatureLinearOperator(values, pattern=pattern))
    transposed = SparseFeatureLinearOperator(values[permutation], pattern=pattern_t)
    torch.testing.assert_close(dense_reference(transposed), dense.T)
    back, inverse = pattern_t.transpose()
    assert back is pattern
    torch.testing.assert_close(values[permutation][inverse], values)


def test_sparse_matmul_gradcheck_batched_values_and_broadcast_rhs():
    pattern = random_pattern(4, 6, seed=6)
    values = random_values(pattern, torch.Size([2]), seed=7, dtype=torch.float64).requires_grad_(True)
    rhs = torch.randn(3, 1, 6, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, r: sparse_matmul(pattern, v, r), (values, rhs), fast_mode=True)
    flat_values = random_values(pattern, seed=8, dtype=torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v, r: sparse_matmul(pattern, v, r), (flat_values, rhs), fast_mode=True)
    with pytest.raises(TypeError, match="dtype"):
        sparse_matmul(pattern, values, rhs.float())


def test_row_selection_with_repeats_and_entry_lookup():
    pattern = random_pattern(5, 7, seed=9)
    op = SparseFeatureLinearOperator(random_values(pattern, torch.Size([2]), seed=10), pattern=pattern)
    dense = dense_reference(op)
    rows = torch.tensor([4, 0, 4, 2])
    selected = op[..., rows, :]
    assert isinstance(selected, SparseFeatureLinearOperator)
    torch.testing.assert_close(selected.to_dense(), dense[..., rows, :])
    columns = torch.tensor([6, 6, 1])
    torch.testing.assert_close(op[:, rows][..., columns].to_dense(), dense[:, rows][..., columns])
    pairs = (torch.tensor([1, 0]), torch.tensor([0, 4]), torch.tensor([3, 6]))
    torch.testing.assert_close(op[pairs], dense[pairs])
    torch.testing.assert_close(op._diagonal(), torch.diagonal(dense, dim1=-2, dim2=-1))


def test_bilinear_derivative_matches_autograd_and_reduces_broadcast_batches():
    pattern = random_pattern(5, 7, seed=11)
    values = random_values(pattern, seed=12, dtype=torch.float64).requires_grad_(True)
    for transposed in (False, True):
        op = SparseFeatureLinearOperator(values, pattern=pattern, transposed=transposed)
        left = torch.randn(3, op.size(-2), 2, dtype=torch.float64)
        right = torch.randn(3, op.size(-1), 2, dtype=torch.float64)
        (custom,) = op._bilinear_derivative(left, right)
        (reference,) = torch.autograd.grad((left * (dense_reference(op) @ right)).sum(), values)
        torch.testing.assert_close(custom, reference)
