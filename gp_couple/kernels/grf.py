r"""GPyTorch kernels on the nodes of a graph: graph random features and the exact reference.

:class:`GRFKernel` is the scalable GRF-GP kernel of the paper (sec:graph_gp_experiments,
app:grfs_for_gps): walks are sampled once, with any walk-length coupling (i.i.d.,
antithetic or :math:`\sigma`-coupled), and the kernel between node sets :math:`A`, :math:`B`
is the sparse, unbiased (off the diagonal) estimate

.. math::

    \widehat{\mathbf K}_{AB} = \Phi_A(\theta)\,\Phi_B(\theta)^\top, \qquad
    \Phi(\theta) = \sum_t f_\theta(t)\,\Phi_t ,

returned as a :class:`~gp_couple.operators.GRFGramLinearOperator`, so gpytorch's CG/Lanczos
inference never densifies it. The modulation :math:`f_\theta` comes from the
``graph_kernel`` submodule (:mod:`gp_couple.modulation`), whose hyperparameters (e.g. the
diffusion :math:`\gamma`) are learnable gpytorch parameters with constraints and priors.
Combine with :class:`gpytorch.kernels.ScaleKernel` for the amplitude :math:`\kappa`
(app:grf_gp_details: :math:`\mathbf K = \kappa\exp(-\gamma^2\widetilde{\mathbf L})`).

:class:`ExactGraphKernel` is the exact kernel :math:`\sum_k \alpha_k \widetilde{\mathbf W}^k`
for small graphs, with the same ``graph_kernel`` submodule, so state dicts transfer
between the two (e.g. train a GRF-GP, then load its hyperparameters into the exact GP
to measure the KL divergence to the true posterior, app:grf_gp_details).

Inputs are node indices: tensors of shape ``(..., n, 1)``, floating point (integer
valued) or integer. Batched inputs that hold the same nodes in every batch entry (the
usual case: hyperparameter batches, e.g. Pyro samples) share one feature pattern;
batch entries with different nodes are also exact and sparse, on a pattern padded to
the union of their rows (so it grows with the batch). Both kernels pass gpytorch's
``BaseKernelTestCase``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from copy import deepcopy
from typing import Any

import numpy as np
import torch
from gpytorch.kernels import Kernel
from linear_operator.operators import LinearOperator
from torch import Tensor

from .._random import SeedLike, draw_seed
from ..couplings.directions import (
    DirectionCoupling,
    IndependentDirections,
    direction_coupling_from_dict,
    get_direction_coupling,
)
from ..couplings.proposals import NeighbourProposal, UniformProposal, get_proposal, proposal_from_dict
from ..couplings.walk_lengths import (
    WalkLengthCoupling,
    check_p_halt,
    coupling_from_dict,
    get_walk_length_coupling,
)
from ..exact import DENSE_LIMIT, normalized_adjacency_eigh
from ..features.grf import GraphRandomFeatures
from ..graphs import Graph
from ..modulation import Diffusion, GraphKernelSeries
from ..operators import CSRPattern, GRFGramLinearOperator, SparseFeatureLinearOperator

__all__ = ["GraphNodeKernel", "GRFKernel", "ExactGraphKernel"]

#: Names of the feature tensors stored as buffers (``features_<name>``).
_FEATURE_KEYS = ("start_nodes", "row_pointer", "columns", "slot_pointer", "steps", "weights")
#: Row selections remembered per kernel (train, train+test, test, ...).
_SELECTION_CACHE_SIZE = 8
#: Largest integer that float32 represents exactly.
_FLOAT32_EXACT = 2**24
_EXTRA_STATE_VERSION = 1


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


class GraphNodeKernel(Kernel):
    r"""Base class of kernels on graph nodes with a :class:`~gp_couple.modulation.GraphKernelSeries` submodule.

    Handles the graph, the ``graph_kernel`` submodule and the validation of node-index
    inputs.

    :param graph: The graph.
    :param graph_kernel: The graph kernel family (default :class:`~gp_couple.modulation.Diffusion`).
    :param batch_shape: Hyperparameter batch shape (must match ``graph_kernel.batch_shape``).
    :param kwargs: Passed to :class:`gpytorch.kernels.Kernel` (e.g. ``active_dims``).
    """

    has_lengthscale = False

    def __init__(self, graph: Graph, graph_kernel: GraphKernelSeries | None = None, *,
                 batch_shape: torch.Size = torch.Size(), **kwargs: Any) -> None:
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be a gp_couple.Graph, got {type(graph).__name__}")
        batch_shape = torch.Size(batch_shape)
        if graph_kernel is None:
            graph_kernel = Diffusion(batch_shape=batch_shape)
        elif not isinstance(graph_kernel, GraphKernelSeries):
            raise TypeError("graph_kernel must be a gp_couple.modulation.GraphKernelSeries "
                            f"(e.g. Diffusion()), got {type(graph_kernel).__name__}")
        elif graph_kernel.batch_shape != batch_shape:
            raise ValueError(f"graph_kernel has batch_shape {tuple(graph_kernel.batch_shape)} but the "
                             f"kernel was given batch_shape {tuple(batch_shape)}; pass the same shape")
        super().__init__(batch_shape=batch_shape, **kwargs)
        self._graph = graph
        self.graph_kernel = graph_kernel

    @property
    def graph(self) -> Graph:
        """The graph (immutable)."""
        return self._graph

    @property
    def num_nodes(self) -> int:
        """Number of graph nodes :math:`N`."""
        return self._graph.num_nodes

    def node_indices(self, x: Tensor, name: str = "x", *, allow_batch: bool = False) -> Tensor:
        """Validate node-index inputs ``(..., n, 1)`` and return them as int64.

        :param x: Node indices (integer dtype, or floating point with integer values).
        :param name: Argument name used in error messages.
        :param allow_batch: Return ``(..., n)`` when batch entries hold different nodes
            (otherwise that is an error). Batch entries that all hold the same nodes
            always give ``(n,)``: the fast path, one feature pattern for every entry.
        :raises TypeError: If ``x`` is not a real tensor.
        :raises ValueError: If the shape is wrong, an index is not an integer, lies
            outside ``[0, num_nodes)``, or batch entries differ without ``allow_batch``.
        """
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a tensor of node indices, got {type(x).__name__}")
        if x.dtype == torch.bool or x.dtype.is_complex:
            raise TypeError(f"{name} must hold node indices as integers or integer-valued floats, "
                            f"got dtype {x.dtype}")
        if x.requires_grad:
            # e.g. gpytorch's default learn_inducing_locations=True: gradients cannot move
            # discrete node indices, so they would silently never change.
            raise ValueError(f"{name} requires grad, but graph kernel inputs are node indices, which "
                             "cannot be learned; in an ApproximateGP pass learn_inducing_locations=False "
                             "(see gp_couple.variational.GraphVariationalGP)")
        if x.ndim < 2 or x.shape[-1] != 1:
            raise ValueError(f"{name} must have shape (..., n, 1) with one node index per row, "
                             f"got shape {tuple(x.shape)}")
        flat = x[..., 0].reshape(-1, x.shape[-2])
        shared = flat.shape[0] <= 1 or bool((flat == flat[0]).all())
        if not shared and not allow_batch:
            raise ValueError(f"{name} must hold the same nodes in every batch entry here; "
                             "pass allow_batch=True to get one row of indices per batch entry")
        index = flat[0] if shared else flat
        if index.dtype.is_floating_point:
            if not bool(torch.isfinite(index).all()):
                raise ValueError(f"{name} contains NaN or infinite node indices")
            if not bool((index == torch.round(index)).all()):
                bad = index[index != torch.round(index)][0].item()
                raise ValueError(f"{name} contains non-integer node index {bad}")
            if index.dtype in (torch.float16, torch.bfloat16, torch.float32) and index.numel() \
                    and float(index.abs().max()) > _FLOAT32_EXACT:
                raise ValueError(f"{name} has dtype {index.dtype}, which cannot represent node indices "
                                 f"above 2**24 exactly; pass int64 or float64 indices")
        index = index.to(torch.int64)
        if index.numel():
            low, high = int(index.min()), int(index.max())
            if low < 0 or high >= self.num_nodes:
                bad = low if low < 0 else high
                raise ValueError(f"{name} contains node index {bad} outside [0, {self.num_nodes})")
        return index if shared else index.reshape(x.shape[:-1])

    # Hyperparameters live in the graph_kernel submodule and the walk buffers have no
    # batch dimension, so gpytorch's generic versions (which reshape the kernel's own
    # parameters and every buffer) do not apply.
    def _with_hyper_batch(self, transform: Any) -> GraphNodeKernel:
        new_kernel = deepcopy(self)
        for parameter in new_kernel.graph_kernel.parameters():
            parameter.data = transform(parameter.data)
        hyper_batch = transform(torch.empty(*self.graph_kernel.batch_shape, 0)).shape[:-1]
        new_kernel.graph_kernel._batch_shape = hyper_batch
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
            torch.broadcast_shapes(batch, self.batch_shape, self.graph_kernel.batch_shape)
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

    def _check_graph_state(self, state: Any, prefix: str) -> None:
        if not isinstance(state, dict) or "graph_fingerprint" not in state:
            raise ValueError(f"{prefix or 'state_dict'}: the saved kernel state is not a graph-kernel state")
        if state["graph_fingerprint"] != self._graph.fingerprint():
            raise ValueError(
                f"{prefix or 'state_dict'} was saved for a different graph (num_nodes="
                f"{state.get('num_nodes')}, fingerprint {str(state['graph_fingerprint'])[:12]}...) than "
                f"this kernel's (num_nodes={self.num_nodes}, fingerprint "
                f"{self._graph.fingerprint()[:12]}...); build the kernel on the same graph")

    def get_extra_state(self) -> dict[str, Any]:
        """Graph identity (fingerprint and size), checked when loading a state dict."""
        return self._graph_state()

    def set_extra_state(self, state: Any) -> None:
        """Validate the graph identity of a loaded state (see :meth:`get_extra_state`)."""
        self._check_graph_state(state, "")

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: Any,
                              strict: bool, missing_keys: list, unexpected_keys: list,
                              error_msgs: list) -> None:
        # Check the graph before anything is copied, so a mismatch leaves the kernel intact.
        extra = state_dict.get(prefix + "_extra_state")
        if extra is not None:
            self._check_graph_state(extra, prefix.rstrip("."))
        self._before_load(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        self._after_load(prefix, error_msgs)

    def _before_load(self, state_dict: dict[str, Any], prefix: str) -> None:
        """Hook: adapt buffers to a state dict before it is copied in."""

    def _after_load(self, prefix: str, error_msgs: list) -> None:
        """Hook: rebuild derived state after loading."""


class GRFKernel(GraphNodeKernel):
    r"""Graph random feature kernel :math:`\widehat k(v_i, v_j) = \phi(v_i)^\top\phi(v_j)` (app:grf_approx).

    The walks are sampled once, here, and stored as buffers (saved in the state
    dict); the feature values :math:`\Phi(\theta) = \sum_t f_\theta(t)\Phi_t` are
    rebuilt from them in every forward pass, so they follow the hyperparameters and
    are differentiable in them. The same ``seed`` gives identical kernels.

    Diagonal entries :math:`\|\phi(v_i)\|^2` square one set of walks and are biased
    upwards (footnote in app:grf_approx); off-diagonal entries are unbiased.

    :param graph: The graph.
    :param num_walkers: Walkers per node :math:`m` (even for paired couplings).
    :param p_halt: Termination probability :math:`p_\mathrm{halt}`.
    :param coupling: Walk-length coupling: ``"iid"``, ``"antithetic"`` or a
        :class:`~gp_couple.couplings.walk_lengths.WalkLengthCoupling` (e.g. a fitted
        :class:`~gp_couple.couplings.walk_lengths.SigmaCoupling`).
    :param graph_kernel: The graph kernel family and its hyperparameters (default
        :class:`~gp_couple.modulation.Diffusion`), exposed as ``kernel.graph_kernel``.
    :param max_length: Optional cap on walk lengths (truncates the series).
    :param seed: Seed of the walks (int, generator or ``None`` for fresh entropy; the
        int actually used is kept in :attr:`seed`).
    :param nodes: Sample feature rows only for these nodes (default: all nodes). On
        large graphs pass the observed and test nodes; inputs outside this set raise.
    :param batch_shape: Hyperparameter batch shape.
    :param proposal: Neighbour proposal: ``"weighted"`` (default; choice in proportion
        to edge weight, identical to ``"uniform"`` on unweighted graphs), ``"uniform"``
        or a :class:`~gp_couple.couplings.proposals.NeighbourProposal`.
    :param directions: Direction coupling: ``"independent"`` (default), ``"repelling"``
        (repelling random walks) or a :class:`~gp_couple.couplings.directions.DirectionCoupling`.
    :param kwargs: Passed to :class:`gpytorch.kernels.Kernel`.
    """

    def __init__(self, graph: Graph, num_walkers: int = 16, p_halt: float = 0.5,
                 coupling: str | WalkLengthCoupling = "iid", graph_kernel: GraphKernelSeries | None = None,
                 max_length: int | None = None, seed: SeedLike = 0, nodes: Any = None,
                 batch_shape: torch.Size = torch.Size(), proposal: str | NeighbourProposal | None = None,
                 directions: str | DirectionCoupling | None = None, **kwargs: Any) -> None:
        super().__init__(graph, graph_kernel, batch_shape=batch_shape, **kwargs)
        self._cache: dict[str, Any] = {}
        config = _walk_config(num_walkers, p_halt, coupling, max_length, proposal, directions)
        seed = _resolve_seed(seed)
        features = self._sample(config, seed, self._check_nodes(nodes), torch.get_default_dtype(),
                                torch.device("cpu"))
        self._set_config(config, seed)
        for name, tensor in features.tensors().items():
            self.register_buffer(f"features_{name}", tensor)

    # ---------------------------------------------------------------- configuration
    def _set_config(self, config: dict[str, Any], seed: int) -> None:
        self.num_walkers: int = config["num_walkers"]
        self.p_halt: float = config["p_halt"]
        self.coupling: WalkLengthCoupling = config["coupling"]
        self.max_length: int | None = config["max_length"]
        self.proposal: NeighbourProposal = config["proposal"]
        self.directions: DirectionCoupling = config["directions"]
        self.seed: int = seed

    def _check_nodes(self, nodes: Any) -> np.ndarray | None:
        if nodes is None:
            return None
        if isinstance(nodes, Tensor):
            nodes = nodes.detach().cpu().numpy()
        index = np.asarray(nodes)
        if index.ndim != 1:
            raise ValueError(f"nodes must be a 1-D sequence of node indices, got shape {index.shape}")
        if index.size == 0:
            raise ValueError("nodes is empty")
        if not np.issubdtype(index.dtype, np.integer):
            raise TypeError(f"nodes must hold integer node indices, got dtype {index.dtype}")
        if index.min() < 0 or index.max() >= self.num_nodes:
            bad = index.min() if index.min() < 0 else index.max()
            raise ValueError(f"nodes contains node index {bad} outside [0, {self.num_nodes})")
        if np.unique(index).size != index.size:
            raise ValueError("nodes contains duplicate node indices")
        return index.astype(np.int64)

    def _sample(self, config: dict[str, Any], seed: int, nodes: np.ndarray | None, dtype: torch.dtype,
                device: torch.device) -> GraphRandomFeatures:
        features = GraphRandomFeatures.sample(
            self._graph, config["num_walkers"], config["p_halt"], config["coupling"],
            max_length=config["max_length"], seed=seed, start_nodes=nodes, dtype=dtype,
            proposal=config["proposal"], directions=config["directions"])
        if device.type != "cpu":
            features = GraphRandomFeatures.from_tensors(
                {name: tensor.to(device) for name, tensor in features.tensors().items()},
                self.num_nodes)
        return features

    def resample(self, seed: SeedLike = None, *, nodes: Any = "keep", num_walkers: int | None = None,
                 p_halt: float | None = None, coupling: str | WalkLengthCoupling | None = None,
                 proposal: str | NeighbourProposal | None = None,
                 directions: str | DirectionCoupling | None = None) -> GRFKernel:
        """Draw new walks (the hyperparameters are kept; on error the kernel is unchanged).

        :param seed: Seed of the new walks (``None``: fresh entropy).
        :param nodes: New set of start nodes (``None`` for all nodes; default: keep the
            current ones).
        :param num_walkers: New number of walkers (default: unchanged).
        :param p_halt: New termination probability (default: unchanged).
        :param coupling: New walk-length coupling (default: unchanged).
        :param proposal: New neighbour proposal (default: unchanged).
        :param directions: New direction coupling (default: unchanged).
        :return: ``self``.
        """
        if isinstance(nodes, str):
            if nodes != "keep":
                raise ValueError(f"nodes must be node indices, None or 'keep', got {nodes!r}")
            nodes = None if self._rows_are_nodes() else self.features_start_nodes.cpu().numpy()
        config = _walk_config(self.num_walkers if num_walkers is None else num_walkers,
                              self.p_halt if p_halt is None else p_halt,
                              self.coupling if coupling is None else coupling, self.max_length,
                              self.proposal if proposal is None else proposal,
                              self.directions if directions is None else directions)
        seed = _resolve_seed(seed)
        weights = self.features_weights
        features = self._sample(config, seed, self._check_nodes(nodes), weights.dtype, weights.device)
        self._set_config(config, seed)
        for name, tensor in features.tensors().items():
            setattr(self, f"features_{name}", tensor)
        self._invalidate()
        return self

    # ---------------------------------------------------------------- state
    def get_extra_state(self) -> dict[str, Any]:
        """Graph identity plus the walk configuration (restored on load)."""
        state = self._graph_state()
        state.update(num_walkers=self.num_walkers, p_halt=self.p_halt, coupling=self.coupling.to_dict(),
                     max_length=self.max_length, seed=self.seed, proposal=self.proposal.to_dict(),
                     directions=self.directions.to_dict())
        return state

    def set_extra_state(self, state: Any) -> None:
        """Restore the walk configuration saved by :meth:`get_extra_state`."""
        self._check_graph_state(state, "")
        if "num_walkers" in state:  # absent in an ExactGraphKernel state
            # States saved before proposals existed were walked uniformly and independently.
            config = _walk_config(
                state["num_walkers"], state["p_halt"], coupling_from_dict(state["coupling"]),
                state["max_length"], proposal_from_dict(state.get("proposal", UniformProposal().to_dict())),
                direction_coupling_from_dict(state.get("directions", IndependentDirections().to_dict())))
            self._set_config(config, state["seed"])

    def _before_load(self, state_dict: dict[str, Any], prefix: str) -> None:
        saved = {name: state_dict.get(f"{prefix}features_{name}") for name in _FEATURE_KEYS}
        if all(isinstance(tensor, Tensor) for tensor in saved.values()):
            # Refuse corrupt features before anything is copied, so the kernel stays intact.
            try:
                GraphRandomFeatures.from_tensors(saved, self.num_nodes)
            except ValueError as error:
                raise ValueError(f"{prefix}features_*: the saved GRF feature tensors are inconsistent "
                                 f"({error})") from error
        # resample() changes the number of feature entries, so a saved kernel's buffers
        # legitimately differ in shape from a freshly built one: adopt the saved shapes.
        for name in _FEATURE_KEYS:
            saved = state_dict.get(f"{prefix}features_{name}")
            current = self._buffers[f"features_{name}"]
            if isinstance(saved, Tensor) and saved.shape != current.shape:
                self._buffers[f"features_{name}"] = current.new_empty(saved.shape)

    def _after_load(self, prefix: str, error_msgs: list) -> None:
        self._invalidate()
        try:
            self._features()
        except ValueError as error:
            error_msgs.append(f"{prefix}features_*: inconsistent GRF feature tensors ({error})")

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> GRFKernel:
        # Cached patterns hold tensors of the old device/dtype.
        result = super()._apply(fn, *args, **kwargs)
        self._invalidate()
        return result

    def _invalidate(self) -> None:
        self._cache = {}

    def _cached(self, key: str, build: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    # ---------------------------------------------------------------- features
    def _features(self) -> GraphRandomFeatures:
        return self._cached("features", lambda: GraphRandomFeatures.from_tensors(
            {name: getattr(self, f"features_{name}") for name in _FEATURE_KEYS}, self.num_nodes))

    @property
    def features(self) -> GraphRandomFeatures:
        """The sampled walk decomposition (:class:`~gp_couple.features.grf.GraphRandomFeatures`)."""
        return self._features()

    @property
    def nodes(self) -> Tensor:
        """The start node of every feature row (int64)."""
        return self.features_start_nodes

    def _pattern(self) -> CSRPattern:
        return self._cached("pattern", lambda: CSRPattern(
            self.features_row_pointer, self.features_columns, self.num_nodes, validate=False))

    def _rows_are_nodes(self) -> bool:
        def build() -> bool:
            starts = self.features_start_nodes
            return starts.numel() == self.num_nodes and bool(
                torch.equal(starts, torch.arange(self.num_nodes, device=starts.device)))

        return self._cached("rows_are_nodes", build)

    def feature_values(self) -> Tensor:
        r"""Values of :math:`\Phi(\theta)` on the fixed pattern, shape ``(*hyper_batch, nnz)``."""
        features = self._features()
        return features.values(self.graph_kernel.modulation(features.num_steps))

    def rows(self, nodes: Tensor, name: str = "x") -> Tensor:
        """Feature rows of validated node indices (int64 ``(n,)``).

        :raises ValueError: If a node has no feature row (it is outside ``nodes``).
        """
        if self._rows_are_nodes():
            return nodes

        def build() -> tuple[Tensor, Tensor]:
            return torch.sort(self.features_start_nodes)

        sorted_starts, order = self._cached("row_lookup", build)
        position = torch.searchsorted(sorted_starts, nodes).clamp_(max=sorted_starts.numel() - 1)
        found = sorted_starts[position] == nodes
        if not bool(found.all()):
            missing = nodes[~found]
            raise ValueError(
                f"{name} contains node {int(missing[0])} (and {missing.numel() - 1} more) without GRF "
                f"features: this kernel sampled walks only from its {sorted_starts.numel()} `nodes`; "
                "include them in `nodes` or call resample(nodes=...)")
        return order[position]

    def feature_operator(self, nodes: Tensor, values: Tensor | None = None,
                         name: str = "x") -> SparseFeatureLinearOperator:
        r"""The feature rows :math:`\Phi_A` of validated node indices (``(*hyper_batch, n, N)``)."""
        pattern, slots = self._selection(self.rows(nodes, name))
        values = self.feature_values() if values is None else values
        return SparseFeatureLinearOperator(values[..., slots], pattern=pattern)

    def _batched_feature_operator(self, nodes: Tensor, values: Tensor, batch: torch.Size,
                                  name: str) -> SparseFeatureLinearOperator:
        r"""Feature rows for node indices that differ across the batch (``(*batch, n, N)``).

        Row :math:`i` of the shared pattern holds the union of the columns of row
        :math:`i` over all batch entries; each entry stores zeros where its own row has
        no entry. Exact, and never dense, but the pattern grows with the batch, so
        inputs that share their nodes across the batch take the faster path.
        """
        n = nodes.shape[-1]
        entry_nodes = nodes.expand(*batch, n).reshape(-1)
        entry_values = values.expand(*batch, values.shape[-1]).reshape(-1, values.shape[-1])
        pattern, slots = self._pattern().select_rows(self.rows(entry_nodes, name))
        owner = pattern.row_indices  # (batch entry) * n + position
        entry, position = owner // n, owner % n
        union_keys, union_slot = torch.unique(position * self.num_nodes + pattern.columns, sorted=True,
                                              return_inverse=True)
        union_rows = union_keys // self.num_nodes
        pointer = torch.zeros(n + 1, dtype=torch.int64, device=union_keys.device)
        pointer[1:] = torch.bincount(union_rows, minlength=n).cumsum(0)
        union = CSRPattern(pointer, union_keys % self.num_nodes, self.num_nodes, validate=False)
        padded = entry_values.new_zeros(entry_values.shape[0], union_keys.numel())
        padded = padded.index_put((entry, union_slot), entry_values[entry, slots])
        return SparseFeatureLinearOperator(padded.reshape(*batch, -1), pattern=union)

    def _selection(self, rows: Tensor) -> tuple[CSRPattern, Tensor]:
        # Training evaluates the kernel on the same rows every iteration: remembering
        # the selected pattern also keeps its cached transpose for the CG products.
        selections: OrderedDict = self._cached("selections", OrderedDict)
        key = hashlib.sha1(rows.cpu().numpy().tobytes()).hexdigest()
        hit = selections.get(key)
        if hit is not None and torch.equal(hit[0], rows):
            selections.move_to_end(key)
            return hit[1], hit[2]
        pattern, slots = self._pattern().select_rows(rows)
        selections[key] = (rows.clone(), pattern, slots)
        while len(selections) > _SELECTION_CACHE_SIZE:
            selections.popitem(last=False)
        return pattern, slots

    # ---------------------------------------------------------------- gpytorch
    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False,
                **params: Any) -> LinearOperator | Tensor:
        self._check_forward_args(last_dim_is_batch)
        same = x1 is x2 or (x1.shape == x2.shape and torch.equal(x1, x2))
        nodes1 = self.node_indices(x1, "x1", allow_batch=True)
        nodes2 = nodes1 if same else self.node_indices(x2, "x2", allow_batch=True)
        values = self.feature_values()
        batch = self._output_batch(values.shape[:-1], x1, x2)
        if nodes1.ndim > 1 or nodes2.ndim > 1:
            # Different nodes per batch entry: one padded pattern for the whole batch.
            left = self._batched_feature_operator(nodes1, values, batch, "x1")
            right = left if same else self._batched_feature_operator(nodes2, values, batch, "x2")
        else:
            left = self.feature_operator(nodes1, values, "x1")
            right = left if same else self.feature_operator(nodes2, values, "x2")
        gram = GRFGramLinearOperator(left) if right is left else GRFGramLinearOperator(left, right)
        if diag:
            if nodes1.shape[-1] != nodes2.shape[-1]:
                raise ValueError(f"diag=True needs x1 and x2 of equal length, got {nodes1.shape[-1]} "
                                 f"and {nodes2.shape[-1]}")
            diagonal = gram._diagonal()
            return diagonal.expand(*batch, diagonal.shape[-1])
        return gram if gram.batch_shape == batch else gram._expand_batch(batch)

    def extra_repr(self) -> str:
        rows = self.features_start_nodes.numel()
        return (f"num_nodes={self.num_nodes}, rows={rows}, num_walkers={self.num_walkers}, "
                f"p_halt={self.p_halt}, coupling={self.coupling!r}, proposal={self.proposal!r}, "
                f"directions={self.directions!r}, seed={self.seed}")


def _walk_config(num_walkers: Any, p_halt: Any, coupling: Any, max_length: Any, proposal: Any,
                 directions: Any) -> dict[str, Any]:
    """Validated walk configuration of a :class:`GRFKernel`."""
    return {"num_walkers": _check_int("num_walkers", num_walkers, 1), "p_halt": check_p_halt(p_halt),
            "coupling": get_walk_length_coupling(coupling),
            "max_length": None if max_length is None else _check_int("max_length", max_length, 0),
            "proposal": get_proposal(proposal), "directions": get_direction_coupling(directions)}


def _resolve_seed(seed: SeedLike) -> int:
    # Ints are used as given (so GRFKernel(seed=s) matches GraphRandomFeatures.sample(seed=s));
    # generators and None are turned into the int that is then stored and saved.
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        draw_seed(seed)  # validates (non-negative)
        return int(seed)
    return draw_seed(seed)


class ExactGraphKernel(GraphNodeKernel):
    r"""The exact graph kernel, for graphs small enough for a dense eigendecomposition.

    .. math::

        \mathbf K = \sum_k \alpha_k \widetilde{\mathbf W}^k = \mathbf U g_\theta(\Lambda)\mathbf U^\top .

    Uses one cached eigendecomposition of :math:`\widetilde{\mathbf W}`
    (:func:`gp_couple.exact.normalized_adjacency_eigh`); each evaluation costs
    :math:`O(n_1 n_2 N)` and is differentiable in the hyperparameters. Same
    ``graph_kernel`` submodule as :class:`GRFKernel`, so their state dicts transfer
    (``load_state_dict(..., strict=False)`` ignores the GRF walk buffers).

    :param graph: The graph (at most :data:`gp_couple.exact.DENSE_LIMIT` nodes unless ``force``).
    :param graph_kernel: The graph kernel family (default :class:`~gp_couple.modulation.Diffusion`).
    :param batch_shape: Hyperparameter batch shape.
    :param force: Allow graphs above the dense limit.
    :param kwargs: Passed to :class:`gpytorch.kernels.Kernel`.
    """

    def __init__(self, graph: Graph, graph_kernel: GraphKernelSeries | None = None, *,
                 batch_shape: torch.Size = torch.Size(), force: bool = False, **kwargs: Any) -> None:
        super().__init__(graph, graph_kernel, batch_shape=batch_shape, **kwargs)
        if graph.num_nodes > DENSE_LIMIT and not force:
            raise ValueError(f"ExactGraphKernel needs a dense eigendecomposition; the graph has "
                             f"{graph.num_nodes} > {DENSE_LIMIT} nodes. Use GRFKernel, or pass force=True")

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False,
                **params: Any) -> Tensor:
        self._check_forward_args(last_dim_is_batch)
        nodes1 = self.node_indices(x1, "x1", allow_batch=True)
        nodes2 = self.node_indices(x2, "x2", allow_batch=True)
        eigenvalues, eigenvectors = normalized_adjacency_eigh(self._graph)
        dtype = self.dtype
        spectrum = self.graph_kernel.spectrum(eigenvalues.to(dtype=dtype, device=x1.device))
        spectrum = spectrum.to(torch.float64)
        eigenvectors = eigenvectors.to(x1.device)
        left, right = eigenvectors[nodes1], eigenvectors[nodes2]
        batch = self._output_batch(spectrum.shape[:-1], x1, x2)
        if diag:
            if nodes1.shape[-1] != nodes2.shape[-1]:
                raise ValueError(f"diag=True needs x1 and x2 of equal length, got {nodes1.shape[-1]} "
                                 f"and {nodes2.shape[-1]}")
            result = ((left * right) * spectrum.unsqueeze(-2)).sum(-1)
        else:
            result = (left * spectrum.unsqueeze(-2)) @ right.transpose(-1, -2)
        result = result.to(dtype)
        return result.expand(*batch, *result.shape[-(1 if diag else 2):])
