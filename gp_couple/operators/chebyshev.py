r"""Graph kernels applied matrix-free as Chebyshev polynomials of the normalised adjacency.

Every kernel family of :mod:`gp_couple.kernel_families` is a function
:math:`g_\theta(\widetilde{\mathbf W})` of the normalised adjacency, whose eigenvalues lie in
:math:`[-1, 1]` (paper, section on graph node kernels, eq. for the normalised Laplacian).
Expanding :math:`g_\theta` in Chebyshev polynomials of the first kind,

.. math::

    \mathbf K = g_\theta(\widetilde{\mathbf W}) \approx \sum_{j=0}^{J} c_j(\theta)\, T_j(\widetilde{\mathbf W}),
    \qquad T_{j+1}(\widetilde{\mathbf W})\mathbf v = 2\widetilde{\mathbf W}\, T_j(\widetilde{\mathbf W})\mathbf v
    - T_{j-1}(\widetilde{\mathbf W})\mathbf v,

gives products :math:`\mathbf K\mathbf v` from :math:`J` sparse products and never forms
:math:`\mathbf K`. Only the coefficients depend on the hyperparameters, which is the same
structure as the GRF features :math:`\Phi(\theta) = \sum_t f_\theta(t)\Phi_t` (Appendix on
GRF approximation), so gradients cost one more recurrence:
:math:`\partial(\mathbf u^\top\mathbf K\mathbf v)/\partial c_j = \mathbf u^\top T_j\mathbf v`.

Because :math:`|T_j(\lambda)| \le 1` on :math:`[-1, 1]`, dropping the terms :math:`j > J`
changes :math:`\mathbf K` by at most :math:`\sum_{j > J}|c_j|` in operator norm; the degree
:math:`J` is chosen from that bound (:func:`chebyshev_expansion`).

The method lives in three modules, one concept each:

* :mod:`gp_couple.operators.chebyshev_series`: :func:`~gp_couple.operators.chebyshev_series.chebyshev_expansion`,
  the coefficients :math:`c_j(\theta)` of a :class:`~gp_couple.kernel_families.KernelFamily`,
  differentiable, with the truncation bound.
* :mod:`gp_couple.operators.chebyshev_basis`: :class:`~gp_couple.operators.chebyshev_basis.ChebyshevBasis`,
  the sparse :math:`\widetilde{\mathbf W}`, its recurrences and the cached,
  hyperparameter-free diagonals :math:`T_j(\widetilde{\mathbf W})_{ii}`.
* here: :class:`ChebyshevKernelLinearOperator`, the block :math:`\mathbf K_{AB}` on node
  sets :math:`A`, :math:`B` as a :class:`~linear_operator.LinearOperator`.
"""

from __future__ import annotations

from typing import Any

import torch
from linear_operator.operators import LinearOperator
from linear_operator.utils.getitem import _is_noop_index, _noop_index
from torch import Tensor

from ..settings import kept_chebyshev_terms
from .chebyshev_basis import BLOCK_ENTRIES, ChebyshevBasis, one_hot_columns

__all__ = ["ChebyshevKernelLinearOperator"]


class _ChebyshevProduct(torch.autograd.Function):
    r""":math:`\mathbf Y = \sum_j c_j T_j(\widetilde{\mathbf W})\mathbf X` with a recurrence-based backward.

    The backward pass reruns the recurrence instead of keeping :math:`J` blocks on an
    autograd tape: :math:`\partial/\partial c_j = \langle \bar{\mathbf Y}, T_j\mathbf X\rangle`
    and :math:`\bar{\mathbf X} = \sum_j c_j T_j\bar{\mathbf Y}` (:math:`\widetilde{\mathbf W}`
    is symmetric), :math:`O(N t)` memory. ``block`` may also be int64 node indices,
    standing for their one-hot columns (then it is not saved as a dense block). With
    ``rows`` (int64 node indices) only those rows of :math:`\mathbf Y` are formed: the sums
    over :math:`j` then run on them alone, in the forward and the backward pass. (Dense
    blocks whose terms fit in memory avoid the second recurrence altogether:
    :meth:`ChebyshevKernelLinearOperator.to_dense`.)
    """

    @staticmethod
    def forward(ctx: Any, coefficients: Tensor, block: Tensor, basis: ChebyshevBasis,
                rows: Tensor | None = None) -> Tensor:
        ctx.basis = basis
        ctx.rows = rows
        ctx.save_for_backward(coefficients, block)
        return basis.combine(coefficients, _dense_block(block, basis.num_nodes, coefficients.dtype), rows)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        coefficients, block = ctx.saved_tensors
        basis: ChebyshevBasis = ctx.basis
        rows: Tensor | None = ctx.rows
        grad_coefficients = grad_block = None
        if ctx.needs_input_grad[0]:
            dense = _dense_block(block, basis.num_nodes, coefficients.dtype)
            moments = basis.moments(grad, dense, coefficients.shape[-1] - 1, rows)
            grad_coefficients = moments.sum_to_size(coefficients.shape)
        if ctx.needs_input_grad[1]:
            if rows is not None:  # the adjoint of selecting the rows: scatter (repeats add up)
                grad = grad.new_zeros(*grad.shape[:-2], basis.num_nodes, grad.shape[-1]).index_add_(-2, rows, grad)
            grad_block = basis.combine(coefficients, grad).sum_to_size(block.shape)
        return grad_coefficients, grad_block, None, None


class _LocalBlock(torch.autograd.Function):
    r""":math:`\mathbf K_{AB} = \sum_j c_j T_j(\widetilde{\mathbf W})_{AB}` from one-hot recurrences on the
    nodes each block of columns reaches (:meth:`ChebyshevBasis.summed_block`), for blocks whose terms
    are not kept; the backward reruns them for :math:`\partial/\partial c_j = \langle\bar{\mathbf K},
    T_j(\widetilde{\mathbf W})_{AB}\rangle` (:meth:`ChebyshevBasis.block_moments`)."""

    @staticmethod
    def forward(ctx: Any, coefficients: Tensor, basis: ChebyshevBasis, rows: Tensor, columns: Tensor) -> Tensor:
        ctx.basis, ctx.rows, ctx.columns = basis, rows, columns
        ctx.shape = coefficients.shape
        return basis.summed_block(coefficients, rows, columns)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        moments = ctx.basis.block_moments(grad, ctx.rows, ctx.columns, ctx.shape[-1] - 1)
        return moments.to(grad.dtype).sum_to_size(ctx.shape), None, None, None


def _dense_block(block: Tensor, num_nodes: int, dtype: torch.dtype) -> Tensor:
    return block if block.is_floating_point() else one_hot_columns(block, num_nodes, dtype)


# ------------------------------------------------------------------ the operator
class ChebyshevKernelLinearOperator(LinearOperator):
    r"""Matrix-free graph kernel block
    :math:`\mathbf K_{AB} = \mathbf P_A\sum_j c_jT_j(\widetilde{\mathbf W})\mathbf P_B^\top`.

    :math:`\mathbf P_A` selects the rows of the nodes in :math:`A` (``row_nodes``), so
    :math:`(\mathbf K_{AB})_{ab} = k(A_a, B_b)`. Products scatter the right-hand side onto
    the graph, run one recurrence of :math:`J` sparse products for all columns and batch
    entries together, and sum the terms on the rows of :math:`A` only; costs are
    :math:`O(J\,\mathrm{nnz}(\widetilde{\mathbf W})\,t)` time and :math:`O(N t)` memory for
    :math:`t` right-hand sides, whatever :math:`|A|`, :math:`|B|`.

    * Gradients with respect to the coefficients (hence the hyperparameters) use
      :math:`\partial(\mathbf u^\top\mathbf K\mathbf v)/\partial c_j =
      (\mathbf P_A^\top\mathbf u)^\top T_j(\mathbf P_B^\top\mathbf v)`: one more recurrence
      (:meth:`_bilinear_derivative`, and the backward of every product).
    * The diagonal of a symmetric block is :math:`\mathbf D_A\mathbf c` with the
      hyperparameter-free table :math:`(\mathbf D_A)_{aj} = T_j(\widetilde{\mathbf W})_{A_aA_a}`
      cached by the :class:`ChebyshevBasis` (:meth:`ChebyshevBasis.diagonal`).
    * Dense blocks within :class:`~gp_couple.settings.kept_chebyshev_terms` are sums over the basis's kept terms
      :math:`T_j(\widetilde{\mathbf W})_{AB}` (:meth:`to_dense`).
    * Entries and rows (e.g. for the pivoted-Cholesky preconditioner) run the recurrence
      on the one-hot columns of whichever side has fewer distinct nodes
      (:math:`\mathbf K` is symmetric in the node pair).

    :param coefficients: :math:`c_0, \dots, c_J`, shape ``(*batch, J + 1)``.
    :param basis: The :class:`ChebyshevBasis` of the graph.
    :param row_nodes: Node indices of :math:`A`, shape ``(n_A,)`` (shared by the batch) or
        ``(*batch, n_A)``.
    :param column_nodes: Node indices of :math:`B` (same conventions).
    """

    def __init__(self, coefficients: Tensor, *, basis: ChebyshevBasis, row_nodes: Tensor,
                 column_nodes: Tensor) -> None:
        batch = coefficients.shape[:-1]
        symmetric = column_nodes is row_nodes
        # LinearOperator.to()/type() may convert every tensor argument: indices stay int64.
        row_nodes = _nodes(row_nodes, batch)
        column_nodes = row_nodes if symmetric else _nodes(column_nodes, batch)
        super().__init__(coefficients, basis=basis, row_nodes=row_nodes, column_nodes=column_nodes)
        self.coefficients = coefficients
        self.basis = basis
        self.row_nodes = row_nodes
        self.column_nodes = column_nodes

    def _new(self, coefficients: Tensor) -> ChebyshevKernelLinearOperator:
        # Same nodes, new coefficients (batched node indices follow their batch shape).
        batch = coefficients.shape[:-1]
        rows = _expand_nodes(self.row_nodes, batch)
        columns = rows if self.column_nodes is self.row_nodes else _expand_nodes(self.column_nodes, batch)
        return self.__class__(coefficients, basis=self.basis, row_nodes=rows, column_nodes=columns)

    @property
    def degree(self) -> int:
        """The Chebyshev degree :math:`J`."""
        return self.coefficients.shape[-1] - 1

    # ---------------------------------------------------------------- required hooks
    def _size(self) -> torch.Size:
        return torch.Size((*self.coefficients.shape[:-1], self.row_nodes.shape[-1],
                           self.column_nodes.shape[-1]))

    def _scatter(self, nodes: Tensor, values: Tensor) -> Tensor:
        r""":math:`\mathbf P^\top\mathbf V` on the graph, ``(*batch, N, t)``."""
        batch = torch.broadcast_shapes(nodes.shape[:-1], values.shape[:-2])
        shape = (*batch, self.basis.num_nodes, values.shape[-1])
        index = nodes.unsqueeze(-1).expand(*batch, nodes.shape[-1], values.shape[-1])
        return values.new_zeros(shape).scatter_add(-2, index, values.expand(*batch, *values.shape[-2:]))

    @staticmethod
    def _gather(nodes: Tensor, full: Tensor) -> Tensor:
        if nodes.ndim == 1:
            return full.index_select(-2, nodes)
        batch = torch.broadcast_shapes(nodes.shape[:-1], full.shape[:-2])
        index = nodes.unsqueeze(-1).expand(*batch, nodes.shape[-1], full.shape[-1])
        return full.expand(*batch, *full.shape[-2:]).gather(-2, index)

    def _matmul(self, rhs: Tensor) -> Tensor:
        vector = rhs.ndim == 1
        rhs = rhs.unsqueeze(-1) if vector else rhs
        result = self._product_rows(self._scatter(self.column_nodes, rhs))
        return result.squeeze(-1) if vector else result

    def _product_rows(self, block: Tensor) -> Tensor:
        r"""The rows :math:`A` of :math:`\sum_j c_j T_j\mathbf X` (accumulated on those rows alone
        when the batch shares them)."""
        if self._shared_rows():
            return _ChebyshevProduct.apply(self.coefficients, block, self.basis, self.row_nodes)
        return self._gather(self.row_nodes, _ChebyshevProduct.apply(self.coefficients, block, self.basis))

    def _shared_rows(self) -> bool:
        """Whether sums run on the row nodes alone: one set for the whole batch, fewer than the graph's
        nodes (with as many rows, selecting them from every term would only copy it)."""
        return self.row_nodes.ndim == 1 and self.row_nodes.numel() < self.basis.num_nodes

    def _transpose_nonbatch(self) -> ChebyshevKernelLinearOperator:
        if self.row_nodes is self.column_nodes:
            return self
        return self.__class__(self.coefficients, basis=self.basis, row_nodes=self.column_nodes,
                              column_nodes=self.row_nodes)

    def _bilinear_derivative(self, left_vecs: Tensor, right_vecs: Tensor) -> tuple[Tensor | None, ...]:
        if not self.coefficients.requires_grad:
            return (None, None, None)
        if left_vecs.ndim == 1:
            left_vecs, right_vecs = left_vecs.unsqueeze(-1), right_vecs.unsqueeze(-1)
        with torch.no_grad():
            right = self._scatter(self.column_nodes, right_vecs)
            if self._shared_rows():
                moments = self.basis.moments(left_vecs, right, self.degree, self.row_nodes)
            else:
                moments = self.basis.moments(self._scatter(self.row_nodes, left_vecs), right, self.degree)
        # Representation order: coefficients, then the tensor kwargs sorted by name.
        return (moments.sum_to_size(self.coefficients.shape), None, None)

    # ---------------------------------------------------------------- batch handling
    def _expand_batch(self, batch_shape: torch.Size | list[int]) -> ChebyshevKernelLinearOperator:
        return self._new(self.coefficients.expand(*batch_shape, self.coefficients.shape[-1]))

    def _with_batch_map(self, coefficients: Tensor, transform: Any) -> ChebyshevKernelLinearOperator:
        # Batched node indices follow the coefficients' batch; shared (1-D) ones stay shared.
        def apply(nodes: Tensor) -> Tensor:
            return nodes if nodes.ndim == 1 else transform(nodes)

        rows = apply(self.row_nodes)
        columns = rows if self.column_nodes is self.row_nodes else apply(self.column_nodes)
        return self.__class__(coefficients, basis=self.basis, row_nodes=rows, column_nodes=columns)

    def _permute_batch(self, *dims: int) -> ChebyshevKernelLinearOperator:
        return self._with_batch_map(self.coefficients.permute(*dims, -1),
                                    lambda nodes: nodes.permute(*dims, -1))

    def _unsqueeze_batch(self, dim: int) -> ChebyshevKernelLinearOperator:
        return self._with_batch_map(self.coefficients.unsqueeze(dim), lambda nodes: nodes.unsqueeze(dim))

    def _mul_constant(self, other: float | Tensor) -> LinearOperator:
        # c * g(W) = (c g)(W): scaling the coefficients keeps the cheap derivative (ScaleKernel).
        constant = torch.as_tensor(other, dtype=self.dtype, device=self.device)
        return self._new(self.coefficients * constant.unsqueeze(-1))

    # ---------------------------------------------------------------- entries
    def _diagonal(self) -> Tensor:
        size = min(self.matrix_shape)
        rows, columns = self.row_nodes[..., :size], self.column_nodes[..., :size]
        if not torch.equal(rows, columns):
            index = torch.arange(size, device=self.device)
            return self._entries(rows, columns, index, index)
        table = self.basis.diagonal(rows, self.degree).to(self.dtype)
        return (table * self.coefficients.unsqueeze(-2)).sum(-1)

    def _entries(self, rows: Tensor, columns: Tensor, row_index: Tensor, column_index: Tensor,
                 batch_indices: tuple[Tensor, ...] = ()) -> Tensor:
        r"""Entries :math:`k(A_{r_p}, B_{s_p})` for flat index lists ``row_index``, ``column_index``.

        One recurrence runs on the one-hot columns of whichever side has fewer distinct
        nodes (:math:`k` is symmetric in the node pair), e.g. a single column for a
        pivoted-Cholesky row :math:`\mathbf K[i, :]`. With ``batch_indices`` every pair
        has its own batch entry; the recurrence then runs for the distinct entries only.
        """
        if batch_indices:
            first = rows[row_index] if rows.ndim == 1 else rows[(*batch_indices, row_index)]
            second = columns[column_index] if columns.ndim == 1 else columns[(*batch_indices, column_index)]
        else:
            first, second = rows[..., row_index], columns[..., column_index]
        distinct_first, distinct_second = torch.unique(first), torch.unique(second)
        if distinct_first.numel() < distinct_second.numel():
            first, second, distinct_second = second, first, distinct_first
        position = torch.searchsorted(distinct_second, second)
        if batch_indices:
            entry = torch.zeros_like(row_index)
            for index, size in zip(batch_indices, self.batch_shape):
                entry = entry * size + index
            distinct_entries, owner = torch.unique(entry, return_inverse=True)
            coefficients = self.coefficients.reshape(-1, self.degree + 1)[distinct_entries]
            full = _ChebyshevProduct.apply(coefficients, distinct_second, self.basis)  # (E, N, u)
            return full[owner, first, position]
        full = _ChebyshevProduct.apply(self.coefficients, distinct_second, self.basis)  # (*batch, N, u)
        batch = full.shape[:-2]
        flat = full.reshape(-1, *full.shape[-2:])
        first = first.expand(*batch, first.shape[-1]).reshape(flat.shape[0], -1)
        position = position.expand(*batch, position.shape[-1]).reshape(flat.shape[0], -1)
        picked = flat[torch.arange(flat.shape[0], device=flat.device).unsqueeze(-1), first, position]
        return picked.reshape(*batch, -1)

    def _get_indices(self, row_index: Tensor, col_index: Tensor, *batch_indices: Tensor) -> Tensor:
        shape = torch.broadcast_shapes(row_index.shape, col_index.shape, *(index.shape for index in batch_indices))
        flat_batch = tuple(index.expand(shape).reshape(-1) for index in batch_indices)
        values = self._entries(self.row_nodes, self.column_nodes, row_index.expand(shape).reshape(-1),
                               col_index.expand(shape).reshape(-1), flat_batch)
        return values.reshape(shape)

    def _getitem(self, row_index: Any, col_index: Any, *batch_indices: Any) -> LinearOperator:
        coefficients = self.coefficients
        batched = batch_indices and not all(_is_noop_index(index) for index in batch_indices)
        if batched:
            coefficients = coefficients[(*batch_indices, _noop_index)]

        def select(nodes: Tensor, index: Any) -> Tensor:
            if nodes.ndim > 1 and batched:
                nodes = nodes[(*batch_indices, _noop_index)]
            return nodes if _is_noop_index(index) else nodes[..., index]

        batch = coefficients.shape[:-1]
        rows = _expand_nodes(select(self.row_nodes, row_index), batch)
        if self.row_nodes is self.column_nodes and _same_index(row_index, col_index):
            columns = rows
        else:
            columns = _expand_nodes(select(self.column_nodes, col_index), batch)
        return self.__class__(coefficients, basis=self.basis, row_nodes=rows, column_nodes=columns)

    # ---------------------------------------------------------------- dense
    def to_dense(self) -> Tensor:
        r"""The dense block, from one-hot recurrences on the distinct nodes of the smaller side, in chunks.

        Costs :math:`J\,\mathrm{nnz}\,\min(|A|, |B|)` and :math:`O(N\,\mathrm{chunk})` memory; meant for
        the small blocks that gpytorch's Cholesky path asks for. Where the hyperparameter-free
        blocks :math:`T_j(\widetilde{\mathbf W})_{AB}` fit in
        :class:`~gp_couple.settings.kept_chebyshev_terms`, the block is their sum
        :math:`\sum_j c_j T_j(\widetilde{\mathbf W})_{AB}` over the terms the basis keeps
        (:meth:`~gp_couple.operators.ChebyshevBasis.block`): in training, every evaluation on
        the same nodes after the first costs :math:`(J + 1)|A||B|`, and so does its gradient.
        Where they do not fit, the block is summed as its recurrences run
        (:meth:`~gp_couple.operators.ChebyshevBasis.summed_block`), and its backward reruns them.
        Either way the recurrences run on the nodes within :math:`J` hops of each block of nearby
        columns, not on the whole graph.
        """
        columns = self.column_nodes
        if columns.ndim > 1:
            index = torch.arange(columns.shape[-1], device=self.device)
            rows = torch.arange(self.row_nodes.shape[-1], device=self.device)
            grid_rows, grid_columns = torch.meshgrid(rows, index, indexing="ij")
            values = self._entries(self.row_nodes, columns, grid_rows.reshape(-1), grid_columns.reshape(-1))
            return values.reshape(*self.batch_shape, rows.numel(), index.numel())
        distinct, position = torch.unique(columns, return_inverse=True)
        if self.row_nodes.ndim == 1 and torch.unique(self.row_nodes).numel() < distinct.numel():
            # K_AB = K_BA^T: one-hot recurrences on the side with fewer distinct nodes.
            return self._transpose_nonbatch().to_dense().mT
        if self._shared_rows():
            # The bound counts float64 numbers; terms kept in a narrower dtype fit more of them in its memory.
            bound = kept_chebyshev_terms.value() * 8 // self.coefficients.element_size()
            block = self.basis.block(self.coefficients, self.row_nodes, distinct, bound)
            if block is None:
                block = _LocalBlock.apply(self.coefficients, self.basis, self.row_nodes, distinct)
            return block if torch.equal(distinct, columns) else block[..., position]
        chunk = max(1, BLOCK_ENTRIES // (3 * self.basis.num_nodes * max(1, self.batch_shape.numel())))
        blocks = [self._product_rows(distinct[start:start + chunk])
                  for start in range(0, distinct.numel(), chunk)]
        return torch.cat(blocks, dim=-1)[..., position]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(shape={tuple(self.shape)}, degree={self.degree}, "
                f"num_nodes={self.basis.num_nodes}, dtype={self.dtype})")


def _same_index(first: Any, second: Any) -> bool:
    if isinstance(first, Tensor) and isinstance(second, Tensor):
        return first.shape == second.shape and bool(torch.equal(first, second))
    if isinstance(first, slice) and isinstance(second, slice):
        return (first.start, first.stop, first.step) == (second.start, second.stop, second.step)
    return False


def _nodes(nodes: Tensor, batch: torch.Size) -> Tensor:
    if not isinstance(nodes, Tensor):
        raise TypeError(f"node indices must be a tensor, got {type(nodes).__name__}")
    nodes = nodes if nodes.dtype == torch.int64 else nodes.to(torch.int64)
    if nodes.ndim > 1 and nodes.shape[:-1] != batch:
        raise ValueError(f"batched node indices of shape {tuple(nodes.shape)} do not match the "
                         f"coefficient batch shape {tuple(batch)}")
    return nodes


def _expand_nodes(nodes: Tensor, batch: torch.Size) -> Tensor:
    if nodes.ndim == 1 or nodes.shape[:-1] == batch:
        return nodes
    return nodes.expand(*batch, nodes.shape[-1])
