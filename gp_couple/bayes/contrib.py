r"""gp_couple kernels as :mod:`pyro.contrib.gp` kernels (``GPRegression``, ``SparseGPRegression``, ``VariationalGP``).

:class:`GPyTorchKernel` adapts any gpytorch kernel: each of its constrained
hyperparameters becomes a Pyro attribute of the adapter, a
:class:`~pyro.nn.module.PyroParam` in the constrained space (its support translated from
the gpytorch constraint), which may be replaced by a :class:`~pyro.nn.module.PyroSample`
for a prior. Every evaluation calls the gpytorch kernel itself through
:func:`torch.func.functional_call` with ``raw = constraint.inverse_transform(value)``
substituted for its raw parameters, so the features (the GRF walks of
:class:`~gp_couple.kernels.GRFKernel`, the coupled frequencies of
:class:`~gp_couple.kernels.CoupledRFFKernel`) and their couplings are those of the
gpytorch kernel: there is no second implementation, and the adapter and the gpytorch
kernel give the same matrix for the same seed and hyperparameters.

The thin subclasses :class:`PyroGRFKernel`, :class:`PyroCoupledRFFKernel` and
:class:`PyroCoupledRLFKernel` build the gpytorch kernel (inside a
:class:`~gpytorch.kernels.ScaleKernel`) from the same arguments and name the amplitude
``variance``, as Pyro's own kernels do::

    kernel = PyroGRFKernel(graph, num_walkers=16, p_halt=0.4, seed=0)
    kernel.gamma = PyroSample(dist.Gamma(3.0, 2.0))        # a prior on the diffusion gamma
    gpr = pyro.contrib.gp.models.GPRegression(train_nodes.double(), y, kernel)

Node indices are the inputs of graph kernels (a float tensor ``(n,)`` or ``(n, 1)``).
In ``SparseGPRegression`` the inducing inputs are node indices too: they receive no
gradient (indices are not differentiable), so optimisers leave them in place.

A ``PyroSample`` prior must fit the constraint as in NUTS
(:func:`gp_couple.bayes.priors.check_support`): assigning one that does not raises
:class:`ValueError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gpytorch
import pyro.contrib.gp as gp
import torch
from gpytorch.constraints import Interval
from linear_operator import to_dense
from pyro.distributions import constraints
from pyro.nn.module import PyroParam, PyroSample
from torch import Tensor
from torch.distributions import Distribution

from ..graphs import Graph
from ..kernels.grf_kernel import GRFKernel
from ..kernels.random_features import CoupledRFFKernel, CoupledRLFKernel
from .priors import check_support

__all__ = ["GPyTorchKernel", "PyroGRFKernel", "PyroCoupledRFFKernel", "PyroCoupledRLFKernel"]


def _support(constraint: Interval | None) -> constraints.Constraint:
    """The torch support of the values a gpytorch constraint can represent."""
    if constraint is None:
        return constraints.real
    low = float(torch.as_tensor(constraint.lower_bound).min())
    high = float(torch.as_tensor(constraint.upper_bound).max())
    if low == float("-inf") and high == float("inf"):
        return constraints.real
    if high == float("inf"):
        return constraints.positive if low == 0.0 else constraints.greater_than(low)
    if low == float("-inf"):
        return constraints.less_than(high)
    return constraints.interval(low, high)


class _DenseEvaluation(torch.nn.Module):
    """Evaluates a gpytorch kernel eagerly to a dense tensor (inside functional_call)."""

    def __init__(self, kernel: gpytorch.kernels.Kernel) -> None:
        super().__init__()
        self.kernel = kernel

    def forward(self, x1: Tensor, x2: Tensor, diag: bool) -> Tensor:
        # Evaluate while functional_call's substituted parameters are in place.
        with gpytorch.settings.lazily_evaluate_kernels(False):
            return to_dense(self.kernel(x1, x2, diag=diag))


class GPyTorchKernel(gp.kernels.Kernel):
    """A gpytorch kernel as a :class:`pyro.contrib.gp.kernels.Kernel` (module docstring).

    The gpytorch kernel is held outside the module tree (so Pyro neither registers
    nor trains its raw parameters; the adapter's Pyro attributes are the
    hyperparameters), but follows ``.to()`` / ``.double()``. Its walks or frequencies
    are a deterministic function of its seed: rebuild the adapter with the same seed
    before loading a saved state dict.

    :param kernel: The gpytorch kernel (e.g. ``ScaleKernel(GRFKernel(graph))``).
    :param input_dim: Number of input columns the kernel acts on.
    :param active_dims: Input columns to use (Pyro's convention; default all).
    :param names: Pyro attribute names for gpytorch hyperparameters, keyed by their
        dotted gpytorch name without ``raw_`` (e.g. ``{"outputscale": "variance"}``).
        Unnamed ones use their last name component (``"base_kernel.kernel_family.gamma"``
        gives ``gamma``), or the whole dotted name with ``_`` if that is ambiguous.
    :raises TypeError: If ``kernel`` is not a gpytorch kernel.
    :raises ValueError: If ``names`` maps to unknown or clashing names.
    """

    #: Inputs are indices (no gradient flows to them, e.g. Pyro's inducing inputs ``Xu``).
    discrete_inputs: bool = False

    def __init__(self, kernel: gpytorch.kernels.Kernel, input_dim: int, active_dims: list[int] | None = None,
                 names: Mapping[str, str] | None = None) -> None:
        if not isinstance(kernel, gpytorch.kernels.Kernel):
            raise TypeError(f"kernel must be a gpytorch Kernel, got {type(kernel).__name__}")
        super().__init__(input_dim, active_dims)
        hyper = [(path, parameter, constraint) for path, parameter, constraint
                 in kernel.named_parameters_and_constraints()]
        values = {path: path.rsplit(".", 1) for path, _, _ in hyper}
        public = {path: ".".join(parts[:-1] + [parts[-1][4:] if parts[-1].startswith("raw_") else parts[-1]])
                  for path, parts in values.items()}
        names = dict(names or {})
        unknown = sorted(set(names) - set(public.values()))
        if unknown:
            raise ValueError(f"names has unknown hyperparameters {unknown}; the kernel's are "
                             f"{sorted(public.values())}")
        short = [public[path].rsplit(".", 1)[-1] for path, _, _ in hyper]
        self._hyper: list[tuple[str, str, Interval | None]] = []
        for (path, parameter, constraint), last in zip(hyper, short):
            dotted = public[path]
            attribute = names.get(dotted, last if short.count(last) == 1 else dotted.replace(".", "_"))
            if any(attribute == existing for existing, _, _ in self._hyper):
                raise ValueError(f"two hyperparameters would both be called {attribute!r}; pass names=")
            with torch.no_grad():
                value = parameter if constraint is None else constraint.transform(parameter)
            self._hyper.append((attribute, "kernel." + path, constraint))
            setattr(self, attribute, PyroParam(value.detach().clone(), _support(constraint)))
            parameter.requires_grad_(False)
        # A tuple hides the evaluator from torch's and Pyro's module traversal.
        self._evaluation = (_DenseEvaluation(kernel),)

    @property
    def gpytorch_kernel(self) -> gpytorch.kernels.Kernel:
        """The wrapped gpytorch kernel (its hyperparameters are not used; see the Pyro attributes)."""
        return self._evaluation[0].kernel

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> GPyTorchKernel:
        self._evaluation[0]._apply(fn, *args, **kwargs)
        return super()._apply(fn, *args, **kwargs)

    @property
    def hyperparameter_names(self) -> tuple[str, ...]:
        """The Pyro attribute names of the hyperparameters."""
        return tuple(attribute for attribute, _, _ in self._hyper)

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, PyroSample) and isinstance(value.prior, Distribution):
            for attribute, _, constraint in self.__dict__.get("_hyper", ()):
                if attribute == name:
                    check_support(value.prior, constraint, f"{type(self).__name__}.{name}")
        super().__setattr__(name, value)

    def _raw_parameters(self) -> dict[str, Tensor]:
        raw = {}
        for attribute, path, constraint in self._hyper:
            value = getattr(self, attribute)
            raw[path] = value if constraint is None else constraint.inverse_transform(value)
        return raw

    def forward(self, X: Tensor, Z: Tensor | None = None, diag: bool = False) -> Tensor:
        """The covariance ``k(X, Z)`` (dense ``(n, m)``) or its diagonal ``(n,)``."""
        x1 = self._slice_input(X)
        x2 = x1 if Z is None else self._slice_input(Z)
        if self.discrete_inputs:
            x1, x2 = x1.detach(), x2.detach()
        return torch.func.functional_call(self._evaluation[0], self._raw_parameters(), (x1, x2, diag), strict=False)


class PyroGRFKernel(GPyTorchKernel):
    r"""The GRF kernel :math:`\sigma^2\,\phi(v_i)^\top\phi(v_j)` for :mod:`pyro.contrib.gp` (inputs: node indices).

    Builds ``ScaleKernel(GRFKernel(graph, ...))``: same walks for the same seed.
    Hyperparameters: ``variance`` and those of the kernel family (``gamma`` for the
    default :class:`~gp_couple.kernel_families.Diffusion`).

    :param graph: The graph.
    :param variance: Initial amplitude :math:`\sigma^2`.
    :param active_dims: The input column holding the node index (default ``[0]``).
    :param kwargs: Passed to :class:`~gp_couple.kernels.GRFKernel` (``num_walkers``,
        ``p_halt``, ``coupling``, ``kernel_family``, ``seed``, ``nodes``, ...).
    """

    discrete_inputs = True

    def __init__(self, graph: Graph, *, variance: float = 1.0, active_dims: list[int] | None = None,
                 **kwargs: Any) -> None:
        kernel = gpytorch.kernels.ScaleKernel(GRFKernel(graph, **kwargs))
        kernel.outputscale = variance
        super().__init__(kernel, 1, active_dims, names={"outputscale": "variance"})

    @property
    def grf_kernel(self) -> GRFKernel:
        """The gpytorch GRF kernel holding the walks."""
        return self.gpytorch_kernel.base_kernel


class _PyroRandomFeatureKernel(GPyTorchKernel):
    kernel_class: type

    def __init__(self, num_features: int, num_dims: int, coupling: Any = None, *, variance: float = 1.0,
                 lengthscale: float | Tensor = 1.0, seed: Any = None, active_dims: list[int] | None = None,
                 **kwargs: Any) -> None:
        base = self.kernel_class(num_features, num_dims, coupling, seed=seed, **kwargs)
        base.lengthscale = lengthscale
        kernel = gpytorch.kernels.ScaleKernel(base)
        kernel.outputscale = variance
        super().__init__(kernel, num_dims, active_dims, names={"outputscale": "variance",
                                                               "base_kernel.lengthscale": "lengthscale"})


class PyroCoupledRFFKernel(_PyroRandomFeatureKernel):
    r"""Coupled random Fourier features (:class:`~gp_couple.kernels.CoupledRFFKernel`) for :mod:`pyro.contrib.gp`.

    :param num_features: Number of frequencies :math:`m`.
    :param num_dims: Input dimension :math:`d`.
    :param coupling: Frequency coupling (default ``"pnc"``).
    :param variance: Initial amplitude :math:`\sigma^2`.
    :param lengthscale: Initial lengthscale(s) (pass ``ard_num_dims=d`` for one per dimension).
    :param seed: Seed of the frequencies (same seed, same frequencies as the gpytorch kernel).
    :param active_dims: Input columns (Pyro's convention).
    :param kwargs: Passed to the gpytorch kernel (e.g. ``ard_num_dims``).
    """

    kernel_class = CoupledRFFKernel


class PyroCoupledRLFKernel(_PyroRandomFeatureKernel):
    r"""Coupled random Laplace features (:class:`~gp_couple.kernels.CoupledRLFKernel`) for :mod:`pyro.contrib.gp`.

    Same parameters as :class:`PyroCoupledRFFKernel` (default coupling ``"pnc+antithetic"``).
    """

    kernel_class = CoupledRLFKernel
