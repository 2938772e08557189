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
by :math:`n`; CG/Lanczos above ``max_cholesky_size``, with the noise's gradient below). It is the objective of
:func:`gp_couple.models.fit_gp`. An exact objective with its exact gradient also suits
L-BFGS, whose line searches need the two to agree: on CG/Lanczos objectives they spend
several evaluations per iteration.

**The stochastic log-determinant's gradient in the noise.** Above ``max_cholesky_size``,
gpytorch estimates the log-determinant's gradient
:math:`\operatorname{tr}(\mathbf C^{-1}\partial\mathbf C)` with probe vectors
:math:`\mathbf z \sim \mathcal N(\mathbf 0, \mathbf P)` drawn from its preconditioner
:math:`\mathbf P = \mathbf L\mathbf L^\top + \sigma^2\mathbf I` (a rank-:math:`k` pivoted
Cholesky factor :math:`\mathbf L` of the kernel matrix), as
:math:`(\mathbf C^{-1}\mathbf z)^\top\partial\mathbf C\,\mathbf P^{-1}\mathbf z`, and uses
:math:`\mathbf P` as a control variate: it adds the exact
:math:`\operatorname{tr}(\mathbf P^{-1}\partial\mathbf P)` and subtracts its probe estimate
(Wenger et al., 2022, "Preconditioning for scalable Gaussian process hyperparameter
optimization"). That removes the variance in the :math:`k` directions :math:`\mathbf L` captures,
but for the noise (:math:`\partial\mathbf P = \partial\mathbf C = \partial\sigma^2\,\mathbf I`)
it adds a variance of about :math:`2` per direction in which the kernel matrix exceeds the noise and
:math:`\mathbf L` does not reach. On thousands of training points with a smooth kernel that is
almost every direction, while the likelihood's curvature in :math:`\log\sigma^2` is only that of
the few directions below the noise: with the probes fixed, L-BFGS converges away from the noise's
optimum by one or more of that curvature's standard deviations. So this objective holds the
preconditioner's diagonal fixed in the gradient: the noise's derivative is the plain estimate
:math:`\partial\sigma^2\,(\mathbf C^{-1}\mathbf z)^\top\mathbf P^{-1}\mathbf z`, unbiased and with a
variance of :math:`2\sum_i(\sigma^2/c_i)^2/p` for :math:`p` probes and eigenvalues :math:`c_i` of
:math:`\mathbf C` (a nat or less), while the kernel's hyperparameters, which the data fix far
more tightly, keep the control variate through :math:`\mathbf L`. Values are unchanged, so
the value's slope in the noise still carries the control variate's error; where that defeats
SciPy's line searches, :func:`gp_couple.optimize.minimize` finishes on the gradient alone.

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
from .operators.training_covariance import dense_covariance, scaled_plus_diagonal

__all__ = ["BIAS_PROBES", "DenseMarginalLogLikelihood"]

#: Probe vectors of the trace in the bias-corrected likelihood.
BIAS_PROBES = 32
#: Seed of those probe vectors (fixed: the objective is deterministic).
_PROBE_SEED = 0



class _BiasCorrectedGaussian(torch.autograd.Function):
    r"""Twice the corrected negative log-likelihood, less :math:`n\log 2\pi`, from the covariance's parts.

    The covariance is :math:`\mathbf C = s\bar{\mathbf K} + \operatorname{diag}(\boldsymbol\sigma^2)`
    and the perturbation :math:`\mathbf H = s\mathbf D`; the function takes
    :math:`\bar{\mathbf K}`, :math:`s`, :math:`\boldsymbol\sigma^2` and :math:`\mathbf D`
    and forms neither :math:`\mathbf H` nor a dense diagonal, and frees :math:`\mathbf C`
    once factorised: an evaluation holds :math:`\bar{\mathbf K}`, :math:`\mathbf D`, the
    factor and two gradients of :math:`n \times n` numbers at most
    (:data:`~gp_couple.kernels.grf_kernel.PAIRED_DENSE_MATRICES` counts them with the walks).

    The value is :math:`\mathbf r^\top\mathbf C^{-1}\mathbf r + \log\det\mathbf C - \tfrac14 q + \tfrac18\hat t`, with
    :math:`q = \boldsymbol\alpha^\top\mathbf H\mathbf C^{-1}\mathbf H\boldsymbol\alpha` and
    :math:`\hat t = \tfrac1p\sum_i \mathbf z_i^\top\mathbf C^{-1}\mathbf H\mathbf C^{-1}\mathbf H\mathbf z_i`
    (Hutchinson's estimate of :math:`\operatorname{tr}(\mathbf C^{-1}\mathbf H\mathbf C^{-1}\mathbf H)`).
    Both depend on :math:`\mathbf C` only through :math:`\mathbf C^{-1}`, so the gradient
    with respect to :math:`\mathbf C` is :meth:`_GaussianQuadraticAndLogdet.backward`'s
    :math:`\mathbf C^{-1} - \boldsymbol\alpha\boldsymbol\alpha^\top` plus outer products
    of :math:`n \times p` blocks: with :math:`\mathbf w = \mathbf C^{-1}\mathbf H\boldsymbol\alpha`,
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

    The chain rule through :math:`\mathbf C = s\bar{\mathbf K} + \operatorname{diag}(\boldsymbol\sigma^2)`
    and :math:`\mathbf H = s\mathbf D` then gives :math:`s\mathbf G_C` for :math:`\bar{\mathbf K}`,
    :math:`\operatorname{diag}\mathbf G_C` for the noise, :math:`s\mathbf G_H` for :math:`\mathbf D` and
    :math:`\langle\mathbf G_C, \bar{\mathbf K}\rangle + \langle\mathbf G_H, \mathbf D\rangle` for :math:`s`,
    the last from :math:`n \times p` products (:math:`\mathbf G_H` is a sum of outer products).
    """

    @staticmethod
    def forward(ctx: Any, mean_gram: Tensor, scale: Tensor, noise: Tensor, difference: Tensor, residual: Tensor,
                probes: Tensor) -> tuple[Tensor, Tensor]:
        covariance = mean_gram * scale
        covariance.diagonal().add_(noise)
        factor = psd_safe_cholesky(covariance)
        del covariance
        alpha = torch.cholesky_solve(residual.unsqueeze(-1), factor)
        moved = (difference @ alpha).mul_(scale)
        solved = torch.cholesky_solve(torch.cat([moved, probes, (difference @ probes).mul_(scale)], dim=-1), factor)
        count = probes.shape[-1]
        w, b, a = solved[:, :1], solved[:, 1:1 + count], solved[:, 1 + count:]
        ctx.save_for_backward(mean_gram, scale, factor, alpha, w, b, a, difference, probes)
        quadratic = (residual.unsqueeze(-1) * alpha).sum()
        logdet = 2 * factor.diagonal().log().sum()
        second = (moved * w).sum()
        trace = (b * (difference @ a)).sum() * scale / count
        # The spectral norm of H = sD, s > 0.
        whitened = whitened_norm(factor, difference, probes[:, :1]) * scale
        ctx.mark_non_differentiable(whitened)
        return quadratic + logdet - second / 4 + trace / 8, whitened

    @staticmethod
    def backward(ctx: Any, grad: Tensor, _: Tensor) -> tuple[Tensor | None, ...]:
        mean_gram, scale, factor, alpha, w, b, a, difference, probes = ctx.saved_tensors
        count = probes.shape[-1]
        # v, P, Q of the docstring in one solve.
        again = torch.cholesky_solve((difference @ torch.cat([w, a, b], dim=-1)).mul_(scale), factor)
        v, p_block, q_block = again[:, :1], again[:, 1:1 + count], again[:, 1 + count:]
        grad_mean_gram = grad_scale = grad_noise = grad_difference = grad_residual = None
        needs_mean_gram, needs_scale, needs_noise, needs_difference, needs_residual = ctx.needs_input_grad[:5]
        if needs_mean_gram or needs_scale or needs_noise:
            left = torch.cat([alpha, w, p_block, a], dim=-1)
            right = torch.cat([v / 2 - alpha, w / 4, -b / (8 * count), -q_block / (8 * count)], dim=-1)
            # G_C = (C^-1 + (left right^T + right left^T) / 2) grad: symmetric, from one product.
            grad_covariance = torch.cholesky_inverse(factor).addmm_(
                torch.cat([left, right], dim=-1), torch.cat([right, left], dim=-1).mT, alpha=0.5).mul_(grad)
            if needs_noise:
                grad_noise = grad_covariance.diagonal().clone()
            if needs_scale:
                grad_scale = _inner(grad_covariance, mean_gram)
            if needs_mean_gram:
                grad_mean_gram = grad_covariance.mul_(scale)
            del grad_covariance
        if needs_difference or needs_scale:
            # G_H = (left right^T + right left^T) grad / 2.
            left = torch.cat([alpha, a, probes], dim=-1)
            right = torch.cat([-w / 2, b / (8 * count), q_block / (8 * count)], dim=-1)
            if needs_scale:
                moved = (left * (difference @ right)).sum() + (right * (difference @ left)).sum()
                grad_scale = moved * grad / 2 + (0 if grad_scale is None else grad_scale)
            if needs_difference:
                grad_difference = (torch.cat([left, right], dim=-1) @ torch.cat([right, left], dim=-1).mT).mul_(
                    scale * grad / 2)
        if needs_residual:
            grad_residual = (2 * alpha - v / 2).squeeze(-1) * grad
        return grad_mean_gram, grad_scale, grad_noise, grad_difference, grad_residual, None


def _inner(symmetric: Tensor, other: Tensor) -> Tensor:
    r""":math:`\langle\mathbf A, \mathbf B\rangle = \sum_{ij} A_{ij}B_{ij}` for a symmetric :math:`\mathbf A`,
    without an :math:`n \times n` temporary (:math:`\mathbf A` is read in the memory order of
    :math:`\mathbf B`: LAPACK's results are column-major)."""
    if not symmetric.is_contiguous() and symmetric.mT.is_contiguous():
        symmetric = symmetric.mT
    return torch.vdot(symmetric.reshape(-1), other.reshape(-1))


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


def _preconditioner_at_fixed_noise(covariance: AddedDiagLinearOperator) -> tuple[Any, Any, Any]:
    r"""gpytorch's pivoted-Cholesky preconditioner of :math:`\widehat{\mathbf K} + \sigma^2\mathbf I`, its
    diagonal :math:`\sigma^2` held fixed in the gradient (module docstring: the noise's derivative then
    takes the plain probe estimate, without the preconditioner's control variate)."""
    return AddedDiagLinearOperator(covariance._linear_op, covariance._diag_tensor.detach())._preconditioner()


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
    (:meth:`~gp_couple.kernels.graph_node.GraphNodeKernel.pairs_evaluations`). Larger training sets take
    gpytorch's CG/Lanczos path, whose preconditioner's diagonal is held fixed in the gradient
    (module docstring: the same values and kernel gradients, a noise gradient of far lower
    variance). Masked observations (gpytorch's ``observation_nan_policy``), multitask outputs and
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
                return self._iterative(function_dist, target, params, kwargs)
            if not self._dense_solves_pay():
                self._report(function_dist, target, params)
                with gpytorch.settings.max_cholesky_size(num_data - 1):
                    return self._iterative(function_dist, target, params, kwargs)
        if output is None:
            output = self.likelihood(function_dist, *params, **kwargs)
            operator = output.lazy_covariance_matrix.evaluate_kernel()
        if type(operator).inv_quad_logdet is not LinearOperator.inv_quad_logdet:
            # A solver of its own (low rank plus diagonal, Kronecker, ...): gpytorch's log density.
            result = output.log_prob(target)
        elif paired is not None and target.ndim == 1 and (parts := self._paired_parts(operator)) is not None:
            kernel, scale, difference = paired
            mean_gram, constant, noise = parts
            residual = target - output.mean
            noise = noise.expand(num_data)
            terms, whitened = _BiasCorrectedGaussian.apply(
                mean_gram.to_dense(), scale if constant is None else constant.reshape(()), noise, difference,
                residual, self._probes(num_data, difference))
            # D's second moment is four times that of the mean estimate's error.
            kernel.record_evaluation(LikelihoodEvaluation(
                expansion_error=float(whitened) / 2, outputscale=float(scale.detach()), residual=residual.detach(),
                noise=noise.detach()))
            result = -0.5 * (terms + num_data * math.log(2 * math.pi))
        else:
            self._report(function_dist, target, params)
            covariance = dense_covariance(operator)
            residual = target - output.mean
            batch = torch.broadcast_shapes(covariance.shape[:-2], residual.shape[:-1])
            covariance = covariance.expand(*batch, *covariance.shape[-2:])
            residual = residual.expand(*batch, residual.shape[-1])
            quadratic, logdet = _GaussianQuadraticAndLogdet.apply(covariance, residual)
            result = -0.5 * (quadratic + logdet + num_data * math.log(2 * math.pi))
        result = self._add_other_terms(result, params)
        return result.div_(num_data)

    def _iterative(self, function_dist: MultivariateNormal, target: Tensor, params: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Tensor:
        """gpytorch's CG/Lanczos likelihood, its preconditioner's diagonal fixed in the gradient (module docstring)."""
        output = self.likelihood(function_dist, *params, **kwargs)
        covariance = output.lazy_covariance_matrix.evaluate_kernel()
        residual = target - output.mean
        if (isinstance(covariance, AddedDiagLinearOperator) and covariance.preconditioner_override is None
                and residual.shape[:-1] == covariance.batch_shape):
            # gpytorch's log_prob would evaluate the kernel again, into an operator without the override.
            covariance = AddedDiagLinearOperator(covariance._linear_op, covariance._diag_tensor,
                                                 preconditioner_override=_preconditioner_at_fixed_noise)
            quadratic, logdet = covariance.inv_quad_logdet(inv_quad_rhs=residual.unsqueeze(-1), logdet=True)
            result = -0.5 * (quadratic + logdet + residual.shape[-1] * math.log(2 * math.pi))
        else:
            result = output.log_prob(target)
        return self._add_other_terms(result, params).div_(function_dist.event_shape.numel())

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
        self._warn_uncorrected()
        return None

    def _paired_parts(self, operator: LinearOperator) -> tuple[LinearOperator, Tensor | None, Tensor] | None:
        """The parts of a paired evaluation's covariance (:func:`.scaled_plus_diagonal`); warns once without them."""
        parts = scaled_plus_diagonal(operator)
        if parts is not None and (parts[1] is None or parts[1].numel() == 1):
            return parts
        self._warn_uncorrected()
        return None

    def _warn_uncorrected(self) -> None:
        if not getattr(self, "_bias_warned", False):
            self._bias_warned = True
            warnings.warn("the GRF likelihood's bias correction needs a model whose covariance is one GRFKernel, "
                          "optionally inside a ScaleKernel without batch dimensions, plus the diagonal noise of a "
                          "Gaussian likelihood; this model trains on the mean of two walk draws without it",
                          BiasCorrectionWarning, stacklevel=3)

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
