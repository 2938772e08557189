r"""An exact GP's training covariance :math:`s\mathbf K + \operatorname{diag}(\boldsymbol\sigma^2)`: parts, dense form.

Under a Gaussian likelihood the training covariance of an exact GP (paper, Appendix F.2
"Scalable GPs on graphs" [app:grf_gp_details]) is

.. math::

    \mathbf C = s\,\mathbf K + \operatorname{diag}(\boldsymbol\sigma^2),

with :math:`s` the output scale of a :class:`~gpytorch.kernels.ScaleKernel` (absent
without one) and :math:`\boldsymbol\sigma^2` the noise. linear_operator represents it as an
:class:`~linear_operator.operators.AddedDiagLinearOperator`, whose ``to_dense`` keeps
:math:`s\mathbf K` and a dense diagonal matrix in its caches beside the sum. The marginal
likelihood's dense path and the dense predictive variances factorise :math:`\mathbf C`
instead as one new matrix, :math:`s\mathbf K` with the noise added to its diagonal.
"""

from __future__ import annotations

import torch
from linear_operator.operators import (
    AddedDiagLinearOperator,
    ConstantMulLinearOperator,
    DiagLinearOperator,
    LinearOperator,
    SumLinearOperator,
)
from torch import Tensor

__all__ = ["dense_covariance", "scaled_plus_diagonal"]


def scaled_plus_diagonal(operator: LinearOperator) -> tuple[LinearOperator, Tensor | None, Tensor] | None:
    r"""The parts :math:`(\mathbf K, s, \boldsymbol\sigma^2)` of a covariance
    :math:`s\mathbf K + \operatorname{diag}(\boldsymbol\sigma^2)`.

    :param operator: A training covariance: an
        :class:`~linear_operator.operators.AddedDiagLinearOperator`, or the sum of an
        operator and a :class:`~linear_operator.operators.DiagLinearOperator` that indexing
        one of its batch entries gives.
    :return: The kernel matrix, the output scale (broadcastable to the kernel matrix;
        ``None`` without a :class:`~gpytorch.kernels.ScaleKernel`) and the noise
        variances; ``None`` for an operator of any other form.
    """
    if isinstance(operator, AddedDiagLinearOperator):
        rest, noise = operator._linear_op, operator._diag_tensor.diagonal()
    elif (isinstance(operator, SumLinearOperator) and len(operator.linear_ops) == 2
          and isinstance(operator.linear_ops[1], DiagLinearOperator)):
        # What indexing a batch entry of an AddedDiagLinearOperator gives.
        rest, noise = operator.linear_ops[0], operator.linear_ops[1].diagonal()
    else:
        return None
    if isinstance(rest, ConstantMulLinearOperator):
        return rest.base_linear_op, rest.expanded_constant, noise
    return rest, None, noise


def dense_covariance(operator: LinearOperator, dtype: torch.dtype | None = None) -> Tensor:
    r"""The training covariance as one new dense tensor, which the caller may overwrite.

    :math:`s\mathbf K + \operatorname{diag}(\boldsymbol\sigma^2)` is formed as :math:`s\mathbf K`
    in ``dtype`` with the noise added to its diagonal: up to two :math:`n \times n`
    matrices fewer than the operators' own ``to_dense`` keeps while the factor is made.
    Any other operator is densified by its ``to_dense`` and copied.

    :param operator: A training covariance.
    :param dtype: Floating dtype of the result (default: the operator's).
    :return: The dense covariance, shape ``operator.shape``.
    """
    dtype = operator.dtype if dtype is None else dtype
    parts = scaled_plus_diagonal(operator)
    # The noise must fit the diagonal in place: a batch of its own goes through the operators.
    if parts is None or torch.broadcast_shapes(operator.shape[:-1], parts[2].shape) != operator.shape[:-1]:
        return operator.to_dense().to(dtype=dtype, copy=True)
    base, constant, noise = parts
    # A copy either way: the operators may hand out their cached dense matrices.
    dense = base.to_dense()
    if constant is None:
        covariance = dense.to(dtype=dtype, copy=True)
    elif (torch.broadcast_shapes(dense.shape, constant.shape) == dense.shape
          and not (torch.is_grad_enabled() and (dense.requires_grad or constant.requires_grad))):
        # No graph to record: scaled in place, without a second matrix in the new dtype.
        covariance = dense.to(dtype=dtype, copy=True).mul_(constant)
    else:
        # Out of place: an in-place product would make autograd keep a copy of its input.
        covariance = dense.to(dtype) * constant.to(dtype)
    covariance.diagonal(dim1=-2, dim2=-1).add_(noise)
    return covariance
