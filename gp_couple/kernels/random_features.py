r"""GPyTorch kernels built from coupled random Fourier / Laplace features (paper, Section 3 "Random
Fourier features and random Laplace features" [sec:rffs_and_rlfs]).

:class:`CoupledRFFKernel` and :class:`CoupledRLFKernel` approximate the Gaussian kernel

.. math::

    k(\boldsymbol x, \boldsymbol y) = \exp\!\big(-\tfrac12 \|(\boldsymbol x - \boldsymbol y) / \boldsymbol\ell\|^2\big)
    \approx \phi(\boldsymbol x / \boldsymbol\ell)^\top \phi(\boldsymbol y / \boldsymbol\ell)

with ``num_features`` frequencies drawn by a
:class:`~gp_couple.couplings.FrequencyCoupling`; wrap them in
:class:`gpytorch.kernels.ScaleKernel` for an amplitude. They return low-rank
operators (:class:`~linear_operator.operators.LowRankRootLinearOperator` for
:math:`k(X, X)`, :class:`~linear_operator.operators.MatmulLinearOperator` otherwise), so
an :class:`gpytorch.models.ExactGP` with Gaussian noise is a sparse-spectrum GP
(Lázaro-Gredilla et al. 2010) trained in :math:`O(N m^2)` through the Woodbury identity,
and predicts through gpytorch's ``LinearPredictionStrategy``.

Randomness lives in buffers drawn eagerly at construction (the coupling's *noise*);
the frequencies are recomputed from it in every forward pass, so a learnable coupling
(:class:`~gp_couple.couplings.GaussianCopulaCoupling`) is trained by gradient descent,
``load_state_dict`` into a freshly built kernel restores the exact frequencies (even
after :meth:`~CoupledRandomFeatureKernel.resample` changed their number), and
:meth:`~CoupledRandomFeatureKernel.resample` draws new ones explicitly.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from gpytorch.kernels import Kernel
from gpytorch.models import exact_prediction_strategies
from linear_operator.operators import (
    LinearOperator,
    LowRankRootLinearOperator,
    MatmulLinearOperator,
    RootLinearOperator,
)
from torch import Tensor

from .._checks import check_positive_int
from .._random import SeedLike, as_numpy_generator
from ..couplings.frequencies import FREQUENCY_COUPLINGS, FrequencyCoupling, get_frequency_coupling
from ..features.fourier import check_finite_inputs, feature_map, gaussian_kernel, num_feature_columns
from ..optimize import Convergence, TrainingHistory, check_schedule, minimize
from ._inputs import InputCache, same_inputs
from ._state import check_state_tensors

__all__ = [
    "CoupledRandomFeatureKernel",
    "CoupledRFFKernel",
    "CoupledRLFKernel",
    "gram_rmse",
    "fit_coupling",
]

_NOISE_PREFIX = "noise_"


class CoupledRandomFeatureKernel(Kernel):
    r"""Base class of Gaussian kernels estimated by coupled random features.

    Subclasses set :attr:`feature_map_name` (a key of
    :data:`gp_couple.features.fourier.FEATURE_MAPS`) and :attr:`default_coupling`.

    :param num_features: Number of frequencies :math:`m \ge 1`.
    :param num_dims: Input dimension :math:`d` (after ``active_dims``); inferred from
        ``active_dims`` or ``ard_num_dims`` when omitted. Needed up front because the
        frequencies are drawn at construction.
    :param coupling: A :class:`~gp_couple.couplings.FrequencyCoupling` or its name (see
        :func:`~gp_couple.couplings.get_frequency_coupling`); default
        :attr:`default_coupling`. A coupling with parameters becomes a sub-module.
    :param seed: Seed of the initial frequencies (same int seed, same frequencies); ``None``
        draws them from torch's global generator, so ``torch.manual_seed`` reproduces them
        (gpytorch's convention, as in :class:`gpytorch.kernels.RFFKernel`).
    :param kwargs: Passed to :class:`gpytorch.kernels.Kernel` (``ard_num_dims``,
        ``batch_shape``, ``active_dims``, ``lengthscale_prior``,
        ``lengthscale_constraint``). Batch members get independent frequencies.
    """

    has_lengthscale = True
    #: Feature map used by the kernel (``"rff"`` or ``"rlf"``).
    feature_map_name: ClassVar[str]
    #: Coupling used when none is given.
    default_coupling: ClassVar[str]

    def __init__(self, num_features: int, num_dims: int | None = None,
                 coupling: FrequencyCoupling | str | None = None, *, seed: SeedLike = None,
                 **kwargs: Any) -> None:
        if not hasattr(type(self), "feature_map_name"):
            raise TypeError(f"{type(self).__name__} does not set feature_map_name: use CoupledRFFKernel, "
                            "CoupledRLFKernel or a subclass that sets it")
        num_features = check_positive_int("num_features", num_features)
        num_dims = self._infer_num_dims(num_dims, kwargs.get("ard_num_dims"), kwargs.get("active_dims"))
        super().__init__(**kwargs)
        # Inputs checked to be finite: a training loop checks its inputs once, not every step.
        self._finite_inputs = InputCache()
        self.num_dims = num_dims
        self._num_features = num_features
        self.coupling = get_frequency_coupling(
            self.default_coupling if coupling is None else coupling, dim=num_dims)
        self._noise_keys: tuple[str, ...] = ()
        self._feature_fn = feature_map(self.feature_map_name)
        self.resample(seed)

    @staticmethod
    def _infer_num_dims(num_dims: int | None, ard_num_dims: int | None, active_dims: Any) -> int:
        candidates = {}
        if ard_num_dims is not None and ard_num_dims != 1:
            candidates["ard_num_dims"] = check_positive_int("ard_num_dims", ard_num_dims)
        if active_dims is not None:
            dims = torch.as_tensor(active_dims).reshape(-1)
            if dims.dtype == torch.bool or dims.dtype.is_floating_point or dims.dtype.is_complex:
                raise TypeError(f"active_dims must hold integer input dimensions, got dtype {dims.dtype}")
            if dims.numel() == 0 or bool((dims < 0).any()) or dims.unique().numel() != dims.numel():
                raise ValueError(f"active_dims must be distinct non-negative input dimensions, got {dims.tolist()}")
            candidates["active_dims"] = dims.numel()
        if num_dims is None:
            if not candidates:
                raise ValueError("num_dims is required (the frequencies are drawn at construction); "
                                 "pass num_dims=<input dimension>")
            num_dims = next(iter(candidates.values()))
        num_dims = check_positive_int("num_dims", num_dims)
        for name, value in candidates.items():
            if value != num_dims:
                raise ValueError(f"{name} implies {value} input dimensions but num_dims={num_dims}")
        return num_dims

    # ------------------------------------------------------------------ frequencies

    @property
    def num_features(self) -> int:
        """Number of frequencies :math:`m`."""
        return self._num_features

    @property
    def num_feature_columns(self) -> int:
        """Columns of the feature matrix (:math:`2m` for RFFs, :math:`m` for RLFs)."""
        return num_feature_columns(self.feature_map_name, self._num_features)

    @property
    def noise(self) -> dict[str, Tensor]:
        """The coupling's stored noise (buffers ``noise_<key>``)."""
        return {key: getattr(self, _NOISE_PREFIX + key) for key in self._noise_keys}

    @property
    def frequencies(self) -> Tensor:
        """Frequencies ``(*batch_shape, num_features, num_dims)`` before division by the lengthscale."""
        return self.coupling(self.noise, self._num_features, dim=self.num_dims, batch_shape=self.batch_shape)

    def resample(self, seed: SeedLike = None, *,
                 num_features: int | None = None) -> CoupledRandomFeatureKernel:
        """Draw new frequencies (optionally a new number of them), in place.

        An :class:`~gpytorch.models.ExactGP` in eval mode caches its prediction
        strategy: call ``model.train()`` before predicting again.

        :param seed: Seed or generator for the new noise.
        :param num_features: New number of frequencies (default: unchanged).
        :return: This kernel (like :meth:`gp_couple.kernels.GRFKernel.resample`).
        """
        if num_features is not None:
            self._num_features = check_positive_int("num_features", num_features)
        reference = self.raw_lengthscale
        noise = self.coupling.draw_noise(self._num_features, self.num_dims,
                                         batch_shape=self.batch_shape, seed=seed,
                                         dtype=reference.dtype, device=reference.device)
        for key in self._noise_keys:
            if key not in noise:
                delattr(self, _NOISE_PREFIX + key)
        for key, tensor in noise.items():
            self.register_buffer(_NOISE_PREFIX + key, tensor)
        self._noise_keys = tuple(noise)
        return self

    # ------------------------------------------------------------------ state

    def get_extra_state(self) -> dict[str, Any]:
        # The coupling's registered description (type and constructor arguments), so
        # that the saved state says which coupling it needs; an unregistered coupling
        # class can only be described by its name.
        coupling = (self.coupling.to_dict() if FREQUENCY_COUPLINGS.is_registered(self.coupling)
                    else self.coupling.name)
        return {"num_features": self._num_features, "num_dims": self.num_dims, "coupling": coupling}

    def _check_extra_state(self, state: Any) -> int:
        if not isinstance(state, dict) or "num_features" not in state:
            raise ValueError(f"not a {type(self).__name__} state: {state!r}")
        if state.get("num_dims", self.num_dims) != self.num_dims:
            raise ValueError(f"the saved kernel has num_dims={state['num_dims']} but this one has "
                             f"num_dims={self.num_dims}")
        saved = state.get("coupling", self.coupling.name)
        if isinstance(saved, dict):
            # Parses through the registry (a clear error for an unknown type); its
            # parameters themselves are restored from the state dict's tensors.
            saved = FREQUENCY_COUPLINGS.from_dict(saved).name
        if saved != self.coupling.name:
            raise ValueError(f"the saved kernel uses the {saved!r} coupling but this one "
                             f"uses {self.coupling.name!r}: build it with coupling={saved!r}")
        return check_positive_int("num_features", state["num_features"])

    def set_extra_state(self, state: Any) -> None:
        self._num_features = self._check_extra_state(state)

    def _check_saved_noise(self, state_dict: dict[str, Any], prefix: str, num_features: int) -> None:
        """Check that the saved noise (or the kept one) gives ``num_features`` frequencies of this kernel's shape."""
        noise = {}
        for key, current in self.noise.items():
            saved = state_dict.get(prefix + _NOISE_PREFIX + key, current)
            if not isinstance(saved, Tensor) or not saved.dtype.is_floating_point:
                raise TypeError(f"{prefix}{_NOISE_PREFIX}{key}: expected a floating-point tensor in the state dict, "
                                f"got {saved.dtype if isinstance(saved, Tensor) else type(saved).__name__}")
            noise[key] = saved.to(device=current.device, dtype=current.dtype)
        try:
            with torch.no_grad():
                self.coupling(noise, num_features, dim=self.num_dims, batch_shape=self.batch_shape)
        except (ValueError, TypeError, RuntimeError, IndexError, KeyError) as error:
            raise ValueError(f"{prefix}{_NOISE_PREFIX}*: the saved noise does not give {num_features} frequencies "
                             f"of dimension {self.num_dims} for batch shape {tuple(self.batch_shape)} "
                             f"({error})") from error

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: Any,
                              strict: bool, missing_keys: list[str], unexpected_keys: list[str],
                              error_msgs: list[str]) -> None:
        # Validate everything before anything is copied, so that a bad state leaves the kernel intact.
        key = prefix + "_extra_state"
        num_features = self._check_extra_state(state_dict[key]) if key in state_dict else self._num_features
        self._check_saved_noise(state_dict, prefix, num_features)
        check_state_tensors(self, state_dict, prefix, [_NOISE_PREFIX + key for key in self._noise_keys])
        # The saved noise may hold more or fewer frequencies (after resample(num_features=...)):
        # re-register those buffers with the incoming shapes so that copying succeeds.
        for key in self._noise_keys:
            incoming = state_dict.get(prefix + _NOISE_PREFIX + key)
            current = getattr(self, _NOISE_PREFIX + key)
            if isinstance(incoming, Tensor) and incoming.shape != current.shape:
                self.register_buffer(_NOISE_PREFIX + key,
                                     torch.empty(incoming.shape, dtype=current.dtype, device=current.device))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    # ------------------------------------------------------------------ evaluation

    def _featurize(self, x: Tensor, name: str) -> Tensor:
        if x.shape[-1] != self.num_dims:
            raise ValueError(f"{name} has {x.shape[-1]} input dimensions but the kernel was built "
                             f"for num_dims={self.num_dims}")
        if self._finite_inputs.get(x) is None:
            check_finite_inputs(x, name)
            self._finite_inputs.put(x, True)
        features = self._feature_fn(x, self.frequencies, self.lengthscale, check_finite=False)
        self._check_features(features, x, name)
        return features

    def _check_features(self, features: Tensor, x: Tensor, name: str) -> None:
        """Hook: refuse features that cannot estimate the kernel at ``x`` (after the map)."""

    def _check_raw_inputs(self, x: Any, name: str) -> None:
        """The public edge of raw inputs ``(..., n, D)``: a tensor whose ``D`` covers ``active_dims``."""
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if self.active_dims is not None and x.dim() >= 1:
            needed = int(self.active_dims.max()) + 1
            if x.shape[-1] < needed:
                raise ValueError(f"{name} has {x.shape[-1]} input dimensions but active_dims="
                                 f"{self.active_dims.tolist()} selects dimension {needed - 1}")

    def __call__(self, x1: Tensor, x2: Tensor | None = None, diag: bool = False, last_dim_is_batch: bool = False,
                 **params: Any) -> Any:
        self._check_raw_inputs(x1, "x1")
        if x2 is not None:
            self._check_raw_inputs(x2, "x2")
        return super().__call__(x1, x2, diag=diag, last_dim_is_batch=last_dim_is_batch, **params)

    def features(self, x: Tensor) -> Tensor:
        r"""Feature matrix :math:`\phi(\boldsymbol x / \boldsymbol\ell)` ``(..., n, F)`` (``active_dims`` applied).

        :param x: Inputs ``(..., n, D)``.
        :raises TypeError: If ``x`` is not a tensor.
        :raises ValueError: If ``x`` has too few dimensions for ``active_dims``, another
            number than ``num_dims`` after them, a batch shape that does not broadcast
            with the kernel's, or NaN or infinite values.
        """
        self._check_raw_inputs(x, "x")
        if x.dim() == 1:
            x = x.unsqueeze(-1)
        if self.active_dims is not None:
            x = x.index_select(-1, self.active_dims)
        self._check_batch(x, "x")
        return self._featurize(x, "x")

    def _check_batch(self, x: Tensor, name: str, other: Tensor | None = None) -> None:
        shapes = {name: tuple(x.shape[:-2])}
        if other is not None:
            shapes["x2"] = tuple(other.shape[:-2])
        try:
            torch.broadcast_shapes(*shapes.values(), self.batch_shape)
        except RuntimeError:
            described = ", ".join(f"{key} {shape}" for key, shape in shapes.items())
            raise ValueError(f"input batch shapes ({described}) do not broadcast with the kernel's batch_shape "
                             f"{tuple(self.batch_shape)}: every batch member has its own frequencies") from None

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False,
                **params: Any) -> Tensor | LinearOperator:
        if last_dim_is_batch:
            raise ValueError("last_dim_is_batch is not supported by random-feature kernels: "
                             "their frequencies live in the full input space")
        self._check_batch(x1, "x1", x2)
        z1 = self._featurize(x1, "x1")
        x1_eq_x2 = same_inputs(x1, x2)
        z2 = z1 if x1_eq_x2 else self._featurize(x2, "x2")
        if diag:
            return (z1 * z2).sum(-1)
        if x1_eq_x2:
            # Low rank pays off only with fewer feature columns than points.
            if z1.size(-1) < z1.size(-2):
                return LowRankRootLinearOperator(z1)
            return RootLinearOperator(z1)
        return MatmulLinearOperator(z1, z2.mT)

    def prediction_strategy(self, train_inputs: Any, train_prior_dist: Any, train_labels: Tensor,
                            likelihood: Any) -> exact_prediction_strategies.PredictionStrategy:
        # Predictions in feature space: O(m^2) per test point after an O(N m^2) cache.
        return exact_prediction_strategies.LinearPredictionStrategy(
            train_inputs, train_prior_dist, train_labels, likelihood)

    def extra_repr(self) -> str:
        return f"num_features={self._num_features}, num_dims={self.num_dims}, coupling={self.coupling.name!r}"


class CoupledRFFKernel(CoupledRandomFeatureKernel):
    r"""Gaussian kernel estimated by coupled random Fourier features (paper, eq. (3), the RFF map,
    Section 3 [eq:rff_exp]).

    .. math::

        \widehat k(\boldsymbol x, \boldsymbol y) = \frac1m \sum_{i=1}^m
        \cos\big(\boldsymbol\omega_i^\top (\boldsymbol x - \boldsymbol y) / \boldsymbol\ell\big)

    Default coupling: pairwise norm-coupled orthogonal frequencies (``"pnc"``). The
    feature matrix has :math:`2m` columns.

    Example::

        kernel = gpytorch.kernels.ScaleKernel(
            CoupledRFFKernel(num_features=64, num_dims=8, ard_num_dims=8, seed=0))
    """

    feature_map_name = "rff"
    default_coupling = "pnc"


class CoupledRLFKernel(CoupledRandomFeatureKernel):
    r"""Gaussian kernel estimated by coupled random Laplace features (paper, eq. (4), the RLF map,
    Section 3 [eq:rlf_exp]).

    .. math::

        \widehat k(\boldsymbol x, \boldsymbol y) = \frac1m \sum_{i=1}^m
        \exp\big(\boldsymbol\omega_i^\top (\boldsymbol x + \boldsymbol y)
        - \|\boldsymbol x\|^2 - \|\boldsymbol y\|^2\big)
        \quad\text{on } \boldsymbol x / \boldsymbol\ell, \boldsymbol y / \boldsymbol\ell

    Every estimate is positive, but the variance grows like
    :math:`\exp(\|\boldsymbol x + \boldsymbol y\|^2)`: keep inputs / lengthscale small.
    Default coupling: PNC with antithetic pairs (``"pnc+antithetic"``), the paper's best
    RLF coupling. The estimate depends on :math:`\boldsymbol x + \boldsymbol y`, so the
    kernel is not stationary as a function of the draws.

    Far from the origin the estimate itself, not only its computation, vanishes: at
    :math:`\boldsymbol x = \boldsymbol y` it is
    :math:`\frac1m\sum_i \exp(2\boldsymbol\omega_i^\top\boldsymbol x - 2\|\boldsymbol x\|^2)`
    with :math:`\boldsymbol\omega_i^\top\boldsymbol x = O(\|\boldsymbol x\|)`, e.g.
    :math:`e^{-2\cdot 10^4}` at :math:`\|\boldsymbol x / \boldsymbol\ell\| = 100`
    where :math:`k(\boldsymbol x, \boldsymbol x) = 1`; no rescaling of the features can
    recover it. So inputs whose estimate of :math:`k(\boldsymbol x, \boldsymbol x)`
    underflows (below the dtype's smallest normal number, where the Gram matrix would
    silently hold zeros) raise a :class:`ValueError` naming the input row and
    :math:`\|\boldsymbol x / \boldsymbol\ell\|`: centre and scale the inputs, use a
    longer lengthscale, or :class:`CoupledRFFKernel` (one value is read back from an
    accelerator per evaluation).
    """

    feature_map_name = "rlf"
    default_coupling = "pnc+antithetic"

    @property
    def is_stationary(self) -> bool:
        return False

    def _check_features(self, features: Tensor, x: Tensor, name: str) -> None:
        # |phi(x)|^2 estimates k(x, x) = 1; where it underflows, every Gram entry of the row does.
        diagonal = features.detach().square().sum(-1)
        underflow = diagonal < torch.finfo(diagonal.dtype).tiny
        if bool(underflow.any()):
            position = tuple(int(i) for i in underflow.nonzero()[0])
            norms = (x.detach() / self.lengthscale.detach()).norm(dim=-1).expand(diagonal.shape)
            raise ValueError(
                f"{name} row {position[-1] if len(position) == 1 else position}: the random Laplace features "
                f"underflow to 0 at |x / lengthscale| = {float(norms[position]):.3g} (the estimate of "
                f"k(x, x) = 1 is {float(diagonal[position]):.3g}), so the Gram matrix would hold zeros where "
                "the Gaussian kernel is near 1: RLF estimates vanish far from the origin (their variance grows "
                "like exp(|x + y|^2)); centre and scale the inputs, use a longer lengthscale, or use "
                "CoupledRFFKernel")


# --------------------------------------------------------------------------- coupling fitting


def gram_rmse(coupling: FrequencyCoupling | str, inputs: Tensor, num_features: int,
              feature_map_name: str = "rff", *, num_draws: int = 1, seed: SeedLike = None,
              exact: Tensor | None = None) -> Tensor:
    r"""Per-draw RMSE of the estimated Gram matrix (paper, eq. (35), the copula's RMSE loss,
    Appendix A.5 [eq:rmseloss], before the expectation).

    .. math::

        \sqrt{\frac{1}{N^2}\sum_{i,j=1}^N \big(\phi(\boldsymbol x_i)^\top\phi(\boldsymbol x_j)
        - k(\boldsymbol x_i, \boldsymbol x_j)\big)^2}

    Differentiable in the parameters of a learnable coupling.

    :param coupling: Coupling (or name) drawing the frequencies.
    :param inputs: Inputs ``(N, d)``, already divided by the lengthscale.
    :param num_features: Frequencies per draw.
    :param feature_map_name: ``"rff"`` or ``"rlf"``.
    :param num_draws: Independent draws.
    :param seed: Seed or generator.
    :param exact: The exact Gram matrix (computed from ``inputs`` if omitted).
    :return: Tensor ``(num_draws,)``.
    """
    coupling = get_frequency_coupling(coupling, dim=inputs.shape[-1])
    fmap = feature_map(feature_map_name)
    if exact is None:
        exact = gaussian_kernel(inputs)
    batch_shape = (check_positive_int("num_draws", num_draws),)
    noise = coupling.draw_noise(num_features, inputs.shape[-1], batch_shape=batch_shape,
                                seed=seed, dtype=inputs.dtype, device=inputs.device)
    features = fmap(inputs, coupling(noise, num_features, dim=inputs.shape[-1], batch_shape=batch_shape))
    errors = features @ features.mT - exact
    return errors.square().mean(dim=(-2, -1)).sqrt()


def fit_coupling(kernel: CoupledRandomFeatureKernel, inputs: Tensor, *, iterations: int = 500,
                 lr: float = 1e-2, convergence: Convergence | None = None, samples_per_step: int = 8,
                 seed: SeedLike = None) -> TrainingHistory:
    r"""Fit a learnable coupling's parameters to minimise the kernel RMSE on data (paper, Appendix
    A.5 "Copulas as numerical OT solvers" [app:copulas]).

    Minimises eq. (35), the copula's RMSE loss, Appendix A.5 [eq:rmseloss], :math:`\mathcal
    L(\boldsymbol\theta) = \mathbb E\,\mathrm{RMSE}`, by Adam with the reparameterisation trick
    (:func:`gp_couple.optimize.minimize`): every step draws ``samples_per_step``
    fresh noise sets and averages their Gram RMSEs on ``inputs`` scaled by the kernel's
    (fixed) lengthscale. Only the coupling's parameters change; the kernel's stored
    noise is untouched, and its frequencies follow the fitted coupling immediately.
    The loss is stochastic, so the optimiser is Adam (L-BFGS needs a deterministic objective).

    :param kernel: Kernel whose ``coupling`` has trainable parameters.
    :param inputs: Training inputs ``(N, D)`` (``active_dims`` applied here; moved to the
        kernel's device and dtype).
    :param iterations: Adam steps.
    :param lr: Adam learning rate.
    :param convergence: Stopping rule (:class:`gp_couple.optimize.Convergence`, on window
        means of the noisy loss); ``None`` runs all ``iterations``.
    :param samples_per_step: Noise draws per step (more gives smoother gradients).
    :param seed: Seed or generator of the training noise.
    :return: The training loss of every step, with how training ended
        (:class:`gp_couple.optimize.TrainingHistory`).
    :raises TypeError: If ``kernel`` is not a coupled random-feature kernel.
    :raises ValueError: For a coupling without trainable parameters, a batched kernel,
        inputs of the wrong shape or a bad schedule.
    """
    if not isinstance(kernel, CoupledRandomFeatureKernel):
        raise TypeError(f"kernel must be a CoupledRandomFeatureKernel, got {type(kernel).__name__}")
    parameters = dict(kernel.coupling.named_parameters())
    if not any(parameter.requires_grad for parameter in parameters.values()):
        raise ValueError(f"the {kernel.coupling.name!r} coupling has no trainable parameters to fit")
    if len(kernel.batch_shape):
        raise ValueError("fit_coupling needs a kernel without batch dimensions")
    check_schedule(iterations, lr)
    samples_per_step = check_positive_int("samples_per_step", samples_per_step)
    if not isinstance(inputs, Tensor) or inputs.dim() != 2:
        raise ValueError("inputs must be a 2-D tensor (N, D)")
    reference = kernel.raw_lengthscale
    inputs = inputs.to(device=reference.device, dtype=reference.dtype)
    if kernel.active_dims is not None:
        inputs = inputs.index_select(-1, kernel.active_dims)
    if inputs.shape[-1] != kernel.num_dims:
        raise ValueError(f"inputs have {inputs.shape[-1]} dimensions but the kernel has "
                         f"num_dims={kernel.num_dims}")
    with torch.no_grad():
        scaled = inputs / kernel.lengthscale.reshape(-1)
        exact = gaussian_kernel(scaled)
    rng = as_numpy_generator(seed)

    def loss() -> Tensor:
        return gram_rmse(kernel.coupling, scaled, kernel.num_features, kernel.feature_map_name,
                         num_draws=samples_per_step, seed=rng, exact=exact).mean()

    return minimize(loss, parameters, iterations=iterations, lr=lr, convergence=convergence,
                    description="fitting the coupling")
