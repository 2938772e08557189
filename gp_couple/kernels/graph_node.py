r"""The base of kernels on graph nodes: node-index inputs, hyperparameter batches and saved state.

:class:`GraphNodeKernel` holds the graph and the ``kernel_family`` submodule
(:mod:`gp_couple.kernel_families`) whose hyperparameters every graph kernel learns; it
validates node-index inputs, batches hyperparameters (gpytorch's ``__getitem__`` /
``expand_batch`` contract) and records the graph's identity in the state dict.
:class:`~gp_couple.kernels.grf_kernel.GRFKernel`,
:class:`~gp_couple.kernels.exact_graph.ExactGraphKernel` and
:class:`~gp_couple.kernels.matrix_free.MatrixFreeGraphKernel` derive from it.

Inputs are node indices: tensors of shape ``(..., n, 1)``, floating point (integer
valued, as gpytorch passes them) or integer. Their values are checked once per input
tensor by the rule of :mod:`gp_couple._nodes` (one host synchronisation on an
accelerator); the result is remembered for that tensor, so a training loop does not
check or synchronise again. The GP models validate their nodes themselves and hand them
over with :meth:`GraphNodeKernel.prepare_inputs`, the hook through which a kernel also
refuses nodes it cannot be evaluated at (:meth:`GraphNodeKernel.check_covered`: a GRF
kernel has feature rows only for its ``nodes``), so models never need to know the
kernel's class.
"""

from __future__ import annotations

import itertools
from copy import deepcopy
from typing import Any

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from .. import _nodes
from ..graphs import Graph
from ..kernel_families import Diffusion, KernelFamily
from ._inputs import InputCache
from ._state import check_state_tensors
from .walk_schedule import LikelihoodEvaluation

__all__ = ["GraphNodeKernel", "check_node_tensor_form", "graph_kernels"]

_EXTRA_STATE_VERSION = 1


# -------------------------------------------------------------------- node-index inputs
def check_node_tensor_form(x: Any, name: str) -> None:
    """Check the type and shape ``(..., n, 1)`` of kernel inputs (no device synchronisation).

    Their dtype and values are checked, once per input tensor, by
    :func:`gp_couple._nodes.check_node_values`.

    :param x: Kernel inputs.
    :param name: Argument name used in error messages.
    :raises TypeError: If ``x`` is not a tensor.
    :raises ValueError: If ``x`` requires grad or has the wrong shape.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a tensor of node indices, got {type(x).__name__}")
    if x.requires_grad:
        # e.g. gpytorch's default learn_inducing_locations=True: gradients cannot move
        # discrete node indices, so they would silently never change.
        raise ValueError(f"{name} requires grad, but graph kernel inputs are node indices, which "
                         "cannot be learned; in an ApproximateGP pass learn_inducing_locations=False "
                         "(see gp_couple.variational.GraphVariationalGP)")
    if x.ndim < 2 or x.shape[-1] != 1:
        raise ValueError(f"{name} must have shape (..., n, 1) with one node index per row, "
                         f"got shape {tuple(x.shape)}")


def _node_values(x: Tensor, name: str, num_nodes: int, device: torch.device) -> Tensor:
    """Int64 node indices of kernel inputs ``(..., n, 1)``: ``(n,)`` when shared by the batch."""
    # Looked up on the module at every call (tests count the checks by replacing it there).
    flat = _nodes.check_node_values(x[..., 0].reshape(-1, x.shape[-2]), name, num_nodes,
                                    gpytorch_inputs=True).to(device)
    if flat.shape[0] <= 1 or bool((flat == flat[0]).all()):
        return flat[0]
    return flat.reshape(x.shape[:-1])


class GraphNodeKernel(Kernel):
    r"""Base class of kernels on graph nodes with a :class:`~gp_couple.kernel_families.KernelFamily` submodule.

    Handles the graph, the ``kernel_family`` submodule and the validation of node-index
    inputs.

    :param graph: The graph.
    :param kernel_family: The kernel family and its hyperparameters (default
        :class:`~gp_couple.kernel_families.Diffusion`).
    :param batch_shape: Hyperparameter batch shape (must match ``kernel_family.batch_shape``).
    :param kwargs: Passed to :class:`gpytorch.kernels.Kernel` (e.g. ``active_dims``).
    """

    has_lengthscale = False

    def __init__(self, graph: Graph, kernel_family: KernelFamily | None = None, *,
                 batch_shape: torch.Size = torch.Size(), **kwargs: Any) -> None:
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be a gp_couple.Graph, got {type(graph).__name__}")
        batch_shape = torch.Size(batch_shape)
        if kernel_family is None:
            kernel_family = Diffusion(batch_shape=batch_shape)
        elif not isinstance(kernel_family, KernelFamily):
            raise TypeError("kernel_family must be a gp_couple.kernel_families.KernelFamily "
                            f"(e.g. Diffusion()), got {type(kernel_family).__name__}")
        elif kernel_family.batch_shape != batch_shape:
            raise ValueError(f"kernel_family has batch_shape {tuple(kernel_family.batch_shape)} but the "
                             f"kernel was given batch_shape {tuple(batch_shape)}; pass the same shape")
        super().__init__(batch_shape=batch_shape, **kwargs)
        self._graph = graph
        self.kernel_family = kernel_family
        self._node_cache = InputCache()

    @property
    def graph(self) -> Graph:
        """The graph (immutable)."""
        return self._graph

    @property
    def num_nodes(self) -> int:
        """Number of graph nodes :math:`N`."""
        return self._graph.num_nodes

    @property
    def device(self) -> torch.device:
        """Device of the kernel's parameters and buffers (node indices are moved there)."""
        for tensor in itertools.chain(self.parameters(), self.buffers()):
            return tensor.device
        return torch.device("cpu")

    def node_indices(self, x: Tensor, name: str = "x", *, allow_batch: bool = False) -> Tensor:
        """Validate node-index inputs ``(..., n, 1)`` and return them as int64 on :attr:`device`.

        The values of an input tensor are checked once: the result is remembered for
        that tensor (until it is modified in place), so a training loop that passes the
        same inputs every iteration synchronises with the device only on the first one.

        :param x: Node indices (integer dtype, or floating point with integer values).
        :param name: Argument name used in error messages.
        :param allow_batch: Return ``(..., n)`` when batch entries hold different nodes
            (otherwise that is an error). Batch entries that all hold the same nodes
            always give ``(n,)``: the fast path, one feature pattern for every entry.
        :raises TypeError: If ``x`` is not a real tensor.
        :raises ValueError: If the shape is wrong, an index is not an integer, lies
            outside ``[0, num_nodes)``, or batch entries differ without ``allow_batch``.
        """
        check_node_tensor_form(x, name)
        index = self._node_cache.get(x)
        if index is None:
            index = self._node_cache.put(x, _node_values(x, name, self.num_nodes, self.device))
        if index.ndim > 1 and not allow_batch:
            raise ValueError(f"{name} must hold the same nodes in every batch entry here; "
                             "pass allow_batch=True to get one row of indices per batch entry")
        return index

    def check_estimator(self) -> None:
        """Warn if the kernel's estimate is unreliable at the current hyperparameters (exact kernels: never).

        Called by :func:`gp_couple.models.fit_gp` after training and by
        :func:`gp_couple.models.predict`; randomised kernels override it.
        """

    def check_learnt_noise(self, noise: Tensor, floor: float) -> None:
        """Warn if a learnt observation noise at its lower bound suggests the estimate's error stands in for it.

        Called by :func:`gp_couple.models.fit_gp` when training ends, for a likelihood whose
        noise is learnt and bounded below; exact kernels never warn (there a noise at its bound
        is the data's), randomised kernels override it.

        :param noise: The learnt noise variances.
        :param floor: The lower bound of the noise's constraint.
        """

    def dense_solves_pay(self, nodes: Tensor) -> bool:
        """Whether a dense Cholesky factor of the training covariance on ``nodes`` costs less than CG/Lanczos.

        :class:`~gp_couple.marginal_likelihood.DenseMarginalLogLikelihood` asks every graph
        kernel of a model before it factorises a training set of at most gpytorch's
        ``max_cholesky_size`` points, and solves by CG/Lanczos if one says no. Exact kernels
        say yes: their covariances are dense matrices, or (matrix-free) products as costly
        per column as the factor's. GRF kernels compare the factor with their sparse
        features (:meth:`gp_couple.kernels.grf_kernel.GRFKernel.dense_solves_pay`).

        :param nodes: The training inputs, as the model holds them.
        """
        return True

    def refine_walks(self, phase: int) -> bool:
        """Redraw the kernel's random draws if the current hyperparameters need better ones (exact kernels: never).

        Called by :func:`gp_couple.models.fit_gp` after each training phase converges; a
        ``True`` answer starts another phase on the new draws. Randomised kernels override
        it (:meth:`gp_couple.kernels.grf_kernel.GRFKernel.refine_walks`).

        :param phase: The training phase about to start (1 for the first redraw).
        :return: Whether anything was redrawn.
        """
        return False

    def prepare_prediction(self, refit: int = 0) -> bool:
        """Make the kernel ready to predict once training has ended (exact kernels: nothing to do).

        Called by :func:`gp_couple.models.fit_gp` when training ends (``refit`` 0), and
        again after each training round it asked for (``refit`` 1, 2, ...); randomised
        kernels override it (:meth:`gp_couple.kernels.grf_kernel.GRFKernel.prepare_prediction`).

        :param refit: Training rounds run since the prediction draws were first made.
        :return: Whether training should go on, on the draws just made.
        """
        return False

    def round_regressed(self) -> bool:
        """Whether the training round just run left the kernel's estimate worse than before it (exact kernels: never).

        Asked by :func:`gp_couple.models.fit_gp` after each round that
        :meth:`prepare_prediction` asked for; where a kernel says yes, ``fit_gp`` restores
        every parameter of the model to its value before the round and calls
        :meth:`undo_round` on every graph kernel. Randomised kernels override it
        (:meth:`gp_couple.kernels.grf_kernel.GRFKernel.round_regressed`).
        """
        return False

    def undo_round(self) -> None:
        """Forget the training round just run: :func:`gp_couple.models.fit_gp` restored the parameters before it.

        Randomised kernels override it (:meth:`gp_couple.kernels.grf_kernel.GRFKernel.undo_round`).
        """

    def finish_training(self) -> None:
        """Drop what only training needed (exact kernels: nothing).

        Called by :func:`gp_couple.models.fit_gp` when it returns or raises; randomised
        kernels override it (:meth:`gp_couple.kernels.grf_kernel.GRFKernel.finish_training`).
        """

    def pairs_evaluations(self) -> bool:
        """Whether the next training evaluation may be bias-corrected (exact kernels: never).

        In those evaluations the kernel returns a dense training covariance, the mean of two
        draws, and hands their difference to the objective
        (:meth:`estimate_difference`). :class:`~gp_couple.marginal_likelihood.DenseMarginalLogLikelihood`
        asks before it chooses a solver: where a kernel may pair, it evaluates the
        covariance first and takes the dense path when the evaluation was paired, whatever
        gpytorch's ``max_cholesky_size`` (the kernel bounds the size itself,
        :meth:`gp_couple.kernels.grf_kernel.GRFKernel.pairs_evaluations`).
        """
        return False

    def estimate_difference(self) -> Tensor | None:
        """The error proxy of a bias-corrected training evaluation, taken once (exact kernels: ``None``).

        :class:`~gp_couple.marginal_likelihood.DenseMarginalLogLikelihood` asks every graph
        kernel after it evaluates the training covariance; randomised kernels override it
        (:meth:`gp_couple.kernels.grf_kernel.GRFKernel.estimate_difference`).
        """
        return None

    def record_evaluation(self, evaluation: LikelihoodEvaluation) -> None:
        """Keep the report of a training evaluation of the likelihood (exact kernels: nothing to keep).

        :class:`~gp_couple.marginal_likelihood.DenseMarginalLogLikelihood` reports it after
        each evaluation of a model whose covariance is this kernel, optionally scaled;
        :meth:`gp_couple.kernels.grf_kernel.GRFKernel.prepare_prediction` reads the last one.

        :param evaluation: The output scale, the residual and the noise of that evaluation,
            and the estimate's whitened error where it was bias-corrected
            (:class:`~gp_couple.kernels.walk_schedule.LikelihoodEvaluation`).
        """

    def covered_nodes(self) -> Tensor | None:
        """The nodes this kernel can be evaluated at (int64 ``(m,)``), or ``None`` for every node.

        Kernels defined on every node (the default) return ``None``; a GRF kernel
        returns the nodes it sampled walks from.
        """
        return None

    def check_covered(self, index: Tensor, name: str = "nodes") -> None:
        """Raise if the kernel cannot be evaluated at some of the validated node indices ``index``.

        The default reads :meth:`covered_nodes`; subclasses may override it with a
        faster lookup or a more specific message.

        :param index: Validated int64 node indices ``(n,)``, on any device.
        :param name: Argument name used in the message.
        :raises ValueError: If a node is outside :meth:`covered_nodes`.
        """
        covered = self.covered_nodes()
        if covered is None:
            return
        missing = index[~torch.isin(index.to(covered.device), covered).to(index.device)]
        if missing.numel():
            raise ValueError(f"{name} contains node {int(missing[0])} (and {missing.numel() - 1} more) "
                             f"outside the {covered.numel()} nodes this {type(self).__name__} is defined on")

    def prepare_inputs(self, index: Tensor, inputs: Tensor, name: str = "nodes") -> None:
        """Accept node indices that a model validated and turned into its GP inputs.

        The hook through which models hand nodes to their graph kernels without knowing
        the kernels' classes: the kernel refuses nodes it cannot be evaluated at
        (:meth:`check_covered`), then remembers ``index`` as the node indices of
        ``inputs``, so its forward passes neither check them again nor read the float
        column back (see :mod:`gp_couple._nodes` for why the inputs are floats).

        :param index: Validated int64 node indices ``(n,)``
            (:func:`gp_couple._nodes.node_index_tensor`).
        :param inputs: The GP input column ``(n, 1)`` made from them.
        :param name: Argument name used in error messages.
        :raises ValueError: If the kernel cannot be evaluated at a node.
        """
        self.check_covered(index, name)
        self._node_cache.put(inputs, index.to(self.device))

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> GraphNodeKernel:
        # Remembered indices live on the old device.
        result = super()._apply(fn, *args, **kwargs)
        self._invalidate()
        return result

    def _invalidate(self) -> None:
        """Forget everything derived from inputs or buffers (device moves, new features)."""
        self._node_cache.clear()

    def _copy_memo(self) -> dict[int, Any]:
        """``deepcopy`` memo: what copies share or replace (copies of an InputCache start empty)."""
        return {}

    # Hyperparameters live in the kernel_family submodule and the walk buffers have no
    # batch dimension, so gpytorch's generic versions (which reshape the kernel's own
    # parameters and every buffer) do not apply.
    def _with_hyper_batch(self, transform: Any) -> GraphNodeKernel:
        new_kernel = deepcopy(self, self._copy_memo())
        for parameter in new_kernel.kernel_family.parameters():
            parameter.data = transform(parameter.data)
        hyper_batch = transform(torch.empty(*self.kernel_family.batch_shape, 0)).shape[:-1]
        new_kernel.kernel_family._batch_shape = hyper_batch
        new_kernel.batch_shape = hyper_batch
        return new_kernel

    def __getitem__(self, index: Any) -> GraphNodeKernel:
        """A kernel whose hyperparameters are ``index`` of this one's batch (gpytorch's contract)."""
        if len(self.batch_shape) == 0:
            return self
        index = (index if isinstance(index, tuple) else (index,)) + (slice(None),)
        return self._with_hyper_batch(lambda tensor: tensor[index])

    def expand_batch(self, *sizes: Any) -> GraphNodeKernel:
        """A kernel whose hyperparameters are expanded to the batch shape ``sizes``."""
        batch = torch.Size(sizes[0] if len(sizes) == 1 and not isinstance(sizes[0], int) else sizes)
        if batch == self.batch_shape:
            return self
        try:
            torch.broadcast_shapes(batch, self.batch_shape, self.kernel_family.batch_shape)
        except RuntimeError as error:
            raise ValueError(f"cannot expand a kernel with batch shape {tuple(self.batch_shape)} to "
                             f"{tuple(batch)}") from error
        return self._with_hyper_batch(lambda tensor: tensor.expand(*batch, tensor.shape[-1]))

    def _output_batch(self, hyper_batch: torch.Size, x1: Tensor, x2: Tensor) -> torch.Size:
        try:
            return torch.broadcast_shapes(hyper_batch, self.batch_shape, x1.shape[:-2], x2.shape[:-2])
        except RuntimeError as error:
            raise ValueError(f"input batch shapes {tuple(x1.shape[:-2])}, {tuple(x2.shape[:-2])} do not "
                             f"broadcast with the hyperparameter batch shape {tuple(hyper_batch)}") from error

    @staticmethod
    def _check_forward_args(last_dim_is_batch: bool) -> None:
        if last_dim_is_batch:
            raise ValueError("graph node kernels take a single node-index column; "
                             "last_dim_is_batch is not supported")

    # ---------------------------------------------------------------- graph identity
    def _graph_state(self) -> dict[str, Any]:
        return {"version": _EXTRA_STATE_VERSION, "graph_fingerprint": self._graph.fingerprint(),
                "num_nodes": self.num_nodes}

    def _check_graph_state(self, state: Any, prefix: str) -> Any:
        """Check a saved state's graph identity; return what :meth:`_apply_extra_state` applies.

        Subclasses with more saved configuration extend it to validate all of it, so
        that loading checks everything before anything is copied (and applies nothing
        on an error).
        """
        if not isinstance(state, dict) or "graph_fingerprint" not in state:
            raise ValueError(f"{prefix or 'state_dict'}: the saved kernel state is not a graph-kernel state")
        if state["graph_fingerprint"] != self._graph.fingerprint():
            raise ValueError(
                f"{prefix or 'state_dict'} was saved for a different graph (num_nodes="
                f"{state.get('num_nodes')}, fingerprint {str(state['graph_fingerprint'])[:12]}...) than "
                f"this kernel's (num_nodes={self.num_nodes}, fingerprint "
                f"{self._graph.fingerprint()[:12]}...); build the kernel on the same graph")
        return None

    def _apply_extra_state(self, checked: Any) -> None:
        """Hook: apply what :meth:`_check_graph_state` returned (the graph itself needs nothing)."""

    def get_extra_state(self) -> dict[str, Any]:
        """Graph identity (fingerprint and size), checked when loading a state dict."""
        return self._graph_state()

    def set_extra_state(self, state: Any) -> None:
        """Validate the graph identity of a loaded state (see :meth:`get_extra_state`), then apply it."""
        self._apply_extra_state(self._check_graph_state(state, ""))

    def _reshaped_on_load(self) -> frozenset[str]:
        """Names of own buffers that take the saved shape on load (see :meth:`_before_load`)."""
        return frozenset()

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: Any,
                              strict: bool, missing_keys: list, unexpected_keys: list,
                              error_msgs: list) -> None:
        # Check everything before anything is copied, so a bad state leaves the kernel intact.
        if prefix + "_extra_state" in state_dict:
            self._check_graph_state(state_dict[prefix + "_extra_state"], prefix.rstrip("."))
        else:
            # Without the saved graph identity, buffers sampled on a graph (walks) cannot be
            # verified to belong to this one, even with strict=False.
            graph_bound = sorted(name for name in self._buffers if name not in self._non_persistent_buffers_set
                                 and prefix + name in state_dict)
            if graph_bound:
                raise ValueError(
                    f"{prefix + '_extra_state' if prefix else '_extra_state'} is missing from the state dict, "
                    f"which holds this kernel's {', '.join(graph_bound)}: the graph they were sampled on cannot "
                    "be checked against this kernel's; load a state dict saved with the extra state "
                    "(kernel.state_dict()), or leave those entries out")
        check_state_tensors(self, state_dict, prefix, self._reshaped_on_load())
        self._before_load(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        self._after_load(prefix, error_msgs)

    def _before_load(self, state_dict: dict[str, Any], prefix: str) -> None:
        """Hook: adapt buffers to a state dict before it is copied in."""

    def _after_load(self, prefix: str, error_msgs: list) -> None:
        """Hook: rebuild derived state after loading."""


def graph_kernels(module: torch.nn.Module) -> list[GraphNodeKernel]:
    """Every graph kernel inside ``module`` (a model, a covariance module), in module order."""
    return [sub for sub in module.modules() if isinstance(sub, GraphNodeKernel)]
