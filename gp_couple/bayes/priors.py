r"""The hyperparameters that carry priors, and the check that each prior fits its constraint.

NUTS (and every Pyro sampler) moves over the whole support of a prior: Pyro maps the
support bijectively onto :math:`\mathbb R^d` and proposes anywhere there. gpytorch then
stores the sampled value through the parameter's *constraint*
(``raw = constraint.inverse_transform(value)``), which can only represent values inside
the constraint's range. A sampled value outside that range is silently mapped to NaN
or to the wrong value (gpytorch issue 2646: a ``LogNormal`` noise prior with the
default ``GreaterThan(1e-4)`` noise constraint), so the chain explores a different
posterior from the one written down.

The rule checked here is therefore

.. math::

    \operatorname{supp}(\text{prior}) \subseteq [\text{constraint.lower\_bound},\;
    \text{constraint.upper\_bound}] ,

for example

==============================================  =========================================
prior (support)                                 constraint that matches
==============================================  =========================================
``GammaPrior``, ``LogNormalPrior``,             ``Positive()`` (not gpytorch's default
``HalfCauchyPrior`` (:math:`(0, \infty)`)       ``GreaterThan(1e-4)`` of the Gaussian noise)
``UniformPrior(a, b)`` (:math:`[a, b]`)         ``Interval(a', b')`` with :math:`a' \le a`, :math:`b' \ge b`
``NormalPrior`` (:math:`\mathbb R`)             an unconstrained parameter only
==============================================  =========================================

A prior is matched to its constraint by gpytorch's naming convention: a prior
``<name>_prior`` on a module acts on the parameter ``raw_<name>`` constrained by
``raw_<name>_constraint`` (every gpytorch kernel, likelihood and the
:mod:`gp_couple.kernel_families` follow it). Priors on derived quantities (a
closure such as ``lambda m: m.noise.sqrt()``) have no such constraint and are not
checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from gpytorch.constraints import Interval
from gpytorch.module import Module
from gpytorch.priors import Prior
from torch.distributions import constraints as support_constraints

__all__ = ["PriorSite", "prior_sites", "check_support", "support_bounds"]


@dataclass(frozen=True)
class PriorSite:
    """One hyperparameter with a prior: a Pyro sample site of the NUTS model.

    :ivar name: Site name, the prior's dotted name in the model
        (e.g. ``"covar_module.outputscale_prior"``; the key of the samples).
    :ivar module: The module that registered the prior.
    :ivar prior: The gpytorch prior.
    :ivar closure: ``closure(module)`` returns the hyperparameter's current value.
    :ivar setting_closure: ``setting_closure(module, value)`` stores a value.
    :ivar constraint: The constraint of the parameter the prior acts on (``None`` if
        the prior acts on a derived quantity).
    :ivar shape: Shape of one sample (the current value's shape).
    """

    name: str
    module: Module
    prior: Prior
    closure: Callable[[Module], torch.Tensor]
    setting_closure: Callable[[Module, torch.Tensor], None]
    constraint: Interval | None
    shape: torch.Size

    def current_value(self) -> torch.Tensor:
        """The hyperparameter's value in the model now (detached)."""
        return self.closure(self.module).detach().clone()


def support_bounds(support: support_constraints.Constraint) -> tuple[float, float]:
    """Lower and upper bound of a real interval-like support (``±inf`` when open-ended).

    :param support: A :mod:`torch.distributions.constraints` object (``positive``,
        ``real``, ``interval(a, b)``, ``independent(...)``, ...).
    :return: ``(lower, upper)``.
    :raises ValueError: If the support is discrete or not an interval (e.g. a simplex),
        which NUTS over gpytorch constraints cannot represent.
    """
    base = support
    while isinstance(base, support_constraints.independent):
        base = base.base_constraint
    if base.is_discrete:
        raise ValueError(f"the prior's support {support} is discrete: NUTS needs continuous hyperparameters")
    lower = getattr(base, "lower_bound", None)
    upper = getattr(base, "upper_bound", None)
    if lower is None and upper is None and base is not support_constraints.real:
        raise ValueError(f"the prior's support {support} is not an interval of the real line: a gpytorch "
                         "constraint (an interval) cannot represent it")
    return (-math.inf if lower is None else float(lower), math.inf if upper is None else float(upper))


def check_support(prior: Any, constraint: Interval | None, name: str) -> None:
    """Raise if a prior's support is not inside a constraint's range (module docstring).

    :param prior: A torch/gpytorch distribution (anything with ``.support``).
    :param constraint: The gpytorch constraint of the parameter (``None``: not checked).
    :param name: The prior's name, for the message.
    :raises ValueError: If the support reaches outside the constraint's range, or is
        not a real interval.
    """
    if constraint is None:
        return
    low, high = support_bounds(prior.support)
    c_low = float(torch.as_tensor(constraint.lower_bound).min())
    c_high = float(torch.as_tensor(constraint.upper_bound).max())
    if c_low <= low and high <= c_high:
        return
    if low == 0.0 and high == math.inf:
        advice = "use gpytorch.constraints.Positive() (e.g. GaussianLikelihood(noise_constraint=Positive()))"
    elif math.isfinite(low) and math.isfinite(high):
        advice = f"use gpytorch.constraints.Interval({low:g}, {high:g}) or wider"
    elif math.isfinite(low):
        advice = f"use gpytorch.constraints.GreaterThan({low:g}) or a wider constraint"
    else:
        advice = "give the parameter a constraint whose range covers the support, or a prior inside the constraint"
    raise ValueError(
        f"prior {name} ({type(prior).__name__}) has support [{low:g}, {high:g}] but its parameter is "
        f"constrained to [{c_low:g}, {c_high:g}] by {constraint}: Pyro samples anywhere in the support, "
        f"which the constraint cannot represent (gpytorch issue 2646); {advice}")


def _constraint_of(module: Module, prior_name: str) -> Interval | None:
    if not prior_name.endswith("_prior"):
        return None
    value_name = prior_name[: -len("_prior")]
    constraints = getattr(module, "_constraints", {})
    for key in (f"raw_{value_name}_constraint", f"{value_name}_constraint"):
        if key in constraints:
            return constraints[key]
    return None


def prior_sites(model: Module) -> list[PriorSite]:
    """Every hyperparameter of ``model`` with a prior, checked against its constraint.

    Priors shared between modules (the same object registered twice) give one site,
    as in :meth:`gpytorch.Module.pyro_sample_from_prior`.

    :param model: A gpytorch module (e.g. a :class:`~gp_couple.models.GraphGP`).
    :return: The sites, in module order.
    :raises TypeError: If ``model`` is not a gpytorch Module.
    :raises ValueError: If no hyperparameter has a prior, a prior has no setting
        closure, or a prior's support does not fit its constraint.
    """
    if not isinstance(model, Module):
        raise TypeError(f"model must be a gpytorch Module, got {type(model).__name__}")
    sites: list[PriorSite] = []
    seen: set[int] = set()
    for name, module, prior, closure, setting_closure in model.named_priors():
        if id(prior) in seen:
            continue
        seen.add(id(prior))
        if setting_closure is None:
            raise ValueError(f"prior {name} has no setting closure, so sampled values cannot be stored: "
                             "register it with register_prior(name, prior, closure, setting_closure)")
        constraint = _constraint_of(module, name.rsplit(".", 1)[-1])
        check_support(prior, constraint, name)
        with torch.no_grad():
            shape = closure(module).shape
        sites.append(PriorSite(name, module, prior, closure, setting_closure, constraint, shape))
    if not sites:
        raise ValueError("model has no hyperparameters with priors: register priors (e.g. "
                         "ScaleKernel(..., outputscale_prior=GammaPrior(2.0, 2.0))) on those NUTS should sample")
    return sites
