r"""The compiled loops (numba) of a dense Gram matrix :math:`\Phi\Phi^\top` of sparse features, and of its gradient.

Both loops walk the stored entries :math:`(r, c)` of :math:`\Phi` row by row, and for each
one the entries :math:`(b, c)` of its column (the transposed pattern), so they cost
:math:`\sum_c n_c^2` multiply-adds for column counts :math:`n_c`: the work of the sparse
product itself, with no intermediate sparse matrix and no densified feature rows. Each
row of the output (or of the gradient) belongs to one thread, so the loops run in
parallel without atomics and every sum is taken in a fixed order (deterministic).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["symmetric_gram", "symmetric_gram_gradient"]


@njit(parallel=True, cache=True)
def symmetric_gram(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, column_pointer: np.ndarray,
                   column_rows: np.ndarray, column_values: np.ndarray,
                   out: np.ndarray) -> None:  # pragma: no cover - compiled
    """Add :math:`\\Phi\\Phi^\\top` to ``out`` (``R x R``, zeros on entry)."""
    for row in prange(indptr.shape[0] - 1):
        for entry in range(indptr[row], indptr[row + 1]):
            column = indices[entry]
            value = values[entry]
            for position in range(column_pointer[column], column_pointer[column + 1]):
                out[row, column_rows[position]] += value * column_values[position]


@njit(parallel=True, cache=True)
def symmetric_gram_gradient(indptr: np.ndarray, indices: np.ndarray, column_pointer: np.ndarray,
                            column_rows: np.ndarray, column_values: np.ndarray, weights: np.ndarray,
                            out: np.ndarray) -> None:  # pragma: no cover - compiled
    """Fill ``out[u] = sum_b weights[r, b] * Phi[b, c]`` for every stored entry ``u = (r, c)``."""
    for row in prange(indptr.shape[0] - 1):
        for entry in range(indptr[row], indptr[row + 1]):
            column = indices[entry]
            total = 0.0
            for position in range(column_pointer[column], column_pointer[column + 1]):
                total += weights[row, column_rows[position]] * column_values[position]
            out[entry] = total
