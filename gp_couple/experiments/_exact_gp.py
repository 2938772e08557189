r"""Exact-GP hyperparameters of the Gaussian kernel for the random-feature experiments.

Protocol of the appendix on RFF and RLF experiments (Appendix B.1 "Details for RFF and RLF
experiments" [app:rff_rlf_expt_details]): the lengthscale :math:`\ell`, amplitude :math:`\sigma_v^2`
and noise :math:`\sigma_n^2` of an exact zero-mean GP with the Gaussian kernel maximise the marginal
likelihood of the
training set (RFFs); for RLFs :math:`\ell` follows a fixed rule (:func:`rlf_lengthscale`)
and only :math:`\sigma_v^2, \sigma_n^2` are fitted.

The marginal likelihood of a few hundred points has three parameters and a cheap exact
gradient, so a quasi-Newton method (L-BFGS) reaches the optimum in tens of iterations. Adam, the paper's optimiser, is kept as an option: with
learning rate :math:`10^{-2}` it needs thousands of steps, and with the RLF lengthscale
fixed it had not converged after 5000 (the amplitude still moving).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import gpytorch
import numpy as np
import torch
from scipy import optimize

from ..couplings.frequencies import check_positive_int
from ._runtime import with_bounded_threads

__all__ = ["GPHyperparameters", "GP_OPTIMIZERS", "fit_gp_hyperparameters", "rlf_lengthscale"]

#: Optimisers accepted by :func:`fit_gp_hyperparameters`.
GP_OPTIMIZERS: tuple[str, ...] = ("lbfgs", "adam")
#: Box on gpytorch's raw (inverse-softplus) hyperparameters for L-BFGS-B: values from
#: softplus(-15) = 3e-7 (the noise keeps gpytorch's floor of 1e-4 above it) to 1e6.
_RAW_BOUNDS = (-15.0, 1e6)


@dataclass(frozen=True)
class GPHyperparameters:
    """Gaussian-kernel GP hyperparameters: :math:`\\ell`, :math:`\\sigma_v^2`, :math:`\\sigma_n^2`.

    :ivar steps: Optimiser iterations used (L-BFGS iterations or Adam steps).
    :ivar converged: Whether the stopping rule was met before the step limit.
    """

    lengthscale: float
    outputscale: float
    noise: float
    steps: int
    converged: bool = True


class _ExactGP(gpytorch.models.ExactGP):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def rlf_lengthscale(inputs: np.ndarray) -> float:
    r"""The RLF lengthscale rule :math:`\ell = \frac{2}{N^2}\sum_{i,j}\|\boldsymbol x_i +
    \boldsymbol x_j\|` (Appendix B.1 "Details for RFF and RLF experiments"
    [app:rff_rlf_expt_details]).

    :param inputs: Training inputs ``(N, d)``.
    :raises ValueError: For an empty array or all-zero inputs.
    """
    x = np.asarray(inputs, dtype=np.float64)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError("inputs must be a non-empty (N, d) array")
    sums = np.linalg.norm(x[:, None, :] + x[None, :, :], axis=-1)
    value = 2.0 * float(sums.mean())
    if value <= 0:
        raise ValueError("the RLF lengthscale rule gave 0: all inputs are zero")
    return value


@with_bounded_threads
def fit_gp_hyperparameters(inputs: np.ndarray, targets: np.ndarray, *, max_steps: int = 5000,
                           learning_rate: float = 1e-2, tolerance: float = 1e-5,
                           lengthscale: float | None = None, check_every: int = 100,
                           optimizer: str = "lbfgs") -> GPHyperparameters:
    r"""Fit an exact zero-mean GP with a Gaussian kernel on the marginal likelihood.

    Starts from gpytorch's defaults (all three values :math:`\log 2`). The loss is the
    negative marginal log-likelihood per point (:class:`gpytorch.mlls.ExactMarginalLogLikelihood`),
    evaluated by a dense Cholesky factorisation.

    * ``"lbfgs"`` (default): SciPy's L-BFGS-B on gpytorch's raw parameters (boxed, so
      that no line search reaches a zero lengthscale), stopping when the projected
      gradient's largest entry is below ``tolerance`` or the relative loss change is
      below ``tolerance * 1e-4``, or after ``max_steps`` iterations.
    * ``"adam"``: Adam with ``learning_rate``, stopping after ``max_steps`` steps or
      when the loss changed by less than ``tolerance`` over the last ``check_every``
      steps (the paper's optimiser).

    :param inputs: Training inputs ``(N, d)`` (standardised).
    :param targets: Training targets ``(N,)`` (standardised).
    :param max_steps: Most iterations (L-BFGS) or steps (Adam).
    :param learning_rate: Adam learning rate (L-BFGS takes unit steps scaled by its line search).
    :param tolerance: Convergence threshold (see above).
    :param lengthscale: Fix :math:`\ell` to this value (the RLF rule) instead of fitting it.
    :param check_every: Adam steps between convergence checks.
    :param optimizer: ``"lbfgs"`` or ``"adam"``.
    :param threads: Keyword only: torch and BLAS threads during the fit (default 1).
    :raises ValueError: For an unknown optimiser or non-positive step counts.
    """
    max_steps = check_positive_int("max_steps", max_steps)
    if optimizer not in GP_OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose from {list(GP_OPTIMIZERS)}")
    x = torch.as_tensor(np.asarray(inputs, dtype=np.float64))
    y = torch.as_tensor(np.asarray(targets, dtype=np.float64))
    model = _ExactGP(x, y).double()
    if lengthscale is not None:
        model.covar_module.base_kernel.lengthscale = float(lengthscale)
        model.covar_module.base_kernel.raw_lengthscale.requires_grad_(False)
    parameters = [p for p in model.parameters() if p.requires_grad]
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()

    def loss() -> torch.Tensor:
        return -mll(model(x), y)

    # N <= a few hundred: a dense Cholesky is exact and cheaper than CG.
    with gpytorch.settings.max_cholesky_size(max(len(y), 800) + 1):
        if optimizer == "lbfgs":
            steps, converged = _run_lbfgs(parameters, loss, max_steps, tolerance)
        else:
            steps, converged = _run_adam(parameters, loss, max_steps, learning_rate, tolerance,
                                         check_positive_int("check_every", check_every))
    kernel = model.covar_module
    return GPHyperparameters(lengthscale=float(kernel.base_kernel.lengthscale.detach()),
                             outputscale=float(kernel.outputscale.detach()),
                             noise=float(model.likelihood.noise.detach()), steps=steps, converged=converged)


def _run_lbfgs(parameters: list[torch.Tensor], loss: Callable[[], torch.Tensor], max_steps: int,
               tolerance: float) -> tuple[int, bool]:
    # SciPy's L-BFGS-B with box bounds on the raw (softplus) parameters: without them a
    # line search can try a step to a vanishing lengthscale, where the kernel is 0/0.
    sizes = [p.numel() for p in parameters]

    def assign(vector: np.ndarray) -> None:
        with torch.no_grad():
            for parameter, chunk in zip(parameters, np.split(vector, np.cumsum(sizes)[:-1])):
                parameter.copy_(torch.as_tensor(chunk, dtype=parameter.dtype).view_as(parameter))

    def value_and_gradient(vector: np.ndarray) -> tuple[float, np.ndarray]:
        assign(vector)
        for parameter in parameters:
            parameter.grad = None
        value = loss()
        value.backward()
        gradient = torch.cat([p.grad.reshape(-1) for p in parameters])
        return float(value.detach()), gradient.detach().cpu().numpy().astype(np.float64)

    start = torch.cat([p.detach().reshape(-1) for p in parameters]).cpu().numpy().astype(np.float64)
    result = optimize.minimize(value_and_gradient, start, jac=True, method="L-BFGS-B",
                               bounds=[_RAW_BOUNDS] * start.size,
                               options={"maxiter": max_steps, "gtol": tolerance, "ftol": tolerance * 1e-4})
    assign(result.x)
    return int(result.nit), bool(result.success)


def _run_adam(parameters: list[torch.Tensor], loss: Callable[[], torch.Tensor], max_steps: int, learning_rate: float,
              tolerance: float, check_every: int) -> tuple[int, bool]:
    optimizer = torch.optim.Adam(parameters, lr=learning_rate)
    previous = math.inf
    for step in range(1, max_steps + 1):
        optimizer.zero_grad()
        value = loss()
        value.backward()
        optimizer.step()
        if step % check_every == 0:
            current = float(value.detach())
            if abs(previous - current) < tolerance:
                return step, True
            previous = current
    return max_steps, False
