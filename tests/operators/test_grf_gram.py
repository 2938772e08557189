"""GRFGramLinearOperator: the linear_operator peer suites plus our own checks."""

from __future__ import annotations

import unittest

import pytest
import torch
from linear_operator.operators import RootLinearOperator
from linear_operator.test.linear_operator_test_case import (
    LinearOperatorTestCase,
    RectangularLinearOperatorTestCase,
)

from gp_couple.operators import GRFGramLinearOperator, SparseFeatureLinearOperator, grf_gram

from .mixins import (
    CrossGramOperatorMixin,
    GRFGramOperatorMixin,
    gram_reference,
    random_pattern,
    random_values,
)


class TestGRFGramLinearOperator(GRFGramOperatorMixin, LinearOperatorTestCase, unittest.TestCase):
    pass


class TestBatchGRFGramLinearOperator(GRFGramOperatorMixin, LinearOperatorTestCase, unittest.TestCase):
    batch_shape = torch.Size([2, 3])


class TestCrossGRFGramLinearOperator(CrossGramOperatorMixin, RectangularLinearOperatorTestCase,
                                     unittest.TestCase):
    pass


class TestBatchCrossGRFGramLinearOperator(CrossGramOperatorMixin, RectangularLinearOperatorTestCase,
                                          unittest.TestCase):
    batch_shape = torch.Size([2, 3])


class TestCompactGRFGramLinearOperator(GRFGramOperatorMixin, LinearOperatorTestCase, unittest.TestCase):
    # Six of fourteen graph nodes are visited by no row's walks.
    num_columns = 14
    untouched = 6


class TestBatchCompactGRFGramLinearOperator(GRFGramOperatorMixin, LinearOperatorTestCase, unittest.TestCase):
    num_columns = 14
    untouched = 6
    batch_shape = torch.Size([3])


class TestCompactCrossGRFGramLinearOperator(CrossGramOperatorMixin, RectangularLinearOperatorTestCase,
                                            unittest.TestCase):
    # Each side leaves different columns empty: the inner space is their union.
    num_columns = 16


class TestBatchCompactCrossGRFGramLinearOperator(CrossGramOperatorMixin, RectangularLinearOperatorTestCase,
                                                 unittest.TestCase):
    num_columns = 16
    batch_shape = torch.Size([2])


# ------------------------------------------------------------------ our own checks
def _features(rows, columns, seed, batch_shape=torch.Size(), dtype=torch.float64):
    pattern = random_pattern(rows, columns, density=0.3, seed=seed)
    return SparseFeatureLinearOperator(random_values(pattern, batch_shape, seed=seed + 1, dtype=dtype),
                                       pattern=pattern)


def test_chunked_to_dense_matches_reference(monkeypatch):
    monkeypatch.setattr(grf_gram, "_DENSE_CHUNK_ENTRIES", 6)
    gram = GRFGramLinearOperator(_features(7, 40, 1, torch.Size([2])), _features(9, 40, 2, torch.Size([2])))
    torch.testing.assert_close(gram.to_dense(), gram_reference(gram))
    symmetric = GRFGramLinearOperator(_features(9, 40, 3))
    torch.testing.assert_close(symmetric.to_dense(), gram_reference(symmetric))


def test_entries_diagonal_and_selection_without_densifying(monkeypatch):
    gram = GRFGramLinearOperator(_features(8, 30, 4))
    reference = gram_reference(gram)

    def forbidden(self):
        raise AssertionError("to_dense called")

    monkeypatch.setattr(GRFGramLinearOperator, "to_dense", forbidden)
    rows, cols = torch.tensor([0, 7, 7, 3]), torch.tensor([7, 0, 7, 5])
    torch.testing.assert_close(gram._get_indices(rows, cols), reference[rows, cols])
    torch.testing.assert_close(gram._diagonal(), reference.diagonal())
    block = gram[torch.tensor([1, 6]), 2:5]
    assert isinstance(block, GRFGramLinearOperator) and not block.is_symmetric
    assert gram[1:4, 1:4].is_symmetric
    # Pivoted Cholesky (the CG preconditioner) reads only the diagonal and rows.
    factor = gram.add_jitter(1.0).pivoted_cholesky(rank=3)
    assert factor.shape == (8, 3)


def test_scaling_keeps_the_exact_root():
    features = _features(6, 20, 5)
    gram = GRFGramLinearOperator(features)
    scaled = gram.mul(torch.tensor(2.5, dtype=torch.float64))
    assert isinstance(scaled, GRFGramLinearOperator) and scaled.is_symmetric
    root = scaled.root_decomposition()
    assert isinstance(root, RootLinearOperator) and isinstance(root.root, SparseFeatureLinearOperator)
    torch.testing.assert_close(root.to_dense(), 2.5 * gram_reference(gram))
    negative = gram.mul(torch.tensor(-1.0, dtype=torch.float64))
    torch.testing.assert_close(negative.to_dense(), -gram_reference(gram))


def test_constructor_validation():
    with pytest.raises(TypeError, match="left"):
        GRFGramLinearOperator(torch.eye(3))
    with pytest.raises(ValueError, match="widths"):
        GRFGramLinearOperator(_features(3, 5, 6), _features(3, 6, 7))
    with pytest.raises(TypeError, match="dtypes"):
        GRFGramLinearOperator(_features(3, 5, 6), _features(3, 5, 7, dtype=torch.float32))
