"""The sparse LU factor and its inverse quadratic forms against dense linear algebra."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from gp_couple.sparse_factor import SparseFactor, factor_bytes_bound, factor_cost, nested_dissection


def _problem(seed: int, size: int = 300) -> tuple[sp.csc_matrix, sp.csr_matrix]:
    root = sp.random(size, 200, density=0.015, random_state=seed)
    matrix = (root @ root.T + 0.05 * sp.identity(size)).tocsc()
    rows = sp.random(40, size, density=0.03, random_state=seed + 1).tocsr()
    return matrix, rows


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_inverse_quadratic_forms_match_dense_solves(seed):
    matrix, rows = _problem(seed)
    factor = SparseFactor(matrix)
    dense, dense_rows = matrix.toarray(), rows.toarray()
    expected = np.einsum("ij,ji->i", dense_rows, np.linalg.solve(dense, dense_rows.T))
    np.testing.assert_allclose(factor.inverse_quadratic_forms(rows), expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(factor.solve(dense_rows.T), np.linalg.solve(dense, dense_rows.T), rtol=1e-9,
                               atol=1e-12)


def test_empty_rows_and_no_rows():
    matrix, rows = _problem(3)
    factor = SparseFactor(matrix)
    rows = sp.vstack([rows[:2], sp.csr_matrix((1, matrix.shape[0])), rows[2:3]]).tocsr()
    forms = factor.inverse_quadratic_forms(rows)
    assert forms.shape == (4,) and forms[2] == 0.0 and np.all(forms[[0, 1, 3]] > 0)
    assert factor.inverse_quadratic_forms(sp.csr_matrix((0, matrix.shape[0]))).shape == (0,)


def test_factors_that_cannot_fit_in_memory_are_refused_before_any_work(monkeypatch):
    from gp_couple import sparse_factor

    matrix, _ = _problem(5)
    monkeypatch.setattr(sparse_factor, "physical_memory", lambda: 1000)
    with pytest.raises(ValueError, match="needs at least .* GiB, more than this machine's"):
        SparseFactor(matrix)


def test_factor_bookkeeping_and_errors():
    matrix, _ = _problem(4)
    factor = SparseFactor(matrix)
    assert factor.size == matrix.shape[0] and factor.nnz >= matrix.shape[0]
    assert factor_bytes_bound(matrix) > 0
    with pytest.raises(ValueError, match="square"):
        SparseFactor(sp.random(4, 5, density=0.5, random_state=0))
    with pytest.raises(ValueError, match="singular"):
        SparseFactor(sp.csc_matrix(np.array([[1.0, 1.0], [1.0, 1.0]])))
    with pytest.raises(ValueError, match="not symmetric positive definite"):
        SparseFactor(sp.csc_matrix(np.array([[1.0, 2.0], [2.0, 1.0]])))


def _grid_laplacian(side: int) -> sp.csc_matrix:
    path = sp.diags([-np.ones(side - 1), 2 * np.ones(side), -np.ones(side - 1)], [-1, 0, 1])
    return (sp.kronsum(path, path) + 0.1 * sp.identity(side * side)).tocsc()


def test_nested_dissection_is_a_permutation_that_cuts_the_fill_of_a_grid():
    import scipy.sparse.linalg as spla

    matrix = _grid_laplacian(60)
    order = nested_dissection(matrix)
    assert order.dtype == np.int64 and np.array_equal(np.sort(order), np.arange(matrix.shape[0]))
    natural = spla.splu(matrix, permc_spec="NATURAL", diag_pivot_thresh=0.0, options={"SymmetricMode": True})
    # The natural (row by row) ordering fills the band of width 60; a nested dissection
    # keeps O(n log n) entries.
    assert SparseFactor(matrix).nnz < 0.5 * natural.L.nnz


def test_a_diagonal_matrix_keeps_its_order_and_solves_exactly():
    matrix = sp.diags(np.arange(1.0, 6.0)).tocsc()
    assert np.array_equal(nested_dissection(matrix), np.arange(5))
    factor = SparseFactor(matrix)
    np.testing.assert_allclose(factor.solve(np.ones(5)), 1 / np.arange(1.0, 6.0))
    np.testing.assert_allclose(factor.inverse_quadratic_forms(sp.identity(5, format="csr")), 1 / np.arange(1.0, 6.0))


def test_the_ordering_is_deterministic():
    matrix, _ = _problem(6)
    assert np.array_equal(nested_dissection(matrix), nested_dissection(matrix))


def test_forms_and_solves_hold_at_a_high_signal_to_noise_ratio():
    # At a signal-to-noise ratio of 10^6 the pivots are up to 10^6 times smaller than the
    # diagonal (recovering them from L and diag(A) would lose digits to cancellation).
    root = sp.random(300, 200, density=0.015, random_state=7)
    matrix = (1e6 * (root @ root.T) + sp.identity(300)).tocsc()
    rows = sp.random(40, 300, density=0.03, random_state=8).tocsr()
    dense, dense_rows = matrix.toarray(), rows.toarray()
    expected = np.einsum("ij,ji->i", dense_rows, np.linalg.solve(dense, dense_rows.T))
    factor = SparseFactor(matrix)
    np.testing.assert_allclose(factor.inverse_quadratic_forms(rows), expected, rtol=1e-8)
    # Solves are backward stable: a normwise error of order the condition number (7e6) times
    # the unit roundoff.
    solution = np.linalg.solve(dense, dense_rows.T)
    assert np.linalg.norm(factor.solve(dense_rows.T) - solution) <= 1e-8 * np.linalg.norm(solution)


@pytest.mark.parametrize("matrix", [_grid_laplacian(30), _problem(0)[0], _problem(1, size=500)[0]],
                         ids=["grid", "random", "random_larger"])
def test_the_symbolic_count_is_the_factors_size_and_stops_at_its_limit(matrix):
    cost = factor_cost(matrix, 10**15)
    factor = SparseFactor(matrix, cost.order)
    columns = np.diff(factor._lower.indptr)
    assert cost.entries == factor.nnz == columns.sum()
    assert cost.multiply_adds == int((columns.astype(np.float64) ** 2).sum())
    assert np.array_equal(cost.order, nested_dissection(matrix))
    again = factor_cost(matrix, cost.multiply_adds)
    assert (again.entries, again.multiply_adds) == (cost.entries, cost.multiply_adds)
    assert factor_cost(matrix, cost.multiply_adds - 1) is None
    # Stopped on the entries alone: sum(c^2) >= E^2 / n.
    assert factor_cost(matrix, cost.entries ** 2 // matrix.shape[0] // 4) is None


def test_the_symbolic_count_and_the_ordering_rule_reject_bad_input():
    from gp_couple.predictive_variance import sparse_factor_ordering

    matrix = _grid_laplacian(5)
    with pytest.raises(ValueError, match="must be square"):
        factor_cost(sp.random(4, 5, density=0.5, format="csr", random_state=0), 10)
    with pytest.raises(ValueError, match="multiply_add_limit"):
        factor_cost(matrix, -1)
    with pytest.raises(TypeError, match="multiply_add_limit"):
        factor_cost(matrix, 1.5)
    with pytest.raises(ValueError, match="num_solves"):
        sparse_factor_ordering(matrix, -1)
