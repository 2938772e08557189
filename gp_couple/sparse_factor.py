r"""Exact factorisation of a sparse symmetric positive-definite matrix, and its inverse quadratic forms.

A GP's predictive variance needs :math:`\mathbf k_*^\top\mathbf A^{-1}\mathbf k_*` for every
test point, with :math:`\mathbf A = \mathbf K_{XX} + \sigma_n^2\mathbf I`. When
:math:`\mathbf A` and the cross-covariance rows :math:`\mathbf k_*` are sparse, as GRF
kernel matrices :math:`\Phi\Phi^\top` are (two nodes covary only where their walks meet),
a sparse LU factorisation :math:`\mathbf P\mathbf A\mathbf P^\top = \mathbf L\mathbf U`
(SuperLU through SciPy, in a nested-dissection ordering :math:`\mathbf P` of the graph of
:math:`\mathbf A` computed by METIS, with diagonal pivots, so that :math:`\mathbf U =
\mathbf D\mathbf L^\top`) is exact and far smaller than a dense Cholesky factor, and each
quadratic form costs one triangular solve with a sparse right-hand side, which touches
only the part of the factor reachable from the nonzeros of :math:`\mathbf k_*`
(:mod:`gp_couple._sparse_factor_compiled`).

The ordering decides the factor's size. The kernel matrix of observed nodes scattered over
a mesh or a road network has the structure of a planar graph, whose nested-dissection
orderings have the least fill known (George's :math:`O(n\log n)` entries for grids); METIS
(through ``pymetis``) computes one in nearly linear time. On large training sets it gives
a smaller factor than SuperLU's own minimum-degree ordering of :math:`\mathbf A +
\mathbf A^\top` (``benchmarks/RESULTS.md``, "Sparse factors in a nested-dissection ordering").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from . import _sparse_factor_compiled as compiled
from ._checks import check_int
from .devices import physical_memory

__all__ = ["FILL_ALLOWANCE", "FactorCost", "SparseFactor", "factor_bytes_bound", "factor_cost", "nested_dissection"]

#: Bytes per stored factor entry (a float64 value and an int32 row index) in SuperLU's L and U.
_BYTES_PER_FACTOR_ENTRY = 12
#: Factor entries per matrix entry that auto-selection assumes at most (the fill of a
#: fill-reducing ordering is not known before factorising).
FILL_ALLOWANCE = 16


def factor_bytes_bound(matrix: sp.spmatrix) -> int:
    """Bytes the factors of ``matrix`` are allowed before auto-selection prefers another method.

    :data:`FILL_ALLOWANCE` times the stored entries of ``matrix``, for both triangles.
    """
    return 2 * FILL_ALLOWANCE * int(matrix.nnz) * _BYTES_PER_FACTOR_ENTRY


def nested_dissection(matrix: sp.spmatrix) -> np.ndarray:
    r"""A fill-reducing nested-dissection ordering of a structurally symmetric sparse matrix (METIS).

    :param matrix: A square SciPy sparse matrix; only its off-diagonal pattern is read.
    :return: ``order`` (int64, a permutation of ``range(n)``): row and column ``k`` of the
        ordered matrix ``matrix[order][:, order]`` are row and column ``order[k]`` of
        ``matrix``.
    """
    import pymetis

    pattern = sp.csr_matrix(matrix, copy=True)
    pattern.setdiag(0)
    pattern.eliminate_zeros()
    if pattern.nnz == 0:
        return np.arange(pattern.shape[0], dtype=np.int64)
    pattern = (pattern + pattern.T).tocsr()  # METIS needs a symmetric adjacency
    pattern.sort_indices()
    order, _ = pymetis.nested_dissection(pymetis.CSRAdjacency(pattern.indptr, pattern.indices))
    return np.asarray(order, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class FactorCost:
    r"""The size and work of the factor of a symmetric matrix in a given ordering (known before factorising).

    :ivar order: The ordering (:func:`nested_dissection`).
    :ivar entries: Entries of :math:`\mathbf L`, diagonal included.
    :ivar multiply_adds: :math:`\sum_j c_j^2` over the column counts :math:`c_j` of
        :math:`\mathbf L`, the work of the factorisation up to a constant (for a dense
        matrix :math:`\approx n^3/3`).
    """

    order: np.ndarray
    entries: int
    multiply_adds: int


def factor_cost(matrix: sp.spmatrix, multiply_add_limit: int) -> FactorCost | None:
    r"""The factor's entries and work in a nested-dissection ordering, by a symbolic factorisation.

    The Cholesky factor's column counts of the ordered pattern (elimination tree and row
    subtrees, :func:`gp_couple._sparse_factor_compiled.symbolic_cholesky`); SuperLU's
    :math:`\mathbf L` with diagonal pivots on a symmetric pattern has the same structure.
    The count stops once the entries :math:`E` alone prove the work above the limit
    (:math:`\sum_j c_j^2 \ge E^2/n`), so a factor that fills in costs no more than that.

    :param matrix: A square, structurally symmetric SciPy sparse matrix.
    :param multiply_add_limit: Work above which the cost is not needed (a non-negative int).
    :return: The :class:`FactorCost`, or ``None`` where the work exceeds the limit.
    :raises ValueError: If ``matrix`` is not square or the limit is negative.
    :raises TypeError: If the limit is not an int.
    """
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"the matrix must be square, got shape {matrix.shape}")
    multiply_add_limit = check_int("multiply_add_limit", multiply_add_limit, 0)
    size = int(matrix.shape[0])
    order = nested_dissection(matrix)
    ordered = sp.csc_matrix(matrix)[order][:, order].tocsc()
    ordered.sort_indices()
    entry_limit = int(min(np.sqrt(float(multiply_add_limit) * size), np.iinfo(np.int64).max // 2))
    counts = np.empty(size, dtype=np.int64)
    entries = int(compiled.symbolic_cholesky(ordered.indptr.astype(np.int64), ordered.indices.astype(np.int64),
                                             entry_limit, counts))
    if entries > entry_limit:
        return None
    work = int(np.square(counts.astype(np.float64)).sum())
    return None if work > multiply_add_limit else FactorCost(order, entries, work)


class SparseFactor:
    r"""The sparse factorisation :math:`\mathbf P\mathbf A\mathbf P^\top = \mathbf L\mathbf D\mathbf L^\top`
    of a symmetric positive-definite matrix.

    SuperLU's LU factors in the nested-dissection ordering :math:`\mathbf P`
    (:func:`nested_dissection`) with diagonal pivots:
    :math:`\mathbf U = \mathbf D\mathbf L^\top`, so only :math:`\mathbf L` (unit lower
    triangular) and the diagonal of :math:`\mathbf U` are kept for the quadratic forms.

    :param matrix: :math:`\mathbf A`, a square SciPy sparse matrix (converted to float64 CSC).
    :param order: Its fill-reducing ordering, if already computed (:func:`nested_dissection`
        of ``matrix``, e.g. from :func:`factor_cost`).
    :raises ValueError: If ``matrix`` is not square, is not symmetric positive definite (a
        zero, negative or off-diagonal pivot), or its factors cannot fit in the physical
        memory (they hold at least the entries of ``matrix``).
    """

    def __init__(self, matrix: sp.spmatrix, order: np.ndarray | None = None) -> None:
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
        if order is None:
            order = nested_dissection(matrix)
        ordered = matrix[order][:, order].tocsc()
        del matrix
        try:
            lu = spla.splu(ordered, permc_spec="NATURAL", diag_pivot_thresh=0.0, options={"SymmetricMode": True})
        except RuntimeError as error:  # SuperLU: "Factor is exactly singular"
            raise ValueError(f"the matrix is singular: {error}") from error
        if not np.array_equal(lu.perm_r, lu.perm_c) or not np.array_equal(lu.perm_c, np.arange(self.size)):
            raise ValueError("the matrix is not symmetric positive definite (SuperLU's pivots left the diagonal)")
        self._order = order
        #: ``(P A)[permutation[i]] = A[i]``: the position of row (and column) ``i`` in the ordering.
        self.permutation = np.empty(self.size, dtype=np.int64)
        self.permutation[order] = np.arange(self.size)
        #: :math:`\mathbf D`, the pivots (read from :math:`\mathbf U`: recovering them from
        #: :math:`\mathbf L` and the diagonal of :math:`\mathbf A` loses digits to cancellation
        #: at high signal-to-noise ratios).
        self.pivots = lu.U.diagonal()
        if not np.all(self.pivots > 0):
            raise ValueError("the matrix is not symmetric positive definite (a pivot was not positive)")
        # Only L and D are kept: SuperLU's own storage of both triangles is released.
        self._lower = sp.csc_matrix(lu.L)
        del lu
        self._lower.sort_indices()

    @property
    def nnz(self) -> int:
        r"""Entries stored in :math:`\mathbf L`, the factor kept."""
        return int(self._lower.nnz)

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        r""":math:`\mathbf A^{-1}\mathbf b` for a dense ``rhs`` of shape ``(n,)`` or ``(n, k)`` (float64)."""
        rhs = np.asarray(rhs, dtype=np.float64)
        ordered = np.ascontiguousarray(rhs[self._order].reshape(self.size, -1))
        lower = self._lower
        compiled.solve_ldlt(lower.indptr, lower.indices, lower.data, self.pivots, ordered)
        solution = np.empty_like(ordered)
        solution[self._order] = ordered
        return solution.reshape(rhs.shape)

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
