"""The sparse LU factor and its inverse quadratic forms against dense linear algebra."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from gp_couple.sparse_factor import SparseFactor, factor_bytes_bound


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
