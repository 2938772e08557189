"""The compiled loops (numba) of :class:`gp_couple.sparse_factor.SparseFactor`: sparse triangular solves.

The right-hand sides are sparse too.

A lower-triangular system :math:`\\mathbf L\\mathbf x = \\mathbf b` with a sparse
:math:`\\mathbf b` has a sparse solution: its nonzeros are the nodes reachable from those
of :math:`\\mathbf b` in the graph of :math:`\\mathbf L` (column :math:`j` points to the
rows below the diagonal it holds), and solving in a topological order of that reach
costs only the entries of the reached columns (Gilbert and Peierls' algorithm, as in
CSparse's ``cs_reach`` / ``cs_spsolve``). A quadratic form
:math:`\\mathbf k^\\top\\mathbf A^{-1}\\mathbf k` of a sparse :math:`\\mathbf k` then costs
one such solve instead of a dense one.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["inverse_quadratic_forms", "solve_ldlt", "symbolic_cholesky"]


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
def _solve(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, rhs_rows: np.ndarray,
           rhs_values: np.ndarray, x: np.ndarray, mark: np.ndarray, stamp: int, stack: np.ndarray,
           head: np.ndarray, order: np.ndarray) -> int:  # pragma: no cover - compiled
    """Solve the unit lower-triangular CSC system for a sparse right-hand side; the solution is ``x[order[top:]]``."""
    top = _reach(indptr, indices, rhs_rows, mark, stamp, stack, head, order)
    for k in range(top, order.shape[0]):
        x[order[k]] = 0.0
    for k in range(rhs_rows.shape[0]):
        x[rhs_rows[k]] += rhs_values[k]
    for k in range(top, order.shape[0]):
        column = order[k]
        value = x[column]
        for position in range(indptr[column], indptr[column + 1]):
            row = indices[position]
            if row > column:
                x[row] -= data[position] * value
    return top


@njit(parallel=True, cache=True)
def inverse_quadratic_forms(lower_indptr: np.ndarray, lower_indices: np.ndarray, lower_data: np.ndarray,
                            pivots: np.ndarray, permutation: np.ndarray, rows_indptr: np.ndarray,
                            rows_indices: np.ndarray, rows_data: np.ndarray, num_chunks: int,
                            out: np.ndarray) -> None:  # pragma: no cover - compiled
    r"""``out[r] = y^T D^{-1} y`` with ``y = L^{-1} P k_r`` for the sparse rows ``k_r`` (CSR).

    From :math:`\mathbf P\mathbf A\mathbf P^\top = \mathbf L\mathbf D\mathbf L^\top`
    (``L`` unit lower triangular, CSC; ``(P k)[permutation[i]] = k[i]``), this is
    :math:`\mathbf k^\top\mathbf A^{-1}\mathbf k`: one sparse solve per row and a sum of
    non-negative terms. Rows are split into ``num_chunks`` parallel chunks, each with its
    own work arrays.
    """
    n = pivots.shape[0]
    num_rows = rows_indptr.shape[0] - 1
    per_chunk = (num_rows + num_chunks - 1) // num_chunks
    for chunk in prange(num_chunks):
        first = chunk * per_chunk
        last = min(num_rows, first + per_chunk)
        if first >= last:
            continue
        x = np.zeros(n)
        mark = np.zeros(n, dtype=np.int64)
        stack = np.empty(n, dtype=np.int64)
        head = np.empty(n, dtype=np.int64)
        order = np.empty(n, dtype=np.int64)
        for r in range(first, last):
            start, stop = rows_indptr[r], rows_indptr[r + 1]
            total = 0.0
            if start < stop:
                top = _solve(lower_indptr, lower_indices, lower_data, permutation[rows_indices[start:stop]],
                             rows_data[start:stop], x, mark, r - first + 1, stack, head, order)
                for k in range(top, n):
                    node = order[k]
                    total += x[node] * x[node] / pivots[node]
            out[r] = total


@njit(parallel=True, cache=True)
def solve_ldlt(lower_indptr: np.ndarray, lower_indices: np.ndarray, lower_data: np.ndarray, pivots: np.ndarray,
               rhs: np.ndarray) -> None:  # pragma: no cover - compiled
    r"""Overwrite the columns of ``rhs`` (shape ``(n, k)``, in the factor's order) with
    :math:`(\mathbf L\mathbf D\mathbf L^\top)^{-1}` times them.

    A forward substitution with the unit lower-triangular CSC ``L`` (column by column), the
    division by the pivots, and a backward substitution with :math:`\mathbf L^\top` (each
    unknown a dot product with its column); the right-hand sides in parallel.
    """
    n = pivots.shape[0]
    for j in prange(rhs.shape[1]):
        for column in range(n):
            value = rhs[column, j]
            if value != 0.0:
                for position in range(lower_indptr[column], lower_indptr[column + 1]):
                    row = lower_indices[position]
                    if row > column:
                        rhs[row, j] -= lower_data[position] * value
        for column in range(n):
            rhs[column, j] /= pivots[column]
        for column in range(n - 1, -1, -1):
            total = rhs[column, j]
            for position in range(lower_indptr[column], lower_indptr[column + 1]):
                row = lower_indices[position]
                if row > column:
                    total -= lower_data[position] * rhs[row, j]
            rhs[column, j] = total


@njit(cache=True)
def symbolic_cholesky(indptr: np.ndarray, indices: np.ndarray, entry_limit: int,
                      column_counts: np.ndarray) -> int:  # pragma: no cover - compiled
    r"""Entries of the Cholesky factor of a symmetric pattern (both triangles stored), and its column counts.

    The elimination tree by Liu's algorithm with path compression, then each row's pattern
    in :math:`\mathbf L` as the union of the tree paths from its entries left of the diagonal
    (the row subtrees of CSparse's ``cs_ereach``): :math:`O(|\mathbf L|)` work, with no
    factor stored. ``column_counts[j]`` receives the entries of column ``j`` (diagonal
    included). The count stops, and returns ``entry_limit + 1``, as soon as it passes
    ``entry_limit``; ``column_counts`` is then partial.
    """
    n = indptr.shape[0] - 1
    parent = np.full(n, -1, dtype=np.int64)
    ancestor = np.full(n, -1, dtype=np.int64)
    for k in range(n):
        for position in range(indptr[k], indptr[k + 1]):
            i = indices[position]
            while i != -1 and i < k:
                following = ancestor[i]
                ancestor[i] = k
                if following == -1:
                    parent[i] = k
                i = following
    mark = np.full(n, -1, dtype=np.int64)
    column_counts[:] = 1
    total = n
    for k in range(n):
        mark[k] = k
        for position in range(indptr[k], indptr[k + 1]):
            i = indices[position]
            while i < k and mark[i] != k:
                mark[i] = k
                column_counts[i] += 1
                total += 1
                i = parent[i]
        if total > entry_limit:
            return entry_limit + 1
    return total
