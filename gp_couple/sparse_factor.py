r"""Exact factorisation of a sparse symmetric positive-definite matrix, and its inverse quadratic forms.

A GP's predictive variance needs :math:`\mathbf k_*^\top\mathbf A^{-1}\mathbf k_*` for every
test point, with :math:`\mathbf A = \mathbf K_{XX} + \sigma_n^2\mathbf I`. When
:math:`\mathbf A` and the cross-covariance rows :math:`\mathbf k_*` are sparse, as GRF
kernel matrices :math:`\Phi\Phi^\top` are (two nodes covary only where their walks meet),
a sparse LU factorisation :math:`\mathbf P_r\mathbf A\mathbf P_c = \mathbf L\mathbf U`
(SuperLU through SciPy, with a fill-reducing minimum-degree ordering of
:math:`\mathbf A + \mathbf A^\top` and diagonal pivots) is exact and far smaller than a
dense Cholesky factor, and each quadratic form costs two triangular solves with a sparse
right-hand side, which touch only the part of the factor reachable from the nonzeros of
:math:`\mathbf k_*` (:mod:`gp_couple._sparse_factor_compiled`).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from . import _sparse_factor_compiled as compiled
from .devices import physical_memory

__all__ = ["FILL_ALLOWANCE", "SparseFactor", "factor_bytes_bound"]

#: Bytes per stored factor entry (a float64 value and an int32 row index) in SuperLU's L and U.
_BYTES_PER_FACTOR_ENTRY = 12
#: Fill allowance: the factors of the GRF training covariances measured in the
#: benchmarks held 0.5-4 times the entries of the matrix; auto-selection assumes at most this.
FILL_ALLOWANCE = 16


def factor_bytes_bound(matrix: sp.spmatrix) -> int:
    """Bytes the factors of ``matrix`` are allowed before auto-selection prefers another method.

    :data:`FILL_ALLOWANCE` times the stored entries of ``matrix``, for both triangles.
    """
    return 2 * FILL_ALLOWANCE * int(matrix.nnz) * _BYTES_PER_FACTOR_ENTRY


def _lower_csc(matrix: sp.spmatrix) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A lower-triangular CSC matrix as ``(indptr, indices, data, diagonal)`` (int64 indices, float64)."""
    matrix = sp.csc_matrix(matrix)
    matrix.sort_indices()
    diagonal = matrix.diagonal().astype(np.float64)
    return (matrix.indptr.astype(np.int64), matrix.indices.astype(np.int64), matrix.data.astype(np.float64),
            diagonal)


class SparseFactor:
    r"""The sparse LU factors of a symmetric positive-definite matrix :math:`\mathbf A`.

    :param matrix: :math:`\mathbf A`, a square SciPy sparse matrix (converted to float64 CSC).
    :raises ValueError: If ``matrix`` is not square, is singular to working precision, or
        its factors cannot fit in the physical memory (they hold at least the entries of
        ``matrix``, :data:`_BYTES_PER_FACTOR_ENTRY` bytes each).
    """

    def __init__(self, matrix: sp.spmatrix) -> None:
        matrix = sp.csc_matrix(matrix, dtype=np.float64)
        if matrix.shape[0] != matrix.shape[1]:
            raise ValueError(f"the matrix must be square, got shape {matrix.shape}")
        available = physical_memory()
        least = (int(matrix.nnz) + matrix.shape[0]) * _BYTES_PER_FACTOR_ENTRY
        if available is not None and least > available:
            raise ValueError(f"the sparse factor of this {matrix.shape[0]} x {matrix.shape[0]} matrix with "
                             f"{matrix.nnz} entries needs at least {least / 2**30:.3g} GiB, more than this machine's "
                             f"{available / 2**30:.3g} GiB; use fewer observed nodes or fewer or shorter walks")
        self.size = int(matrix.shape[0])
        try:
            self._lu = spla.splu(matrix, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                                 options={"SymmetricMode": True})
        except RuntimeError as error:  # SuperLU: "Factor is exactly singular"
            raise ValueError(f"the matrix is singular: {error}") from error
        self._lower = _lower_csc(self._lu.L)
        self._upper_transposed = _lower_csc(self._lu.U.T)
        self.row_permutation = np.asarray(self._lu.perm_r, dtype=np.int64)
        self.column_permutation = np.asarray(self._lu.perm_c, dtype=np.int64)
        # Diagonal pivots of a symmetric matrix under a symmetric ordering give U = D L^T.
        self.symmetric_pivots = bool(np.array_equal(self.row_permutation, self.column_permutation)
                                     and np.all(self._upper_transposed[3] > 0))

    @property
    def nnz(self) -> int:
        """Entries stored in the two triangular factors."""
        return int(self._lower[1].size + self._upper_transposed[1].size)

    def nbytes(self) -> int:
        """Bytes held by the factors (SuperLU's and the compiled solver's copies)."""
        return sum(int(array.nbytes) for part in (self._lower, self._upper_transposed) for array in part) \
            + self.nnz * _BYTES_PER_FACTOR_ENTRY

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        r""":math:`\mathbf A^{-1}\mathbf b` for a dense ``rhs`` of shape ``(n,)`` or ``(n, k)`` (float64)."""
        return self._lu.solve(np.asarray(rhs, dtype=np.float64))

    def inverse_quadratic_forms(self, rows: sp.spmatrix) -> np.ndarray:
        r""":math:`\mathbf k_r^\top\mathbf A^{-1}\mathbf k_r` for every row :math:`\mathbf k_r` of the sparse ``rows``.

        :param rows: A SciPy sparse matrix of shape ``(t, n)``.
        :return: float64 array of shape ``(t,)``.
        """
        rows = sp.csr_matrix(rows, dtype=np.float64)
        rows.sum_duplicates()
        out = np.empty(rows.shape[0])
        if rows.shape[0] == 0:
            return out
        from numba import get_num_threads

        chunks = int(min(rows.shape[0], 4 * get_num_threads()))
        compiled.inverse_quadratic_forms(*self._lower, *self._upper_transposed, self.row_permutation,
                                         self.column_permutation, rows.indptr.astype(np.int64),
                                         rows.indices.astype(np.int64), rows.data, self.symmetric_pivots,
                                         chunks, out)
        return out
