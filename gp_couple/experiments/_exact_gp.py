r"""Exact-GP hyperparameters of the Gaussian kernel for the random-feature experiments.

Protocol of the appendix on RFF and RLF experiments (Appendix B.1 "Details for RFF and RLF
experiments" [app:rff_rlf_expt_details]): the lengthscale :math:`\ell`, amplitude :math:`\sigma_v^2`
and noise :math:`\sigma_n^2` of an exact zero-mean GP with the Gaussian kernel maximise the marginal
likelihood of the
training set (RFFs); for RLFs :math:`\ell` follows a fixed rule (:func:`rlf_lengthscale`)
and only :math:`\sigma_v^2, \sigma_n^2` are fitted.

The marginal likelihood of a few hundred points has three parameters and a cheap exact
gradient, so a quasi-Newton method (L-BFGS) reaches the optimum in tens of iterations.
Adam, the paper's optimiser, is kept as an option: with learning rate :math:`10^{-2}` it
needs thousands of steps, and with the RLF lengthscale fixed it had not converged after
5000 (the amplitude still moving). Both run through the library's one training loop,
:func:`gp_couple.optimize.minimize`.
"""

from __future__ import annotations

from dataclasses import dataclass

import gpytorch
import numpy as np
import torch
from gpytorch.constraints import GreaterThan
from gpytorch.utils.transforms import inv_softplus

from ..marginal_likelihood import DenseMarginalLogLikelihood
from ..optimize import Convergence, minimize, parameter_constraints
from ._options import GP_LOSS_TOLERANCE, GP_OPTIMIZERS, GP_PARAMETER_TOLERANCE, GP_WINDOW
from ._runtime import with_bounded_threads

__all__ = ["GPHyperparameters", "GP_CONVERGENCE", "GP_OPTIMIZERS", "fit_gp_hyperparameters", "rlf_lengthscale"]

#: The exact-GP fits' stopping rule: the loss per point changed by at most 1e-7 and no
#: parameter moved by more than 1e-4 in the optimiser's coordinates (relatively, for the
#: positive hyperparameters under L-BFGS), between L-BFGS iterations or between the means of
#: consecutive windows of 100 Adam steps (SciPy's relative-reduction test then stops
#: L-BFGS at 1e-9). The optimisers it accepts, :data:`GP_OPTIMIZERS`, are
#: :data:`gp_couple.optimize.OPTIMIZERS`, L-BFGS first (the default).
GP_CONVERGENCE = Convergence(loss_tolerance=GP_LOSS_TOLERANCE, parameter_tolerance=GP_PARAMETER_TOLERANCE,
                             window=GP_WINDOW)


@dataclass(frozen=True)
class GPHyperparameters:
    """Gaussian-kernel GP hyperparameters: :math:`\\ell`, :math:`\\sigma_v^2`, :math:`\\sigma_n^2`.

    :ivar iterations: Optimiser iterations used (L-BFGS iterations or Adam steps).
    :ivar converged: Whether the stopping rule was met before the iteration budget.
    """

    lengthscale: float
    outputscale: float
    noise: float
    iterations: int
    converged: bool = True


def _scaled_softplus(scale: float, lower_bound: float = 0.0) -> GreaterThan:
    """``lower_bound + scale * softplus(raw)``: gpytorch's positive constraint (``scale = 1``)
    with its raw values in units of ``scale``."""
    return GreaterThan(lower_bound, transform=lambda raw: scale * torch.nn.functional.softplus(raw),
                       inv_transform=lambda value: inv_softplus(value / scale))


class _ExactGP(gpytorch.models.ExactGP):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        # Amplitude and noise are measured in units of the targets' mean square (when above 1):
        # unstandardised targets (e.g. airfoil's decibels) need amplitudes of 10^3-10^4, which
        # in raw softplus units would reach the L-BFGS box and take Adam 10^5 steps.
        # Standardised targets keep gpytorch's parameterisation exactly.
        scale = max(1.0, float(y.square().mean()))
        likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=_scaled_softplus(scale, 1e-4))
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(),
                                                         outputscale_constraint=_scaled_softplus(scale))

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
def fit_gp_hyperparameters(inputs: np.ndarray, targets: np.ndarray, *, iterations: int = 5000,
                           lr: float = 1e-2, optimizer: str = "lbfgs", convergence: Convergence = GP_CONVERGENCE,
                           lengthscale: float | None = None) -> GPHyperparameters:
    r"""Fit an exact zero-mean GP with a Gaussian kernel on the marginal likelihood.

    Starts from gpytorch's raw values 0 (all three values :math:`\log 2`; amplitude and
    noise in units of the targets' mean square when it exceeds 1). The loss is the
    negative marginal log-likelihood per point
    (:class:`~gp_couple.marginal_likelihood.DenseMarginalLogLikelihood`), evaluated by a dense
    Cholesky factorisation, and minimised by
    :func:`gp_couple.optimize.minimize` until ``convergence`` holds:

    * ``"lbfgs"`` (default): SciPy's L-BFGS-B on the logarithms of the three positive
      hyperparameters (boxed, so that no line search reaches a zero lengthscale; see
      :mod:`gp_couple.optimize`);
    * ``"adam"``: Adam with learning rate ``lr`` (the paper's optimiser), the rule checked
      on window means of ``convergence.window`` steps.

    :param inputs: Training inputs ``(N, d)`` (standardised).
    :param targets: Training targets ``(N,)`` (standardised).
    :param iterations: Most L-BFGS iterations or Adam steps.
    :param lr: Adam learning rate (L-BFGS takes the steps its line search finds).
    :param optimizer: ``"lbfgs"`` or ``"adam"``.
    :param convergence: The stopping rule (default :data:`GP_CONVERGENCE`).
    :param lengthscale: Fix :math:`\ell` to this value (the RLF rule) instead of fitting it.
    :param threads: Keyword only: torch and BLAS threads during the fit (default 1).
    :raises ValueError: For an unknown optimiser or a bad schedule.
    """
    if optimizer not in GP_OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose from {list(GP_OPTIMIZERS)}")
    x = torch.as_tensor(np.asarray(inputs, dtype=np.float64))
    y = torch.as_tensor(np.asarray(targets, dtype=np.float64))
    model = _ExactGP(x, y).double()
    if lengthscale is not None:
        model.covar_module.base_kernel.lengthscale = float(lengthscale)
        model.covar_module.base_kernel.raw_lengthscale.requires_grad_(False)
    mll = DenseMarginalLogLikelihood(model.likelihood, model)
    model.train()

    # N <= a few hundred: a dense Cholesky is exact and cheaper than CG (and makes the
    # objective deterministic; the seed only keeps torch's global generator untouched).
    with gpytorch.settings.max_cholesky_size(max(len(y), 800) + 1):
        history = minimize(lambda: -mll(model(x), y), dict(model.named_parameters()), iterations=iterations,
                           lr=lr, optimizer=optimizer, convergence=convergence, seed=0,
                           description="exact-GP hyperparameters", constraints=parameter_constraints(model),
                           num_data=len(y))
    kernel = model.covar_module
    # L-BFGS records the starting loss too.
    used = len(history) - 1 if optimizer == "lbfgs" and history else len(history)
    return GPHyperparameters(lengthscale=float(kernel.base_kernel.lengthscale.detach()),
                             outputscale=float(kernel.outputscale.detach()),
                             noise=float(model.likelihood.noise.detach()), iterations=used,
                             converged=history.converged)
