r"""The compiled loops (numba) of a dense Gram matrix :math:`\Phi_A\Phi_B^\top` of sparse features, and of its gradient.

Both loops walk the stored entries :math:`(r, c)` of :math:`\Phi_A` row by row, and for
each one the entries :math:`(b, c)` of column :math:`c` of :math:`\Phi_B` (its transposed
pattern), so they cost :math:`\sum_c n^A_c n^B_c` multiply-adds for the column counts of
the two sides: the work of the sparse product itself, with no intermediate sparse matrix
and no densified feature rows. Each row of the output (or of the gradient) belongs to one
thread, so the loops run in parallel without atomics and every sum is taken in a fixed
order (deterministic). The symmetric Gram :math:`\Phi\Phi^\top` is the case
:math:`A = B`. A third loop counts the stored entries of the sparse
:math:`\Phi\Phi^\top` without forming it.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["sparse_gram", "sparse_gram_gradient", "sparse_gram_entries"]


@njit(parallel=True, cache=True)
def sparse_gram(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, column_pointer: np.ndarray,
                column_rows: np.ndarray, column_values: np.ndarray,
                out: np.ndarray) -> None:  # pragma: no cover - compiled
    """Add :math:`\\Phi_A\\Phi_B^\\top` to ``out`` (``R_A x R_B``, zeros on entry).

    ``indptr``, ``indices``, ``values``: :math:`\\Phi_A` in CSR form; ``column_pointer``,
    ``column_rows``, ``column_values``: :math:`\\Phi_B` in CSC form (its transposed pattern).
    """
    for row in prange(indptr.shape[0] - 1):
        for entry in range(indptr[row], indptr[row + 1]):
            column = indices[entry]
            value = values[entry]
            for position in range(column_pointer[column], column_pointer[column + 1]):
                out[row, column_rows[position]] += value * column_values[position]


@njit(parallel=True, cache=True)
def sparse_gram_gradient(indptr: np.ndarray, indices: np.ndarray, column_pointer: np.ndarray,
                         column_rows: np.ndarray, column_values: np.ndarray, weights: np.ndarray,
                         out: np.ndarray) -> None:  # pragma: no cover - compiled
    """Fill ``out[u] = sum_b weights[r, b] * Phi_B[b, c]`` for every stored entry ``u = (r, c)`` of :math:`\\Phi_A`.

    The gradient of :math:`\\langle\\mathbf W, \\Phi_A\\Phi_B^\\top\\rangle` with respect to
    the stored values of :math:`\\Phi_A` (arguments as in :func:`sparse_gram`).
    """
    for row in prange(indptr.shape[0] - 1):
        for entry in range(indptr[row], indptr[row + 1]):
            column = indices[entry]
            total = 0.0
            for position in range(column_pointer[column], column_pointer[column + 1]):
                total += weights[row, column_rows[position]] * column_values[position]
            out[entry] = total


@njit(cache=True)
def sparse_gram_entries(indptr: np.ndarray, indices: np.ndarray, column_pointer: np.ndarray,
                        column_rows: np.ndarray, limit: int) -> int:  # pragma: no cover - compiled
    """Stored entries of the sparse :math:`\\Phi\\Phi^\\top` (pairs of rows whose walks share a node), or ``limit + 1``.

    ``indptr``, ``indices``: :math:`\\Phi` in CSR form; ``column_pointer``, ``column_rows``:
    its transposed pattern. The count stops as soon as it exceeds ``limit``.
    """
    num_rows = indptr.shape[0] - 1
    last_row = np.full(num_rows, -1, dtype=np.int64)
    total = 0
    for row in range(num_rows):
        for entry in range(indptr[row], indptr[row + 1]):
            column = indices[entry]
            for position in range(column_pointer[column], column_pointer[column + 1]):
                other = column_rows[position]
                if last_row[other] != row:
                    last_row[other] = row
                    total += 1
        if total > limit:
            return limit + 1
    return total
