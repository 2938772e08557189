"""The compiled loop (numba) of the sampled dense-dense product behind the values' gradient.

For every stored entry ``u = (r, c)`` of a CSR pattern: ``out[u] = left[r] . right[c]``.
A loop over the pattern reads each row of ``left`` once and the rows of ``right`` that
the pattern names, which costs about one sparse product with ``k`` right-hand sides
(torch's CPU ``sampled_addmm`` cost 4-5x that on GRF patterns, and a gathered
``(left[rows] * right[cols]).sum(-1)`` materialises two ``nnz x k`` arrays).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["sampled_dots_rows"]


@njit(parallel=True, cache=True)
def sampled_dots_rows(indptr: np.ndarray, indices: np.ndarray, left: np.ndarray, right: np.ndarray,
                      out: np.ndarray) -> None:  # pragma: no cover - compiled
    """Fill ``out[u] = left[r] . right[indices[u]]`` for the entries ``u`` of every row ``r``."""
    width = left.shape[1]
    for row in prange(indptr.shape[0] - 1):
        for entry in range(indptr[row], indptr[row + 1]):
            column = indices[entry]
            total = 0.0
            for k in range(width):
                total += left[row, k] * right[column, k]
            out[entry] = total
