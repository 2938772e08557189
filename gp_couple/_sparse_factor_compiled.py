"""The compiled loops (numba) of :class:`gp_couple.sparse_factor.SparseFactor`: sparse triangular solves.

The right-hand sides are sparse too.

A lower-triangular system :math:`\\mathbf L\\mathbf x = \\mathbf b` with a sparse
:math:`\\mathbf b` has a sparse solution: its nonzeros are the nodes reachable from those
of :math:`\\mathbf b` in the graph of :math:`\\mathbf L` (column :math:`j` points to the
rows below the diagonal it holds), and solving in a topological order of that reach
costs only the entries of the reached columns (Gilbert and Peierls' algorithm, as in
CSparse's ``cs_reach`` / ``cs_spsolve``). A quadratic form
:math:`\\mathbf k^\\top\\mathbf A^{-1}\\mathbf k` of a sparse :math:`\\mathbf k` then costs
two such solves instead of two dense ones.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["inverse_quadratic_forms"]


@njit(cache=True)
def _reach(indptr: np.ndarray, indices: np.ndarray, starts: np.ndarray, mark: np.ndarray, stamp: int,
           stack: np.ndarray, head: np.ndarray, order: np.ndarray) -> int:  # pragma: no cover - compiled
    """Nodes reachable from ``starts`` below the diagonal of a CSC triangle, in topological order.

    Depth-first search without recursion; ``order[top:]`` receives the reach in reverse
    post-order (every node before the nodes it reaches) and ``top`` is returned. Nodes are
    marked with ``stamp``, so the work arrays are never cleared.
    """
    top = order.shape[0]
    for s in range(starts.shape[0]):
        root = starts[s]
        if mark[root] == stamp:
            continue
        mark[root] = stamp
        depth = 0
        stack[0] = root
        head[0] = indptr[root]
        while depth >= 0:
            node = stack[depth]
            position = head[depth]
            pushed = False
            while position < indptr[node + 1]:
                child = indices[position]
                position += 1
                if child > node and mark[child] != stamp:
                    head[depth] = position
                    mark[child] = stamp
                    depth += 1
                    stack[depth] = child
                    head[depth] = indptr[child]
                    pushed = True
                    break
            if not pushed:
                depth -= 1
                top -= 1
                order[top] = node
    return top


@njit(cache=True)
def _solve(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, diagonal: np.ndarray,
           rhs_rows: np.ndarray, rhs_values: np.ndarray, x: np.ndarray, mark: np.ndarray, stamp: int,
           stack: np.ndarray, head: np.ndarray, order: np.ndarray) -> int:  # pragma: no cover - compiled
    """Solve the lower-triangular CSC system for a sparse right-hand side; the solution is ``x[order[top:]]``."""
    top = _reach(indptr, indices, rhs_rows, mark, stamp, stack, head, order)
    for k in range(top, order.shape[0]):
        x[order[k]] = 0.0
    for k in range(rhs_rows.shape[0]):
        x[rhs_rows[k]] += rhs_values[k]
    for k in range(top, order.shape[0]):
        column = order[k]
        value = x[column] / diagonal[column]
        x[column] = value
        for position in range(indptr[column], indptr[column + 1]):
            row = indices[position]
            if row > column:
                x[row] -= data[position] * value
    return top


@njit(parallel=True, cache=True)
def inverse_quadratic_forms(lower_indptr: np.ndarray, lower_indices: np.ndarray, lower_data: np.ndarray,
                            lower_diagonal: np.ndarray, upper_t_indptr: np.ndarray, upper_t_indices: np.ndarray,
                            upper_t_data: np.ndarray, upper_t_diagonal: np.ndarray, row_permutation: np.ndarray,
                            column_permutation: np.ndarray, rows_indptr: np.ndarray, rows_indices: np.ndarray,
                            rows_data: np.ndarray, symmetric: bool, num_chunks: int,
                            out: np.ndarray) -> None:  # pragma: no cover - compiled
    r"""``out[r] = k_r^T A^{-1} k_r`` for the sparse rows ``k_r`` (CSR), from :math:`P_r A P_c = L U`.

    :math:`\mathbf k^\top\mathbf A^{-1}\mathbf k = (\mathbf U^{-\top}\mathbf P_c^\top\mathbf k)^\top
    (\mathbf L^{-1}\mathbf P_r\mathbf k)`: one sparse solve with :math:`\mathbf L` and one
    with :math:`\mathbf U^\top` (both lower triangular, CSC), summed over the common reach.
    ``(P_r k)[row_permutation[i]] = k[i]`` and ``(P_c^T k)[column_permutation[i]] = k[i]``.
    When ``symmetric`` (symmetric pivoting, :math:`P_c = P_r^\top`, so that
    :math:`\mathbf U = \mathbf D\mathbf L^\top`), the form is
    :math:`\mathbf y^\top\mathbf D^{-1}\mathbf y` with :math:`\mathbf y = \mathbf L^{-1}\mathbf P_r\mathbf k`:
    one solve, and a sum of non-negative terms.
    """
    n = lower_diagonal.shape[0]
    num_rows = rows_indptr.shape[0] - 1
    per_chunk = (num_rows + num_chunks - 1) // num_chunks
    for chunk in prange(num_chunks):
        first = chunk * per_chunk
        last = min(num_rows, first + per_chunk)
        if first >= last:
            continue
        x_lower = np.zeros(n)
        x_upper = np.zeros(n)
        mark_lower = np.zeros(n, dtype=np.int64)
        mark_upper = np.zeros(n, dtype=np.int64)
        stack = np.empty(n, dtype=np.int64)
        head = np.empty(n, dtype=np.int64)
        order_lower = np.empty(n, dtype=np.int64)
        order_upper = np.empty(n, dtype=np.int64)
        for r in range(first, last):
            start, stop = rows_indptr[r], rows_indptr[r + 1]
            stamp = r - first + 1
            if start == stop:
                out[r] = 0.0
                continue
            values = rows_data[start:stop]
            lower_rows = row_permutation[rows_indices[start:stop]]
            upper_rows = column_permutation[rows_indices[start:stop]]
            top = _solve(lower_indptr, lower_indices, lower_data, lower_diagonal, lower_rows, values, x_lower,
                         mark_lower, stamp, stack, head, order_lower)
            total = 0.0
            if symmetric:
                for k in range(top, n):
                    node = order_lower[k]
                    total += x_lower[node] * x_lower[node] / upper_t_diagonal[node]
                out[r] = total
                continue
            _solve(upper_t_indptr, upper_t_indices, upper_t_data, upper_t_diagonal, upper_rows, values, x_upper,
                   mark_upper, stamp, stack, head, order_upper)
            for k in range(top, n):
                node = order_lower[k]
                if mark_upper[node] == stamp:
                    total += x_lower[node] * x_upper[node]
            out[r] = total
