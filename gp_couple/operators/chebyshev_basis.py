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
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from ..sparse_pattern import sparse_csr

__all__ = ["BLOCK_ENTRIES", "ChebyshevBasis", "kept_terms_entries", "one_hot_columns"]

#: Numbers held by one block of one-hot recurrences (three blocks live at once).
BLOCK_ENTRIES = 1 << 23
#: Largest nnz(W~) x columns product done with torch's COO routine: MKL's CSR routine enters
#: a parallel region on every call, which stalls for milliseconds on an oversubscribed
#: machine, while the COO routine is serial for small sizes but ~30x slower per entry.
_SMALL_PRODUCT = 1 << 15
#: Smallest block of diagonal nodes (their recurrences usually run on a neighbourhood only).
_LOCAL_BLOCK = 64
#: Block of diagonal nodes scattered over the graph (their neighbourhoods overlap less, so a
#: block's recurrence reaches fewer rows per node in smaller blocks).
_SCATTERED_BLOCK = 16
#: Mean fraction of the graph per step beyond which scattered nodes' recurrences are run in the larger
#: blocks of dense requests (their neighbourhoods then cover the graph anyway).
_COVERED = 0.5
#: Columns per local recurrence of a dense block: fewer columns reach fewer rows where their balls
#: do not overlap, more make each sparse product cheaper per column (measured on grids of 10^4 to
#: 10^6 nodes: see benchmarks/RESULTS.md, "Dense blocks on the nodes each column reaches").
_COLUMN_BLOCK = 32


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
        self._scipy_matrix: sp.csr_matrix | None = None
        self._reset_diagonals()
        self._kept_blocks: _KeptBlocks | None = None

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

    @property
    def kept_entries(self) -> int:
        """Numbers the kept terms of :meth:`block` hold (0 when none are kept)."""
        return 0 if self._kept_blocks is None else self._kept_blocks.entries()

    # ---------------------------------------------------------------- recurrences
    def terms(self, block: Tensor, degree: int) -> Iterator[Tensor]:
        r"""Yield :math:`T_0\mathbf X, T_1\mathbf X, \dots, T_J\mathbf X` for a block ``(N, m)``.

        Each step is one fused sparse product :math:`2\widetilde{\mathbf W}T_j\mathbf X - T_{j-1}\mathbf X`
        written over the buffer of :math:`T_{j-1}\mathbf X`, so three blocks are alive at a
        time: a yielded block is only valid until the next one is requested (``block``
        itself is never overwritten).
        """
        matrix = self.matrix(block, layout=_layout(self.nnz, block.shape[-1]))
        yield block
        if degree < 1:
            return
        previous, current = block, matrix @ block
        yield current
        for step in range(degree - 1):
            if matrix.layout == torch.sparse_coo:
                following = torch.sparse.mm(matrix, current).mul_(2).sub_(previous)
            else:
                following = torch.addmm(previous, matrix, current, beta=-1, alpha=2,
                                         **({"out": previous} if step else {}))
            previous, current = current, following
            yield current

    def _stacked(self, tensor: Tensor) -> Tensor:
        # (*batch, N, t) -> (N, batch * t): one sparse product for every batch entry and column.
        return tensor.movedim(-2, 0).reshape(self.num_nodes, -1)

    def combine(self, coefficients: Tensor, block: Tensor, rows: Tensor | None = None) -> Tensor:
        r""":math:`\sum_j c_j T_j(\widetilde{\mathbf W})\mathbf X`, broadcasting batches.

        :param coefficients: ``(*batch_c, J + 1)``.
        :param block: ``(*batch_x, N, t)``.
        :param rows: Only these rows of the result (int64 node indices, repeats allowed): the
            sum is then accumulated on them alone.
        :return: ``(*broadcast(batch_c, batch_x), N, t)``, or ``len(rows)`` rows.
        """
        batch_c, batch_x, width = coefficients.shape[:-1], block.shape[:-2], block.shape[-1]
        batch = torch.broadcast_shapes(batch_c, batch_x)
        weights = coefficients.reshape(1, *([1] * (len(batch) - len(batch_c))), *batch_c, -1, 1)
        result = None
        for j, term in enumerate(self._row_terms(block, coefficients.shape[-1] - 1, rows)):
            term = term.view(term.shape[0], *([1] * (len(batch) - len(batch_x))), *batch_x, width)
            if result is None:
                result = term * weights[..., 0, :]
            else:
                result.addcmul_(term, weights[..., j, :])
        return result.movedim(0, -2)

    def moments(self, left: Tensor, block: Tensor, degree: int, rows: Tensor | None = None) -> Tensor:
        r"""Moments :math:`m_j = \sum_{i, s} \mathbf U_{is}\,(T_j(\widetilde{\mathbf W})\mathbf X)_{is}`
        per batch entry.

        :param left: :math:`\mathbf U`, ``(*batch_u, N, t)``, or ``(*batch_u, len(rows), t)``
            with ``rows``.
        :param block: :math:`\mathbf X`, ``(*batch_x, N, t)``.
        :param degree: :math:`J`.
        :param rows: The nodes of the rows of ``left`` (int64, repeats allowed): :math:`\mathbf U`
            is zero elsewhere, and the sums run over these rows alone.
        :return: ``(*broadcast(batch_u, batch_x), J + 1)``.
        """
        batch_u, batch_x, width, count = left.shape[:-2], block.shape[:-2], block.shape[-1], left.shape[-2]
        batch = torch.broadcast_shapes(batch_u, batch_x)
        term_shape = (count, *([1] * (len(batch) - len(batch_x))), *batch_x, width)
        stacked_left = left.movedim(-2, 0).reshape(count, *([1] * (len(batch) - len(batch_u))),
                                                   *batch_u, left.shape[-1])
        moments = [torch.einsum("n...t,n...t->...", stacked_left, term.view(term_shape)).expand(batch)
                   for term in self._row_terms(block, degree, rows)]
        return torch.stack(moments, dim=-1)

    def _row_terms(self, block: Tensor, degree: int, rows: Tensor | None) -> Iterator[Tensor]:
        r"""The terms :math:`T_j\mathbf X` of :meth:`terms` on the stacked block, on ``rows`` only if given."""
        for term in self.terms(self._stacked(block), degree):
            yield term if rows is None else term.index_select(0, rows)

    # ---------------------------------------------------------------- blocks
    def block(self, coefficients: Tensor, rows: Tensor, columns: Tensor, max_entries: int) -> Tensor | None:
        r"""The block :math:`\sum_j c_j\,T_j(\widetilde{\mathbf W})_{AB}` of node sets :math:`A`
        (``rows``) and :math:`B` (``columns``) from kept terms, or ``None`` where the terms
        :math:`T_j(\widetilde{\mathbf W})_{AB}`, :math:`j \le J`, take more than ``max_entries``
        numbers.

        The terms do not depend on the hyperparameters, so the block and its gradient with
        respect to the coefficients are sums over them, for any coefficients: the recurrence
        runs once for a sequence of evaluations on the same nodes, as in training on the dense
        (Cholesky) path. They are kept for the last pair of node sets asked for, with headroom
        in degree (within ``max_entries``; 25%, or 100% where the recurrences cannot be
        continued but must start again); where the rows are the same node set as
        the columns, as for a training covariance, only its symmetric half is kept. They come
        from one-hot recurrences on blocks of columns that are close in the graph
        (:meth:`_local_blocks`), each on the part of the graph it can reach:
        :math:`T_j\mathbf e_b` lives within :math:`j` hops of :math:`b`, so step :math:`j`
        multiplies only the rows of :math:`\widetilde{\mathbf W}` within :math:`j` hops of the
        block (:class:`_LocalRecurrence`), and the cost follows the balls of radius :math:`J`
        around the columns rather than the whole graph. Only the rows a block's recurrence reaches
        are kept (:math:`T_j(\widetilde{\mathbf W})_{ab} = 0` for nodes more than :math:`j` hops
        apart), so nodes scattered over a large graph keep a small part of the dense terms and fit
        the bound in far larger numbers. A higher
        degree, as training's degree drifts with the hyperparameters, continues each block's
        recurrence from its last two terms, kept too where their numbers are within
        ``max_entries`` (otherwise the terms are recomputed). A request for another pair
        releases them; one beyond the bound (``None``) does not. The terms are computed in float64 and
        kept in the coefficients' dtype (a request in another dtype computes them again), so a float32
        model keeps them in half the memory; the block's gradient is their moments against its adjoint.

        :param coefficients: :math:`c_0, \dots, c_J`, ``(*batch, J + 1)`` (differentiable).
        :param rows: Node indices of :math:`A` (int64, 1-D).
        :param columns: Node indices of :math:`B` (int64, 1-D).
        :param max_entries: Most numbers the kept terms may hold.
        :return: ``(*batch, len(rows), len(columns))`` in the coefficients' dtype, or ``None``.
        """
        kept = self._block_terms(rows, columns, coefficients.shape[-1] - 1, max_entries, coefficients.dtype)
        if kept is None:
            return None
        return _KeptBlockSum.apply(coefficients, kept)

    def _block_terms(self, rows: Tensor, columns: Tensor, degree: int, max_entries: int,
                     dtype: torch.dtype) -> _KeptBlocks | None:
        """The kept terms of :meth:`block` in ``dtype``, computed or continued to at least degree :math:`J`;
        ``None`` beyond the bound (what is kept for these nodes stays kept: a trial point of
        training beyond the bound does not cost the next evaluation its terms)."""
        kept = self._kept_blocks
        if kept is None or not (_same_nodes(kept.rows, rows) and _same_nodes(kept.columns, columns)
                                and kept.dtype == dtype):
            kept = self._kept_blocks = self._new_kept_blocks(rows, columns, degree, dtype)
        elif kept.degree >= degree:
            return kept
        if kept.beyond_bound is not None and degree >= kept.beyond_bound[0] and max_entries <= kept.beyond_bound[1]:
            return None
        fresh = kept if kept.recurrences is not None else kept.restarted()
        first = fresh.degree + 1
        recurrences = fresh.recurrences or [_LocalRecurrence(self, chunk, device=rows.device) for chunk in fresh.chunks]
        # Headroom: 25 % where the recurrences can go on from their last terms (the two kept for each
        # block within the bound); where they must start again, twice the degree, so that the
        # recomputations cost at most about twice the last one.
        wanted = max(degree, 2 * math.ceil(1.25 * degree / 2))
        for recurrence in recurrences:
            recurrence.extend(wanted)
        if not _ends_fit(recurrences, max_entries):
            wanted = max(degree, 2 * math.ceil(2.0 * degree / 2))
        reached = []  # per block: the rows its recurrence reaches, and their local numbers (by distance)
        for index, recurrence in enumerate(recurrences):
            recurrence.extend(wanted)
            targets, positions = recurrence.positions(fresh.chunk_rows(index))
            order = torch.argsort(positions)
            reached.append((targets[order], positions[order]))
        held = fresh.entries()

        def entries(last: int) -> int:
            """Numbers held with the terms up to ``last``: the rows within ``last`` hops of each block."""
            counts = [int(torch.searchsorted(positions, recurrence.reach(last))) * recurrence.sources.numel()
                      for recurrence, (_, positions) in zip(recurrences, reached)]
            return held + (last + 1 - first) * sum(counts)

        if entries(degree) > max_entries:
            kept.beyond_bound = (degree, max_entries)
            return None
        kept = None  # terms restarted from the beginning replace those kept
        low, high = degree, wanted  # the largest degree within the bound (the numbers grow with it)
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if entries(middle) <= max_entries else (low, middle - 1)
        degree_kept = low
        keep_ends = _ends_fit(recurrences, max_entries)
        # Released while the terms grow: the end terms are overwritten in place, so an exception
        # part of the way leaves nothing kept rather than ends that no longer match the degree.
        self._kept_blocks = None
        for index, (segments, (targets, positions)) in enumerate(zip(fresh.segments, reached)):
            recurrence = recurrences[index]
            count = int(torch.searchsorted(positions, recurrence.reach(degree_kept)))
            targets, positions = targets[:count], positions[:count]
            values = torch.empty(degree_kept + 1 - first, count, recurrence.sources.numel(), dtype=fresh.dtype,
                                 device=rows.device)
            for j, term in enumerate(recurrence.terms(degree_kept)):
                values[j] = term.index_select(0, positions)
            recurrence.release()
            if not keep_ends:
                recurrences[index] = None  # its last terms go: at most one block's recurrence is alive
            segments.append((first, targets, values))
        fresh.degree, fresh.recurrences = degree_kept, recurrences if keep_ends else None
        self._kept_blocks = fresh
        return fresh

    def _new_kept_blocks(self, rows: Tensor, columns: Tensor, degree: int, dtype: torch.dtype) -> _KeptBlocks:
        """No terms yet for ``rows`` and ``columns`` (to be computed to ``degree`` or more, kept in ``dtype``):
        symmetric storage where both are the same node set."""
        chunks, order = self._column_blocks(columns, degree)
        symmetric = _same_nodes(torch.unique(rows.cpu()), torch.unique(columns.cpu()))
        row_order = _positions_in(chunks, rows.cpu()) if symmetric else None
        return _KeptBlocks(rows.clone(), columns.clone(), chunks, order, [[] for _ in chunks], -1, dtype,
                           row_order=row_order)

    def summed_block(self, coefficients: Tensor, rows: Tensor, columns: Tensor) -> Tensor:
        r"""The block :math:`\sum_j c_j\,T_j(\widetilde{\mathbf W})_{AB}` summed as the local
        recurrences of :meth:`block` run, keeping no terms (for blocks whose terms exceed the
        bound). Costs what :meth:`block`'s first call costs, and memory for the block and one
        block of columns' recurrence; :meth:`block_moments` gives its gradient.

        :param coefficients: :math:`c_0, \dots, c_J`, ``(*batch, J + 1)`` (not differentiated).
        :param rows: Node indices of :math:`A` (int64, 1-D).
        :param columns: Node indices of :math:`B` (int64, 1-D).
        :return: ``(*batch, len(rows), len(columns))`` in the coefficients' dtype.
        """
        weights = coefficients.detach().to(torch.float64)
        chunks, order = self._column_blocks(columns, weights.shape[-1] - 1)
        parts = []
        for chunk in chunks:
            part = torch.zeros(*weights.shape[:-1], rows.numel(), chunk.numel(), dtype=torch.float64,
                               device=rows.device)
            for j, (targets, values) in enumerate(self._local_row_terms(rows, chunk, weights.shape[-1] - 1)):
                part.index_add_(-2, targets, weights[..., j, None, None] * values)
            parts.append(part)
        return torch.cat(parts, dim=-1)[..., order.to(rows.device)].to(coefficients.dtype)

    def block_moments(self, left: Tensor, rows: Tensor, columns: Tensor, degree: int) -> Tensor:
        r"""Moments :math:`m_j = \sum_{a, b}\mathbf G_{ab}\,T_j(\widetilde{\mathbf W})_{A_aB_b}`, the
        gradient of :meth:`summed_block` with respect to its coefficients for the adjoint
        :math:`\mathbf G` (``left``), from the same local recurrences.

        :param left: :math:`\mathbf G`, ``(*batch, len(rows), len(columns))``.
        :param rows: Node indices of :math:`A` (int64, 1-D).
        :param columns: Node indices of :math:`B` (int64, 1-D).
        :param degree: :math:`J`.
        :return: ``(*batch, J + 1)`` float64.
        """
        chunks, order = self._column_blocks(columns, degree)
        left = left.to(torch.float64)
        # The adjoint of gathering the columns: scatter onto the blocks' columns (repeats add up).
        gathered = left.new_zeros(*left.shape[:-1], sum(chunk.numel() for chunk in chunks))
        gathered.index_add_(-1, order.to(left.device), left)
        moments = left.new_zeros(*left.shape[:-2], degree + 1)
        for chunk, part in zip(chunks, torch.split(gathered, [c.numel() for c in chunks], dim=-1)):
            for j, (targets, values) in enumerate(self._local_row_terms(rows, chunk, degree)):
                moments[..., j] += (part.index_select(-2, targets) * values).sum((-2, -1))
        return moments

    def _local_row_terms(self, rows: Tensor, chunk: Tensor, degree: int) -> Iterator[tuple[Tensor, Tensor]]:
        r"""Per :math:`j \le J`, the one-hot recurrence of ``chunk`` on the rows ``rows``: which of them
        it reaches (indices into ``rows``) and their values of :math:`T_j\mathbf e_b`."""
        recurrence = _LocalRecurrence(self, chunk, device=rows.device)
        recurrence.extend(degree)
        targets, positions = recurrence.positions(rows)
        for term in recurrence.terms(degree):
            yield targets, term.index_select(0, positions)

    def _column_blocks(self, columns: Tensor, degree: int) -> tuple[list[Tensor], Tensor]:
        """The distinct ``columns`` in local blocks for recurrences to ``degree`` (:meth:`_local_blocks`), and
        where each of ``columns`` lies in their concatenation."""
        chunks = self._local_blocks(torch.unique(columns.cpu()), _LOCAL_BLOCK, _COLUMN_BLOCK, hops=degree)
        return chunks, _positions_in(chunks, columns.cpu())

    # ---------------------------------------------------------------- diagonals
    def _reset_diagonals(self) -> None:
        # Per node: its row of the table and the degree it was computed to (-1: not yet).
        self._diagonal_slot = torch.full((self.num_nodes,), -1, dtype=torch.int64)
        self._diagonal_degree = torch.full((self.num_nodes,), -1, dtype=torch.int64)
        self._diagonal_values = torch.empty(0, 1, dtype=torch.float64)

    def diagonal(self, nodes: Tensor, degree: int) -> Tensor:
        r"""Diagonal entries :math:`T_j(\widetilde{\mathbf W})_{ii}`, :math:`j \le J`, of ``nodes``.

        They do not depend on the hyperparameters, so they are computed once per node
        and kept (a table of :math:`J + 1` numbers per node asked for). A node is computed
        to the degree asked for (rounded up to an even one, which costs no further step);
        a node asked for again at a higher degree, as in training, whose degree drifts
        with the hyperparameters, is recomputed with 25% headroom, so that it rarely is
        again. With
        :math:`T_{2m} = 2T_m^2 - \mathbf I` and :math:`T_{2m-1} = 2T_mT_{m-1} - T_1`,

        .. math::

            T_{2m}(\widetilde{\mathbf W})_{ii} = 2\|T_m\mathbf e_i\|^2 - 1, \qquad
            T_{2m-1}(\widetilde{\mathbf W})_{ii}
            = 2\langle T_m\mathbf e_i, T_{m-1}\mathbf e_i\rangle - \widetilde W_{ii},

        only :math:`h = \lceil J/2\rceil` recurrence steps on one-hot columns are needed. They
        run on blocks of nodes that are close in the graph (:meth:`_local_blocks`), and
        exactly on the part of the graph each step can reach: :math:`T_m\mathbf e_i` lives
        within :math:`m` hops of node :math:`i`, so with the nodes within :math:`h` hops of a
        block sorted by their distance from it, step :math:`m` multiplies only the rows of
        :math:`\widetilde{\mathbf W}` within :math:`m` hops (:meth:`_one_hot_diagonals`). The
        one-off cost per node is at most :math:`h\,\mathrm{nnz}(\widetilde{\mathbf W})`, and
        on meshes and grids, whose balls grow slowly, about :math:`\sum_{m \le h}` of the
        nonzeros within :math:`m` hops of the block; memory is :math:`3` numbers per node
        within :math:`h` hops per node of a block (:data:`_LOCAL_BLOCK` nodes, or more when
        :data:`BLOCK_ENTRIES` allows).

        :param nodes: Node indices (int64, any shape).
        :param degree: :math:`J`.
        :return: float64 tensor ``(*nodes.shape, J + 1)`` on the device of ``nodes``.
        """
        flat = nodes.reshape(-1).cpu()
        wanted = torch.unique(flat)
        short = wanted[self._diagonal_degree[wanted] < degree]
        if short.numel():
            first = short[self._diagonal_degree[short] < 0]
            again = short[self._diagonal_degree[short] >= 0]
            self._compute_diagonals(first, 2 * math.ceil(degree / 2), nodes.device)
            self._compute_diagonals(again, 2 * math.ceil(1.25 * degree / 2), nodes.device)
        table = self._diagonal_values[self._diagonal_slot[flat], :degree + 1]
        return table.reshape(*nodes.shape, degree + 1).to(nodes.device)

    def _compute_diagonals(self, nodes: Tensor, degree: int, device: torch.device) -> None:
        """Compute the diagonal table of ``nodes`` (CPU int64, distinct) to ``degree`` and keep it."""
        if not nodes.numel():
            return
        blocks = self._local_blocks(nodes, max(_LOCAL_BLOCK, BLOCK_ENTRIES // (3 * self.num_nodes)),
                                    _SCATTERED_BLOCK, hops=(degree + 1) // 2)
        computed = [self._one_hot_diagonals(block.to(device), degree).cpu() for block in blocks]
        nodes = torch.cat(blocks)
        self._diagonal_degree[nodes] = -1
        kept = torch.nonzero(self._diagonal_degree >= 0).squeeze(-1)
        width = max(self._diagonal_values.shape[1], degree + 1)
        # Rows computed to a lower degree are padded with NaN, beyond what any lookup reads;
        # the rows of recomputed nodes are dropped.
        table = [torch.nn.functional.pad(part, (0, width - part.shape[1]), value=math.nan)
                 for part in (self._diagonal_values[self._diagonal_slot[kept]], *computed)]
        self._diagonal_slot[kept] = torch.arange(kept.numel())
        self._diagonal_slot[nodes] = torch.arange(nodes.numel()) + kept.numel()
        self._diagonal_degree[nodes] = degree
        self._diagonal_values = torch.cat(table)

    def _locality_rank(self) -> Tensor:
        """Position of every node in a reverse Cuthill-McKee order (neighbours get close ranks)."""
        if self._rank is None:
            from scipy.sparse.csgraph import reverse_cuthill_mckee

            order = torch.from_numpy(reverse_cuthill_mckee(self._matrix_scipy(), symmetric_mode=True).astype(np.int64))
            self._rank = torch.empty_like(order)
            self._rank[order] = torch.arange(order.numel())
        return self._rank

    def _local_blocks(self, nodes: Tensor, size: int, scattered_size: int | None = None,
                      hops: int | None = None) -> list[Tensor]:
        """``nodes`` (CPU int64, distinct) in blocks of about ``size`` nodes that are close in the graph.

        Where the nodes are dense in the graph (their induced subgraph has an average degree of
        at least 2, e.g. a chunk of a mesh), METIS splits that subgraph into compact parts;
        scattered nodes are cut from a reverse Cuthill-McKee order, in blocks of
        ``scattered_size`` (default ``size``): their neighbourhoods overlap less, and a block's
        recurrence multiplies the union of them. Unless, for recurrences of ``hops`` steps, a
        first such block reaches on average more than :data:`_COVERED` of the graph per step (a
        small-world graph, or a range as wide as the graph): then every block costs about the
        whole graph per step anyway, and blocks of ``size`` make fewer of them. Within a block,
        and the blocks themselves, follow that order, so the result depends on ``nodes`` (and
        ``hops``) alone.
        """
        rank = self._locality_rank()
        nodes = nodes[torch.argsort(rank[nodes])]
        count = nodes.numel()
        scattered_size = size if scattered_size is None else scattered_size
        if count <= min(size, scattered_size):
            return [nodes]
        index = nodes.numpy()
        induced = self._matrix_scipy()[index][:, index]
        induced.setdiag(0)
        induced.eliminate_zeros()
        if induced.nnz < 2 * count:
            if hops is not None and scattered_size < size:
                _, ends = self._layers(nodes[:scattered_size], hops)
                if ends.sum() > _COVERED * (hops + 1) * self.num_nodes:
                    scattered_size = size
            return list(torch.split(nodes, scattered_size))
        if count <= size:
            return [nodes]
        import pymetis

        parts = math.ceil(count / size)
        _, membership = pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(induced.indptr, induced.indices))
        membership = torch.as_tensor(np.asarray(membership, dtype=np.int64))
        # Parts in the order of their first node's rank; nodes within a part in rank order.
        first = torch.full((parts,), count, dtype=torch.int64).scatter_reduce(
            0, membership, torch.arange(count), reduce="amin")
        position = torch.empty_like(first)
        position[torch.argsort(first)] = torch.arange(parts)
        ordered = torch.argsort(position[membership] * count + torch.arange(count))
        sizes = torch.bincount(position[membership], minlength=parts)
        # METIS balances the parts only to a few per cent: a part above ``size`` is cut in rank order.
        return [piece for part in torch.split(nodes[ordered], sizes.tolist()) for piece in torch.split(part, size)]

    def _layers(self, nodes: Tensor, hops: int) -> tuple[np.ndarray, np.ndarray]:
        r"""The nodes within ``hops`` of ``nodes``, sorted by that distance, and where each distance ends.

        A breadth-first search from all of ``nodes`` at once, one hop per step over the CSR
        pattern of :math:`\widetilde{\mathbf W}`: it touches only the edges of the nodes it reaches.

        :return: ``(local, ends)``: ``local[k]`` is a node index, ``local[:ends[m]]`` the nodes
            within ``m`` hops (``nodes`` themselves first, in their order; then by distance and
            node index).
        """
        matrix = self._matrix_scipy()
        pointer, neighbours = matrix.indptr, matrix.indices
        sources = nodes.cpu().numpy().astype(np.int64)
        seen = np.zeros(self.num_nodes, dtype=bool)
        seen[sources] = True
        layers, ends, frontier = [sources], [sources.size], sources
        for _ in range(hops):
            starts, counts = pointer[frontier], pointer[frontier + 1] - pointer[frontier]
            offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            reached = neighbours[np.repeat(starts, counts) + offsets]
            frontier = np.unique(reached[~seen[reached]]).astype(np.int64)
            seen[frontier] = True
            layers.append(frontier)
            ends.append(ends[-1] + frontier.size)
        return np.concatenate(layers), np.asarray(ends, dtype=np.int64)

    def _one_hot_diagonals(self, nodes: Tensor, degree: int) -> Tensor:
        hops = (degree + 1) // 2
        count = nodes.numel()
        result = torch.empty(count, degree + 1, dtype=torch.float64, device=nodes.device)
        result[:, 0] = 1.0
        if hops == 0:
            return result
        recurrence = _LocalRecurrence(self, nodes.cpu(), device=nodes.device)
        recurrence.extend(hops)
        diagonal = torch.arange(count, device=nodes.device)
        self_loops = previous = None
        for m, current in enumerate(recurrence.terms(hops)):
            rows = recurrence.reach(m)
            if m == 1:
                self_loops = current[diagonal, diagonal].clone()
            if m >= 1 and 2 * m - 1 <= degree:
                result[:, 2 * m - 1] = 2 * (current[:rows] * previous[:rows]).sum(0) - self_loops
            if m >= 1 and 2 * m <= degree:
                result[:, 2 * m] = 2 * current[:rows].square().sum(0) - 1
            previous = current
        return result

    def _matrix_scipy(self) -> sp.csr_matrix:
        r""":math:`\widetilde{\mathbf W}` as a SciPy CSR matrix (float64, kept; its pattern is the graph's hops)."""
        if self._scipy_matrix is None:
            matrix = self._matrix.cpu()
            self._scipy_matrix = sp.csr_matrix((matrix.values().numpy(), matrix.col_indices().numpy(),
                                                matrix.crow_indices().numpy()), shape=tuple(matrix.shape))
        return self._scipy_matrix


def _layout(nnz: int, width: int) -> torch.layout:
    return torch.sparse_coo if nnz * width <= _SMALL_PRODUCT else torch.sparse_csr


@dataclass
class _KeptBlocks:
    """The terms of :meth:`ChebyshevBasis.block` for one pair of node sets.

    The distinct columns lie in local blocks (``chunks``), and ``column_order`` says where each
    of ``columns`` lies in their concatenation. A block's rows are all of ``rows``, or, where the
    rows are the same node set as the columns (``row_order``, where each of ``rows`` lies in the
    concatenation), the symmetric half: the nodes of this and the earlier blocks
    (:meth:`chunk_rows`). Per block, ``segments`` of consecutive degrees up to ``degree``
    (``(first degree, targets, values)``) hold the terms on the rows its recurrence reaches by the
    segment's last degree (``targets``, indices into the block's rows; ``values`` of shape
    ``(count, len(targets), len(chunk))``): the other rows are zero. ``recurrences`` continue the
    blocks' recurrences (``None`` where their last terms are not kept); ``beyond_bound`` is a
    degree found not to fit, and the bound it did not fit. The values are kept in ``dtype``.
    """

    rows: Tensor
    columns: Tensor
    chunks: list[Tensor]
    column_order: Tensor
    segments: list[list[tuple[int, Tensor, Tensor]]]
    degree: int
    dtype: torch.dtype
    recurrences: list[_LocalRecurrence | None] | None = None
    row_order: Tensor | None = None
    beyond_bound: tuple[int, int] | None = None

    def restarted(self) -> _KeptBlocks:
        """The same node sets and blocks with no terms yet (for recurrences that must start again)."""
        return _KeptBlocks(self.rows, self.columns, self.chunks, self.column_order, [[] for _ in self.chunks], -1,
                           self.dtype, row_order=self.row_order, beyond_bound=self.beyond_bound)

    def chunk_rows(self, index: int) -> Tensor:
        """The row nodes of block ``index``."""
        if self.row_order is None:
            return self.rows
        return torch.cat(self.chunks[:index + 1]).to(self.rows.device)

    def chunk_row_count(self, index: int) -> int:
        """How many row nodes block ``index`` has."""
        if self.row_order is None:
            return self.rows.numel()
        return sum(chunk.numel() for chunk in self.chunks[:index + 1])

    def entries(self) -> int:
        """Numbers held."""
        return sum(values.numel() for segments in self.segments for _, _, values in segments)

    def up_to(self, degree: int) -> list[list[tuple[int, Tensor, Tensor]]]:
        """The segments of every block, cut at ``degree``."""
        return [[(first, targets, values[:degree + 1 - first]) for first, targets, values in chunk if first <= degree]
                for chunk in self.segments]

    def sum(self, weights: Tensor) -> Tensor:
        r"""The block :math:`\sum_j w_j T_j(\widetilde{\mathbf W})_{AB}` for ``weights`` ``(*batch, J + 1)``
        (in :attr:`dtype`, not differentiated; :math:`J` at most :attr:`degree`), in the order of
        :attr:`rows` and :attr:`columns`.

        Each segment's sum over its degrees is added in place into one matrix over the blocks'
        concatenated nodes (and, where symmetric, copied transposed below the diagonal blocks), which is
        then gathered into the requested order: at most two dense temporaries of the block's size.
        """
        batch, degree = weights.shape[:-1], weights.shape[-1] - 1
        sizes = [chunk.numel() for chunk in self.chunks]
        total = sum(sizes)
        rows = total if self.row_order is not None else self.rows.numel()
        full = weights.new_zeros(*batch, rows, total)
        start = 0
        for index, segments in enumerate(self.up_to(degree)):
            end = start + sizes[index]
            # Symmetric: this block's rows are its own and the earlier blocks' nodes (the upper block
            # triangle), and the lower triangle is its transpose; the diagonal block is written as it is.
            piece = full[..., :end, start:end] if self.row_order is not None else full[..., start:end]
            for first, targets, values in segments:
                piece.index_add_(-2, targets,
                                 torch.einsum("...j,jab->...ab", weights[..., first:first + values.shape[0]], values))
            if self.row_order is not None:
                full[..., start:end, :start] = piece[..., :start, :].mT
            start = end
        if self.row_order is not None and not _is_identity(self.row_order):
            full = full.index_select(-2, self.row_order.to(full.device))
        if not _is_identity(self.column_order):
            full = full.index_select(-1, self.column_order.to(full.device))
        return full

    def moments(self, left: Tensor, degree: int) -> Tensor:
        r"""Moments :math:`m_j = \sum_{a, b}\mathbf G_{ab}\,T_j(\widetilde{\mathbf W})_{A_aB_b}`,
        :math:`j \le J`: the gradient of :meth:`sum` with respect to its weights for the adjoint
        :math:`\mathbf G` (``left``, ``(*batch, len(rows), len(columns))``), from the kept terms.

        :return: ``(*batch, J + 1)`` in :attr:`dtype`.
        """
        left = left.to(self.dtype)
        sizes = [chunk.numel() for chunk in self.chunks]
        total = sum(sizes)
        # The adjoint of the gathers of :meth:`sum`: scatters onto the blocks' nodes (repeats add up).
        if not _is_identity(self.column_order):
            left = left.new_zeros(*left.shape[:-1], total).index_add_(-1, self.column_order.to(left.device), left)
        if self.row_order is not None and not _is_identity(self.row_order):
            left = left.new_zeros(*left.shape[:-2], total, total).index_add_(-2, self.row_order.to(left.device), left)
        moments = left.new_zeros(*left.shape[:-2], degree + 1)
        start = 0
        for index, segments in enumerate(self.up_to(degree)):
            end = start + sizes[index]
            if self.row_order is not None:
                # The upper entries were written twice, as themselves and as their transposes below the
                # diagonal blocks; the diagonal block once.
                part = left[..., :end, start:end] + left[..., start:end, :end].mT
                part[..., start:end, :] = left[..., start:end, start:end]
            else:
                part = left[..., start:end]
            for first, targets, values in segments:
                moments[..., first:first + values.shape[0]] += torch.einsum(
                    "...ab,jab->...j", part.index_select(-2, targets), values)
            start = end
        return moments


class _KeptBlockSum(torch.autograd.Function):
    r""":meth:`ChebyshevBasis.block`: :math:`\sum_j c_j T_j(\widetilde{\mathbf W})_{AB}` from kept terms,
    whose backward is the moments :math:`\partial/\partial c_j = \langle\bar{\mathbf K},
    T_j(\widetilde{\mathbf W})_{AB}\rangle` of the same terms (:meth:`_KeptBlocks.moments`), with no
    dense intermediate kept for autograd."""

    @staticmethod
    def forward(ctx: Any, coefficients: Tensor, kept: _KeptBlocks) -> Tensor:
        ctx.kept, ctx.shape = kept, coefficients.shape
        return kept.sum(coefficients.detach())

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None
        moments = ctx.kept.moments(grad, ctx.shape[-1] - 1)
        return moments.to(grad.dtype).sum_to_size(ctx.shape), None


def _is_identity(order: Tensor) -> bool:
    """Whether ``order`` is ``0, 1, ..., len - 1``."""
    return bool(torch.equal(order, torch.arange(order.numel(), device=order.device)))


def symmetric_entries(block_sizes: list[int]) -> int:
    """Numbers per degree of symmetric kept terms in blocks of columns of these sizes (each block holds the
    rows of its own and the earlier blocks)."""
    sizes = np.asarray(block_sizes, dtype=np.int64)
    return int((np.cumsum(sizes) * sizes).sum())


def kept_terms_entries(num_nodes: int, degree: int) -> int:
    """Most numbers :meth:`ChebyshevBasis.block` keeps for the symmetric block of ``num_nodes`` nodes (blocks of
    ``_COLUMN_BLOCK`` columns) to ``degree``, where every block's recurrence reaches every row: what a training
    covariance's terms take at most (fewer where the nodes lie more than ``degree`` hops apart)."""
    sizes = [_COLUMN_BLOCK] * (num_nodes // _COLUMN_BLOCK) + ([num_nodes % _COLUMN_BLOCK] if num_nodes % _COLUMN_BLOCK
                                                               else [])
    return (degree + 1) * symmetric_entries(sizes)


class _LocalRecurrence:
    r"""The Chebyshev recurrence on the one-hot columns of ``sources``, on the nodes it can reach.

    :math:`T_j\mathbf e_b` lives within :math:`j` hops of :math:`b`. The nodes within
    ``hops`` of the sources are numbered by their distance (:meth:`ChebyshevBasis._layers`,
    the sources first), so the rows step :math:`j` can reach are a leading block: it
    multiplies only those rows of :math:`\widetilde{\mathbf W}` restricted to the local
    nodes, and every buffer is zero beyond them. Exact up to degree ``hops``; :meth:`extend`
    takes the reach further (the nodes within fewer hops keep their numbers) and
    :meth:`terms` continues from the last two terms.

    :param basis: The basis whose :math:`\widetilde{\mathbf W}` this runs on.
    :param sources: Distinct node indices (CPU int64).
    :param device: Device of the buffers.
    """

    def __init__(self, basis: ChebyshevBasis, sources: Tensor, *, device: torch.device) -> None:
        self.basis, self.sources, self.device = basis, sources, device
        self.hops = -1
        self.degree = -1  # of the last term computed
        self.size = 0
        self._matrix: tuple[np.ndarray, Tensor, Tensor, Tensor] | None = None
        self._previous = self._current = torch.zeros(0, sources.numel(), dtype=torch.float64, device=device)

    def extend(self, hops: int) -> None:
        """Reach ``hops`` hops from the sources (exact terms up to that degree)."""
        if hops <= self.hops:
            return
        self.local, self._ends = self.basis._layers(self.sources, hops)
        self.hops = hops
        self._matrix = None
        self.size = self.local.size

    def _grow(self) -> None:
        """Zero rows for the nodes :meth:`extend` added to the last two terms (allocated when a step needs them)."""
        padding = (0, 0, 0, self.size - self._previous.shape[0])
        if padding[-1]:
            self._previous = torch.nn.functional.pad(self._previous, padding)
            self._current = torch.nn.functional.pad(self._current, padding)

    def release(self) -> None:
        """Drop the restricted matrix until the next step needs it (the last two terms are kept)."""
        self._matrix = None

    def _restricted(self) -> tuple[np.ndarray, Tensor, Tensor, Tensor]:
        r""":math:`\widetilde{\mathbf W}` on the local nodes: SciPy's row pointer, and torch's pointer, columns and
        values (int32 indices, as for the whole matrix: MKL's sparse kernels would convert int64 ones on every
        product); built when first needed after :meth:`extend` or :meth:`release`."""
        if self._matrix is None:
            restricted = sp.csr_matrix(self.basis._matrix_scipy()[self.local][:, self.local])
            restricted.sort_indices()
            self._matrix = (restricted.indptr,
                            torch.from_numpy(restricted.indptr.astype(np.int32)).to(self.device),
                            torch.from_numpy(restricted.indices.astype(np.int32)).to(self.device),
                            torch.from_numpy(restricted.data.astype(np.float64)).to(self.device))
        return self._matrix

    def reach(self, degree: int) -> int:
        """How many leading local nodes the term of ``degree`` can be nonzero on."""
        return int(self._ends[min(degree, self.hops)])

    def positions(self, nodes: Tensor) -> tuple[Tensor, Tensor]:
        """Which of ``nodes`` are local (their indices in ``nodes``), and their local numbers."""
        order = np.argsort(self.local, kind="stable")
        wanted = nodes.cpu().numpy()
        found = np.minimum(np.searchsorted(self.local, wanted, sorter=order), self.size - 1)
        inside = self.local[order[found]] == wanted
        return (torch.from_numpy(np.flatnonzero(inside)).to(self.device),
                torch.from_numpy(order[found[inside]]).to(self.device))

    def terms(self, degree: int) -> Iterator[Tensor]:
        r"""Yield the terms after the last computed, up to ``degree`` (at most ``hops``), as
        ``(size, len(sources))`` buffers: the last two yielded stay valid until the next call."""
        self._grow()
        if self.degree < 0:
            diagonal = torch.arange(self.sources.numel(), device=self.device)
            self._previous[diagonal, diagonal] = 1.0
            self.degree = 0
            yield self._previous
        if self.degree == 0 and degree >= 1:
            rows = self.reach(1)
            self._current[:rows] = self._leading_rows(rows) @ self._previous
            self.degree = 1
            yield self._current
        while self.degree < degree:
            # T_{j+1} = 2 W T_j - T_{j-1}, over T_{j-1}'s buffer (small products: COO, see _SMALL_PRODUCT).
            rows = self.reach(self.degree + 1)
            matrix, previous = self._leading_rows(rows), self._previous[:rows]
            if int(self._restricted()[0][rows]) * self.sources.numel() <= _SMALL_PRODUCT:
                previous.copy_(torch.sparse.mm(matrix.to_sparse_coo(), self._current).mul_(2).sub_(previous))
            else:
                torch.addmm(previous, matrix, self._current, beta=-1, alpha=2, out=previous)
            self._previous, self._current = self._current, self._previous
            self.degree += 1
            yield self._current

    def _leading_rows(self, rows: int) -> Tensor:
        row_pointer, pointer, columns, values = self._restricted()
        end = int(row_pointer[rows])
        return sparse_csr(pointer[:rows + 1], columns[:end], values[:end], (rows, self.size))


def _ends_fit(recurrences: list[_LocalRecurrence], max_entries: int) -> bool:
    """Whether the last two terms of every recurrence, on the nodes each reaches, fit ``max_entries``."""
    return 2 * sum(recurrence.size * recurrence.sources.numel() for recurrence in recurrences) <= max_entries


def _positions_in(chunks: list[Tensor], nodes: Tensor) -> Tensor:
    """Where each of ``nodes`` (all among the chunks' distinct nodes) lies in the concatenation of ``chunks``."""
    concatenated = torch.cat(chunks)
    distinct, where = torch.sort(concatenated)
    return where[torch.searchsorted(distinct, nodes)]


def _same_nodes(first: Tensor, second: Tensor) -> bool:
    return first.device == second.device and first.shape == second.shape and bool(torch.equal(first, second))


def one_hot_columns(nodes: Tensor, num_nodes: int, dtype: torch.dtype) -> Tensor:
    """The ``(num_nodes, len(nodes))`` block whose column ``k`` is the indicator of ``nodes[k]``."""
    block = torch.zeros(num_nodes, nodes.numel(), dtype=dtype, device=nodes.device)
    block[nodes, torch.arange(nodes.numel(), device=nodes.device)] = 1.0
    return block
