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
import math
import warnings
from typing import Any, Callable

import gpytorch
import numpy as np
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.likelihoods import Likelihood
from gpytorch.means import Mean, ZeroMean
from torch import Tensor

from ._random import SeedLike, seeded_torch_rng
from .kernels.graph_node import GraphNodeKernel, node_index_tensor
from .kernels.grf import GRFKernel
from .progress import progress

__all__ = ["GraphGP", "TrainingWarning", "adam_steps", "check_schedule", "check_training", "fit_gp", "predict",
           "node_index_array", "module_device"]

_FLOAT32_EXACT = 2**24


def _module_dtype(module: torch.nn.Module) -> torch.dtype:
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.get_default_dtype()


def _graph_kernels(module: torch.nn.Module) -> list[GraphNodeKernel]:
    return [sub for sub in module.modules() if isinstance(sub, GraphNodeKernel)]


def _as_array(value: Any, name: str) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be array-like, got {type(value).__name__}") from error


def node_index_array(nodes: Any, name: str, num_nodes: int | None = None) -> np.ndarray:
    """Validate node indices (1-D, or a column ``(n, 1)``) and return them as an int64 array.

    The NumPy form of :func:`gp_couple.kernels.graph_node.node_index_tensor` (same checks).

    :param nodes: Tensor, array or sequence of node indices (integers, or floats with
        integer values).
    :param name: Argument name used in error messages.
    :param num_nodes: If given, every index must lie in ``[0, num_nodes)``.
    :raises TypeError: If the indices are not numbers.
    :raises ValueError: If the shape is wrong, or an index is non-finite, non-integer,
        negative or out of range.
    """
    return node_index_tensor(nodes, name, num_nodes).cpu().numpy()


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
    return _graph_kernels(covar_module)


def _node_inputs(nodes: Any, name: str, num_nodes: int | None, graph_kernels: list[GraphNodeKernel],
                 device: torch.device | None = None) -> Tensor:
    """Validated GP inputs ``(n, 1)`` on ``device`` (default: the first graph kernel's).

    The indices are checked here, once: the graph kernels are told that these inputs
    hold them (:meth:`~gp_couple.kernels.graph_node.GraphNodeKernel.trust_node_inputs`), so
    their forward passes neither re-check nor synchronise with the device.
    """
    if device is None:
        device = graph_kernels[0].device if graph_kernels else torch.device("cpu")
    index = node_index_tensor(nodes, name, num_nodes, device=device)
    for kernel in graph_kernels:
        if isinstance(kernel, GRFKernel):
            kernel.rows(index, name)  # raises for nodes without features
    dtype = torch.float64 if num_nodes is not None and num_nodes > _FLOAT32_EXACT else torch.get_default_dtype()
    inputs = index.to(dtype).unsqueeze(-1)
    for kernel in graph_kernels:
        kernel.trust_node_inputs(inputs, index)
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
        targets = self._targets(train_targets, inputs.shape[0], _module_dtype(covar_module)).to(inputs.device)
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
        return _node_inputs(nodes, name, self._num_nodes, _graph_kernels(self.covar_module),
                            self.train_inputs[0].device)

    @staticmethod
    def _targets(targets: Any, num_train: int, dtype: torch.dtype) -> Tensor:
        array = _as_array(targets, "train_targets")
        if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.number) \
                or np.iscomplexobj(array):
            raise TypeError(f"train_targets must be real numbers, got dtype {array.dtype}")
        if array.shape != (num_train,):
            raise ValueError(f"train_targets must have shape ({num_train},) to match train_nodes, "
                             f"got {array.shape}")
        if not np.all(np.isfinite(array)):
            bad = int(np.flatnonzero(~np.isfinite(array))[0])
            raise ValueError(f"train_targets contains NaN or infinite values (first at position {bad})")
        return torch.as_tensor(array).to(dtype)

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


class TrainingWarning(RuntimeWarning):
    """Training ended worse than it started or its loss never moved (see :func:`fit_gp`)."""


#: A run is reported when its last loss exceeds its first by this fraction of max(1, |first|)
#: (plus three standard deviations of the step-to-step noise of stochastic CG losses).
_DIVERGENCE_TOLERANCE = 0.01


def _loss_summary(history: list[float]) -> str:
    best = int(np.argmin(history))
    return (f"loss {history[0]:.6g} at step 0, best {history[best]:.6g} at step {best}, "
            f"last {history[-1]:.6g} at step {len(history) - 1}")


def check_training(history: list[float], lr: float) -> None:
    r"""Warn (:class:`TrainingWarning`) when a loss history shows diverged or stalled training.

    Diverged: the last loss exceeds the first by more than 1 % of
    :math:`\max(1, |\text{first}|)` plus three standard deviations of the loss noise
    (estimated from the differences of the last ten losses, which are random under
    CG/Lanczos). Stalled: the loss did not change at all over two or more steps (e.g.
    after a step so large that every gradient vanished).

    :param history: Losses, one per step.
    :param lr: The learning rate used (named in the message).
    """
    if len(history) < 2:
        return
    values = np.asarray(history, dtype=np.float64)
    first, last = values[0], values[-1]
    tail = np.diff(values[-10:])
    noise = float(np.std(tail) / math.sqrt(2)) if tail.size > 1 else 0.0
    if last > first + _DIVERGENCE_TOLERANCE * max(1.0, abs(first)) + 3 * noise:
        warnings.warn(f"training diverged: {_loss_summary(history)}; the model keeps its last "
                      f"parameters. Try a smaller lr than {lr:g}", TrainingWarning, stacklevel=3)
    elif np.ptp(values) == 0:
        warnings.warn(f"training stalled: the loss stayed at {first:.6g} for {len(history)} steps "
                      f"(zero gradients?); check lr={lr:g} and which parameters require grad",
                      TrainingWarning, stacklevel=3)


def fit_gp(model: gpytorch.models.ExactGP, likelihood: Likelihood, *, iterations: int, lr: float = 0.01,
           callback: Callable[[int, float], bool | None] | None = None, seed: SeedLike = None) -> list[float]:
    r"""Maximise the exact marginal log-likelihood with Adam (Appendix F.2 "Scalable GPs on graphs",
    paragraph "Training GRF-GPs: technical details" [app:grf_gp_details]).

    Every iteration evaluates :math:`-\log p(\mathbf y \mid \theta) / n` on the training
    data and takes one Adam step on all parameters of ``model`` (which include the
    likelihood's). gpytorch picks Cholesky or CG/Lanczos by ``max_cholesky_size``:
    use :func:`gp_couple.settings.grf_gp_settings`. Train/eval modes are restored.

    :param model: The GP (in any mode).
    :param likelihood: ``model.likelihood``.
    :param iterations: Number of Adam steps (the paper uses 1000).
    :param lr: Adam learning rate.
    :param callback: Called as ``callback(step, loss)`` after each step; returning
        ``True`` stops training early.
    :param seed: Seeds the random probe vectors of CG/Lanczos training (drawn from
        torch's global generator, which is restored afterwards), so that training is
        reproducible; ``None`` uses the global generator as it is.
    :return: The loss before each step (negative MLL per data point).
    :raises FloatingPointError: If the loss or a parameter becomes NaN or infinite (the
        result would be meaningless).
    :warns TrainingWarning: If training diverged (the last loss is clearly above the
        first, e.g. because ``lr`` is too large) or stalled (the loss never changed); the
        message summarises the loss history (see :func:`check_training`).
    """
    _check_pair(model, likelihood)
    check_schedule(iterations, lr)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {type(callback).__name__}")
    was_training = model.training
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    try:
        return adam_steps(lambda: -mll(model(*model.train_inputs), model.train_targets).sum(),
                          dict(model.named_parameters()), iterations=iterations, lr=lr, seed=seed,
                          callback=callback)
    finally:
        model.train(was_training)


def check_schedule(iterations: Any, lr: Any) -> None:
    """Validate an Adam schedule: ``iterations`` a non-negative int, ``lr`` a positive finite float.

    :raises ValueError: Naming the argument.
    """
    if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) or iterations < 0:
        raise ValueError(f"iterations must be a non-negative int, got {iterations!r}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive float, got {lr!r}")


def adam_steps(objective: Callable[[], Tensor], parameters: dict[str, torch.nn.Parameter], *, iterations: int,
               lr: float, seed: SeedLike = None,
               callback: Callable[[int, float], bool | None] | None = None) -> list[float]:
    """Minimise ``objective()`` with Adam over ``parameters``: the training loop of :func:`fit_gp`.

    :param objective: Returns the loss (a scalar tensor) of the current parameters.
    :param parameters: The parameters to train, by name (names appear in errors).
    :param iterations: Number of steps.
    :param lr: Adam learning rate.
    :param seed: Seeds torch's global generator inside the loop (restored afterwards).
    :param callback: Called as ``callback(step, loss)``; returning ``True`` stops early.
    :return: The loss before each step.
    :raises FloatingPointError: If the loss or a parameter becomes NaN or infinite.
    :warns TrainingWarning: If the loss history shows diverged or stalled training
        (:func:`check_training`).
    """
    optimizer = torch.optim.Adam(parameters.values(), lr=float(lr))
    history: list[float] = []
    with seeded_torch_rng(seed):
        for step in progress(range(int(iterations)), description="training", unit="step"):
            optimizer.zero_grad()
            loss = objective()
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(f"the training loss became {value} at step {step}")
            loss.backward()
            optimizer.step()
            history.append(value)
            if callback is not None and callback(step, value) is True:
                break
    for name, parameter in parameters.items():
        if not bool(torch.isfinite(parameter).all()):
            raise FloatingPointError(f"parameter {name} became NaN or infinite during training "
                                     f"({_loss_summary(history)}); try a smaller lr than {lr:g}")
    check_training(history, float(lr))
    return history


def predict(model: gpytorch.models.ExactGP, likelihood: Likelihood, nodes: Any, *, fast: bool = False,
            noise: bool = True, seed: SeedLike = None) -> tuple[Tensor, Tensor]:
    r"""Predictive mean and variance at ``nodes`` (no gradients).

    :param model: A trained :class:`GraphGP` (or any ExactGP on node-index inputs).
    :param likelihood: ``model.likelihood``.
    :param nodes: Node indices to predict at, shape ``(n,)``.
    :param fast: Use gpytorch's ``fast_pred_var`` (Lanczos) for the variances.
    :param noise: Return the variance of noisy observations :math:`y_*` (default,
        what NLPD needs); ``False`` returns the latent :math:`g(v_*)` variance.
    :param seed: Seeds the random vectors of CG/Lanczos solves and ``fast`` variances
        (torch's global generator is restored afterwards); ``None`` uses it as it is.
    :return: ``(mean, variance)``, each of shape ``(n,)`` (plus any batch shape).
    """
    _check_pair(model, likelihood)
    if isinstance(model, GraphGP):
        inputs = model.node_inputs(nodes)
    else:
        train = model.train_inputs[0]
        inputs = node_index_tensor(nodes, "nodes", device=train.device).to(train.dtype).unsqueeze(-1)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), gpytorch.settings.fast_pred_var(bool(fast)), seeded_torch_rng(seed):
            latent = model(inputs)
            output = likelihood(latent) if noise else latent
            mean, variance = output.mean, output.variance
    finally:
        model.train(was_training)
    return mean, variance
