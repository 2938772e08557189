r"""Kernel families: graph node kernels as power series in the normalised adjacency, with their modulation functions.

Every kernel here is a function of the normalised Laplacian
:math:`\widetilde{\mathbf L} = \mathbf I - \widetilde{\mathbf W}` (paper, eq. (48), the normalised
Laplacian, Appendix C.1 [eq:graph_lap], Table 4, Appendix C.1 [tab:taylor_expansions]) written as a
power series in
:math:`\widetilde{\mathbf W}`,

.. math::

    \mathbf K = \sum_{k \ge 0} \alpha_k \widetilde{\mathbf W}^k .

Graph random features estimate it without bias when their *modulation function*
:math:`f` is a convolutional square root of the coefficients (Appendix C.1 "Constructing graph
random features" [app:grf_approx]),

.. math::

    \sum_{p=0}^{k} f(p)\, f(k - p) = \alpha_k \qquad (k = 0, 1, \dots).

A *kernel family* (:class:`KernelFamily`) is one such kernel with its hyperparameters:
a gpytorch :class:`~gpytorch.Module` whose hyperparameters carry gpytorch constraints
and can take priors, so :meth:`KernelFamily.modulation` is differentiable with respect
to them. The gpytorch kernels (:mod:`gp_couple.kernels`) hold one as their
``kernel_family`` submodule; amplitudes are left to
:class:`gpytorch.kernels.ScaleKernel`.

.. list-table::
   :header-rows: 1

   * - family
     - kernel
     - :math:`\alpha_k`
   * - :class:`Diffusion`
     - :math:`\exp(-\gamma^2 \widetilde{\mathbf L})`
     - :math:`e^{-\gamma^2}\gamma^{2k}/k!`
   * - :class:`RegularisedLaplacian`
     - :math:`(\mathbf I + \sigma^2 \widetilde{\mathbf L})^{-d}`
     - :math:`(1+\sigma^2)^{-d}\binom{k+d-1}{k}c^k`, :math:`c = \tfrac{\sigma^2}{1+\sigma^2}`
   * - :class:`PStepRandomWalk`
     - :math:`(\alpha \mathbf I - \widetilde{\mathbf L})^{p}`
     - :math:`\binom{p}{k}(\alpha - 1)^{p-k}`
   * - :class:`InverseCosine`
     - :math:`\cos(\beta \widetilde{\mathbf L})`
     - :math:`\tfrac{\beta^k}{k!}\cos(\beta - k\pi/2)`
   * - :class:`PowerSeries`
     - :math:`\sum_k \alpha_k \widetilde{\mathbf W}^k` (user-supplied)
     - given
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from gpytorch.constraints import GreaterThan, Positive
from gpytorch.module import Module
from gpytorch.priors import Prior

from ._checks import check_int
from .registry import Registered, Registry

#: Natural logs of float64's smallest normal and largest finite numbers.
_LOG_FLOAT64_TINY = math.log(torch.finfo(torch.float64).tiny)
_LOG_FLOAT64_MAX = math.log(torch.finfo(torch.float64).max)

__all__ = [
    "KernelFamily",
    "Diffusion",
    "RegularisedLaplacian",
    "PStepRandomWalk",
    "InverseCosine",
    "PowerSeries",
    "convolutional_sqrt",
    "convolve_series",
    "get_kernel_family",
    "KERNEL_FAMILIES",
]

#: The kernel families by name: a subclass of :class:`KernelFamily` with a class
#: attribute ``name`` registers itself here (:mod:`gp_couple.registry`).
KERNEL_FAMILIES: Registry[KernelFamily] = Registry("kernel family")


def convolve_series(f: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
    r"""Truncated Cauchy product :math:`h_k = \sum_{p \le k} f_p g_{k-p}` along the last dim."""
    g = f if g is None else g
    num_terms = f.shape[-1]
    # h = f @ T(g) with T(g)[p, k] = g[k - p] (Toeplitz, upper triangular).
    index = torch.arange(num_terms, device=f.device)
    offsets = index.view(1, -1) - index.view(-1, 1)
    toeplitz = torch.where(offsets >= 0, g[..., offsets.clamp(min=0)], torch.zeros((), dtype=g.dtype, device=g.device))
    return (f.unsqueeze(-2) @ toeplitz).squeeze(-2)


def convolutional_sqrt(coefficients: torch.Tensor) -> torch.Tensor:
    r"""Convolutional square root :math:`f` of a power series, :math:`f * f = \alpha`.

    Solves :math:`f_0 = \sqrt{\alpha_0}`,
    :math:`f_k = (\alpha_k - \sum_{p=1}^{k-1} f_p f_{k-p}) / (2 f_0)` — the Taylor
    coefficients of :math:`\sqrt{A(x)}` for :math:`A(x) = \sum_k \alpha_k x^k`. The
    recursion runs on the rescaled series

    .. math::

        \hat\alpha_k = \frac{\alpha_k}{\alpha_0} g^{-k}, \qquad
        g = \max_{k \ge 1} |\alpha_k / \alpha_0|^{1/k},

    whose coefficients have modulus at most one, which keeps the cancellation error of
    the inner sums at the level of the largest term. It runs in float64 with
    :math:`g^k` in log space, so float32 series with tiny or zero coefficients (e.g.
    hyperparameters near their bounds) give finite results, cast back to the input
    dtype. It is differentiable (autograd) and batched over leading dimensions.

    :param coefficients: :math:`\alpha_0, \alpha_1, \dots` along the last dimension,
        with :math:`\alpha_0 > 0`.
    :raises ValueError: If :math:`\alpha_0 \le 0` (no real square root series exists).
    """
    if coefficients.shape[-1] == 0:
        raise ValueError("coefficients must have at least one term")
    alpha0 = coefficients[..., 0]
    if torch.any(alpha0 <= 0):
        raise ValueError("the zeroth coefficient must be positive for a real square-root series")
    num_terms = coefficients.shape[-1]
    # The recursion runs in float64 whatever the input dtype: float32's exponent range
    # (1e-38 .. 3e38) is too narrow for the rescaling below, and the result is cast back.
    dtype = coefficients.dtype
    alpha = coefficients.to(torch.float64)
    alpha0 = alpha[..., 0]
    ratios = alpha / alpha0.unsqueeze(-1)
    powers = torch.arange(num_terms, dtype=torch.float64, device=alpha.device)
    # Rescale alpha_k -> alpha_k / alpha_0 * g^{-k} with log g = max_k log|alpha_k / alpha_0| / k,
    # so that every normalised coefficient has modulus <= 1; f scales back by
    # sqrt(alpha_0) g^k. The scale lives in log space: g^{-k} alone overflows float64 for
    # slowly growing series (e.g. g = 1e-13 at k = 24), while the products stay bounded.
    with torch.no_grad():
        if num_terms > 1:
            log_growth = (ratios[..., 1:].abs().log() / powers[1:]).amax(dim=-1)
        else:
            log_growth = torch.zeros_like(alpha0)
        log_growth = log_growth.clamp(min=_LOG_FLOAT64_TINY)
        log_scale = -powers * log_growth.unsqueeze(-1)
    # Scales beyond float64's range are capped: there the coefficient is 0 or its
    # contribution is below float64's resolution, and the cap keeps 0 * inf (NaN) out of
    # the values and gradients.
    normalised = ratios * torch.exp(log_scale.clamp(max=_LOG_FLOAT64_MAX))
    terms = [torch.ones_like(alpha0)]
    for index in range(1, num_terms):
        if index > 1:
            previous = torch.stack(terms[1:index], dim=-1)
            inner = (previous * previous.flip(-1)).sum(-1)
        else:
            inner = torch.zeros_like(alpha0)
        terms.append((normalised[..., index] - inner) / 2.0)
    root = torch.stack(terms, dim=-1)
    back_scale = torch.exp((-log_scale).clamp(max=_LOG_FLOAT64_MAX))
    return (root * alpha0.sqrt().unsqueeze(-1) * back_scale).to(dtype)


class KernelFamily(Registered, Module, ABC, registry=KERNEL_FAMILIES):
    r"""Abstract kernel family: the graph node kernel :math:`\sum_k \alpha_k \widetilde{\mathbf W}^k` and its
    hyperparameters.

    Subclasses implement :meth:`coefficients` and :meth:`spectrum` (the kernel as a
    function :math:`g(\lambda) = \sum_k \alpha_k \lambda^k` of the eigenvalues of
    :math:`\widetilde{\mathbf W}`), and may override :meth:`modulation` with a closed
    form and :meth:`apply_exact` with a better exact product. A subclass that sets the
    class attribute ``name`` is registered in :data:`KERNEL_FAMILIES`, so
    :func:`get_kernel_family` and the experiments find it by that name; its
    :meth:`hyperparameters` are named like its constructor arguments, so that
    :meth:`~gp_couple.registry.Registered.to_dict` describes it.

    :param batch_shape: Batch shape of the hyperparameters (e.g. for Pyro sampling).
    """

    def __init__(self, batch_shape: torch.Size = torch.Size()) -> None:
        super().__init__()
        self._batch_shape = torch.Size(batch_shape)

    @property
    def batch_shape(self) -> torch.Size:
        """Batch shape of the hyperparameters."""
        return self._batch_shape

    @abstractmethod
    def coefficients(self, num_terms: int) -> torch.Tensor:
        r"""Series coefficients :math:`\alpha_0, \dots, \alpha_{T-1}`, shape ``(*batch, T)``."""

    @abstractmethod
    def spectrum(self, eigenvalues: torch.Tensor) -> torch.Tensor:
        r""":math:`g(\lambda)` at eigenvalues of :math:`\widetilde{\mathbf W}`, shape ``(*batch, N)``."""

    def modulation(self, num_terms: int) -> torch.Tensor:
        r"""Modulation function :math:`f(0), \dots, f(T-1)`, shape ``(*batch, T)``."""
        return convolutional_sqrt(self.coefficients(check_int("num_terms", num_terms, 1)))

    def apply_exact(self, normalized_adjacency: sp.spmatrix, block: np.ndarray) -> np.ndarray:
        r"""Exact product :math:`\mathbf K B` in float64 (no batch), for large sparse graphs.

        The default sums the power series with Horner's rule until the remaining
        coefficients are negligible; subclasses use expm_multiply or sparse solves.
        """
        self._require_unbatched()
        alpha = self.coefficients(_SERIES_TERMS).detach().double().cpu().numpy()
        significant = np.flatnonzero(np.abs(alpha) > _SERIES_TOL * np.abs(alpha).max())
        alpha = alpha[: int(significant.max()) + 1]
        result = alpha[-1] * block
        for coefficient in alpha[-2::-1]:
            result = normalized_adjacency @ result + coefficient * block
        return np.asarray(result)

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={value}" for name, value in self.hyperparameters().items())

    def hyperparameters(self) -> dict[str, Any]:
        """Current hyperparameter values (floats, or lists when batched) for reports."""
        return {}

    def params(self) -> dict[str, Any]:
        """Constructor arguments of the current hyperparameters (:meth:`hyperparameters`; priors not described)."""
        return self.hyperparameters()

    def _require_unbatched(self) -> None:
        if self._batch_shape != torch.Size():
            raise ValueError("exact products need unbatched hyperparameters "
                             f"(batch_shape is {tuple(self._batch_shape)})")

    def _positive_parameter(self, name: str, value: float, prior: Prior | None,
                            constraint: Any) -> None:
        raw = torch.zeros(*self._batch_shape, 1, dtype=torch.get_default_dtype())
        self.register_parameter(f"raw_{name}", torch.nn.Parameter(raw))
        self.register_constraint(f"raw_{name}", constraint)
        if prior is not None:
            if not isinstance(prior, Prior):
                raise TypeError(f"{name}_prior must be a gpytorch Prior, got {type(prior).__name__}")
            self.register_prior(f"{name}_prior", prior,
                                lambda module, n=name: getattr(module, n),
                                lambda module, v, n=name: module._set_hyper(n, v))
        self._set_hyper(name, value)

    def _get_hyper(self, name: str) -> torch.Tensor:
        constraint = getattr(self, f"raw_{name}_constraint")
        return constraint.transform(getattr(self, f"raw_{name}"))

    def _set_hyper(self, name: str, value: Any) -> None:
        raw = getattr(self, f"raw_{name}")
        tensor = torch.as_tensor(value, dtype=raw.dtype, device=raw.device)
        if torch.any(~torch.isfinite(tensor)):
            raise ValueError(f"{name} must be finite, got {value}")
        constraint = getattr(self, f"raw_{name}_constraint")
        if not constraint.check(tensor.reshape(-1)):
            raise ValueError(f"{name}={value} violates its constraint {constraint}")
        raw_value = constraint.inverse_transform(tensor)
        if not torch.all(torch.isfinite(raw_value)):
            # gpytorch's check() accepts the bound itself (e.g. gamma=0 for Positive()),
            # whose raw value is -inf and whose gradient is NaN.
            raise ValueError(f"{name}={value} lies on the bound of its constraint {constraint} "
                             f"(in {raw.dtype}); choose a value strictly inside it")
        # initialize() broadcasts into the parameter, or replaces it when a batch of
        # values (e.g. Pyro samples) has a larger shape; the batch shape follows it.
        self.initialize(**{f"raw_{name}": raw_value})
        self._batch_shape = getattr(self, f"raw_{name}").shape[:-1]


_SERIES_TERMS = 400
_SERIES_TOL = 1e-17
#: Cap on squared scale hyperparameters (keeps float32 and float64 arithmetic finite).
_HUGE = 1e30
_LOG_HUGE = math.log(_HUGE)


def _steps(num_terms: int, like: torch.Tensor) -> torch.Tensor:
    return torch.arange(check_int("num_terms", num_terms, 1), dtype=like.dtype, device=like.device)


def _log_square(value: torch.Tensor) -> torch.Tensor:
    r""":math:`\log(v^2)` of a positive hyperparameter, bounded so that the series stay finite.

    Squaring first would underflow to zero in float32 below :math:`v \approx 10^{-19}`
    (then :math:`0 \cdot \log 0` is NaN) and overflow above :math:`10^{19}`; the log is
    computed from :math:`v` itself, clamped below at the dtype's smallest normal
    number and above at :math:`\log 10^{30}` (``_HUGE``, far past any useful value,
    where the kernels have converged to their limits).
    """
    tiny = torch.finfo(value.dtype).tiny
    return (2 * torch.log(value.clamp(min=tiny))).clamp(max=_LOG_HUGE)


def _hyperparameter(name: str, doc: str) -> property:
    """The constrained hyperparameter ``name`` as a property (read and set through its raw parameter)."""
    return property(lambda self: self._get_hyper(name), lambda self, value: self._set_hyper(name, value),
                    doc=doc)


def _value(tensor: torch.Tensor) -> Any:
    flat = tensor.detach().reshape(-1)
    return float(flat[0]) if flat.numel() == 1 else flat.tolist()


class Diffusion(KernelFamily):
    r"""Diffusion (heat) kernel
    :math:`\exp(-\gamma^2 \widetilde{\mathbf L}) = e^{-\gamma^2}\exp(\gamma^2 \widetilde{\mathbf W})`.

    This is the kernel :math:`\kappa\exp(-\gamma^2\widetilde{\mathbf L})` of the GRF-GP experiments
    (Appendix F.2 "Scalable GPs on graphs", paragraph "Training GRF-GPs: technical details"
    [app:grf_gp_details]) without its amplitude :math:`\kappa`; Table 4's
    :math:`\exp(-\sigma^2\mathbf L/2)` (Appendix C.1 [tab:taylor_expansions]) with
    :math:`\sigma^2 = 2\gamma^2`. Its modulation has a closed form, the convolutional square
    root of the coefficients (Appendix C.1 "Constructing graph random features"
    [app:grf_approx]; :math:`\sum_p f(p) f(k-p) = \alpha_k` by the binomial theorem):

    .. math::

        f(t) = e^{-\gamma^2/2} \frac{(\gamma^2/2)^t}{t!}, \qquad
        \alpha_k = e^{-\gamma^2} \frac{\gamma^{2k}}{k!}.

    :param gamma: Initial :math:`\gamma > 0` (the kernel's lengthscale on the graph).
    :param gamma_prior: Optional gpytorch prior on :math:`\gamma`.
    :param gamma_constraint: Constraint on :math:`\gamma` (default ``Positive()``).
    :param batch_shape: Hyperparameter batch shape.
    """

    name = "diffusion"

    def __init__(self, gamma: float = 1.0, *, gamma_prior: Prior | None = None,
                 gamma_constraint: Any = None, batch_shape: torch.Size = torch.Size()) -> None:
        super().__init__(batch_shape)
        self._positive_parameter("gamma", gamma, gamma_prior, gamma_constraint or Positive())

    gamma = _hyperparameter("gamma", r":math:`\gamma`, shape ``(*batch, 1)``.")

    def _log_gamma_squared(self) -> torch.Tensor:
        # Bounded above so that samplers probing huge gamma (e.g. NUTS step-size search)
        # get a vanishing kernel instead of inf - inf = NaN, and below so that tiny gamma
        # gives the identity kernel with finite gradients (see _log_square).
        return _log_square(self.gamma)

    @staticmethod
    def _poisson_terms(log_rate: torch.Tensor, num_terms: int) -> torch.Tensor:
        # e^{-r} r^t / t! evaluated as one exponential of finite logs.
        t = _steps(num_terms, log_rate)
        return torch.exp(-torch.exp(log_rate) + t * log_rate - torch.lgamma(t + 1))

    def coefficients(self, num_terms: int) -> torch.Tensor:
        return self._poisson_terms(self._log_gamma_squared(), num_terms)

    def modulation(self, num_terms: int) -> torch.Tensor:
        return self._poisson_terms(self._log_gamma_squared() - math.log(2.0), num_terms)

    def spectrum(self, eigenvalues: torch.Tensor) -> torch.Tensor:
        return torch.exp(-torch.exp(self._log_gamma_squared()) * (1 - eigenvalues))

    def apply_exact(self, normalized_adjacency: sp.spmatrix, block: np.ndarray) -> np.ndarray:
        from scipy.sparse.linalg import expm_multiply

        self._require_unbatched()
        g2 = float(self.gamma.detach()) ** 2
        return math.exp(-g2) * expm_multiply(g2 * sp.csr_matrix(normalized_adjacency), block)

    def hyperparameters(self) -> dict[str, Any]:
        return {"gamma": _value(self.gamma)}


class RegularisedLaplacian(KernelFamily):
    r"""Regularised Laplacian :math:`(\mathbf I + \sigma^2 \widetilde{\mathbf L})^{-d}` (Table 4,
    Appendix C.1 [tab:taylor_expansions]).

    On the normalised Laplacian (Appendix F.1 "More results for Gram matrix estimation"
    [app:more_grf_results] writes :math:`(\mathbf I - \sigma^2\widetilde{\mathbf L})^{-2}` with
    :math:`\sigma = 1`, which is singular; it is read as the table's form):
    :math:`(\mathbf I + \sigma^2\widetilde{\mathbf L})^{-d}
    = (1 + \sigma^2)^{-d}(\mathbf I - c\widetilde{\mathbf W})^{-d}`
    with :math:`c = \sigma^2/(1 + \sigma^2) < 1`, so

    .. math::

        \alpha_k = (1+\sigma^2)^{-d}\binom{k + d - 1}{k} c^k, \qquad
        f(t) = (1+\sigma^2)^{-d/2} \frac{\Gamma(t + d/2)}{\Gamma(d/2)\, t!} c^t,

    the latter being the series of :math:`(1+\sigma^2)^{-d/2}(1 - c x)^{-d/2}`.

    :param sigma: Initial regulariser :math:`\sigma > 0`.
    :param degree: The power :math:`d > 0` (fixed; exact column products need an integer).
    :param sigma_prior: Optional prior on :math:`\sigma`.
    :param sigma_constraint: Constraint (default ``Positive()``).
    :param batch_shape: Hyperparameter batch shape.
    """

    name = "regularised-laplacian"

    def __init__(self, sigma: float = 1.0, degree: float = 2, *, sigma_prior: Prior | None = None,
                 sigma_constraint: Any = None, batch_shape: torch.Size = torch.Size()) -> None:
        super().__init__(batch_shape)
        if isinstance(degree, bool) or not isinstance(degree, (int, float, np.integer, np.floating)):
            raise TypeError(f"degree must be a number, got {type(degree).__name__}")
        if not (float(degree) > 0 and math.isfinite(float(degree))):
            raise ValueError(f"degree must be positive, got {degree}")
        self.degree = float(degree)
        self._positive_parameter("sigma", sigma, sigma_prior, sigma_constraint or Positive())

    sigma = _hyperparameter("sigma", r":math:`\sigma`, shape ``(*batch, 1)``.")

    def _log_terms(self, num_terms: int, power: float) -> torch.Tensor:
        # log of (1 + s^2)^{-power} * Gamma(k + power) / (Gamma(power) k!) * c^k, from
        # log s^2 alone: log(1 + s^2) = logaddexp(0, log s^2) and log c = -log(1 + s^-2)
        # stay finite and accurate for every s (s^2 itself underflows in float32 below
        # s ~ 1e-19, which made 0 * log 0 = NaN).
        log_s2 = _log_square(self.sigma)
        t = _steps(num_terms, log_s2)
        zero = torch.zeros((), dtype=log_s2.dtype, device=log_s2.device)
        log_c = -torch.logaddexp(zero, -log_s2)
        return (-power * torch.logaddexp(zero, log_s2) + torch.lgamma(t + power) - math.lgamma(power)
                - torch.lgamma(t + 1) + t * log_c)

    def coefficients(self, num_terms: int) -> torch.Tensor:
        return torch.exp(self._log_terms(num_terms, self.degree))

    def modulation(self, num_terms: int) -> torch.Tensor:
        return torch.exp(self._log_terms(num_terms, self.degree / 2))

    def spectrum(self, eigenvalues: torch.Tensor) -> torch.Tensor:
        s2 = torch.exp(_log_square(self.sigma))
        return (1 + s2 * (1 - eigenvalues)) ** (-self.degree)

    def apply_exact(self, normalized_adjacency: sp.spmatrix, block: np.ndarray) -> np.ndarray:
        from scipy.sparse.linalg import splu

        self._require_unbatched()
        if not float(self.degree).is_integer():
            raise ValueError("exact column products need an integer degree; use the dense "
                             "reference (gp_couple.exact.exact_kernel_matrix) instead")
        s2 = float(self.sigma.detach()) ** 2
        n = normalized_adjacency.shape[0]
        system = sp.identity(n, format="csc") * (1 + s2) - s2 * sp.csc_matrix(normalized_adjacency)
        factor = splu(system.tocsc())
        result = np.asarray(block, dtype=np.float64)
        for _ in range(int(self.degree)):
            result = factor.solve(result)
        return result

    def hyperparameters(self) -> dict[str, Any]:
        return {"sigma": _value(self.sigma), "degree": self.degree}


class PStepRandomWalk(KernelFamily):
    r""":math:`p`-step random walk kernel
    :math:`(\alpha\mathbf I - \widetilde{\mathbf L})^p = ((\alpha - 1)\mathbf I + \widetilde{\mathbf W})^p`,
    :math:`\alpha \ge 2`.

    .. math::

        \alpha_k = \binom{p}{k} a^{p-k}, \qquad f(t) = \binom{p/2}{t} a^{p/2 - t},
        \qquad a = \alpha - 1,

    (generalised binomial coefficients; the modulation is an infinite series for odd
    :math:`p`, convergent because :math:`|\lambda| \le 1 \le a`).

    The kernel's scale :math:`\alpha^p = g(1)` must stay below the square root of the
    dtype's largest number (about :math:`1.8 \times 10^{19}` in float32,
    :math:`1.3 \times 10^{154}` in float64), so that Gram matrices and their sums stay
    finite; beyond it the series raise a :class:`ValueError` rather than return
    infinities. Values of :math:`\alpha` below 2 are rejected; exactly 2 (a legitimate
    boundary value that gpytorch's strict ``GreaterThan`` excludes) is stored as
    :math:`2 + 10^{-6}`.

    :param alpha: Initial :math:`\alpha \ge 2`.
    :param steps: The integer power :math:`p \ge 1` (fixed).
    :param alpha_prior: Optional prior on :math:`\alpha`.
    :param alpha_constraint: Constraint (default ``GreaterThan(2)``).
    :param batch_shape: Hyperparameter batch shape.
    """

    name = "p-step"

    def __init__(self, alpha: float = 2.0, steps: int = 2, *, alpha_prior: Prior | None = None,
                 alpha_constraint: Any = None, batch_shape: torch.Size = torch.Size()) -> None:
        super().__init__(batch_shape)
        self.steps = check_int("steps", steps, 1)
        self._positive_parameter("alpha", _off_boundary(alpha), alpha_prior,
                                 alpha_constraint or GreaterThan(2.0))

    @property
    def alpha(self) -> torch.Tensor:
        r""":math:`\alpha`, shape ``(*batch, 1)``."""
        return self._get_hyper("alpha")

    @alpha.setter
    def alpha(self, value: Any) -> None:
        self._set_hyper("alpha", _off_boundary(value))

    def _checked_alpha(self) -> torch.Tensor:
        alpha = self.alpha
        limit = 0.5 * math.log(torch.finfo(alpha.dtype).max)
        log_scale = self.steps * float(torch.log(alpha.detach()).max())
        if log_scale > limit:
            raise ValueError(
                f"alpha={_value(alpha)} with steps={self.steps}: the kernel's scale alpha**steps "
                f"= e^{log_scale:.1f} exceeds e^{limit:.1f}, the square root of the largest "
                f"{alpha.dtype} number; use a smaller alpha or float64")
        return alpha

    def _binomial_series(self, num_terms: int, power: float) -> torch.Tensor:
        # binom(power, t) a^{power - t} with the power of a taken in log space, so that
        # large alpha underflows the high-order terms instead of overflowing a^t first.
        log_a = torch.log(self._checked_alpha() - 1)
        t = _steps(num_terms, log_a)
        factors = (power - t[1:] + 1) / t[1:]
        binomials = torch.cat([torch.ones_like(t[:1]), torch.cumprod(factors, dim=0)])
        return binomials * torch.exp((power - t) * log_a)

    def coefficients(self, num_terms: int) -> torch.Tensor:
        return self._binomial_series(num_terms, float(self.steps))

    def modulation(self, num_terms: int) -> torch.Tensor:
        return self._binomial_series(num_terms, self.steps / 2)

    def spectrum(self, eigenvalues: torch.Tensor) -> torch.Tensor:
        return (self._checked_alpha() - 1 + eigenvalues) ** self.steps

    def apply_exact(self, normalized_adjacency: sp.spmatrix, block: np.ndarray) -> np.ndarray:
        self._require_unbatched()
        a = float(self.alpha.detach()) - 1
        result = np.asarray(block, dtype=np.float64)
        for _ in range(self.steps):
            result = a * result + normalized_adjacency @ result
        return result

    def hyperparameters(self) -> dict[str, Any]:
        return {"alpha": _value(self.alpha), "steps": self.steps}


#: Where ``PStepRandomWalk`` stores :math:`\alpha = 2`.
_P_STEP_BOUNDARY = 2.0 + 1e-6


def _off_boundary(alpha: Any) -> Any:
    """Move ``alpha = 2`` (legitimate, but outside gpytorch's strict ``GreaterThan(2)``) inside."""
    if isinstance(alpha, (bool, str)) or not isinstance(alpha, (int, float, np.number, torch.Tensor)):
        return alpha  # _set_hyper reports the type
    if isinstance(alpha, torch.Tensor):
        return torch.where(alpha == 2.0, torch.full_like(alpha, _P_STEP_BOUNDARY), alpha)
    return _P_STEP_BOUNDARY if float(alpha) == 2.0 else alpha


class InverseCosine(KernelFamily):
    r"""Inverse cosine kernel :math:`\cos(\beta\widetilde{\mathbf L})` (Table 4, Appendix C.1
    [tab:taylor_expansions] uses :math:`\beta = \pi/4`).

    :math:`\cos(\beta\widetilde{\mathbf L}) = \mathrm{Re}\,[e^{i\beta}\exp(-i\beta\widetilde{\mathbf W})]`, so

    .. math::

        \alpha_k = \frac{\beta^k}{k!}\cos(\beta - k\pi/2).

    The kernel is positive semi-definite for :math:`0 < \beta \le \pi/4` (the spectrum of
    :math:`\widetilde{\mathbf L}` lies in :math:`[0, 2]`); :math:`f` is the numerical
    convolutional square root.

    :param beta: Fixed :math:`\beta \in (0, \pi/4]`.
    """

    name = "inverse-cosine"

    def __init__(self, beta: float = math.pi / 4, *, batch_shape: torch.Size = torch.Size()) -> None:
        super().__init__(batch_shape)
        if not (0 < float(beta) <= math.pi / 4 + 1e-15):
            raise ValueError(f"beta must lie in (0, pi/4] for a PSD kernel, got {beta}")
        self.beta = float(beta)
        # A buffer, so that .double()/.to() choose the dtype the series is computed in.
        self.register_buffer("beta_value", torch.tensor(self.beta, dtype=torch.get_default_dtype()))

    def _beta(self) -> torch.Tensor:
        # From the Python float: the buffer only carries the dtype and device, and a
        # float32 buffer converted by .double() would keep float32's rounding of beta.
        return torch.tensor(self.beta, dtype=self.beta_value.dtype, device=self.beta_value.device)

    def coefficients(self, num_terms: int) -> torch.Tensor:
        beta = self._beta()
        t = _steps(num_terms, beta)
        # cos(beta - t pi/2) cycles through cos, sin, -cos, -sin; taken exactly, because
        # cos(beta - pi/2) in floating point has an absolute error of about 1e-16 (1e-8 in
        # float32), far above sin(beta) for small beta.
        cycle = torch.stack([torch.cos(beta), torch.sin(beta), -torch.cos(beta), -torch.sin(beta)])
        phase = cycle[torch.arange(t.numel(), device=t.device) % 4]
        alpha = torch.exp(torch.xlogy(t, beta) - torch.lgamma(t + 1)) * phase
        return alpha.expand(*self.batch_shape, -1)

    def spectrum(self, eigenvalues: torch.Tensor) -> torch.Tensor:
        return torch.cos(self._beta() * (1 - eigenvalues)).expand(*self.batch_shape, -1)

    def apply_exact(self, normalized_adjacency: sp.spmatrix, block: np.ndarray) -> np.ndarray:
        from scipy.sparse.linalg import expm_multiply

        self._require_unbatched()
        rotated = expm_multiply(-1j * self.beta * sp.csr_matrix(normalized_adjacency, dtype=complex),
                                np.asarray(block, dtype=complex))
        return np.real(np.exp(1j * self.beta) * rotated)

    def hyperparameters(self) -> dict[str, Any]:
        return {"beta": self.beta}


class PowerSeries(KernelFamily):
    r"""Any kernel :math:`\sum_k \alpha_k \widetilde{\mathbf W}^k` from its coefficients.

    Coefficients beyond those given are zero. :math:`\alpha_0` must be positive, and the
    kernel positive semi-definite on every graph: the eigenvalues of
    :math:`\widetilde{\mathbf W}` fill :math:`[-1, 1]` (bipartite graphs reach
    :math:`-1`), so :math:`g(\lambda) = \sum_k \alpha_k \lambda^k \ge 0` must hold there.
    Both are checked at construction (the minimum of :math:`g` on :math:`[-1, 1]`, at the
    ends or at a real root of :math:`g'`); learnable coefficients are not checked again
    while they train.

    :param coefficients: :math:`\alpha_0, \alpha_1, \dots` (1-D).
    :param learnable: Make the coefficients a trainable parameter.
    :raises ValueError: If the coefficients are empty, not 1-D, not finite,
        :math:`\alpha_0 \le 0`, or :math:`g(\lambda) < 0` somewhere on :math:`[-1, 1]`
        (the message names the coefficients and where).
    """

    name = "power-series"

    def __init__(self, coefficients: Any, *, learnable: bool = False) -> None:
        super().__init__()
        alpha = torch.as_tensor(coefficients, dtype=torch.get_default_dtype()).clone()
        if alpha.ndim != 1 or alpha.numel() == 0:
            raise ValueError(f"coefficients must be a non-empty 1-D sequence, got shape {tuple(alpha.shape)}")
        if not torch.all(torch.isfinite(alpha)):
            raise ValueError("coefficients must be finite")
        if alpha[0] <= 0:
            raise ValueError(f"the zeroth coefficient must be positive, got {float(alpha[0])}")
        _check_positive_semidefinite(alpha.double().numpy())
        if learnable:
            self.register_parameter("series_coefficients", torch.nn.Parameter(alpha))
        else:
            self.register_buffer("series_coefficients", alpha)

    def coefficients(self, num_terms: int) -> torch.Tensor:
        num_terms = check_int("num_terms", num_terms, 1)
        alpha = self.series_coefficients
        if alpha.numel() >= num_terms:
            return alpha[:num_terms]
        return torch.cat([alpha, alpha.new_zeros(num_terms - alpha.numel())])

    def spectrum(self, eigenvalues: torch.Tensor) -> torch.Tensor:
        result = torch.zeros_like(eigenvalues) + self.series_coefficients[-1]
        for coefficient in self.series_coefficients.flip(0)[1:]:
            result = result * eigenvalues + coefficient
        return result

    def hyperparameters(self) -> dict[str, Any]:
        return {"coefficients": self.series_coefficients.detach().tolist()}


def _check_positive_semidefinite(alpha: np.ndarray) -> None:
    r"""Raise unless :math:`g(\lambda) = \sum_k \alpha_k \lambda^k \ge 0` on :math:`[-1, 1]`.

    The minimum of a polynomial on an interval lies at an end or at a critical point, so
    :math:`g` is evaluated at :math:`\pm 1` and at the real roots of :math:`g'` inside;
    a dense grid backs up roots that the companion-matrix eigenvalues place slightly off
    the real line. Values down to :math:`-10^{-12} \sum_k |\alpha_k|` count as zero
    (round-off of a series that touches zero, e.g. :math:`1 + \lambda` at :math:`-1`).
    """
    series = np.polynomial.Polynomial(alpha)
    roots = series.deriv().roots() if alpha.size > 2 else np.array([])
    critical = roots.real[(np.abs(roots.imag) <= 1e-9 * np.maximum(1.0, np.abs(roots))) & (np.abs(roots.real) <= 1.0)]
    points = np.concatenate([[-1.0, 1.0], critical, np.linspace(-1.0, 1.0, 2001)])
    values = series(points)
    lowest = int(np.argmin(values))
    if values[lowest] < -1e-12 * np.abs(alpha).sum():
        raise ValueError(
            f"coefficients {alpha.tolist()} do not give a positive semi-definite kernel: "
            f"g(lambda) = sum_k alpha_k lambda^k is {values[lowest]:.4g} at lambda = {points[lowest]:.4g}, and the "
            "eigenvalues of the normalised adjacency fill [-1, 1]; g must be >= 0 there")


def get_kernel_family(family: str | KernelFamily, **hyperparameters: Any) -> KernelFamily:
    """Resolve a family name (``diffusion``, ``regularised-laplacian``, ``p-step``, ``inverse-cosine``,
    ``power-series``, or a user's registered one) to an instance.

    :param family: A name in :data:`KERNEL_FAMILIES`, or an instance (returned as is).
    :param hyperparameters: Constructor arguments of the named family.
    :raises ValueError: For an unknown name, hyperparameters with an instance, or hyperparameters
        the named family does not take.
    :raises TypeError: If ``family`` is neither a str nor a :class:`KernelFamily`.
    """
    return KERNEL_FAMILIES.resolve(family, KernelFamily, "family", **hyperparameters)
