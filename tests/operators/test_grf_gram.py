"""GRFGramLinearOperator: the linear_operator peer suites plus our own checks."""

from __future__ import annotations

import math
import unittest

import linear_operator
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


class _PatchedGramModule:
    """Sets attributes of :mod:`gp_couple.operators.grf_gram` (``patches``) for each test, restoring them after."""

    patches: dict = {}

    def setUp(self) -> None:
        super().setUp()
        self._saved = {name: getattr(grf_gram, name) for name in self.patches}
        for name, value in self.patches.items():
            setattr(grf_gram, name, value)

    def tearDown(self) -> None:
        for name, value in self._saved.items():
            setattr(grf_gram, name, value)
        super().tearDown()


class _CompiledDenseProduct(_PatchedGramModule):
    """Every symmetric ``to_dense`` by the compiled sparse loop, however dense the features."""

    patches = {"_DENSE_PRODUCT_ADVANTAGE": 0}


class TestCompiledGRFGramLinearOperator(_CompiledDenseProduct, GRFGramOperatorMixin, LinearOperatorTestCase,
                                        unittest.TestCase):
    pass


class TestBatchCompiledGRFGramLinearOperator(_CompiledDenseProduct, GRFGramOperatorMixin, LinearOperatorTestCase,
                                             unittest.TestCase):
    batch_shape = torch.Size([2, 3])


class TestBatchCompactCompiledGRFGramLinearOperator(_CompiledDenseProduct, GRFGramOperatorMixin,
                                                    LinearOperatorTestCase, unittest.TestCase):
    num_columns = 14
    untouched = 6
    batch_shape = torch.Size([3])


class _AlwaysAssembled(_PatchedGramModule):
    """Every untracked symmetric product by the assembled sparse Gram, from the first, however dense."""

    patches = {"_ASSEMBLY_COST": 0, "_gram_entries": lambda pattern: 0}


class TestAssembledGRFGramLinearOperator(_AlwaysAssembled, GRFGramOperatorMixin, LinearOperatorTestCase,
                                         unittest.TestCase):
    pass


class TestCompactAssembledGRFGramLinearOperator(_AlwaysAssembled, GRFGramOperatorMixin, LinearOperatorTestCase,
                                                unittest.TestCase):
    num_columns = 14
    untouched = 6


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


def _leaf_and_dense(features: SparseFeatureLinearOperator) -> tuple[torch.Tensor, torch.Tensor]:
    """The features' values as a leaf, and the same features as a dense leaf (rows x nodes)."""
    values = features.values.detach().requires_grad_(True)
    dense = values.new_zeros(*values.shape[:-1], *features.pattern.shape)
    dense[..., features.pattern.row_indices, features.pattern.columns] = values.detach()
    return values, dense.requires_grad_(True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch_shape", [torch.Size(), torch.Size([3])])
@pytest.mark.parametrize("symmetric", [True, False])
def test_the_compiled_gram_and_its_gradient_are_the_dense_product(monkeypatch, batch_shape, dtype, symmetric):
    calls = []
    compiled = grf_gram._CompiledGram.apply
    monkeypatch.setattr(grf_gram._CompiledGram, "apply", lambda *args: calls.append(1) or compiled(*args))
    monkeypatch.setattr(grf_gram, "_DENSE_PRODUCT_ADVANTAGE", 0)
    left = _features(11, 30, 5, batch_shape, dtype)
    right = left if symmetric else _features(8, 30, 9, batch_shape, dtype)
    left_values, left_dense = _leaf_and_dense(left)
    right_values, right_dense = (left_values, left_dense) if symmetric else _leaf_and_dense(right)
    weights = torch.randn(*batch_shape, 11, right.size(-2), generator=torch.Generator().manual_seed(6), dtype=dtype)
    left_operator = SparseFeatureLinearOperator(left_values, pattern=left.pattern)
    gram = GRFGramLinearOperator(left_operator) if symmetric else \
        GRFGramLinearOperator(left_operator, SparseFeatureLinearOperator(right_values, pattern=right.pattern))
    gram = gram.to_dense()
    assert calls, "the compiled loop was not used"
    expected = left_dense @ right_dense.mT
    torch.testing.assert_close(gram, expected)
    (gram * weights).sum().backward()
    (expected * weights).sum().backward()
    torch.testing.assert_close(left_values.grad, left_dense.grad[..., left.pattern.row_indices, left.pattern.columns])
    if not symmetric:
        torch.testing.assert_close(right_values.grad,
                                   right_dense.grad[..., right.pattern.row_indices, right.pattern.columns])


def test_sparse_features_take_the_compiled_loop_and_dense_ones_a_matrix_product(monkeypatch):
    calls = []
    compiled = grf_gram._CompiledGram.apply
    monkeypatch.setattr(grf_gram._CompiledGram, "apply", lambda *args: calls.append(1) or compiled(*args))
    # Ten nonzeros per row of 2,000 nodes: about 2,000 x 100 multiply-adds for the loop,
    # 100^2 x 2,000 for a product of the densified rows.
    rows, columns = 100, 2000
    pattern_columns = torch.stack([torch.randperm(columns, generator=torch.Generator().manual_seed(row))[:10].sort()
                                   .values for row in range(rows)]).reshape(-1)
    pattern = grf_gram.CSRPattern(torch.arange(0, rows * 10 + 1, 10), pattern_columns, columns)
    sparse = SparseFeatureLinearOperator(torch.rand(rows * 10, dtype=torch.float64), pattern=pattern)
    torch.testing.assert_close(GRFGramLinearOperator(sparse).to_dense(), gram_reference(GRFGramLinearOperator(sparse)))
    assert calls == [1]
    dense = _features(30, 12, 7)
    torch.testing.assert_close(GRFGramLinearOperator(dense).to_dense(), gram_reference(GRFGramLinearOperator(dense)))
    assert calls == [1]


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
    rhs = torch.randn(6, 2, dtype=torch.float64)
    torch.testing.assert_close(negative._matmul(rhs), -gram_reference(gram) @ rhs)


def test_constructor_validation():
    with pytest.raises(TypeError, match="left"):
        GRFGramLinearOperator(torch.eye(3))
    with pytest.raises(ValueError, match="widths"):
        GRFGramLinearOperator(_features(3, 5, 6), _features(3, 6, 7))
    with pytest.raises(TypeError, match="dtypes"):
        GRFGramLinearOperator(_features(3, 5, 6), _features(3, 5, 7, dtype=torch.float32))


def test_cross_products_run_on_the_shared_nodes_and_keep_gradients():
    # Test and training rows share a few graph nodes only; the products drop the rest.
    left, right = _features(6, 50, 20), _features(8, 50, 22)
    gram = GRFGramLinearOperator(left, right)
    reference = gram_reference(gram).detach()
    rhs = torch.randn(8, 3, dtype=torch.float64)
    with torch.no_grad():  # caches the restricted factors untracked
        torch.testing.assert_close(gram._matmul(rhs), reference @ rhs)
    factor_left, factor_right = gram._product_factors()
    assert factor_left.pattern.num_columns == factor_right.pattern.num_columns
    assert factor_left.pattern.nnz < left.pattern.nnz and factor_right.pattern.nnz < right.pattern.nnz
    torch.testing.assert_close(gram._t_matmul(torch.ones(6, 2, dtype=torch.float64)),
                               reference.mT @ torch.ones(6, 2, dtype=torch.float64))
    # With gradients on, the gather is tracked again: values get their gradients.
    values = left.values.clone().requires_grad_(True)
    tracked = GRFGramLinearOperator(SparseFeatureLinearOperator(values, pattern=left.pattern), right)
    with torch.no_grad():
        tracked._matmul(rhs)
    tracked._matmul(rhs).sum().backward()
    dense_values = values.detach().clone().requires_grad_(True)
    dense = gram_reference(GRFGramLinearOperator(SparseFeatureLinearOperator(dense_values, pattern=left.pattern),
                                                 right))
    (dense @ rhs).sum().backward()
    torch.testing.assert_close(values.grad, dense_values.grad)
    # An in-place change of the values is seen by the next product.
    with torch.no_grad():
        left.values.mul_(2.0)
        torch.testing.assert_close(gram._matmul(rhs), 2.0 * reference @ rhs)


def test_cross_product_of_rows_with_no_shared_node_is_zero():
    from gp_couple.operators import CSRPattern

    left = SparseFeatureLinearOperator(torch.tensor([1.0, 2.0]), pattern=CSRPattern(
        torch.tensor([0, 1, 2]), torch.tensor([0, 1]), 6))
    right = SparseFeatureLinearOperator(torch.tensor([3.0]), pattern=CSRPattern(
        torch.tensor([0, 1]), torch.tensor([5]), 6))
    gram = GRFGramLinearOperator(left, right)
    torch.testing.assert_close(gram._matmul(torch.ones(1, 4)), torch.zeros(2, 4))
    torch.testing.assert_close(gram._t_matmul(torch.ones(2, 4)), torch.zeros(1, 4))


def _scattered_rows(rows: int, columns: int, per_row: int,
                    dtype: torch.dtype = torch.float64) -> SparseFeatureLinearOperator:
    """Rows with ``per_row`` random columns of ``columns``: few rows share a column, so the Gram is sparse."""
    pattern_columns = torch.stack([torch.randperm(columns, generator=torch.Generator().manual_seed(row))[:per_row]
                                   .sort().values for row in range(rows)]).reshape(-1)
    pattern = grf_gram.CSRPattern(torch.arange(0, rows * per_row + 1, per_row), pattern_columns, columns)
    values = torch.rand(rows * per_row, dtype=dtype, generator=torch.Generator().manual_seed(rows))
    return SparseFeatureLinearOperator(values, pattern=pattern)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_repeated_untracked_products_switch_to_the_assembled_sparse_gram(dtype):
    features = _scattered_rows(200, 4000, 10, dtype)
    pattern = features.pattern.compact()[0]
    reference = gram_reference(GRFGramLinearOperator(features))
    # The count of the compiled loop is the stored entries of the sparse product, and fewer than Phi's.
    assert grf_gram._gram_entries(pattern) == int((reference != 0).sum()) < pattern.nnz
    gram = GRFGramLinearOperator(features)
    rhs = torch.randn(3, 200, 4, dtype=dtype, generator=torch.Generator().manual_seed(0))
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    assembled = []
    with torch.no_grad():
        for _ in range(6):
            torch.testing.assert_close(gram._matmul(rhs), reference @ rhs, **tolerance)
            assembled.append(gram._assembly[2] is not None)
    # Not for the first products (a few products never pay for assembling), then for every one.
    spent_per_product = 2 * pattern.nnz * rhs.shape[0] * rhs.shape[-1]
    first = math.ceil(grf_gram._ASSEMBLY_COST * grf_gram._assembly_multiply_adds(pattern) / spent_per_product)
    assert 0 < first < 6 and assembled == [False] * first + [True] * (6 - first)
    # An in-place change of the values assembles again: no stale Gram.
    with torch.no_grad():
        features.values.mul_(2.0)
        torch.testing.assert_close(gram._matmul(rhs), 4.0 * reference @ rhs, **tolerance)
    # Tracked products keep the differentiable path, and their gradients.
    features.values.requires_grad_(True)
    tracked = GRFGramLinearOperator(features)
    for _ in range(6):
        tracked._matmul(rhs).sum().backward()
    assert tracked._assembly is None and features.values.grad is not None


def test_the_entry_count_takes_a_limit_and_rejects_a_widely_shared_column_before_counting(monkeypatch):
    features = _scattered_rows(200, 4000, 10)
    pattern = features.pattern.compact()[0]
    entries = grf_gram._gram_entries(pattern)
    gram = GRFGramLinearOperator(features)
    assert gram.sparse_entries(entries) == entries and gram.sparse_entries(entries - 1) is None
    # Every row sharing column 0: at least 200^2 entries, known from the column counts alone.
    shared = grf_gram.CSRPattern(torch.arange(0, 401, 2), torch.stack([torch.zeros(200, dtype=torch.int64),
                                                                     torch.arange(1, 201)], 1).reshape(-1), 201)
    monkeypatch.setattr(grf_gram, "sparse_gram_entries", None)     # not counted
    assert grf_gram._gram_entries(shared, 200 ** 2 - 1) is None


def test_a_gram_with_more_entries_than_its_features_is_never_assembled():
    features = _features(30, 12, 7)
    assert grf_gram._gram_entries(features.pattern.compact()[0]) is None
    gram = GRFGramLinearOperator(features)
    rhs = torch.randn(30, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for _ in range(20):
            torch.testing.assert_close(gram._matmul(rhs), gram_reference(gram) @ rhs)
    assert gram._assembly[2] is None


def test_cg_solves_and_log_determinants_agree_with_and_without_the_assembled_gram(monkeypatch):
    features = _scattered_rows(300, 5000, 12)
    rhs = torch.randn(300, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def solve_and_logdet():
        covariance = GRFGramLinearOperator(features).add_diagonal(torch.tensor(0.5, dtype=torch.float64))
        # The same probe vectors for both stochastic log-determinants.
        with linear_operator.settings.max_cholesky_size(0), torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(0)
            inv_quad, logdet = covariance.inv_quad_logdet(rhs, logdet=True)
            return covariance.solve(rhs), inv_quad, logdet

    assemblies = []
    assemble = grf_gram._assembled_gram
    monkeypatch.setattr(grf_gram, "_assembled_gram", lambda features: assemblies.append(1) or assemble(features))
    assembled = solve_and_logdet()
    count = len(assemblies)
    assert count > 0
    monkeypatch.setattr(grf_gram, "_gram_entries", lambda pattern: None)
    by_features = solve_and_logdet()
    assert len(assemblies) == count
    for first, second in zip(assembled, by_features):
        torch.testing.assert_close(first, second, rtol=1e-6, atol=1e-8)
