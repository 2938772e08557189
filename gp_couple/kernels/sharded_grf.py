r"""A GRF kernel whose training rows are sharded across processes (torch.distributed).

Each process samples walks only from its block of the training nodes
(:meth:`gp_couple.distributed.Collective.shard`). Walks are keyed by their start node
(:func:`gp_couple.features.walks.sample_walk_lengths`), so the union of the blocks is
exactly the feature matrix one process would sample with the same seed: 1, 2 or 64
processes train on the same walks. The training covariance is a
:class:`~gp_couple.operators.sharded_gram.ShardedGramLinearOperator`; gpytorch's
marginal likelihood, CG and Lanczos run on it unchanged (on replicated vectors), and
the hyperparameter gradients that reach the walks' values are summed over the processes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from linear_operator.operators import LinearOperator
from torch import Tensor

from .._random import SeedLike
from ..couplings.walk_lengths import WalkLengthCoupling
from ..distributed import Collective
from ..features.graph_random_features import GraphRandomFeatures
from ..graphs import Graph
from ..operators.sharded_gram import ShardedGramLinearOperator, SharedColumns
from ..sparse_pattern import CSRPattern
from .grf_kernel import GRFKernel, dense_factor_pays
from .walk_schedule import SHARDED_SCHEDULE, WalkSchedule

__all__ = ["ShardedGRFKernel", "check_sharded_schedule"]


class ShardedGRFKernel(GRFKernel):
    r"""GRF kernel on the training nodes, each process holding the walks of its block of them.

    It evaluates the training covariance only (``x1 = x2 =`` the training nodes, the
    input of training); predict with :class:`gp_couple.streaming.StreamedPredictor`,
    which samples prediction walks chunk by chunk from this kernel's configuration, reads
    the observed nodes' features from this process's rows and samples the others. A kernel
    that is only predicted from can then :meth:`release_walks` (the predictor's
    ``release_kernel_walks``), freeing its rows while the training side is built.

    Training follows ``schedule`` (:mod:`gp_couple.kernels.walk_schedule`), as a
    :class:`~gp_couple.kernels.grf_kernel.GRFKernel` does, on every process alike: the
    training phases redraw each process's block with the walk configuration the learnt range
    needs, and when training ends the :math:`\sigma`-coupled prediction walkers are drawn and
    trained on while that moves the range. The choices are the same on every process: the
    hyperparameters are, and the error estimates behind them sample the same subsets of all
    the training nodes. Those rounds train on the plain likelihood: its bias correction needs
    a dense factor of the whole training covariance on one process. The checks that need the
    kernel's rows outside the training set (the error the prediction walks add to the
    predictive mean) are not made: the kernel has no such rows.

    :param graph: The graph (every process loads it).
    :param train_nodes: All training nodes, sorted and distinct (the same on every process).
    :param collective: The processes (default: the default process group, or this process alone).
    :param schedule: How training redraws the walks (default
        :data:`~gp_couple.kernels.walk_schedule.SHARDED_SCHEDULE`; ``None`` keeps them as drawn).
    :param kwargs: Walk configuration and hyperparameters, as for :class:`~gp_couple.kernels.grf_kernel.GRFKernel`
        (``num_walkers``, ``p_halt``, ``coupling``, ``kernel_family``, ``seed``, ...; not ``nodes``
        or ``batch_shape``).
    :raises ValueError: If ``train_nodes`` is not sorted and distinct, has fewer nodes than
        processes, or differs between processes, or ``schedule`` asks for the bias correction.
    """

    def __init__(self, graph: Graph, train_nodes: Any, *, collective: Collective | None = None,
                 schedule: WalkSchedule | None = SHARDED_SCHEDULE, **kwargs: Any) -> None:
        reasons = {"nodes": "its rows are its block of train_nodes", "batch_shape": "it has no hyperparameter batches"}
        for name, reason in reasons.items():
            if name in kwargs:
                raise TypeError(f"ShardedGRFKernel takes no {name!r}: {reason}")
        check_sharded_schedule(schedule)
        collective = Collective() if collective is None else collective
        train = np.asarray(train_nodes)
        if train.ndim != 1 or not np.issubdtype(train.dtype, np.integer) or train.size == 0:
            raise ValueError("train_nodes must be a non-empty 1-D array of integer node indices")
        if np.any(np.diff(train) <= 0):
            raise ValueError("train_nodes must be sorted and distinct (the rows are sharded in this order)")
        if train.size < collective.size:
            raise ValueError(f"{train.size} training nodes cannot be shared by {collective.size} processes")
        collective.check_same("train_nodes", train)
        # Each process's rows are its block of the training nodes; gp_couple.streaming samples the
        # prediction nodes' walks chunk by chunk from the kernel's configuration.
        super().__init__(graph, nodes=train[collective.shard(train.size)], schedule=schedule, **kwargs)
        self.collective = collective
        self.register_buffer("train_nodes", torch.as_tensor(train, dtype=torch.int64), persistent=False)

    @property
    def walks_released(self) -> bool:
        """Whether :meth:`release_walks` freed this process's rows (no :meth:`resample` since)."""
        return self.features_start_nodes.numel() == 0

    def release_walks(self) -> None:
        """Free this process's walks, keeping the walk configuration, the seed and the hyperparameters.

        The kernel then evaluates nothing until :meth:`resample` draws its rows again (with
        ``nodes="keep"``, its block of the training nodes); :meth:`sample_features` still gives
        the walks of any node under the kept configuration.
        """
        weights = self.features_weights
        index = self.features_columns.new_zeros(0)
        self._hold(GraphRandomFeatures(
            num_nodes=self.num_nodes, start_nodes=self.features_start_nodes.new_zeros(0),
            row_pointer=index.new_zeros(1), columns=index, slot_pointer=self.features_slot_pointer.new_zeros(1),
            steps=self.features_steps.new_zeros(0), weights=weights.new_zeros(0), num_terms=1))

    def resample(self, seed: SeedLike = None, *, nodes: Any = "keep", **kwargs: Any) -> ShardedGRFKernel:
        """Draw new walks, as :meth:`GRFKernel.resample <gp_couple.kernels.grf_kernel.GRFKernel.resample>`;
        ``nodes="keep"`` after :meth:`release_walks` draws this process's block of the training nodes again."""
        if isinstance(nodes, str) and nodes == "keep" and self.walks_released:
            nodes = self.train_nodes[self.collective.shard(self.train_nodes.numel())].cpu().numpy()
        super().resample(seed, nodes=nodes, **kwargs)
        return self

    def _check_graph_state(self, state: Any, prefix: str
                           ) -> tuple[dict[str, Any], int, WalkSchedule | None | str] | None:
        checked = super()._check_graph_state(state, prefix)
        if checked is not None and not isinstance(checked[2], str):
            try:
                check_sharded_schedule(checked[2])
            except ValueError as error:
                raise ValueError(f"{prefix}._extra_state: {error}" if prefix else f"_extra_state: {error}") from error
        return checked

    def _gram_error_candidates(self) -> np.ndarray:
        # All training nodes, so that every process estimates the same error and makes the same choice.
        return self.train_nodes.cpu().numpy()

    def _walkers_within_memory(self, p_halt: float, coupling: str | WalkLengthCoupling, upto: int,
                               seed: SeedLike) -> int | None:
        # The fewest any process can hold, so that every process makes the same choice.
        local = super()._walkers_within_memory(p_halt, coupling, upto, seed)
        counts = [upto if count is None else count for count in self.collective.all_gather_objects(local)]
        return min(counts)

    def dense_solves_pay(self, nodes: Tensor) -> bool:
        """:meth:`GRFKernel.dense_solves_pay`'s rule on every process's features together.

        The sum of the stored entries over processes decides, so that every process makes
        the same choice.
        """
        self.check_covered(self.node_indices(nodes))
        local = torch.tensor(float(self.features_columns.numel()), dtype=torch.float64,
                             device=self.features_columns.device)
        entries = float(self.collective.all_reduce(local))
        return dense_factor_pays(self.train_nodes.numel(), entries)

    def check_covered(self, index: Tensor, name: str = "nodes") -> None:
        """Accept the training nodes only (this process holds walks for its block of them).

        :raises ValueError: For any other nodes.
        """
        if not torch.equal(index.to(self.train_nodes.device), self.train_nodes):
            raise ValueError(f"{name}: a ShardedGRFKernel is evaluated at its train_nodes only, in order; "
                             "predict with gp_couple.streaming.StreamedPredictor")

    def _compact_layout(self) -> tuple[CSRPattern, SharedColumns]:
        """This process's pattern on the nodes its walks touch, and where those meet other processes' nodes."""
        def build() -> tuple[CSRPattern, SharedColumns]:
            columns = self.features_columns
            touched = torch.unique(columns)
            every, counts = torch.unique(torch.cat(self.collective.all_gather(touched)), return_counts=True)
            shared = every[counts > 1]
            slot = torch.searchsorted(shared, touched).clamp_(max=max(shared.numel() - 1, 0))
            hit = shared[slot] == touched if shared.numel() else torch.zeros_like(touched, dtype=torch.bool)
            layout = SharedColumns(positions=torch.nonzero(hit).reshape(-1), slots=slot[hit],
                                   num_shared=shared.numel(), num_touched=every.numel())
            pattern = CSRPattern(self.features_row_pointer, torch.searchsorted(touched, columns), touched.numel(),
                                 validate=False)
            return pattern, layout

        return self._cached("compact_layout", build)

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False,
                **params: Any) -> LinearOperator | Tensor:
        self._check_forward_args(last_dim_is_batch)
        if self.walks_released:
            raise RuntimeError("this ShardedGRFKernel released its walks (release_walks); call resample() to "
                               "evaluate it again")
        for name, x in (("x1", x1), ("x2", x2)):
            self.check_covered(self.node_indices(x, name), name)
        values = self.feature_values()
        if values.ndim != 1:
            raise ValueError("a ShardedGRFKernel has no hyperparameter batches")
        pattern, shared = self._compact_layout()
        gram = ShardedGramLinearOperator(values, pattern=pattern, shared=shared,
                                         rows=self.collective.shard(self.train_nodes.numel()),
                                         num_rows=self.train_nodes.numel(), collective=self.collective)
        return gram._diagonal() if diag else gram

    def hyperparameters_to_reduce(self) -> list[torch.nn.Parameter]:
        """The parameters whose gradients each process computes in part (those of the kernel family)."""
        return list(self.kernel_family.parameters())


def check_sharded_schedule(schedule: Any) -> None:
    """Refuse a schedule a :class:`ShardedGRFKernel` cannot follow (one that asks for the bias correction).

    :raises TypeError: If ``schedule`` is neither a :class:`~gp_couple.kernels.walk_schedule.WalkSchedule` nor ``None``.
    :raises ValueError: If it asks for the bias correction.
    """
    if schedule is not None and not isinstance(schedule, WalkSchedule):
        raise TypeError(f"schedule must be a WalkSchedule or None, got {type(schedule).__name__}")
    if schedule is not None and schedule.bias_correction:
        raise ValueError("a ShardedGRFKernel trains its rounds on the prediction walks on the plain likelihood: the "
                         "bias correction needs a dense factor of the whole training covariance on one process. Pass "
                         "a WalkSchedule with bias_correction=False (the default SHARDED_SCHEDULE is one)")
