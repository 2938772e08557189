r"""The Chebyshev basis of a graph: the normalised adjacency, its recurrences and cached diagonals.

:class:`ChebyshevBasis` holds the sparse :math:`\widetilde{\mathbf W}` and applies the
three-term recurrence

.. math::

    T_{j+1}(\widetilde{\mathbf W})\mathbf v = 2\widetilde{\mathbf W}\, T_j(\widetilde{\mathbf W})\mathbf v
    - T_{j-1}(\widetilde{\mathbf W})\mathbf v

to blocks of vectors: combinations :math:`\sum_j c_j T_j\mathbf X` for given coefficients
(:mod:`gp_couple.operators.chebyshev_series`), the moments :math:`\mathbf U^\top T_j\mathbf X`
that are their gradients, and the hyperparameter-free diagonals
:math:`T_j(\widetilde{\mathbf W})_{ii}`, kept per node once computed. Everything here
depends on the graph only, never on kernel hyperparameters.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from ..sparse_pattern import sparse_csr

__all__ = ["BLOCK_ENTRIES", "ChebyshevBasis", "one_hot_columns"]

#: Numbers held by one block of one-hot recurrences (three blocks live at once).
BLOCK_ENTRIES = 1 << 23
#: Largest nnz(W~) x columns product done with torch's COO routine: MKL's CSR routine enters
#: a parallel region on every call, which stalls for milliseconds on an oversubscribed
#: machine, while the COO routine is serial for small sizes but ~30x slower per entry.
_SMALL_PRODUCT = 1 << 15
#: Smallest block of diagonal nodes (their recurrences usually run on a neighbourhood only).
_LOCAL_BLOCK = 64


class ChebyshevBasis:
    r"""The normalised adjacency :math:`\widetilde{\mathbf W}` and its Chebyshev recurrences.

    Holds :math:`\widetilde{\mathbf W}` as a torch sparse CSR tensor (float64; copies in
    other dtypes and devices are made on first use and kept) and a table of the
    hyperparameter-free diagonals :math:`T_j(\widetilde{\mathbf W})_{ii}`, filled on demand
    for the nodes asked for (see :meth:`diagonal`).

    :param normalized_adjacency: :math:`\widetilde{\mathbf W}` (scipy sparse or torch sparse
        CSR), symmetric with spectrum in :math:`[-1, 1]` (not checked).
    """

    def __init__(self, normalized_adjacency: Any) -> None:
        if sp.issparse(normalized_adjacency):
            matrix = sp.csr_matrix(normalized_adjacency, dtype=np.float64)
            self._matrix = sparse_csr(torch.from_numpy(matrix.indptr.astype(np.int64)),
                                      torch.from_numpy(matrix.indices.astype(np.int64)),
                                      torch.from_numpy(np.array(matrix.data, dtype=np.float64)), matrix.shape)
        elif isinstance(normalized_adjacency, Tensor) and normalized_adjacency.layout == torch.sparse_csr:
            self._matrix = normalized_adjacency.to(torch.float64)
        else:
            raise TypeError("normalized_adjacency must be a scipy sparse matrix or a torch sparse CSR "
                            f"tensor, got {type(normalized_adjacency).__name__}")
        if self._matrix.shape[0] != self._matrix.shape[1]:
            raise ValueError(f"normalized_adjacency must be square, got shape {tuple(self._matrix.shape)}")
        if self._matrix.values().numel() < 2**31:
            # MKL's sparse kernels take int32 indices: int64 ones are converted on every product.
            self._matrix = sparse_csr(self._matrix.crow_indices().to(torch.int32),
                                      self._matrix.col_indices().to(torch.int32),
                                      self._matrix.values(), tuple(self._matrix.shape))
        self._copies: dict[tuple[torch.dtype, torch.device], Tensor] = {}
        self._rank: Tensor | None = None
        self._reset_diagonals(-1)

    @property
    def num_nodes(self) -> int:
        """Number of nodes :math:`N`."""
        return int(self._matrix.shape[0])

    @property
    def nnz(self) -> int:
        """Stored entries of :math:`\\widetilde{\\mathbf W}`."""
        return int(self._matrix.values().numel())

    def matrix(self, like: Tensor, *, layout: torch.layout = torch.sparse_csr) -> Tensor:
        r""":math:`\widetilde{\mathbf W}` in the dtype and on the device of ``like`` (CSR, or COO)."""
        key = (like.dtype, like.device, layout)
        if key not in self._copies:
            matrix = self._matrix.to(device=like.device, dtype=like.dtype)
            self._copies[key] = matrix if layout == torch.sparse_csr else matrix.to_sparse_coo().coalesce()
        return self._copies[key]

    # ---------------------------------------------------------------- recurrences
    def terms(self, block: Tensor, degree: int, matrix: Tensor | None = None) -> Iterator[Tensor]:
        r"""Yield :math:`T_0\mathbf X, T_1\mathbf X, \dots, T_J\mathbf X` for a block ``(N, m)``.

        Each step is one fused sparse product :math:`2\widetilde{\mathbf W}T_j\mathbf X - T_{j-1}\mathbf X`
        written over the buffer of :math:`T_{j-1}\mathbf X`, so three blocks are alive at a
        time: a yielded block is only valid until the next one is requested (``block``
        itself is never overwritten). ``matrix`` replaces :math:`\widetilde{\mathbf W}`
        (e.g. by its restriction to a neighbourhood).
        """
        if matrix is None:
            matrix = self.matrix(block, layout=_layout(self.nnz, block.shape[-1]))
        yield block
        if degree < 1:
            return
        previous, current = block, matrix @ block
        yield current
        for step in range(2, degree + 1):
            if matrix.layout == torch.sparse_coo:
                following = torch.sparse.mm(matrix, current).mul_(2).sub_(previous)
            else:
                # Over T_{j-1}'s buffer, except the caller's block.
                following = torch.addmm(previous, matrix, current, beta=-1, alpha=2,
                                        **({} if step == 2 else {"out": previous}))
            previous, current = current, following
            yield current

    def _stacked(self, tensor: Tensor) -> Tensor:
        # (*batch, N, t) -> (N, batch * t): one sparse product for every batch entry and column.
        return tensor.movedim(-2, 0).reshape(self.num_nodes, -1)

    def combine(self, coefficients: Tensor, block: Tensor) -> Tensor:
        r""":math:`\sum_j c_j T_j(\widetilde{\mathbf W})\mathbf X`, broadcasting batches.

        :param coefficients: ``(*batch_c, J + 1)``.
        :param block: ``(*batch_x, N, t)``.
        :return: ``(*broadcast(batch_c, batch_x), N, t)``.
        """
        batch_c, batch_x, width = coefficients.shape[:-1], block.shape[:-2], block.shape[-1]
        batch = torch.broadcast_shapes(batch_c, batch_x)
        term_shape = (self.num_nodes, *([1] * (len(batch) - len(batch_x))), *batch_x, width)
        weights = coefficients.reshape(1, *([1] * (len(batch) - len(batch_c))), *batch_c, -1, 1)
        result = None
        for j, term in enumerate(self.terms(self._stacked(block), coefficients.shape[-1] - 1)):
            term = term.view(term_shape)
            if result is None:
                result = term * weights[..., 0, :]
            else:
                result.addcmul_(term, weights[..., j, :])
        return result.movedim(0, -2)

    def moments(self, left: Tensor, block: Tensor, degree: int) -> Tensor:
        r"""Moments :math:`m_j = \sum_{i, s} \mathbf U_{is}\,(T_j(\widetilde{\mathbf W})\mathbf X)_{is}`
        per batch entry.

        :param left: :math:`\mathbf U`, ``(*batch_u, N, t)``.
        :param block: :math:`\mathbf X`, ``(*batch_x, N, t)``.
        :param degree: :math:`J`.
        :return: ``(*broadcast(batch_u, batch_x), J + 1)``.
        """
        batch_u, batch_x, width = left.shape[:-2], block.shape[:-2], block.shape[-1]
        batch = torch.broadcast_shapes(batch_u, batch_x)
        term_shape = (self.num_nodes, *([1] * (len(batch) - len(batch_x))), *batch_x, width)
        stacked_left = left.movedim(-2, 0).reshape(self.num_nodes, *([1] * (len(batch) - len(batch_u))),
                                                   *batch_u, left.shape[-1])
        moments = [torch.einsum("n...t,n...t->...", stacked_left, term.view(term_shape)).expand(batch)
                   for term in self.terms(self._stacked(block), degree)]
        return torch.stack(moments, dim=-1)

    # ---------------------------------------------------------------- diagonals
    def _reset_diagonals(self, degree: int) -> None:
        self._diagonal_degree = degree
        self._diagonal_slot = torch.full((self.num_nodes,), -1, dtype=torch.int64)
        self._diagonal_values = torch.empty(0, max(degree, 0) + 1, dtype=torch.float64)

    def diagonal(self, nodes: Tensor, degree: int) -> Tensor:
        r"""Diagonal entries :math:`T_j(\widetilde{\mathbf W})_{ii}`, :math:`j \le J`, of ``nodes``.

        They do not depend on the hyperparameters, so they are computed once per node
        and kept (a table of :math:`J + 1` numbers per node asked for). The degree is
        rounded up with 25% headroom, so that training, whose degree drifts with the
        hyperparameters, rarely recomputes. With
        :math:`T_{2m} = 2T_m^2 - \mathbf I` and :math:`T_{2m-1} = 2T_mT_{m-1} - T_1`,

        .. math::

            T_{2m}(\widetilde{\mathbf W})_{ii} = 2\|T_m\mathbf e_i\|^2 - 1, \qquad
            T_{2m-1}(\widetilde{\mathbf W})_{ii}
            = 2\langle T_m\mathbf e_i, T_{m-1}\mathbf e_i\rangle - \widetilde W_{ii},

        only :math:`h = \lceil J/2\rceil` recurrence steps on one-hot columns are needed, and
        they run exactly on the restriction of :math:`\widetilde{\mathbf W}` to the
        :math:`h`-hop neighbourhood of a block of nodes that are close in a reverse
        Cuthill-McKee order (the whole graph when that neighbourhood is over half of it).
        The one-off cost is at most :math:`h\,\mathrm{nnz}(\widetilde{\mathbf W})` per node,
        and on meshes and grids, whose neighbourhoods grow slowly, much less; memory is
        :math:`3N` numbers per node of a block (:data:`_LOCAL_BLOCK` nodes, or more when
        :data:`BLOCK_ENTRIES` allows).

        :param nodes: Node indices (int64, any shape).
        :param degree: :math:`J`.
        :return: float64 tensor ``(*nodes.shape, J + 1)`` on the device of ``nodes``.
        """
        if degree > self._diagonal_degree:
            self._reset_diagonals(2 * math.ceil(1.25 * degree / 2))
        flat = nodes.reshape(-1).cpu()
        wanted = torch.unique(flat)
        missing = wanted[self._diagonal_slot[wanted] < 0]
        if missing.numel():
            # Blocks of nodes that are close in the graph have small joint neighbourhoods.
            missing = missing[torch.argsort(self._locality_rank()[missing])]
            block = max(_LOCAL_BLOCK, BLOCK_ENTRIES // (3 * self.num_nodes))
            computed = [self._one_hot_diagonals(missing[start:start + block].to(nodes.device),
                                                self._diagonal_degree)
                        for start in range(0, missing.numel(), block)]
            self._diagonal_slot[missing] = torch.arange(missing.numel()) + self._diagonal_values.shape[0]
            self._diagonal_values = torch.cat([self._diagonal_values, *[c.cpu() for c in computed]])
        table = self._diagonal_values[self._diagonal_slot[flat], :degree + 1]
        return table.reshape(*nodes.shape, degree + 1).to(nodes.device)

    def _locality_rank(self) -> Tensor:
        """Position of every node in a reverse Cuthill-McKee order (neighbours get close ranks)."""
        if self._rank is None:
            from scipy.sparse.csgraph import reverse_cuthill_mckee

            matrix = self._matrix.cpu()
            pattern = sp.csr_matrix((np.ones(self.nnz), matrix.col_indices().numpy(),
                                     matrix.crow_indices().numpy()), shape=tuple(matrix.shape))
            order = torch.from_numpy(reverse_cuthill_mckee(pattern, symmetric_mode=True).astype(np.int64))
            self._rank = torch.empty_like(order)
            self._rank[order] = torch.arange(order.numel())
        return self._rank

    def _neighbourhood(self, nodes: Tensor, hops: int) -> Tensor | None:
        """Mask of the nodes within ``hops`` of ``nodes``; ``None`` once that is half the graph."""
        matrix = self.matrix(torch.empty(0, dtype=torch.float64, device=nodes.device),
                             layout=_layout(self.nnz, 1))
        reach = torch.zeros(self.num_nodes, 1, dtype=torch.float64, device=nodes.device)
        reach[nodes] = 1.0
        for _ in range(hops):
            # Weights are non-negative, so a positive entry means "reachable".
            reach = ((matrix @ reach) + reach > 0).to(torch.float64)
            if 2 * float(reach.sum()) > self.num_nodes:
                return None
        return reach.squeeze(-1) > 0

    def _restriction(self, keep: Tensor, width: int) -> Tensor:
        r""":math:`\widetilde{\mathbf W}` restricted to the nodes in ``keep`` (float64, for ``width`` columns)."""
        matrix = self.matrix(torch.empty(0, dtype=torch.float64, device=keep.device))
        crow, columns, values = matrix.crow_indices().long(), matrix.col_indices().long(), matrix.values()
        rows = torch.repeat_interleave(torch.arange(self.num_nodes, device=keep.device), crow.diff())
        inside = keep[rows] & keep[columns]
        local = torch.cumsum(keep.long(), 0) - 1  # monotone: CSR order is preserved
        size = int(keep.sum())
        pointer = torch.zeros(size + 1, dtype=torch.int64, device=keep.device)
        pointer[1:] = torch.bincount(local[rows[inside]], minlength=size).cumsum(0)
        restricted = sparse_csr(pointer.to(torch.int32), local[columns[inside]].to(torch.int32), values[inside],
                                (size, size))
        small = _layout(int(inside.sum()), width) == torch.sparse_coo
        return restricted.to_sparse_coo().coalesce() if small else restricted

    def _one_hot_diagonals(self, nodes: Tensor, degree: int) -> Tensor:
        # T_m e_i lives within m hops of node i: the recurrence up to m = ceil(J/2) runs
        # exactly on the restriction of W~ to the block's (ceil(J/2))-hop neighbourhood.
        hops = (degree + 1) // 2
        keep = self._neighbourhood(nodes, hops)
        matrix = None if keep is None else self._restriction(keep, nodes.numel())
        positions = nodes if keep is None else (torch.cumsum(keep.long(), 0) - 1)[nodes]
        size = self.num_nodes if keep is None else int(keep.sum())
        block = one_hot_columns(positions, size, torch.float64)
        columns = torch.arange(nodes.numel(), device=nodes.device)
        result = torch.empty(nodes.numel(), degree + 1, dtype=torch.float64, device=nodes.device)
        result[:, 0] = 1.0
        previous = None
        self_loops = None
        for m, current in enumerate(self.terms(block, hops, matrix)):
            if m == 1:
                self_loops = current[positions, columns]
            if m >= 1:
                if 2 * m - 1 <= degree:
                    result[:, 2 * m - 1] = 2 * (current * previous).sum(0) - self_loops
                if 2 * m <= degree:
                    result[:, 2 * m] = 2 * current.square().sum(0) - 1
            previous = current
        return result


def _layout(nnz: int, width: int) -> torch.layout:
    return torch.sparse_coo if nnz * width <= _SMALL_PRODUCT else torch.sparse_csr


def one_hot_columns(nodes: Tensor, num_nodes: int, dtype: torch.dtype) -> Tensor:
    """The ``(num_nodes, len(nodes))`` block whose column ``k`` is the indicator of ``nodes[k]``."""
    block = torch.zeros(num_nodes, nodes.numel(), dtype=dtype, device=nodes.device)
    block[nodes, torch.arange(nodes.numel(), device=nodes.device)] = 1.0
    return block
