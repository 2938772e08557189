r"""Choosing the termination probability :math:`p_\mathrm{halt}` of graph random features for a kernel.

A walker that has survived :math:`t` steps carries the importance factor
:math:`(1 - p_\mathrm{halt})^{-t}` (Appendix C.1 "Constructing graph random features"
[app:grf_approx], the load of a walk: one factor
:math:`1/(1-p_\mathrm{halt})` per step), which keeps the estimate unbiased because it
survives with probability :math:`(1 - p_\mathrm{halt})^t`. Step :math:`t` therefore
adds :math:`f(t)^2 (1-p)^{-2t}` to the squared feature with probability :math:`(1-p)^t`:

.. math::

    \mathbb E\Big[\sum_t f(t)^2 \Big(\frac{\mathbb 1[\ell \ge t]}{(1 - p)^{t}}\Big)^2\Big]
    = \sum_t f(t)^2 (1 - p)^{-t},

where :math:`\ell` is the walk length. The other per-step factors do not depend on
:math:`p`: with the uniform proposal on an unweighted graph, or the weight-proportional
proposal on a weighted one, they telescope to :math:`\sqrt{d_{v_0} / d_{v_t}}`. The
*halting inflation*

.. math::

    \rho(p) = \frac{\sum_t f(t)^2 (1 - p)^{-t}}{\sum_t f(t)^2} \;\ge 1

is the factor by which halting (instead of walking forever) multiplies that second
moment. It grows with :math:`p` and with the length at which the modulation
:math:`f` has its mass, and it is infinite when :math:`f(t)^2` decays no faster than
:math:`(1 - p)^t`. Walk cost grows like :math:`1/p` (mean length :math:`(1-p)/p`),
so :func:`suggest_p_halt` returns the cheapest :math:`p` whose inflation stays within a
budget.

For the diffusion kernel, :math:`f(t) = e^{-\gamma^2/2}(\gamma^2/2)^t/t!` (a Poisson
profile peaking at :math:`t \approx \gamma^2/2`), and

.. math::

    \rho(p) = \frac{I_0\big(\gamma^2 / \sqrt{1-p}\big)}{I_0(\gamma^2)}
    \approx \exp\Big(\gamma^2\big((1-p)^{-1/2} - 1\big)\Big)
    \quad\Rightarrow\quad p \approx \frac{2 \log \rho_\mathrm{max}}{\gamma^2}

for large :math:`\gamma` (:math:`I_0` the modified Bessel function): a short-range kernel
(:math:`\gamma \approx 1`) tolerates the paper's :math:`p = 0.5`, while :math:`\gamma = 8`
(modulation peak at 32 steps) needs :math:`p \approx 0.02`, where the paper's
:math:`p = 0.4` would inflate the second moment by a factor of about :math:`10^8`.

Measurements (``benchmarks/bench_long_range.py``, ``benchmarks/RESULTS.md``, "Long-range
kernels and the choice of p_halt"; diffusion :math:`\gamma \in \{1, 2, 4, 8\}` on a grid and
an icosphere mesh, 16 walkers, every coupling and direction scheme): the relative Gram
error follows :math:`\rho` rather than :math:`\gamma` or :math:`p` separately. Rows with
:math:`\rho \le 1.5` are within 1.0-1.7x of the error of the longest walks measured
(independent directions), :math:`\rho \approx 2.3` within 1.5-1.7x, and :math:`\rho \approx 4`-6
gives 2.2-3.9x, absolute errors of 0.9-1.6: no better than the zero matrix; hence the default budget
:math:`\rho_\mathrm{max} = 2`. On the San Jose traffic graph the rule at the exact GP's
kernel (:math:`\gamma = 8.06`) gives :math:`p = 0.021`, with which the GRF-GP's likelihood
learns a long-range kernel (``gp-couple traffic``).
"""

from __future__ import annotations

import math
import warnings
from copy import deepcopy

import numpy as np
import torch
from scipy.optimize import brentq
from scipy.special import logsumexp

from ._checks import check_p_halt
from .kernel_families import KernelFamily

__all__ = ["DEFAULT_MAX_INFLATION", "HaltingInflationWarning", "MIN_P_HALT", "WARNING_INFLATION", "halting_inflation",
           "suggest_p_halt", "unreliable_inflation", "warn_if_inflated"]

#: Default budget :math:`\rho_\mathrm{max}` for :func:`suggest_p_halt` (see the module docstring).
DEFAULT_MAX_INFLATION = 2.0
#: Smallest termination probability :func:`suggest_p_halt` searches (mean walk length about 1,000).
MIN_P_HALT = 1e-3
#: Inflation above which a kernel warns: from about 4 on, the long-range benchmark's
#: estimates were no better than the zero matrix.
WARNING_INFLATION = 4.0


class HaltingInflationWarning(RuntimeWarning):
    """The walks halt too early for the kernel's current hyperparameters (see :func:`warn_if_inflated`)."""


_FIRST_TERMS = 128
_MAX_TERMS = 8192
#: A series is summed once its last half adds less than this fraction of the total.
_TAIL_TOLERANCE = 1e-12


def _check_kernel(kernel_family: KernelFamily) -> KernelFamily:
    if not isinstance(kernel_family, KernelFamily):
        raise TypeError("kernel_family must be a gp_couple.kernel_families.KernelFamily "
                        f"(e.g. Diffusion(gamma=4.0)), got {type(kernel_family).__name__}")
    if kernel_family.batch_shape != torch.Size():
        raise ValueError("kernel_family must have unbatched hyperparameters, got batch_shape "
                         f"{tuple(kernel_family.batch_shape)}")
    return kernel_family


class _SquaredModulation:
    r""":math:`\log f(t)^2` of a kernel family, computed once per length and reused for every :math:`p`."""

    def __init__(self, kernel_family: KernelFamily) -> None:
        # float64 copy: f(t)^2 spans hundreds of orders of magnitude for long-range kernels.
        self._family = deepcopy(kernel_family).double()
        self._values = np.empty(0)

    def first(self, num_terms: int) -> np.ndarray:
        # Every family's modulation(T) is the first T terms of one series, so a longer
        # evaluation serves every shorter request (the generic square root is O(T^2)).
        if self._values.size < num_terms:
            with torch.no_grad():
                f = self._family.modulation(num_terms).reshape(-1).cpu().numpy()
            with np.errstate(divide="ignore"):
                self._values = 2.0 * np.log(np.abs(f))
        return self._values[:num_terms]


def _log_inflation(squared: _SquaredModulation, p_halt: float) -> float:
    r""":math:`\log\rho(p)`, summing terms until the tail is negligible (``inf`` if it never is)."""
    num_terms = _FIRST_TERMS
    while True:
        log_f2 = squared.first(num_terms)
        weighted = log_f2 - np.arange(num_terms) * math.log1p(-p_halt)
        half = num_terms // 2
        total, plain = logsumexp(weighted), logsumexp(log_f2)
        if not np.isfinite(plain):
            raise ValueError("kernel_family has an identically zero modulation function")
        tail_weighted, tail_plain = logsumexp(weighted[half:]), logsumexp(log_f2[half:])
        if (tail_weighted - total < math.log(_TAIL_TOLERANCE)
                and tail_plain - plain < math.log(_TAIL_TOLERANCE)):
            return float(total - plain)
        if num_terms >= _MAX_TERMS:
            return math.inf
        num_terms *= 2


def halting_inflation(kernel_family: KernelFamily, p_halt: float) -> float:
    r"""Halting inflation :math:`\rho(p) = \sum_t f(t)^2 (1-p)^{-t} / \sum_t f(t)^2` of a kernel's GRFs.

    The factor by which terminating walks with probability ``p_halt`` (and reweighting
    the survivors, Appendix C.1 "Constructing graph random features" [app:grf_approx]) multiplies
    the second moment of the features, relative to walks that never halt; see the module docstring.

    :param kernel_family: The kernel, at the hyperparameters of interest (unbatched).
    :param p_halt: Termination probability in :math:`(0, 1)`.
    :return: :math:`\rho(p) \ge 1`; ``math.inf`` when the series diverges (the GRF
        estimate then has infinite variance), detected when it has not converged within
        8192 terms.
    :raises TypeError: If ``kernel_family`` is not a
        :class:`~gp_couple.kernel_families.KernelFamily` or ``p_halt`` is not a float.
    :raises ValueError: If ``p_halt`` is outside :math:`(0, 1)`, the hyperparameters are
        batched, or the modulation is identically zero.
    """
    return math.exp(_log_inflation(_SquaredModulation(_check_kernel(kernel_family)), check_p_halt(p_halt)))


def suggest_p_halt(kernel_family: KernelFamily, *, max_inflation: float = DEFAULT_MAX_INFLATION,
                   p_max: float = 0.5, p_min: float = MIN_P_HALT) -> float:
    r"""The cheapest (largest) :math:`p_\mathrm{halt} \le p_\mathrm{max}` within the halting-inflation budget.

    Solves :math:`\rho(p) = \rho_\mathrm{max}` (:func:`halting_inflation`, increasing in
    :math:`p`) by Brent's method. For the diffusion kernel this is
    :math:`p \approx 2\log\rho_\mathrm{max}/\gamma^2` at large :math:`\gamma`: about
    0.02 for :math:`\gamma = 8` and the default budget, while short-range kernels get
    ``p_max``. Choose it for the longest-range hyperparameters the model should be able
    to learn: walks that halt too early cannot represent a long-range kernel, so a
    likelihood trained on them never reaches one.

    :param kernel_family: The kernel, at the hyperparameters the walks must serve.
    :param max_inflation: Budget :math:`\rho_\mathrm{max} > 1` (default
        :data:`DEFAULT_MAX_INFLATION`, from the long-range benchmark).
    :param p_max: Upper end of the search (the paper's experiments use 0.1 to 0.5).
    :param p_min: Lower end of the search (mean walk length :math:`(1 - p)/p`).
    :return: The suggested :math:`p_\mathrm{halt}` in ``[p_min, p_max]``.
    :raises ValueError: If ``max_inflation <= 1``, the search interval is invalid, or
        even ``p_min`` inflates the second moment by more than ``max_inflation`` (the
        modulation decays too slowly for GRFs).
    """
    kernel_family = _check_kernel(kernel_family)
    if isinstance(max_inflation, bool) or not isinstance(max_inflation, (int, float, np.floating)):
        raise TypeError(f"max_inflation must be a float, got {type(max_inflation).__name__}")
    if not (float(max_inflation) > 1.0 and math.isfinite(float(max_inflation))):
        raise ValueError(f"max_inflation must be a finite number > 1, got {max_inflation}")
    p_max, p_min = check_p_halt(p_max), check_p_halt(p_min)
    if p_min >= p_max:
        raise ValueError(f"p_min must be below p_max, got p_min={p_min}, p_max={p_max}")
    log_budget = math.log(float(max_inflation))
    squared = _SquaredModulation(kernel_family)

    def excess(p: float) -> float:
        # Clipped so that brentq sees finite values where the series diverges.
        return min(_log_inflation(squared, p), 1e3) - log_budget

    if excess(p_max) <= 0:
        return p_max
    if excess(p_min) > 0:
        raise ValueError(f"even p_halt={p_min} inflates the second moment of the features by "
                         f"{math.exp(_log_inflation(squared, p_min)):.3g} > max_inflation={max_inflation}: "
                         "the modulation decays too slowly for graph random features "
                         "(lower p_min or choose shorter-range hyperparameters)")
    return float(brentq(excess, p_min, p_max, xtol=1e-6, rtol=1e-6))


def _describe(kernel_family: KernelFamily) -> str:
    return ", ".join(f"{name}={float(value):.4g}" for name, value in kernel_family.hyperparameters().items()
                     if isinstance(value, (int, float, torch.Tensor)) and torch.as_tensor(value).numel() == 1)


def unreliable_inflation(kernel_family: KernelFamily, p_halt: float) -> float | None:
    r""":math:`\rho(p_\mathrm{halt})` of ``kernel_family`` where it exceeds :data:`WARNING_INFLATION`, else ``None``.

    Beyond that bound the GRF estimate is no better than the zero matrix. Kernel families
    with batched hyperparameters are not judged (their entries differ); a modulation that is
    identically zero at these hyperparameters (it underflows far beyond the walks' reach)
    counts as infinite inflation.

    :param kernel_family: The kernel family at its current hyperparameters.
    :param p_halt: The walks' termination probability.
    :return: The inflation (``math.inf`` where it diverges), or ``None`` within the bound.
    """
    family = deepcopy(kernel_family).cpu()
    if family.batch_shape != torch.Size():
        return None
    try:
        inflation = halting_inflation(family, p_halt)
    except ValueError:  # the modulation is identically zero
        return math.inf
    return inflation if inflation > WARNING_INFLATION else None


def warn_if_inflated(kernel_family: KernelFamily, p_halt: float, owner: str) -> bool:
    r"""Warn when :math:`\rho(p_\mathrm{halt})` of ``kernel_family`` exceeds :data:`WARNING_INFLATION`.

    Kernel families with batched hyperparameters are not judged (their entries differ).

    :param kernel_family: The kernel family at its current hyperparameters.
    :param p_halt: The walks' termination probability.
    :param owner: Who is warning (named in the message).
    :return: Whether it warned.
    :warns HaltingInflationWarning: Naming ``p_halt`` and :func:`suggest_p_halt`'s value.
    """
    inflation = unreliable_inflation(kernel_family, p_halt)
    if inflation is None:
        return False
    family = deepcopy(kernel_family).cpu()
    try:
        advice = f"p_halt <= {suggest_p_halt(family):.3g} (gp_couple.halting.suggest_p_halt)"
    except ValueError as error:
        advice = f"shorter-range hyperparameters ({error})"
    warnings.warn(f"{owner}: at the current hyperparameters ({_describe(family)}) p_halt={p_halt:g} inflates the "
                  f"second moment of the features by {inflation:.3g} > {WARNING_INFLATION:g}, so the kernel "
                  f"estimate is unreliable; use {advice}", HaltingInflationWarning, stacklevel=3)
    return True
