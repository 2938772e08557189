r"""The GRF Gram matrix :math:`\Phi\Phi^\top` of training rows sharded across processes.

Process :math:`r` holds the feature rows :math:`\Phi_r` of its block :math:`R_r` of the
:math:`n` training nodes (it sampled walks for those rows only), on the compact space
:math:`U_r` of the nodes its walks touched. A product with a vector :math:`\mathbf v`
(replicated: every process holds all :math:`n` entries) is

.. math::

    \mathbf g = \sum_r \Phi_r^\top \mathbf v_{R_r}, \qquad
    (\Phi\Phi^\top \mathbf v)_{R_r} = \Phi_r \mathbf g_{U_r} ,

and process :math:`r` needs :math:`\mathbf g` on :math:`U_r` only. Its own term covers
that, except on the nodes :math:`S` that the walks of several processes touch: only those
are all-reduced (:math:`|S|` numbers per column; with the training nodes sorted, the
blocks touch mostly disjoint regions of the graph and :math:`S` is their boundary), and
the :math:`n` result entries are all-gathered. linear_operator's CG and Lanczos then run
unchanged on replicated vectors, every process doing the same small dense work.

The derivative of :math:`\mathbf u^\top \Phi\Phi^\top \mathbf v` with respect to the
values of :math:`\Phi_r` is :math:`\mathbf u_{R_r} (\Phi^\top\mathbf v)^\top +
\mathbf v_{R_r}(\Phi^\top\mathbf u)^\top` on the pattern: each process differentiates its
own rows against the reduced :math:`\Phi^\top\mathbf u, \Phi^\top\mathbf v`, so the
hyperparameter gradients reaching the walks' values are partial sums that the caller
all-reduces (:meth:`gp_couple.distributed.Collective.reduce_gradients`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from linear_operator.operators import LinearOperator
from torch import Tensor

from ..distributed import Collective
from ..sparse_pattern import CSRPattern, segment_sum
from .sparse_products import sampled_dots, sparse_matmul

__all__ = ["SharedColumns", "ShardedGramLinearOperator"]


@dataclass(frozen=True)
class SharedColumns:
    """Where this process's touched nodes :math:`U_r` meet other processes' (the shared set :math:`S`).

    :ivar positions: Positions in :math:`U_r` of the shared nodes.
    :ivar slots: Their positions in :math:`S` (sorted, the same on every process).
    :ivar num_shared: :math:`|S|`.
    :ivar num_touched: :math:`|\bigcup_r U_r|`, for reports.
    """

    positions: Tensor
    slots: Tensor
    num_shared: int
    num_touched: int


class ShardedGramLinearOperator(LinearOperator):
    r""":math:`\Phi\Phi^\top` (``n x n``) from this process's rows :math:`\Phi_r` (see the module docstring).

    :param values: Values of :math:`\Phi_r` on ``pattern`` (shape ``(nnz_r,)``).
    :param pattern: The pattern of :math:`\Phi_r`, columns in its compact space :math:`U_r`.
    :param shared: Where :math:`U_r` meets the other processes' touched nodes.
    :param rows: This process's rows ``start:stop`` of the ``n`` training rows.
    :param num_rows: :math:`n`.
    :param collective: The processes (:class:`~gp_couple.distributed.Collective`).
    """

    def __init__(self, values: Tensor, *, pattern: CSRPattern, shared: SharedColumns, rows: slice, num_rows: int,
                 collective: Collective) -> None:
        super().__init__(values, pattern=pattern, shared=shared, rows=rows, num_rows=num_rows, collective=collective)
        self.shared = shared
        self.values = values
        self.pattern = pattern
        self.rows = rows
        self.num_rows = num_rows
        self.collective = collective

    def _size(self) -> torch.Size:
        return torch.Size((self.num_rows, self.num_rows))

    def _transpose_nonbatch(self) -> LinearOperator:
        return self

    def _reduced(self, values: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
        r"""This process's :math:`\Phi_r^\top \mathbf v_{R_r}`, and the sum over processes on :math:`U_r`."""
        local = sparse_matmul(self.pattern, values, rhs[..., self.rows, :], transpose=True)
        if not self.collective.distributed or not self.shared.num_shared:
            return local, local
        buffer = local.new_zeros(self.shared.num_shared, local.shape[-1])
        buffer[self.shared.slots] = local[self.shared.positions]
        total = self.collective.all_reduce(buffer)
        combined = local.clone()
        combined[self.shared.positions] = total[self.shared.slots]
        return local, combined

    def _matmul(self, rhs: Tensor) -> Tensor:
        vector = rhs.ndim == 1
        rhs = rhs.unsqueeze(-1) if vector else rhs
        _, reduced = self._reduced(self.values.detach(), rhs)
        out = self.collective.all_gather_rows(sparse_matmul(self.pattern, self.values.detach(), reduced))
        return out.squeeze(-1) if vector else out

    def _bilinear_derivative(self, left_vecs: Tensor, right_vecs: Tensor) -> tuple[Tensor | None, ...]:
        if not self.values.requires_grad:
            return (None,)
        left_vecs = left_vecs.unsqueeze(-1) if left_vecs.ndim == 1 else left_vecs
        right_vecs = right_vecs.unsqueeze(-1) if right_vecs.ndim == 1 else right_vecs
        values = self.values.detach()
        with torch.no_grad():
            # Entry (r, c): u_r . (Phi^T v)_c + v_r . (Phi^T u)_c, as sampled dot products
            # (no autograd buffers: each |U_r| x k block exists once).
            _, left_total = self._reduced(values, left_vecs)
            _, right_total = self._reduced(values, right_vecs)
            grad = sampled_dots(self.pattern, left_vecs[..., self.rows, :], right_total, values.shape)
            grad += sampled_dots(self.pattern, right_vecs[..., self.rows, :], left_total, values.shape)
        return (grad,)

    def _diagonal(self) -> Tensor:
        squares = segment_sum(self.values.square(), self.pattern.row_indices, self.pattern.num_rows)
        return self.collective.all_gather_rows(squares) if self.collective.distributed else squares

    def _expand_batch(self, batch_shape: torch.Size) -> LinearOperator:
        raise NotImplementedError("a sharded GRF Gram matrix has no batch dimensions")
