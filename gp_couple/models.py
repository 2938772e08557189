r"""Exact GPs on graph nodes, their training loop and predictions.

:class:`GraphGP` is a :class:`gpytorch.models.ExactGP` whose inputs are node indices,
validated once here so that bad data fails with a clear message instead of deep inside
torch. With ``covar_module = ScaleKernel(GRFKernel(graph, ...))`` it is the scalable
GRF-GP of the paper (Section 4.2 "Experiments with σ-coupled GRFs" [sec:graph_gp_experiments]); with
``ScaleKernel(ExactGraphKernel(graph))`` it is the exact reference.

:func:`fit_gp` is the training loop of Appendix F.2 "Scalable GPs on graphs", paragraph "Training
GRF-GPs: technical details" [app:grf_gp_details] (Adam on the exact marginal
log-likelihood; the learnable hyperparameters are the outputscale :math:`\kappa`, the
graph-kernel hyperparameters, e.g. :math:`\gamma`, and the noise :math:`\sigma_n`), and
:func:`predict` returns predictive means and variances.

Library code never changes global gpytorch settings: wrap calls in
:func:`gp_couple.settings.grf_gp_settings` to choose between Cholesky and CG/Lanczos.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gpytorch
import numpy as np
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.likelihoods import Likelihood
from gpytorch.means import Mean, ZeroMean
from torch import Tensor

from ._nodes import node_index_tensor
from ._random import SeedLike, draw_seed, seeded_torch_rng
from .kernels.graph_node import GraphNodeKernel, graph_kernels
from .marginal_likelihood import DenseMarginalLogLikelihood
from .optimize import Convergence, TrainingHistory, check_ending, minimize, parameter_constraints
from .predictive_variance import VarianceEstimate, check_variance_method, posterior_variance
from .settings import flush_denormals

__all__ = ["GraphGP", "Prediction", "check_targets", "fit_gp", "predict", "module_device"]

_FLOAT32_EXACT = 2**24


def _module_dtype(module: torch.nn.Module) -> torch.dtype:
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.get_default_dtype()


def _as_array(value: Any, name: str) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be array-like, got {type(value).__name__}") from error


def check_targets(targets: Any, count: int, dtype: torch.dtype, *, allow_bool: bool = False) -> Tensor:
    """Validate observations (real, shape ``(count,)``, finite in ``dtype``) and return them as a ``dtype`` tensor.

    Finiteness is checked after the conversion: a value such as 1e39 is finite in float64
    but infinite in float32, where it would turn every prediction into NaN.

    :param targets: Tensor, array or sequence of observations.
    :param count: The number of training nodes they must match.
    :param dtype: The model's floating dtype.
    :param allow_bool: Accept booleans (0/1 labels of a classification likelihood).
    :raises TypeError: If the values are not real numbers.
    :raises ValueError: If the shape is wrong, or a value is NaN or infinite (in ``dtype``).
    """
    array = _as_array(targets, "train_targets")
    if (array.dtype == np.bool_ and not allow_bool) or np.iscomplexobj(array) \
            or not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise TypeError(f"train_targets must be real numbers, got dtype {array.dtype}")
    if array.shape != (count,):
        raise ValueError(f"train_targets must have shape ({count},) to match train_nodes, got {array.shape}")
    converted = torch.as_tensor(array.astype(np.float64)).to(dtype)
    finite = torch.isfinite(converted)
    if not bool(finite.all()):
        bad = int(torch.nonzero(~finite)[0, 0])
        raise ValueError(f"train_targets contains NaN or infinite values in the model's dtype {dtype} "
                         f"(first at position {bad}: {array[bad]!r})")
    return converted


def module_device(module: torch.nn.Module) -> torch.device:
    """Device of a module's first parameter or buffer (the CPU if it has none)."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return tensor.device
    return torch.device("cpu")


def _checked_modules(covar_module: Any, mean_module: Any) -> list[GraphNodeKernel]:
    """Check a model's covariance and mean modules; return the graph kernels inside the covariance."""
    if not isinstance(covar_module, gpytorch.kernels.Kernel):
        raise TypeError(f"covar_module must be a gpytorch Kernel, got {type(covar_module).__name__}")
    if mean_module is not None and not isinstance(mean_module, Mean):
        raise TypeError(f"mean_module must be a gpytorch Mean, got {type(mean_module).__name__}")
    return graph_kernels(covar_module)


def _node_inputs(nodes: Any, name: str, num_nodes: int | None, graph_kernels: list[GraphNodeKernel],
                 device: torch.device | None = None, *, unique: bool = False) -> Tensor:
    """Validated GP inputs ``(n, 1)`` on ``device`` (default: the first graph kernel's).

    The indices are checked here, once (integer-valued floats and columns included: a
    model accepts its own ``train_inputs``, see :mod:`gp_couple._nodes`), and handed to
    every graph kernel through
    :meth:`~gp_couple.kernels.graph_node.GraphNodeKernel.prepare_inputs`, which refuses
    nodes the kernel cannot be evaluated at and spares its forward passes a second check
    and a device synchronisation.

    :param nodes: Node indices.
    :param name: Argument name used in error messages.
    :param num_nodes: The graph's size (``None`` without graph kernels).
    :param graph_kernels: The graph kernels of the model's covariance.
    :param device: Device of the inputs.
    :param unique: Refuse repeated nodes.
    """
    if device is None:
        device = graph_kernels[0].device if graph_kernels else torch.device("cpu")
    index = node_index_tensor(nodes, name, num_nodes, unique=unique, gpytorch_inputs=True, device=device)
    dtype = torch.float64 if num_nodes is not None and num_nodes > _FLOAT32_EXACT else torch.get_default_dtype()
    inputs = index.to(dtype).unsqueeze(-1)
    for kernel in graph_kernels:
        kernel.prepare_inputs(index, inputs, name)
    return inputs


class GraphGP(gpytorch.models.ExactGP):
    r"""Exact GP regression on graph nodes, :math:`y_i = g(v_i) + \varepsilon_i`.

    The GP inputs are the node indices as an ``(n, 1)`` floating tensor (float64 when
    the graph has more than :math:`2^{24}` nodes, so indices stay exact), which every
    gpytorch mean and likelihood accepts; the graph kernels read them back as indices.
    The inputs and targets are put on the graph kernels' device: move the covariance and
    likelihood there before building the model, or the model after (``model.to(device)``);
    test inputs follow the training inputs' device.

    The default mean is :class:`gpytorch.means.ZeroMean`: the paper's GRF-GPs learn only
    :math:`\kappa`, the graph-kernel hyperparameters and :math:`\sigma_n`
    (Appendix F.2 "Scalable GPs on graphs", paragraph "Training GRF-GPs: technical details"
    [app:grf_gp_details]), so standardise the targets, or pass
    ``mean_module=gpytorch.means.ConstantMean()`` to learn an offset.

    :param train_nodes: Observed node indices, shape ``(n,)`` (or ``(n, 1)``).
    :param train_targets: Observations, shape ``(n,)``, finite.
    :param likelihood: A gpytorch likelihood (e.g. ``GaussianLikelihood()``).
    :param covar_module: The covariance, e.g. ``ScaleKernel(GRFKernel(graph))``.
    :param mean_module: The mean (default ``ZeroMean()``).
    :raises TypeError: If an argument has the wrong type or non-numeric indices.
    :raises ValueError: If node indices are out of range, not integers or have no
        GRF features, if shapes disagree, or if targets are NaN or infinite.
    """

    def __init__(self, train_nodes: Any, train_targets: Any, likelihood: Likelihood,
                 covar_module: gpytorch.kernels.Kernel, mean_module: Mean | None = None) -> None:
        if not isinstance(likelihood, Likelihood):
            raise TypeError(f"likelihood must be a gpytorch Likelihood, got {type(likelihood).__name__}")
        graph_kernels = _checked_modules(covar_module, mean_module)
        sizes = {kernel.num_nodes for kernel in graph_kernels}
        if len(sizes) > 1:
            raise ValueError(f"covar_module contains graph kernels on graphs of different sizes {sorted(sizes)}")
        num_nodes = sizes.pop() if sizes else None
        inputs = _node_inputs(train_nodes, "train_nodes", num_nodes, graph_kernels,
                              graph_kernels[0].device if graph_kernels else module_device(covar_module))
        targets = check_targets(train_targets, inputs.shape[0], _module_dtype(covar_module)).to(inputs.device)
        super().__init__(inputs, targets, likelihood)
        self._num_nodes = num_nodes
        self.mean_module = ZeroMean() if mean_module is None else mean_module
        self.covar_module = covar_module

    @property
    def num_nodes(self) -> int | None:
        """Number of graph nodes (``None`` if the covariance has no graph kernel)."""
        return self._num_nodes

    def node_inputs(self, nodes: Any, name: str = "nodes") -> Tensor:
        """Validated GP inputs ``(n, 1)`` for node indices (e.g. test nodes), on the training inputs' device."""
        return _node_inputs(nodes, name, self._num_nodes, graph_kernels(self.covar_module),
                            self.train_inputs[0].device)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.training:
            _drop_stale_caches(self)
        return super().__call__(*args, **kwargs)

    def forward(self, x: Tensor) -> MultivariateNormal:
        covariance = self.covar_module(x)
        # ZeroMean returns the input's dtype; the node-index inputs may differ from the
        # covariance's (e.g. after model.double()).
        mean = self.mean_module(x).to(covariance.dtype)
        return MultivariateNormal(mean, covariance)


def _check_pair(model: gpytorch.models.ExactGP, likelihood: Likelihood) -> None:
    if not isinstance(model, gpytorch.models.ExactGP):
        raise TypeError(f"model must be a gpytorch ExactGP, got {type(model).__name__}")
    if likelihood is not model.likelihood:
        raise ValueError("likelihood must be the likelihood the model was built with (model.likelihood)")


def fit_gp(model: gpytorch.models.ExactGP, likelihood: Likelihood, *, iterations: int, lr: float = 0.01,
           optimizer: str = "adam", convergence: Convergence | None = None,
           callback: Callable[[int, float], bool | None] | None = None, seed: SeedLike = None) -> TrainingHistory:
    r"""Maximise the exact marginal log-likelihood (Appendix F.2 "Scalable GPs on graphs",
    paragraph "Training GRF-GPs: technical details" [app:grf_gp_details]).

    Minimises :math:`-\log p(\mathbf y \mid \theta) / n` over all parameters of
    ``model`` (which include the likelihood's) with :func:`gp_couple.optimize.minimize`:
    Adam (the paper's optimiser) or L-BFGS on a deterministic objective (the same CG probe
    vectors at every evaluation; a dense Cholesky up to gpytorch's ``max_cholesky_size``
    points, see :func:`gp_couple.settings.grf_gp_settings`, with the closed-form gradient of
    :class:`~gp_couple.marginal_likelihood.DenseMarginalLogLikelihood`), which moves the
    positive hyperparameters (output scale, noise, range) in logarithmic coordinates
    (:func:`gp_couple.optimize.parameter_constraints`). Train/eval modes are restored.

    Training runs in phases. After each, every graph kernel of the model may redraw its
    random walks for the hyperparameters learnt so far
    (:meth:`~gp_couple.kernels.graph_node.GraphNodeKernel.refine_walks`: a
    :class:`~gp_couple.kernels.grf_kernel.GRFKernel` follows its
    :class:`~gp_couple.kernels.walk_schedule.WalkSchedule`), and if one did, training
    continues from where it stopped on the new walks (L-BFGS from the curvature the phase
    before ended with, :attr:`~gp_couple.optimize.TrainingHistory.curvature`: the objective
    on redrawn walks is a nearby one). When training ends, every graph
    kernel prepares to predict
    (:meth:`~gp_couple.kernels.graph_node.GraphNodeKernel.prepare_prediction`: a
    ``GRFKernel`` draws :math:`\sigma`-coupled prediction walkers), and training goes on,
    phase after phase, on those draws while a kernel asks for it (a ``GRFKernel`` does
    until a phase no longer moves its range, then keeps walks drawn for the
    hyperparameters it ends with). A round after which a kernel reports its estimate worse
    than before (:meth:`~gp_couple.kernels.graph_node.GraphNodeKernel.round_regressed`) is
    undone: every parameter returns to its value before the round, and the history drops its
    losses (:attr:`~gp_couple.optimize.TrainingHistory.undone_phases`). Exact kernels and GRF kernels built with
    ``schedule=None`` train in one phase and are left as they are.

    :param model: The GP (in any mode).
    :param likelihood: ``model.likelihood``.
    :param iterations: Most Adam steps or L-BFGS iterations per phase (the paper uses 1000 Adam steps).
    :param lr: Adam learning rate.
    :param optimizer: ``"adam"`` or ``"lbfgs"``.
    :param convergence: Stopping rule (:class:`gp_couple.optimize.Convergence`); ``None``
        runs all Adam steps (L-BFGS always stops on one).
    :param callback: Called as ``callback(step, loss)`` after each step (steps count on
        across phases); returning ``True`` stops training early.
    :param seed: Seeds the random probe vectors of CG/Lanczos training (drawn from
        torch's global generator, which is restored afterwards; phase :math:`p` uses
        ``seed + p``), so that training is reproducible; ``None`` uses the global
        generator as it is.
    :return: The loss before each step of every phase and how training ended
        (:class:`gp_couple.optimize.TrainingHistory`).
    :raises FloatingPointError: If the loss or a parameter becomes NaN or infinite (the
        result would be meaningless).
    :warns TrainingWarning: Once for the whole run (:func:`gp_couple.optimize.check_ending`),
        if training diverged (the last loss is clearly above the first, e.g. because ``lr``
        is too large), stalled (the loss never changed), or its last phase did not converge
        within ``iterations`` or ended, by SciPy's decision, before the stopping rule held.
    :warns NoiseFloorWarning: If a GRF kernel's model ends with its learnt noise on the
        constraint's lower bound (:meth:`~gp_couple.kernels.graph_node.GraphNodeKernel.check_learnt_noise`).
    """
    _check_pair(model, likelihood)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {type(callback).__name__}")
    base_seed = None if seed is None else draw_seed(seed)
    kernels = graph_kernels(model)
    was_training = model.training
    model.train()
    mll = DenseMarginalLogLikelihood(likelihood, model)
    with torch.no_grad():
        # gpytorch's marginal log-likelihood is the mean over the event (observations, tasks).
        num_data = model(*model.train_inputs).event_shape.numel()
    history = TrainingHistory()

    def counted(step: int, loss: float) -> bool | None:
        return callback(len(history) + step, loss)

    phases_run = 0

    def train_phase() -> bool:
        """Train one phase to convergence; whether training may go on (the callback did not stop it)."""
        nonlocal phases_run
        phase, phases_run = phases_run, phases_run + 1
        # A phase after redrawn walks starts its quasi-Newton model from the last phase's curvature.
        history.extend_phase(minimize(
            lambda: -mll(model(*model.train_inputs), model.train_targets).sum(),
            dict(model.named_parameters()), iterations=iterations, lr=lr, optimizer=optimizer,
            convergence=convergence, seed=None if base_seed is None else base_seed + phase,
            callback=None if callback is None else counted, constraints=parameter_constraints(model), warn=False,
            num_data=num_data, curvature=history.curvature))
        history.phases = phase + 1
        return history.reason != "callback"

    try:
        with flush_denormals():
            # Every kernel is asked (no short-circuit): each redraws what it needs. Plain loops, not
            # comprehensions, so that the kernels' warnings point at the caller of fit_gp.
            going = train_phase()
            while going:
                redrawn = False
                for kernel in kernels:
                    redrawn = kernel.refine_walks(phases_run) or redrawn
                if not redrawn:
                    break
                going = train_phase()
            refit = 0
            while True:
                drawn = False
                for kernel in kernels:
                    drawn = kernel.prepare_prediction(refit) or drawn
                if not (drawn and going):
                    break
                before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
                losses, ending = len(history), history.ending()
                going = train_phase()
                refit += 1
                if any([kernel.round_regressed() for kernel in kernels]):
                    _restore(model, before)
                    history.undo_phase(losses, ending)
                    for kernel in kernels:
                        kernel.undo_round()
        # One report for the whole run: an earlier phase that ended short is followed by more training.
        check_ending(history, optimizer, iterations, lr, convergence is not None or optimizer == "lbfgs")
        learnt = _learnt_noise(likelihood)
        if learnt is not None:
            for kernel in kernels:
                kernel.check_learnt_noise(*learnt)
        return history
    finally:
        model.train(was_training)
        for kernel in kernels:
            kernel.finish_training()
            kernel.check_estimator()


def _learnt_noise(likelihood: Likelihood) -> tuple[Tensor, float] | None:
    """The noise variances a Gaussian likelihood learnt and its constraint's lower bound (``None``: not learnt)."""
    noise_model = getattr(likelihood, "noise_covar", None)
    raw = getattr(noise_model, "raw_noise", None)
    constraint = getattr(noise_model, "raw_noise_constraint", None)
    if not isinstance(raw, torch.nn.Parameter) or not raw.requires_grad or constraint is None:
        return None
    floor = float(torch.as_tensor(constraint.lower_bound).max())
    return noise_model.noise.detach(), floor


@dataclass(frozen=True)
class Prediction:
    r"""Predictive means and variances at some nodes, with how the variances were computed.

    Unpacks as ``mean, variance = predict(...)`` (and indexes as ``prediction[0]``,
    ``prediction[1]``).

    :ivar mean: Predictive means, shape ``(*batch, n)``.
    :ivar variance: Predictive variances (of noisy observations or of the latent
        function, as requested), shape ``(*batch, n)``, in the model's dtype.
    :ivar estimate: The variance method and its estimated relative error
        (:class:`~gp_couple.predictive_variance.VarianceEstimate`); ``None`` when
        variances were skipped.
    """

    mean: Tensor
    variance: Tensor
    estimate: VarianceEstimate | None

    def __iter__(self) -> Iterator[Tensor]:
        return iter((self.mean, self.variance))

    def __getitem__(self, index: int) -> Tensor:
        return (self.mean, self.variance)[index]

    def __len__(self) -> int:
        return 2


class _StateFingerprint:
    """What an evaluating model's caches were built from: its buffers' identities and its parameters' values.

    Buffers (walks, frequencies) can be large: their identity, storage and in-place version
    stand for them. Parameters are small and may be set through ``.data`` (gpytorch's
    setters do), which leaves their version alone: their values are kept.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.buffers = tuple((id(buffer), buffer.data_ptr(), buffer._version) for buffer in model.buffers())
        self.parameters = tuple(parameter.detach().clone() for parameter in model.parameters())

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _StateFingerprint) and self.buffers == other.buffers
                and len(self.parameters) == len(other.parameters)
                and all(mine.shape == theirs.shape and torch.equal(mine, theirs)
                        for mine, theirs in zip(self.parameters, other.parameters)))


def _restore(model: torch.nn.Module, values: dict[str, Tensor]) -> None:
    """Set every parameter of ``model`` back to ``values`` (a detached copy taken by name)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(values[name])


def _drop_stale_caches(model: gpytorch.models.ExactGP) -> None:
    """Forget gpytorch's prediction caches when a parameter or buffer changed since they were built.

    gpytorch keeps the caches of an evaluating :class:`~gpytorch.models.ExactGP` until it
    returns to training mode; a kernel whose walks or frequencies were redrawn
    (``resample``) or whose hyperparameters were set in evaluation mode would otherwise
    predict with the old ones.
    """
    fingerprint = _StateFingerprint(model)
    if getattr(model, "_gp_couple_fingerprint", None) != fingerprint:
        model.prediction_strategy = None
        model._gp_couple_fingerprint = fingerprint


def predict(model: gpytorch.models.ExactGP, likelihood: Likelihood, nodes: Any, *, noise: bool = True,
            variance: str = "auto", variance_tolerance: float = 0.01, seed: SeedLike = None) -> Prediction:
    r"""Predictive mean and variance at ``nodes`` (no gradients).

    The variances are computed by
    :func:`gp_couple.predictive_variance.posterior_variance` to a stated accuracy:
    on training sets up to :data:`~gp_couple.predictive_variance.DENSE_VARIANCE_SIZE`
    points by a float64 factor, whose factor also gives the mean: a sparse LU factor where
    the kernel matrices are sparse (GRF kernels) and it costs less than a dense one, else a
    dense Cholesky factor; on larger ones by a sparse LU factor where the kernel matrices
    are sparse (the mean from the same factor), else by a block Krylov subspace
    grown until the estimated relative error is below ``variance_tolerance``, with
    gpytorch's mean (a CG solve under its settings). The estimate comes back with them
    (:attr:`Prediction.estimate`). Caches of an earlier prediction are dropped if any
    parameter or buffer changed since (e.g. after
    :meth:`~gp_couple.kernels.grf_kernel.GRFKernel.resample`).

    :param model: A trained :class:`GraphGP` (or any ExactGP on node-index inputs).
    :param likelihood: ``model.likelihood``.
    :param nodes: Node indices to predict at, shape ``(n,)``.
    :param noise: Return the variance of noisy observations :math:`y_*` (default,
        what NLPD needs); ``False`` returns the latent :math:`g(v_*)` variance.
    :param variance: ``"auto"`` (dense or, where cheaper, sparse up to
        :data:`~gp_couple.predictive_variance.DENSE_VARIANCE_SIZE` training points,
        sparse or Krylov above), ``"dense"``, ``"sparse"`` or ``"lanczos"``.
    :param variance_tolerance: Largest estimated relative error of the Krylov variances.
    :param seed: Seeds the random vectors of CG solves and of the Krylov start block
        (torch's global generator is restored afterwards); ``None`` draws them from
        torch's global generator.
    :return: A :class:`Prediction` (unpacks as ``mean, variance``, each of shape
        ``(n,)`` plus any batch shape).
    :raises ValueError: For an unknown ``variance`` method or a tolerance outside (0, 1).
    :raises TypeError: For a tolerance that is not a number.
    """
    _check_pair(model, likelihood)
    variance_tolerance = check_variance_method(variance, variance_tolerance)
    if isinstance(model, GraphGP):
        inputs = model.node_inputs(nodes)
    else:
        train = model.train_inputs[0]
        inputs = node_index_tensor(nodes, "nodes", gpytorch_inputs=True,
                                   device=train.device).to(train.dtype).unsqueeze(-1)
    for kernel in graph_kernels(model):
        kernel.check_estimator()
    was_training = model.training
    model.eval()
    _drop_stale_caches(model)
    try:
        with torch.no_grad(), seeded_torch_rng(seed), flush_denormals():
            train_inputs = model.train_inputs[0]
            prior = model.forward(train_inputs)
            train_covariance = likelihood(prior, train_inputs).lazy_covariance_matrix
            cross = model.covar_module(inputs, train_inputs)
            prior_diagonal = model.covar_module(inputs, diag=True)
            noise_floor = float((train_covariance.diagonal() - prior.lazy_covariance_matrix.diagonal()).min())
            start_seed = int(torch.randint(0, 2**31 - 1, ()).item())
            # The dense method's factor gives the mean as well; otherwise gpytorch's solve does.
            residual = model.train_targets - prior.mean if hasattr(model, "mean_module") else None
            latent, estimate, mean_shift = posterior_variance(
                train_covariance, cross, prior_diagonal, noise_floor, method=variance, tolerance=variance_tolerance,
                seed=start_seed, residual=residual)
            if mean_shift is not None:
                mean = model.mean_module(inputs).to(prior_diagonal.dtype) + mean_shift.to(prior_diagonal.dtype)
            else:
                with gpytorch.settings.skip_posterior_variances(True):
                    mean = model(inputs).mean
            latent = latent.to(mean.dtype)
            if noise:
                from linear_operator.operators import DiagLinearOperator

                latent = likelihood(MultivariateNormal(mean, DiagLinearOperator(latent)), inputs).variance
    finally:
        model.train(was_training)
    return Prediction(mean, latent, estimate)
