r"""The base of kernels on graph nodes: node-index inputs, hyperparameter batches and saved state.

:class:`GraphNodeKernel` holds the graph and the ``kernel_family`` submodule
(:mod:`gp_couple.kernel_families`) whose hyperparameters every graph kernel learns; it
validates node-index inputs, batches hyperparameters (gpytorch's ``__getitem__`` /
``expand_batch`` contract) and records the graph's identity in the state dict.
:class:`~gp_couple.kernels.grf.GRFKernel`,
:class:`~gp_couple.kernels.exact_graph.ExactGraphKernel` and
:class:`~gp_couple.kernels.matrix_free.MatrixFreeGraphKernel` derive from it.

Inputs are node indices: tensors of shape ``(..., n, 1)``, floating point (integer
valued) or integer. Their values are checked once per input tensor
(:func:`check_node_values`, one host synchronisation on an accelerator); the result is
remembered for that tensor, so a training loop does not check or synchronise again,
and public entry points that validated the indices already (the GP models, through
:func:`node_index_tensor`) hand them over with
:meth:`GraphNodeKernel.trust_node_inputs`.
"""

from __future__ import annotations

import itertools
from copy import deepcopy
from typing import Any

import numpy as np
import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..graphs import Graph
from ..kernel_families import Diffusion, KernelFamily
from ._inputs import InputCache
from ._state import check_state_tensors

__all__ = ["GraphNodeKernel", "check_node_tensor_form", "check_node_values", "node_index_tensor"]

_EXTRA_STATE_VERSION = 1


# -------------------------------------------------------------------- node-index inputs
def _dtype_error(name: str, dtype: Any) -> TypeError:
    return TypeError(f"{name} must hold node indices as integers or integer-valued floats, got dtype {dtype}")


def check_node_values(index: Tensor, name: str, num_nodes: int | None = None) -> Tensor:
    """Check the values of node indices (any shape, any device) and return them as int64.

    Every check reduces to four numbers read back together, so a device tensor costs
    one host synchronisation.

    :param index: Real tensor of node indices (integer, or floating with integer values).
    :param name: Argument name used in error messages.
    :param num_nodes: If given, every index must lie in ``[0, num_nodes)``.
    :raises ValueError: If an index is NaN or infinite, not an integer, not exactly
        representable in the dtype, negative, or ``>= num_nodes``.
    """
    if index.numel() == 0:
        return index.to(torch.int64)
    if index.dtype.is_floating_point:
        finite = torch.isfinite(index)
        safe = torch.where(finite, index, torch.zeros((), dtype=index.dtype, device=index.device))
        fractional = safe != torch.round(safe)
        nonfinite, has_fraction, low, high = torch.stack(
            [(~finite).any().to(torch.float64), fractional.any().to(torch.float64),
             safe.min().to(torch.float64), safe.max().to(torch.float64)]).tolist()
        if nonfinite:
            raise ValueError(f"{name} contains NaN or infinite node indices")
        if has_fraction:
            raise ValueError(f"{name} contains non-integer node index {safe[fractional][0].item()}")
        # Floats represent integers exactly only up to 2 / eps (2**24 for float32).
        exact = round(2.0 / torch.finfo(index.dtype).eps)
        if max(-low, high) > exact:
            raise ValueError(f"{name} has dtype {index.dtype}, which cannot represent node indices above "
                             f"2**{exact.bit_length() - 1} exactly; pass int64 or float64 indices")
        low, high = int(low), int(high)
    else:
        low, high = torch.stack([index.min(), index.max()]).to(torch.int64).tolist()
    if low < 0:
        bound = "" if num_nodes is None else f", outside [0, {num_nodes})"
        raise ValueError(f"{name} contains negative node index {low}{bound}")
    if num_nodes is not None and high >= num_nodes:
        raise ValueError(f"{name} contains node index {high} outside [0, {num_nodes})")
    return index.to(torch.int64)


def node_index_tensor(nodes: Any, name: str, num_nodes: int | None = None, *,
                      device: torch.device | str | None = None) -> Tensor:
    """Validate a 1-D set of node indices (or a column ``(n, 1)``) and return it as int64 ``(n,)``.

    The public edge for node indices given as tensors, arrays or sequences (the GP
    models' train and test nodes); the values are checked by :func:`check_node_values`.

    :param nodes: Tensor, array or sequence of node indices (integers, or floats with
        integer values).
    :param name: Argument name used in error messages.
    :param num_nodes: If given, every index must lie in ``[0, num_nodes)``.
    :param device: Device of the result (default: the tensor's own, or the CPU).
    :raises TypeError: If the indices are not real numbers.
    :raises ValueError: If the shape is wrong, the set is empty, or an index is
        non-finite, non-integer, negative or out of range.
    """
    if isinstance(nodes, Tensor):
        tensor = nodes.detach()
    else:
        try:
            array = np.asarray(nodes)
        except (TypeError, ValueError) as error:
            raise TypeError(f"{name} must be array-like, got {type(nodes).__name__}") from error
        if array.dtype == np.bool_ or not (np.issubdtype(array.dtype, np.integer)
                                           or np.issubdtype(array.dtype, np.floating)):
            raise _dtype_error(name, array.dtype)
        tensor = torch.from_numpy(np.array(array))
    if tensor.dtype == torch.bool or tensor.dtype.is_complex:
        raise _dtype_error(name, tensor.dtype)
    if tensor.ndim == 2 and tensor.shape[1] == 1:
        tensor = tensor[:, 0]
    if tensor.ndim != 1:
        raise ValueError(f"{name} must be 1-D (or a column of shape (n, 1)), got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        raise ValueError(f"{name} is empty")
    index = check_node_values(tensor, name, num_nodes)
    return index if device is None else index.to(device)


def check_node_tensor_form(x: Any, name: str) -> None:
    """Check the type, dtype and shape ``(..., n, 1)`` of kernel inputs (no device synchronisation).

    :raises TypeError: If ``x`` is not a real tensor.
    :raises ValueError: If ``x`` requires grad or has the wrong shape.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a tensor of node indices, got {type(x).__name__}")
    if x.dtype == torch.bool or x.dtype.is_complex:
        raise _dtype_error(name, x.dtype)
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
    flat = check_node_values(x[..., 0].reshape(-1, x.shape[-2]), name, num_nodes).to(device)
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

    def trust_node_inputs(self, x: Tensor, index: Tensor) -> None:
        """Remember ``index`` (int64 ``(n,)``) as the validated node indices of the column ``x``.

        For public entry points (e.g. :class:`~gp_couple.models.GraphGP`) that built
        ``x`` from indices they have already validated, so the kernel does not check
        them a second time.
        """
        self._node_cache.put(x, index.to(self.device))

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
