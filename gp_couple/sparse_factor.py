r"""Exact factorisation of a sparse symmetric positive-definite matrix, and its inverse quadratic forms.

A GP's predictive variance needs :math:`\mathbf k_*^\top\mathbf A^{-1}\mathbf k_*` for every
test point, with :math:`\mathbf A = \mathbf K_{XX} + \sigma_n^2\mathbf I`. When
:math:`\mathbf A` and the cross-covariance rows :math:`\mathbf k_*` are sparse, as GRF
kernel matrices :math:`\Phi\Phi^\top` are (two nodes covary only where their walks meet),
a sparse LU factorisation :math:`\mathbf P_r\mathbf A\mathbf P_c = \mathbf L\mathbf U`
(SuperLU through SciPy, with a fill-reducing minimum-degree ordering of
:math:`\mathbf A + \mathbf A^\top` and diagonal pivots, so that :math:`\mathbf U =
\mathbf D\mathbf L^\top`) is exact and far smaller than a dense Cholesky factor, and each
quadratic form costs one triangular solve with a sparse right-hand side, which touches
only the part of the factor reachable from the nonzeros of :math:`\mathbf k_*`
(:mod:`gp_couple._sparse_factor_compiled`).
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
#: Factor entries per matrix entry that auto-selection assumes at most (the fill of a
#: minimum-degree ordering is not known before factorising).
FILL_ALLOWANCE = 16


def factor_bytes_bound(matrix: sp.spmatrix) -> int:
    """Bytes the factors of ``matrix`` are allowed before auto-selection prefers another method.

    :data:`FILL_ALLOWANCE` times the stored entries of ``matrix``, for both triangles.
    """
    return 2 * FILL_ALLOWANCE * int(matrix.nnz) * _BYTES_PER_FACTOR_ENTRY


class SparseFactor:
    r"""The sparse factorisation :math:`\mathbf P\mathbf A\mathbf P^\top = \mathbf L\mathbf D\mathbf L^\top`
    of a symmetric positive-definite matrix.

    SuperLU's LU factors with a symmetric ordering and diagonal pivots:
    :math:`\mathbf U = \mathbf D\mathbf L^\top`, so only :math:`\mathbf L` (unit lower
    triangular) and the diagonal of :math:`\mathbf U` are kept for the quadratic forms.

    :param matrix: :math:`\mathbf A`, a square SciPy sparse matrix (converted to float64 CSC).
    :raises ValueError: If ``matrix`` is not square, is not symmetric positive definite (a
        zero, negative or off-diagonal pivot), or its factors cannot fit in the physical
        memory (they hold at least the entries of ``matrix``).
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
        #: ``(P A)[permutation[i]] = A[i]``: the symmetric ordering (row and column permutations agree).
        self.permutation = np.asarray(self._lu.perm_r, dtype=np.int64)
        #: :math:`\mathbf D`, the pivots.
        self.pivots = self._lu.U.diagonal()
        if not np.array_equal(self.permutation, self._lu.perm_c) or not np.all(self.pivots > 0):
            raise ValueError("the matrix is not symmetric positive definite (SuperLU's pivots left the diagonal "
                             "or were not positive)")
        self._lower = sp.csc_matrix(self._lu.L)
        self._lower.sort_indices()

    @property
    def nnz(self) -> int:
        r"""Entries stored in :math:`\mathbf L` (SuperLU holds :math:`\mathbf U` as well)."""
        return int(self._lower.nnz)

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        r""":math:`\mathbf A^{-1}\mathbf b` for a dense ``rhs`` of shape ``(n,)`` or ``(n, k)`` (float64)."""
        return self._lu.solve(np.asarray(rhs, dtype=np.float64))

    def inverse_quadratic_forms(self, rows: sp.spmatrix) -> np.ndarray:
        r""":math:`\mathbf k_r^\top\mathbf A^{-1}\mathbf k_r = \mathbf y_r^\top\mathbf D^{-1}\mathbf y_r`,
        :math:`\mathbf y_r = \mathbf L^{-1}\mathbf P\mathbf k_r`, for every row of the sparse ``rows``.

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
        lower = self._lower
        compiled.inverse_quadratic_forms(lower.indptr, lower.indices, lower.data, self.pivots, self.permutation,
                                         rows.indptr, rows.indices, rows.data, chunks, out)
        return out
