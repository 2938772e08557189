r"""The exact graph kernel for large graphs, applied matrix-free.

:class:`MatrixFreeGraphKernel` evaluates the same kernel as
:class:`~gp_couple.kernels.ExactGraphKernel`,
:math:`\mathbf K = \sum_k \alpha_k\widetilde{\mathbf W}^k = g_\theta(\widetilde{\mathbf W})`,
without a dense eigendecomposition: it returns a
:class:`~gp_couple.operators.ChebyshevKernelLinearOperator` whose products are Chebyshev
recurrences of sparse products, truncated where the discarded coefficients bound the
operator-norm error by ``tolerance`` relative to :math:`\sum_j|c_j| \ge \|\mathbf K\|_2`
(see :mod:`gp_couple.operators.chebyshev`). It is the exact reference at
:math:`10^4`–:math:`10^5` nodes, where the dense kernel no longer fits (issue on
GRF-GPs that predict like exact GPs, section 1), and it works inside
:class:`~gp_couple.models.GraphGP` with gpytorch's CG/Lanczos inference.

Costs on a graph with :math:`\mathrm{nnz}` stored adjacency entries and degree :math:`J`:

* a product with :math:`t` right-hand sides: :math:`J` sparse products,
  :math:`O(J\,\mathrm{nnz}\,t)` time, :math:`O(N t)` memory;
* its gradient with respect to the hyperparameters: one more recurrence;
* a dense block :math:`\mathbf K_{AB}` small enough (the Cholesky path of training): a one-off
  recurrence on the smaller side's one-hot columns, whose hyperparameter-free terms are kept
  on the graph, then :math:`O(J|A||B|)` per evaluation and gradient;
* the diagonal (predictive variances, the CG preconditioner): a one-off
  :math:`\lceil J/2\rceil\,\mathrm{nnz}` per node asked for, kept on the graph (recomputed
  with 25% headroom when the degree grows), then :math:`O(J)` per node.

The ``kernel_family`` submodule is the same as in :class:`~gp_couple.kernels.GRFKernel` and
:class:`~gp_couple.kernels.ExactGraphKernel`, so state dicts transfer between the three
(``strict=False`` to ignore GRF walk buffers).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..graphs import Graph
from ..kernel_families import KernelFamily
from ..operators.chebyshev import ChebyshevKernelLinearOperator
from ..operators.chebyshev_basis import ChebyshevBasis
from ..operators.chebyshev_series import (
    DEFAULT_MAX_DEGREE,
    DEFAULT_TOLERANCE,
    ChebyshevExpansion,
    chebyshev_expansion,
    check_tolerance,
)
from .graph_node import GraphNodeKernel

__all__ = ["MatrixFreeGraphKernel", "chebyshev_basis"]


def chebyshev_basis(graph: Graph) -> ChebyshevBasis:
    """The :class:`~gp_couple.operators.ChebyshevBasis` of a graph, cached on the (immutable) graph.

    Every kernel on the graph (and every copy gpytorch makes of one) shares it, and so
    shares its table of diagonals.
    """
    return graph.derived("chebyshev_basis", lambda: ChebyshevBasis(graph.normalized_adjacency()))


class MatrixFreeGraphKernel(GraphNodeKernel):
    r"""Exact graph kernel :math:`g_\theta(\widetilde{\mathbf W})` as a matrix-free Chebyshev operator.

    .. math::

        \mathbf K_{AB} = \mathbf P_A \sum_{j=0}^{J} c_j(\theta)\, T_j(\widetilde{\mathbf W})\,\mathbf P_B^\top,
        \qquad \sum_{j > J}|c_j| \le \mathrm{tol}\sum_j |c_j| .

    The degree :math:`J` follows the hyperparameters (it is chosen in every evaluation);
    :meth:`truncation` reports it with the error bound. ``tolerance`` and ``max_degree``
    are construction settings, not saved in the state dict.

    :param graph: The graph.
    :param kernel_family: The kernel family (default :class:`~gp_couple.kernel_families.Diffusion`).
    :param tolerance: Relative truncation tolerance in ``[1e-14, 1)`` (default ``1e-8``).
    :param max_degree: Largest Chebyshev degree; a kernel needing more raises ``ValueError``
        when evaluated (default 2000).
    :param batch_shape: Hyperparameter batch shape.
    :param kwargs: Passed to :class:`gpytorch.kernels.Kernel`.
    :raises TypeError: If ``tolerance`` or ``max_degree`` has the wrong type.
    :raises ValueError: If ``tolerance`` or ``max_degree`` is out of range.
    """

    def __init__(self, graph: Graph, kernel_family: KernelFamily | None = None, *,
                 tolerance: float = DEFAULT_TOLERANCE, max_degree: int = DEFAULT_MAX_DEGREE,
                 batch_shape: torch.Size = torch.Size(), **kwargs: Any) -> None:
        tolerance, max_degree = check_tolerance(tolerance, max_degree)
        super().__init__(graph, kernel_family, batch_shape=batch_shape, **kwargs)
        self.tolerance = tolerance
        self.max_degree = max_degree

    @property
    def basis(self) -> ChebyshevBasis:
        """The graph's Chebyshev basis (sparse normalised adjacency and cached diagonals)."""
        return chebyshev_basis(self._graph)

    def expansion(self) -> ChebyshevExpansion:
        r"""The truncated Chebyshev expansion at the current hyperparameters (differentiable)."""
        return chebyshev_expansion(self.kernel_family, self.tolerance, self.max_degree)

    def truncation(self) -> dict[str, Any]:
        r"""Degree :math:`J` and error bounds at the current hyperparameters, as plain numbers.

        ``tail_bound`` bounds :math:`\|\mathbf K - \mathbf K_J\|_2` (absolute, before any
        outputscale); ``relative_bound`` divides it by :math:`\sum_j|c_j|`.
        """
        with torch.no_grad():
            return self.expansion().to_dict()

    def _dtype(self) -> torch.dtype:
        for tensor in list(self.kernel_family.parameters()) + list(self.kernel_family.buffers()):
            if tensor.is_floating_point():
                return tensor.dtype
        return torch.get_default_dtype()

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False,
                **params: Any) -> ChebyshevKernelLinearOperator | Tensor:
        self._check_forward_args(last_dim_is_batch)
        same = x1 is x2 or (x1.shape == x2.shape and torch.equal(x1, x2))
        nodes1 = self.node_indices(x1, "x1", allow_batch=True)
        nodes2 = nodes1 if same else self.node_indices(x2, "x2", allow_batch=True)
        if diag and nodes1.shape[-1] != nodes2.shape[-1]:
            raise ValueError(f"diag=True needs x1 and x2 of equal length, got {nodes1.shape[-1]} "
                             f"and {nodes2.shape[-1]}")
        coefficients = self.expansion().coefficients.to(dtype=self._dtype(), device=x1.device)
        batch = self._output_batch(coefficients.shape[:-1], x1, x2)
        coefficients = coefficients.expand(*batch, coefficients.shape[-1])

        def batched(nodes: Tensor) -> Tensor:
            return nodes if nodes.ndim == 1 else nodes.expand(*batch, nodes.shape[-1])

        rows = batched(nodes1)
        columns = rows if same else batched(nodes2)
        operator = ChebyshevKernelLinearOperator(coefficients, basis=self.basis, row_nodes=rows,
                                                 column_nodes=columns)
        return operator._diagonal() if diag else operator

    def extra_repr(self) -> str:
        return f"num_nodes={self.num_nodes}, tolerance={self.tolerance:g}, max_degree={self.max_degree}"
