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

**The bias-corrected likelihood.** In the training rounds on a GRF kernel's prediction walks
(:class:`~gp_couple.kernels.walk_schedule.WalkSchedule`, ``bias_correction``), the kernel
evaluates the training covariance as the mean :math:`\bar{\mathbf K}` of two independent
estimates and hands over their difference :math:`\mathbf D`
(:meth:`~gp_couple.kernels.grf_kernel.GRFKernel.estimate_difference`). With
:math:`\mathbf H = s\mathbf D` (:math:`s` the output scale of a
:class:`~gpytorch.kernels.ScaleKernel` around the GRF kernel), the objective is then

.. math::

    \log p(\mathbf y \mid \theta)
    + \tfrac18\,\boldsymbol\alpha^\top\mathbf H\mathbf C^{-1}\mathbf H\boldsymbol\alpha
    - \tfrac1{16}\operatorname{tr}(\mathbf C^{-1}\mathbf H\mathbf C^{-1}\mathbf H),
    \qquad \mathbf C = s\bar{\mathbf K} + \sigma^2\mathbf I,

unbiased for the exact log-likelihood to second order in the estimate's error (the
expansion is in :mod:`gp_couple.kernels.walk_schedule`; :math:`\mathbf D`'s second moment
is four times that of :math:`\bar{\mathbf K}`'s error). The trace is estimated with
:data:`BIAS_PROBES` fixed Rademacher vectors :math:`\mathbf z_i`, as
:math:`\tfrac1p\sum_i\mathbf z_i^\top\mathbf C^{-1}\mathbf H\mathbf C^{-1}\mathbf H\mathbf z_i`
(the same vectors at every evaluation, so the
objective stays deterministic); the gradient is in closed form, as for the plain likelihood.
Each evaluation also estimates the whitened error :math:`\tfrac12\|\mathbf L^{-1}\mathbf H
\mathbf L^{-\top}\|_2` (:math:`\mathbf C = \mathbf L\mathbf L^\top`; power iteration) and
reports it to the kernel with the output scale, the residual and the noise
(:meth:`~gp_couple.kernels.graph_node.GraphNodeKernel.record_evaluation`), which warns
when a round ends where the expansion is inaccurate. Evaluations on one draw (dense or
CG/Lanczos) report the same without the whitened error, for every model whose covariance
is one graph kernel, optionally scaled: when training ends, a GRF kernel checks its
prediction walks against the predictive mean there (:mod:`gp_couple.kernels.walk_schedule`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import gpytorch
import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from linear_operator import to_linear_operator
from linear_operator.operators import AddedDiagLinearOperator, LinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from .kernels.graph_node import GraphNodeKernel, graph_kernels
from .kernels.walk_schedule import BiasCorrectionWarning, LikelihoodEvaluation, whitened_norm

__all__ = ["BIAS_PROBES", "DenseMarginalLogLikelihood"]

#: Probe vectors of the trace in the bias-corrected likelihood.
BIAS_PROBES = 32
#: Seed of those probe vectors (fixed: the objective is deterministic).
_PROBE_SEED = 0



class _BiasCorrectedGaussian(torch.autograd.Function):
    r"""Twice the corrected negative log-likelihood, less :math:`n\log 2\pi`.

    That is :math:`\mathbf r^\top\mathbf C^{-1}\mathbf r + \log\det\mathbf C - \tfrac14 q + \tfrac18\hat t`, with
    :math:`q = \boldsymbol\alpha^\top\mathbf H\mathbf C^{-1}\mathbf H\boldsymbol\alpha` and
    :math:`\hat t = \tfrac1p\sum_i \mathbf z_i^\top\mathbf C^{-1}\mathbf H\mathbf C^{-1}\mathbf H\mathbf z_i`
    (Hutchinson's estimate of :math:`\operatorname{tr}(\mathbf C^{-1}\mathbf H\mathbf C^{-1}\mathbf H)`).
    Both depend on :math:`\mathbf C` only through :math:`\mathbf C^{-1}`, so the backward
    is :meth:`_GaussianQuadraticAndLogdet.backward`'s :math:`\mathbf C^{-1} -
    \boldsymbol\alpha\boldsymbol\alpha^\top` plus outer products of :math:`n \times p`
    blocks: with :math:`\mathbf w = \mathbf C^{-1}\mathbf H\boldsymbol\alpha`,
    :math:`\mathbf v = \mathbf C^{-1}\mathbf H\mathbf w`, :math:`\mathbf B = \mathbf C^{-1}\mathbf Z`,
    :math:`\mathbf A = \mathbf C^{-1}\mathbf H\mathbf Z`,
    :math:`\mathbf P = \mathbf C^{-1}\mathbf H\mathbf A` and
    :math:`\mathbf Q = \mathbf C^{-1}\mathbf H\mathbf B`,

    .. math::

        \mathrm d q = -2\boldsymbol\alpha^\top\mathrm d\mathbf C\,\mathbf v
        - \mathbf w^\top\mathrm d\mathbf C\,\mathbf w + 2\boldsymbol\alpha^\top\mathrm d\mathbf H\,\mathbf w
        + 2\,\mathrm d\mathbf r^\top\mathbf v,
        \qquad
        p\,\mathrm d\hat t = \operatorname{tr}\big(-\mathbf P\mathbf B^\top\mathrm d\mathbf C
        - \mathbf A\mathbf Q^\top\mathrm d\mathbf C + \mathbf A\mathbf B^\top\mathrm d\mathbf H
        + \mathbf Z\mathbf Q^\top\mathrm d\mathbf H\big).
    """

    @staticmethod
    def forward(ctx: Any, covariance: Tensor, residual: Tensor, perturbation: Tensor,
                probes: Tensor) -> tuple[Tensor, Tensor]:
        factor = psd_safe_cholesky(covariance)
        alpha = torch.cholesky_solve(residual.unsqueeze(-1), factor)
        moved = perturbation @ alpha
        solved = torch.cholesky_solve(torch.cat([moved, probes, perturbation @ probes], dim=-1), factor)
        count = probes.shape[-1]
        w, b, a = solved[:, :1], solved[:, 1:1 + count], solved[:, 1 + count:]
        ctx.save_for_backward(factor, alpha, w, b, a, perturbation, probes)
        quadratic = (residual.unsqueeze(-1) * alpha).sum()
        logdet = 2 * factor.diagonal().log().sum()
        second = (moved * w).sum()
        trace = (b * (perturbation @ a)).sum() / count
        whitened = whitened_norm(factor, perturbation, probes[:, :1])
        ctx.mark_non_differentiable(whitened)
        return quadratic + logdet - second / 4 + trace / 8, whitened

    @staticmethod
    def backward(ctx: Any, grad: Tensor, _: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:
        factor, alpha, w, b, a, perturbation, probes = ctx.saved_tensors
        count = probes.shape[-1]
        # v, P, Q of the docstring in one solve.
        again = torch.cholesky_solve(perturbation @ torch.cat([w, a, b], dim=-1), factor)
        v, p_block, q_block = again[:, :1], again[:, 1:1 + count], again[:, 1 + count:]
        grad_covariance = grad_perturbation = grad_residual = None
        if ctx.needs_input_grad[0]:
            left = torch.cat([alpha, w, p_block, a], dim=-1)
            right = torch.cat([v / 2 - alpha, w / 4, -b / (8 * count), -q_block / (8 * count)], dim=-1)
            grad_covariance = torch.cholesky_inverse(factor).addmm_(left, right.mT)
            grad_covariance = (grad_covariance + grad_covariance.mT).mul_(grad / 2)
        if ctx.needs_input_grad[2]:
            left = torch.cat([alpha, a, probes], dim=-1)
            right = torch.cat([-w / 2, b / (8 * count), q_block / (8 * count)], dim=-1)
            grad_perturbation = left @ right.mT
            grad_perturbation = (grad_perturbation + grad_perturbation.mT).mul_(grad / 2)
        if ctx.needs_input_grad[1]:
            grad_residual = (2 * alpha - v / 2).squeeze(-1) * grad
        return grad_covariance, grad_residual, grad_perturbation, None


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
            # The rank-one term of every batch member in place, without forming the outer products.
            size = alpha.shape[-1]
            grad_covariance.view(-1, size, size).baddbmm_(
                (alpha * -grad_quadratic.unsqueeze(-1)).reshape(-1, size, 1), alpha.reshape(-1, 1, size))
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
    Values and gradients equal gpytorch's to rounding. The bias-corrected evaluations of a
    GRF kernel's training rounds on its prediction walks (module docstring) take this path
    above ``max_cholesky_size`` too, as far as the kernel finds a dense factor within memory
    (:meth:`~gp_couple.kernels.graph_node.GraphNodeKernel.pairs_evaluations`). Larger training sets, masked
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
                or gpytorch.settings.observation_nan_policy.value() != "ignore"):
            return super().forward(function_dist, target, *params, **kwargs)
        num_data = function_dist.event_shape.numel()
        output = operator = paired = None
        if any(kernel.pairs_evaluations() for kernel in graph_kernels(self.model)):
            # A bias-corrected round: the kernel decides, at any size, whether this evaluation is paired.
            output = self.likelihood(function_dist, *params, **kwargs)
            operator = output.lazy_covariance_matrix.evaluate_kernel()
            paired = self._perturbation()
        if paired is None:
            if num_data > gpytorch.settings.max_cholesky_size.value():
                self._report(function_dist, target, params)
                return super().forward(function_dist, target, *params, **kwargs)
            if not self._dense_solves_pay():
                self._report(function_dist, target, params)
                with gpytorch.settings.max_cholesky_size(num_data - 1):
                    return super().forward(function_dist, target, *params, **kwargs)
        if output is None:
            output = self.likelihood(function_dist, *params, **kwargs)
            operator = output.lazy_covariance_matrix.evaluate_kernel()
        if type(operator).inv_quad_logdet is not LinearOperator.inv_quad_logdet:
            # A solver of its own (low rank plus diagonal, Kronecker, ...): gpytorch's log density.
            result = output.log_prob(target)
        elif paired is not None and target.ndim == 1:
            kernel, scale, difference = paired
            covariance = operator.to_dense()
            residual = target - output.mean
            terms, whitened = _BiasCorrectedGaussian.apply(covariance, residual, scale * difference,
                                                           self._probes(num_data, covariance))
            noise = operator._diag_tensor.diagonal() if isinstance(operator, AddedDiagLinearOperator) else None
            # D's second moment is four times that of the mean estimate's error.
            kernel.record_evaluation(LikelihoodEvaluation(
                expansion_error=float(whitened) / 2, outputscale=float(scale.detach()), residual=residual.detach(),
                noise=None if noise is None else noise.detach().expand(num_data)))
            result = -0.5 * (terms + num_data * math.log(2 * math.pi))
        else:
            self._report(function_dist, target, params)
            covariance = operator.to_dense()
            residual = target - output.mean
            batch = torch.broadcast_shapes(covariance.shape[:-2], residual.shape[:-1])
            covariance = covariance.expand(*batch, *covariance.shape[-2:])
            residual = residual.expand(*batch, residual.shape[-1])
            quadratic, logdet = _GaussianQuadraticAndLogdet.apply(covariance, residual)
            result = -0.5 * (quadratic + logdet + num_data * math.log(2 * math.pi))
        result = self._add_other_terms(result, params)
        return result.div_(num_data)

    def _scale_of(self, kernel: GraphNodeKernel) -> Tensor | None:
        """The output scale of a model whose covariance is ``kernel``, optionally in an unbatched ``ScaleKernel``."""
        covar_module = getattr(self.model, "covar_module", None)
        if covar_module is kernel:
            return torch.ones(())
        if (isinstance(covar_module, gpytorch.kernels.ScaleKernel) and covar_module.base_kernel is kernel
                and covar_module.outputscale.ndim == 0):
            return covar_module.outputscale
        return None

    def _report(self, function_dist: MultivariateNormal, target: Tensor, params: tuple[Any, ...]) -> None:
        """Report an evaluation on one draw to the model's graph kernel (its output scale, residual and noise)."""
        kernels = graph_kernels(self.model)
        if len(kernels) != 1 or target.ndim != 1 or function_dist.batch_shape:
            return
        scale = self._scale_of(kernels[0])
        if scale is None:
            return
        with torch.no_grad():
            noise_covariance = getattr(self.likelihood, "_shaped_noise_covar", None)
            noise = None if noise_covariance is None else noise_covariance(function_dist.mean.shape, *params)
            noise = None if noise is None else to_linear_operator(noise).diagonal().expand(target.shape[-1])
            kernels[0].record_evaluation(LikelihoodEvaluation(
                expansion_error=None, outputscale=float(scale), residual=(target - function_dist.mean).detach(),
                noise=noise))

    def _perturbation(self) -> tuple[GraphNodeKernel, Tensor, Tensor] | None:
        r"""The kernel of a paired evaluation, its output scale :math:`s` and :math:`\mathbf D`, or ``None``."""
        differences = [(kernel, difference) for kernel in graph_kernels(self.model)
                       if (difference := kernel.estimate_difference()) is not None]
        if not differences:
            return None
        if len(differences) == 1:
            kernel, difference = differences[0]
            scale = self._scale_of(kernel)
            if scale is not None:
                return kernel, scale.to(difference), difference
        if not getattr(self, "_bias_warned", False):
            self._bias_warned = True
            warnings.warn("the GRF likelihood's bias correction needs a model whose covariance is one GRFKernel, "
                          "optionally inside a ScaleKernel without batch dimensions; this model trains on the mean of "
                          "two walk draws without it", BiasCorrectionWarning, stacklevel=2)
        return None

    def _probes(self, size: int, like: Tensor) -> Tensor:
        """The fixed Rademacher probe vectors (``size`` x :data:`BIAS_PROBES`) of the trace."""
        cached = getattr(self, "_probe_cache", None)
        if cached is None or cached.shape[0] != size or cached.dtype != like.dtype or cached.device != like.device:
            generator = torch.Generator().manual_seed(_PROBE_SEED)
            signs = torch.randint(0, 2, (size, BIAS_PROBES), generator=generator)
            cached = (2 * signs - 1).to(dtype=like.dtype, device=like.device)
            self._probe_cache = cached
        return cached

    def _dense_solves_pay(self) -> bool:
        """Whether every graph kernel of the model finds a dense factor of the training covariance cheaper than CG."""
        inputs = getattr(self.model, "train_inputs", None)
        if not inputs:
            return True
        return all(kernel.dense_solves_pay(inputs[0]) for kernel in graph_kernels(self.model))
