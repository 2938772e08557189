r"""The exact marginal log-likelihood with a dense Cholesky path whose gradient costs one matrix inverse.

Training maximises (paper, Appendix F.2 "Scalable GPs on graphs", paragraph "Training
GRF-GPs: technical details" [app:grf_gp_details])

.. math::

    \log p(\mathbf y \mid \theta) = -\tfrac12 \mathbf r^\top \mathbf C^{-1} \mathbf r
    - \tfrac12 \log\det \mathbf C - \tfrac n2 \log 2\pi,
    \qquad \mathbf C = \widehat{\mathbf K} + \sigma^2 \mathbf I,\ \mathbf r = \mathbf y - \mu .

Below gpytorch's ``max_cholesky_size``, gpytorch evaluates it through a Cholesky factor
:math:`\mathbf L` and lets autograd differentiate the factorisation, which costs several
triangular solves with :math:`n` right-hand sides. But the gradient with respect to the
covariance has a closed form,

.. math::

    \frac{\partial \log p}{\partial \mathbf C}
    = \tfrac12 \left(\boldsymbol\alpha\boldsymbol\alpha^\top - \mathbf C^{-1}\right),
    \qquad \boldsymbol\alpha = \mathbf C^{-1}\mathbf r,

and :math:`\mathbf C^{-1}` from :math:`\mathbf L` is one LAPACK call
(:func:`torch.cholesky_inverse`). :class:`DenseMarginalLogLikelihood` computes the value and
this gradient, and is otherwise gpytorch's
:class:`~gpytorch.mlls.ExactMarginalLogLikelihood` (priors, added loss terms, the division
by :math:`n`; CG/Lanczos above ``max_cholesky_size``). It is the objective of
:func:`gp_couple.models.fit_gp`. An exact objective with its exact gradient also suits
L-BFGS, whose line searches need the two to agree: on CG/Lanczos objectives they spend
several evaluations per iteration.
"""

from __future__ import annotations

import math
from typing import Any

import gpytorch
import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from linear_operator.operators import LinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from .kernels.graph_node import graph_kernels

__all__ = ["DenseMarginalLogLikelihood"]


class _GaussianQuadraticAndLogdet(torch.autograd.Function):
    r""":math:`(\mathbf r^\top\mathbf C^{-1}\mathbf r, \log\det\mathbf C)` of a dense covariance, batched.

    Backward: :math:`-\boldsymbol\alpha\boldsymbol\alpha^\top` and :math:`\mathbf C^{-1}` for
    the covariance, :math:`2\boldsymbol\alpha` for the residual.
    """

    @staticmethod
    def forward(ctx: Any, covariance: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        factor = psd_safe_cholesky(covariance)
        alpha = torch.cholesky_solve(residual.unsqueeze(-1), factor).squeeze(-1)
        ctx.save_for_backward(factor, alpha)
        quadratic = (residual * alpha).sum(-1)
        logdet = 2 * factor.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return quadratic, logdet

    @staticmethod
    def backward(ctx: Any, grad_quadratic: Tensor, grad_logdet: Tensor) -> tuple[Tensor | None, Tensor | None]:
        factor, alpha = ctx.saved_tensors
        grad_covariance = grad_residual = None
        if ctx.needs_input_grad[0]:
            grad_covariance = torch.cholesky_inverse(factor).mul_(grad_logdet[..., None, None])
            outer = alpha.unsqueeze(-1) * alpha.unsqueeze(-2)
            grad_covariance.sub_(outer.mul_(grad_quadratic[..., None, None]))
        if ctx.needs_input_grad[1]:
            grad_residual = 2 * grad_quadratic.unsqueeze(-1) * alpha
        return grad_covariance, grad_residual


class DenseMarginalLogLikelihood(gpytorch.mlls.ExactMarginalLogLikelihood):
    r"""gpytorch's exact marginal log-likelihood, with a cheaper gradient on its dense Cholesky path.

    For training sets of at most gpytorch's ``max_cholesky_size`` points (see
    :func:`gp_couple.settings.grf_gp_settings`), the covariance of the observations is made
    dense, factorised once, and its gradient is the closed form of the module docstring
    (one :func:`torch.cholesky_inverse` instead of autograd through the factorisation),
    unless a graph kernel of the model finds CG/Lanczos cheaper
    (:meth:`~gp_couple.kernels.graph_node.GraphNodeKernel.dense_solves_pay`: GRF kernels
    with few walkers per node on thousands of training points).
    Values and gradients equal gpytorch's to rounding. Larger training sets, masked
    observations (gpytorch's ``observation_nan_policy``), multitask outputs and
    covariances with a solver of their own (low rank plus diagonal, as for random-feature
    kernels, by the Woodbury identity; Kronecker structure) take gpytorch's own path.
    Use it as gpytorch's::

        mll = DenseMarginalLogLikelihood(likelihood, model)
        loss = -mll(model(*model.train_inputs), model.train_targets)

    :param likelihood: The model's Gaussian likelihood.
    :param model: The exact GP.
    """

    def forward(self, function_dist: MultivariateNormal, target: Tensor, *params: Any, **kwargs: Any) -> Tensor:
        if (not isinstance(function_dist, MultivariateNormal) or isinstance(function_dist, MultitaskMultivariateNormal)
                or function_dist.event_shape.numel() > gpytorch.settings.max_cholesky_size.value()
                or gpytorch.settings.observation_nan_policy.value() != "ignore"):
            return super().forward(function_dist, target, *params, **kwargs)
        num_data = function_dist.event_shape.numel()
        if not self._dense_solves_pay():
            with gpytorch.settings.max_cholesky_size(num_data - 1):
                return super().forward(function_dist, target, *params, **kwargs)
        output = self.likelihood(function_dist, *params, **kwargs)
        operator = output.lazy_covariance_matrix.evaluate_kernel()
        if type(operator).inv_quad_logdet is not LinearOperator.inv_quad_logdet:
            # A solver of its own (low rank plus diagonal, Kronecker, ...): gpytorch's log density.
            result = output.log_prob(target)
        else:
            covariance = operator.to_dense()
            residual = target - output.mean
            batch = torch.broadcast_shapes(covariance.shape[:-2], residual.shape[:-1])
            covariance = covariance.expand(*batch, *covariance.shape[-2:])
            residual = residual.expand(*batch, residual.shape[-1])
            quadratic, logdet = _GaussianQuadraticAndLogdet.apply(covariance, residual)
            result = -0.5 * (quadratic + logdet + num_data * math.log(2 * math.pi))
        result = self._add_other_terms(result, params)
        return result.div_(num_data)

    def _dense_solves_pay(self) -> bool:
        """Whether every graph kernel of the model finds a dense factor of the training covariance cheaper than CG."""
        inputs = getattr(self.model, "train_inputs", None)
        if not inputs:
            return True
        return all(kernel.dense_solves_pay(inputs[0]) for kernel in graph_kernels(self.model))
