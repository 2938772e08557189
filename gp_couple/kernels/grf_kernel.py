r"""The graph-random-feature kernel :class:`GRFKernel`: sampled walks, row lookup and padded batches.

:class:`GRFKernel` is the scalable GRF-GP kernel of the paper (Section 4.2 "Experiments with
σ-coupled GRFs" [sec:graph_gp_experiments], Appendix F "GRFs for GPs: additional details and
experimental results" [app:grfs_for_gps]): walks are sampled once, with any walk-length coupling
(i.i.d., antithetic or :math:`\sigma`-coupled), and the kernel between node sets :math:`A`,
:math:`B`
is the sparse, unbiased (off the diagonal) estimate

.. math::

    \widehat{\mathbf K}_{AB} = \Phi_A(\theta)\,\Phi_B(\theta)^\top, \qquad
    \Phi(\theta) = \sum_t f_\theta(t)\,\Phi_t ,

returned as a :class:`~gp_couple.operators.GRFGramLinearOperator`, so gpytorch's CG/Lanczos
inference never densifies it. The modulation :math:`f_\theta` comes from the
``kernel_family`` submodule (:mod:`gp_couple.kernel_families`), whose hyperparameters (e.g. the
diffusion :math:`\gamma`) are learnable gpytorch parameters with constraints and priors.
Combine with :class:`gpytorch.kernels.ScaleKernel` for the amplitude :math:`\kappa`
(Appendix F.2 "Scalable GPs on graphs", paragraph "Training GRF-GPs: technical details"
[app:grf_gp_details]: :math:`\mathbf K = \kappa\exp(-\gamma^2\widetilde{\mathbf L})`).

Inputs are node indices (:mod:`gp_couple.kernels.graph_node`, the base class). The row
of a node is found by a binary search on the device in the sorted start nodes, and the
rows selected by an input tensor are remembered for it, so training steps on the same
inputs read nothing back from an accelerator. Batched inputs that hold the same nodes in every batch entry (the
usual case: hyperparameter batches, e.g. Pyro samples) share one feature pattern;
batch entries with different nodes are also exact and sparse, on a pattern padded to
the union of their rows (so it grows with the batch). The kernel passes gpytorch's
``BaseKernelTestCase``. Its base class is
:class:`~gp_couple.kernels.graph_node.GraphNodeKernel`, shared with the exact kernels.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Callable
from copy import deepcopy
from typing import Any, NamedTuple

import gpytorch
import numpy as np
import scipy.sparse as sp
import torch
from linear_operator.operators import DenseLinearOperator, DiagLinearOperator, LinearOperator
from torch import Tensor

from .._checks import (
    ALWAYS_FITS_BYTES,
    available_memory,
    check_even_walkers,
    check_fraction,
    check_int,
    check_p_halt,
    is_int,
)
from .._nodes import node_index_array
from .._random import SeedLike, draw_seed
from ..couplings.directions import (
    DirectionCoupling,
    IndependentDirections,
    direction_coupling_from_dict,
    get_direction_coupling,
)
from ..couplings.proposals import NeighbourProposal, UniformProposal, get_proposal, proposal_from_dict
from ..couplings.walk_lengths import SigmaCoupling, WalkLengthCoupling, coupling_from_dict, get_walk_length_coupling
from ..features.graph_random_features import FEATURE_KEYS, GraphRandomFeatures, StepMatrix, walkers_within_memory
from ..features.sigma_fit import fit_sigma_coupling
from ..graphs import Graph
from ..halting import (
    DEFAULT_MAX_INFLATION,
    MIN_P_HALT,
    WARNING_INFLATION,
    HaltingInflationWarning,
    suggest_p_halt,
    unreliable_inflation,
    warn_if_inflated,
)
from ..kernel_families import KernelFamily
from ..operators import GRFGramLinearOperator, SparseFeatureLinearOperator
from ..predictive_variance import (
    DENSE_VARIANCE_SIZE,
    posterior_variance,
    sparse_factor_candidate,
    sparse_factor_ordering,
    sparse_form,
)
from ..sparse_factor import SparseFactor
from ..sparse_pattern import CSRPattern
from ._inputs import InputCache, same_inputs
from .graph_node import GraphNodeKernel
from .walk_schedule import (
    BIAS_EXPANSION_LIMIT,
    DEFAULT_SCHEDULE,
    EXPANSION_ITERATIONS,
    HELD_OUT_ROWS,
    MAX_PREDICT_WALKERS,
    NOISE_FLOOR_FACTOR,
    PREDICT_ERROR_WARNING_FACTOR,
    PREDICT_GRAM_TOLERANCE,
    SIGMA_FIT_SAMPLES,
    WALKER_STEP,
    BiasCorrectionWarning,
    GramToleranceWarning,
    LikelihoodEvaluation,
    NoiseFloorWarning,
    WalkSchedule,
    hyperparameter_change,
    sparse_whitened_norm,
    warn_if_short,
    whitened_norm,
)

__all__ = ["DENSE_SOLVE_QUADRATURE_NODES", "DENSE_SOLVE_WORK", "EXACT_KERNEL_NODES", "GRFKernel", "PREDICT_WALKERS",
           "SIGMA_ORDER", "TRAIN_P_HALT", "TRAIN_WALKERS", "WALKER_ROUNDS", "dense_factor_pays", "paired_factor_fits"]

_LOG = logging.getLogger(__name__)

#: Graphs up to this many nodes have a practical exact kernel (``MatrixFreeGraphKernel``; the
#: which-kernel page of the documentation), which the warnings of training recommend.
EXACT_KERNEL_NODES = 100_000

#: Walkers per node of the training configuration (the constructor's default).
TRAIN_WALKERS = 48
#: Operations of a dense Cholesky factor worth as much as one stored feature entry in a
#: CG/Lanczos evaluation of the marginal likelihood (:meth:`GRFKernel.dense_solves_pay`),
#: measured with :data:`DENSE_SOLVE_QUADRATURE_NODES` log-determinant quadrature nodes.
DENSE_SOLVE_WORK = 150_000
#: The log-determinant quadrature nodes with which :data:`DENSE_SOLVE_WORK` was measured.
DENSE_SOLVE_QUADRATURE_NODES = 20
#: Dense :math:`n \times n` matrices a bias-corrected training evaluation holds at its peak,
#: value and gradient together, its walks' features included (:meth:`GRFKernel.pairs_evaluations`;
#: ``benchmarks/bench_paired_memory.py``).
PAIRED_DENSE_MATRICES = 10
#: Share of the memory available when a round starts that those matrices may take: the count is a
#: measured peak, and the evaluation's memory is freed when it returns.
PAIRED_MEMORY_FRACTION = 0.8
#: Termination probability of the training configuration (the constructor's default).
TRAIN_P_HALT = 0.1
#: Walkers per node :meth:`GRFKernel.resample_for_prediction` starts from when it chooses the count.
PREDICT_WALKERS = 512
#: Rows of the subset on which :meth:`GRFKernel.estimate_gram_error` compares two draws.
GRAM_ERROR_ROWS = 256
#: Most times :meth:`GRFKernel.walkers_for` scales the walker count after its first estimate.
WALKER_ROUNDS = 3
#: Stream of the seed of the second draw in bias-corrected training rounds (with the kernel's seed).
PAIR_STREAM = 2
#: Stream of the seed that picks the held-out rows of the prediction-error check (with the kernel's seed).
HELD_OUT_STREAM = 3
#: Order of the σ-coupling fitted for prediction (the paper's value for GPs).
SIGMA_ORDER = 50
#: Significant digits of the hyperparameters a σ-coupling is fitted at (see :func:`_rounded`).
SIGMA_FIT_DIGITS = 6


def dense_factor_pays(rows: int, entries: float) -> bool:
    r"""The rule of :meth:`GRFKernel.dense_solves_pay`: :math:`n^3 \le c\,\mathrm{nnz}(\Phi)\,\max(1, m / m_0)`.

    A CG evaluation of the log-determinant runs at least as many steps as its quadrature has
    nodes (gpytorch's ``max_lanczos_quadrature_iterations``, :math:`m`), so the work of the
    evaluations near the threshold, which converge in fewer steps, grows with :math:`m`
    from the :math:`m_0` = :data:`DENSE_SOLVE_QUADRATURE_NODES` with which :math:`c` was measured.

    :param rows: Training points :math:`n`.
    :param entries: Stored entries of their features :math:`\mathrm{nnz}(\Phi)`.
    """
    nodes = gpytorch.settings.max_lanczos_quadrature_iterations.value()
    return rows ** 3 <= DENSE_SOLVE_WORK * entries * max(1.0, nodes / DENSE_SOLVE_QUADRATURE_NODES)


def paired_factor_fits(rows: int, itemsize: int) -> bool:
    r"""Whether a bias-corrected evaluation on ``rows`` training points fits in memory.

    It holds :data:`PAIRED_DENSE_MATRICES` dense :math:`n \times n` matrices at its peak;
    they may take :data:`PAIRED_MEMORY_FRACTION` of the available memory
    (:func:`~gp_couple._checks.available_memory`). Where that is unknown, only
    evaluations below :data:`~gp_couple._checks.ALWAYS_FITS_BYTES` fit.

    :param rows: Training points :math:`n`.
    :param itemsize: Bytes per entry of the training covariance.
    """
    needed = PAIRED_DENSE_MATRICES * rows ** 2 * itemsize
    if needed <= ALWAYS_FITS_BYTES:
        return True
    available = available_memory()
    return available is not None and needed <= PAIRED_MEMORY_FRACTION * available


class GRFKernel(GraphNodeKernel):
    r"""Graph random feature kernel :math:`\widehat k(v_i, v_j) = \phi(v_i)^\top\phi(v_j)` (Appendix
    C.1 "Constructing graph random features" [app:grf_approx]).

    The walks are sampled once, here, and stored as buffers (saved in the state
    dict); the feature values :math:`\Phi(\theta) = \sum_t f_\theta(t)\Phi_t` are
    rebuilt from them in every forward pass, so they follow the hyperparameters and
    are differentiable in them. The same ``seed`` gives identical kernels.

    Diagonal entries :math:`\|\phi(v_i)\|^2` square one set of walks and are biased
    upwards (footnote in Appendix C.1 "Constructing graph random features" [app:grf_approx]);
    off-diagonal entries are unbiased.

    The defaults are the recommended GRF-GP: training starts on :data:`TRAIN_WALKERS`
    antithetic walkers per node with repelling directions at
    :math:`p_\mathrm{halt} =` :data:`TRAIN_P_HALT`, and the kernel's
    :class:`~gp_couple.kernels.walk_schedule.WalkSchedule` lets
    :func:`gp_couple.models.fit_gp` redraw longer walks and more walkers as the learnt range
    needs them (:meth:`refine_walks`), and :math:`\sigma`-coupled prediction walkers at the
    learnt hyperparameters when training ends (:meth:`prepare_prediction`), as many as a
    stated accuracy needs. ``GRFKernel(graph)`` + ``fit_gp`` + ``predict`` is therefore the
    recommended model. The paper's experiments pass their own settings (e.g. 16 i.i.d.
    walkers, :math:`p_\mathrm{halt} = 0.5`) with ``schedule=None``, which keeps the walks
    as drawn.

    A kernel whose halting inflation (:func:`gp_couple.halting.halting_inflation`) at its
    current hyperparameters exceeds :data:`~gp_couple.halting.WARNING_INFLATION` warns
    once (:class:`~gp_couple.halting.HaltingInflationWarning`); :func:`gp_couple.models.fit_gp`
    and :func:`gp_couple.models.predict` check it (:meth:`check_estimator`).

    :param graph: The graph.
    :param num_walkers: Walkers per node :math:`m` (even for paired couplings).
    :param p_halt: Termination probability :math:`p_\mathrm{halt}`.
    :param coupling: Walk-length coupling: ``"iid"``, ``"antithetic"`` (default) or a
        :class:`~gp_couple.couplings.walk_lengths.WalkLengthCoupling` (e.g. a fitted
        :class:`~gp_couple.couplings.walk_lengths.SigmaCoupling`).
    :param kernel_family: The kernel family and its hyperparameters (default
        :class:`~gp_couple.kernel_families.Diffusion`), exposed as ``kernel.kernel_family``.
    :param max_length: Optional cap on walk lengths (truncates the series).
    :param seed: Seed of the walks (int, generator or ``None`` for a draw from torch's
        global generator; the int actually used is kept in :attr:`seed`).
    :param nodes: Sample feature rows only for these nodes (default: all nodes). On
        large graphs pass the observed and test nodes; inputs outside this set raise.
    :param batch_shape: Hyperparameter batch shape.
    :param proposal: Neighbour proposal: ``"weighted"`` (default; choice in proportion
        to edge weight, identical to ``"uniform"`` on unweighted graphs), ``"uniform"``
        or a :class:`~gp_couple.couplings.proposals.NeighbourProposal`.
    :param directions: Direction coupling: ``"independent"``, ``"repelling"`` (default;
        repelling random walks) or a :class:`~gp_couple.couplings.directions.DirectionCoupling`.
    :param schedule: How training redraws the walks
        (:class:`~gp_couple.kernels.walk_schedule.WalkSchedule`, default
        :data:`~gp_couple.kernels.walk_schedule.DEFAULT_SCHEDULE`);
        ``None`` keeps them as drawn.
    :param kwargs: Passed to :class:`gpytorch.kernels.Kernel`.
    """

    def __init__(self, graph: Graph, num_walkers: int = TRAIN_WALKERS, p_halt: float = TRAIN_P_HALT,
                 coupling: str | WalkLengthCoupling = "antithetic", kernel_family: KernelFamily | None = None,
                 max_length: int | None = None, seed: SeedLike = 0, nodes: Any = None,
                 batch_shape: torch.Size = torch.Size(), proposal: str | NeighbourProposal | None = None,
                 directions: str | DirectionCoupling | None = "repelling",
                 schedule: WalkSchedule | None = DEFAULT_SCHEDULE, **kwargs: Any) -> None:
        super().__init__(graph, kernel_family, batch_shape=batch_shape, **kwargs)
        self._cache: dict[str, Any] = {}
        config = _walk_config(num_walkers, p_halt, coupling, max_length, proposal, directions)
        if schedule is not None and not isinstance(schedule, WalkSchedule):
            raise TypeError(f"schedule must be a WalkSchedule or None, got {type(schedule).__name__}")
        seed = _resolve_seed(seed)
        features = self._sample(config, seed, self._check_nodes(nodes), torch.get_default_dtype(),
                                torch.device("cpu"))
        #: How :func:`gp_couple.models.fit_gp` redraws the walks (``None``: never).
        self.schedule: WalkSchedule | None = schedule
        #: Whether this training's rounds have redrawn the walks for the whitened error (at most once).
        self._expansion_tried = False
        #: The report that the round on walks redrawn for the whitened error started from, until it is judged.
        self._expansion_start: LikelihoodEvaluation | None = None
        #: The walker count of the round before that round.
        self._expansion_walkers = 0
        #: The walker counts of the round before that round and of that round, once it has been undone.
        self._expansion_undone: tuple[int, int] | None = None
        self._set_config(config, seed)
        self._hold(features)

    # ---------------------------------------------------------------- configuration
    def check_estimator(self) -> None:
        """Warn once if the walks' halting inflation at the current hyperparameters makes the estimate unreliable.

        :warns HaltingInflationWarning: If :func:`~gp_couple.halting.halting_inflation`
            of the kernel family at ``p_halt`` exceeds
            :data:`~gp_couple.halting.WARNING_INFLATION`; the message names ``p_halt`` and
            :func:`~gp_couple.halting.suggest_p_halt`'s value.
        """
        if not self._halting_warned:
            self._halting_warned = warn_if_inflated(self.kernel_family, self.p_halt, "GRFKernel")

    def check_learnt_noise(self, noise: Tensor, floor: float) -> None:
        r"""Warn where training ended with the observation noise on its lower bound.

        The diagonal :math:`\|\phi(v)\|^2` squares one set of walks and is biased upwards,
        and the estimate's error acts as extra, node-dependent noise. Where it exceeds the
        observation noise, the likelihood puts the learnt noise on its bound (within
        :data:`~gp_couple.kernels.walk_schedule.NOISE_FLOOR_FACTOR` of it) and pays with a
        shorter range; the predictive variances of noisy observations, made with other walks,
        are then too small.

        :param noise: The learnt noise variances.
        :param floor: The lower bound of the noise's constraint.
        :warns NoiseFloorWarning: If every noise variance is within the factor of ``floor``.
        """
        if floor > 0 and float(noise.detach().max()) <= NOISE_FLOOR_FACTOR * floor:
            schedule = self.schedule
            if schedule is None:
                remedy = ("Draw more walkers per node or use a lower p_halt (a WalkSchedule adds them as the learnt "
                          "range needs; schedule=None keeps the first walks)")
            else:
                predict = ("predict_walkers" if schedule.predict_walkers is not None else "max_predict_walkers",
                           schedule.predict_walkers or schedule.max_predict_walkers)
                remedy = (f"Raise the WalkSchedule's max_train_walkers ({schedule.max_train_walkers}) and "
                          f"{predict[0]} ({predict[1]})")
            exact = (", or fit an exact kernel (MatrixFreeGraphKernel) to the same data to see the noise they support"
                     if self.num_nodes <= EXACT_KERNEL_NODES else "")
            warnings.warn(f"training ended with the likelihood's noise on its lower bound {floor:g}: the GRF "
                          f"estimate's error, which acts as extra noise, may be standing in for the observation noise "
                          f"({self.num_walkers} walkers per node at p_halt {self.p_halt:.3g}), and the predictive "
                          f"variances of noisy observations may be too small. {remedy}{exact}",
                          NoiseFloorWarning, stacklevel=3)

    def dense_solves_pay(self, nodes: Tensor) -> bool:
        r"""Whether a dense Cholesky factor of the training covariance on ``nodes`` costs less than CG/Lanczos.

        A factor of :math:`n` points costs about :math:`n^3` operations, whatever the walks;
        an evaluation by CG/Lanczos costs a few hundred products with the training features
        :math:`\Phi` (CG iterations times probe vectors), each proportional to their
        stored entries :math:`\mathrm{nnz}(\Phi)`. So the factor pays when

        .. math::

            n^3 \le c \, \mathrm{nnz}(\Phi),

        with :math:`c` = :data:`DENSE_SOLVE_WORK`, measured on one CPU core at converged
        hyperparameters and counting the L-BFGS line-search evaluations that the exact
        objective saves (``benchmarks/RESULTS.md``). The kernel's first walks (few walkers)
        train by CG on large training sets; the walks of later phases and the prediction
        walks, by the factor. The bias-corrected rounds on the prediction walks factorise
        whatever this rule says (:meth:`pairs_evaluations`).

        :param nodes: The training inputs, as the model holds them.
        """
        pattern = self._selection(self.node_indices(nodes), "x")[0]
        return dense_factor_pays(pattern.num_rows, pattern.nnz)

    def estimate_gram_error(self, *, num_walkers: int | None = None, p_halt: float | None = None,
                            coupling: str | WalkLengthCoupling | None = None, rows: int = GRAM_ERROR_ROWS,
                            seed: SeedLike = 0) -> float:
        r"""Relative Frobenius error of the kernel estimate at the current hyperparameters, from two independent draws.

        For two independent estimates :math:`\widehat{\mathbf K}_1, \widehat{\mathbf K}_2`
        of the same configuration on a random subset of ``rows`` of the kernel's nodes,
        :math:`\mathbb E\|\widehat{\mathbf K}_1 - \widehat{\mathbf K}_2\|_F^2 =
        2\,\mathbb E\|\widehat{\mathbf K} - \mathbf K\|_F^2` (the off-diagonal
        entries are unbiased; the diagonal's bias cancels in the difference), so

        .. math::

            \widehat{\varepsilon} = \frac{\|\widehat{\mathbf K}_1 -
            \widehat{\mathbf K}_2\|_F / \sqrt 2}{\|(\widehat{\mathbf K}_1 +
            \widehat{\mathbf K}_2)/2\|_F}

        estimates the relative Gram error of the paper's Figure 3 without the exact kernel.

        :param num_walkers: Walkers per node (default: the kernel's).
        :param p_halt: Termination probability (default: the kernel's).
        :param coupling: Walk-length coupling (default: the kernel's).
        :param rows: Nodes in the subset (at most the kernel's rows).
        :param seed: Seed of the subset and of the two draws.
        :return: The estimated relative error.
        """
        rng = np.random.default_rng(draw_seed(seed))
        starts = self._gram_error_candidates()
        subset = np.sort(rng.choice(starts, size=min(int(rows), starts.size), replace=False))
        config = _walk_config(self.num_walkers if num_walkers is None else num_walkers,
                              self.p_halt if p_halt is None else p_halt,
                              self.coupling if coupling is None else coupling, self.max_length, self.proposal,
                              self.directions)
        family = deepcopy(self.kernel_family).cpu().double()
        estimates = []
        with torch.no_grad():
            for draw in range(2):
                features = self._sample(config, int(rng.integers(2**62)) + draw, subset, torch.float64,
                                        torch.device("cpu"))
                modulation = family.modulation(features.num_terms)
                matrix = features.scipy_feature_matrix(modulation.reshape(-1, modulation.shape[-1])[0])
                estimates.append((matrix @ matrix.T).toarray())
        mean = (estimates[0] + estimates[1]) / 2
        return float(np.linalg.norm(estimates[0] - estimates[1]) / math.sqrt(2) / np.linalg.norm(mean))

    def _gram_error_candidates(self) -> np.ndarray:
        """The nodes :meth:`estimate_gram_error` draws its subset from (the kernel's rows)."""
        return self.features_start_nodes.cpu().numpy()

    def _finite_gram_error(self, num_walkers: int, p_halt: float | None, coupling: str | WalkLengthCoupling | None,
                           seed: SeedLike) -> float:
        """:meth:`estimate_gram_error`, refusing an estimate that is zero or not finite (walks that do not reach
        the kernel's range: every feature underflows)."""
        error = self.estimate_gram_error(num_walkers=num_walkers, p_halt=p_halt, coupling=coupling, seed=seed)
        if not math.isfinite(error):
            family = self.kernel_family
            raise ValueError(f"the GRF estimate of {type(family).__name__}({family.extra_repr()}) is zero or not "
                             f"finite (relative Gram error {error}): walks at p_halt="
                             f"{self.p_halt if p_halt is None else p_halt:g} do not reach this range; lower p_halt "
                             "(gp_couple.halting.suggest_p_halt) or use an exact kernel (MatrixFreeGraphKernel)")
        return error

    def walkers_for(self, tolerance: float, *, start: int, max_walkers: int, p_halt: float | None = None,
                    coupling: str | WalkLengthCoupling | None = None, seed: SeedLike = 0) -> tuple[int, float]:
        r"""The walker count whose estimated relative Gram error (:meth:`estimate_gram_error`) is within ``tolerance``.

        Starts from ``start`` walkers; while the estimate exceeds ``tolerance`` it scales the
        count by :math:`(\widehat\varepsilon / \text{tolerance})^2` (the error of
        independent walkers falls like :math:`m^{-1/2}`; coupled walkers do at least as
        well), by at least :data:`~gp_couple.kernels.walk_schedule.WALKER_STEP` (an estimate
        just above the tolerance is within its own noise of it), capped at ``max_walkers``,
        and estimates again, at most :data:`WALKER_ROUNDS` times. So a count that the
        scaling left just short of the tolerance is not mistaken for a capped one.

        :param tolerance: Largest acceptable estimated relative error.
        :param start: First walker count tried (even).
        :param max_walkers: Largest walker count returned (even); lower where the walks of the
            kernel's rows would not fit in half the machine's memory for training on them
            (:func:`~gp_couple.features.graph_random_features.walkers_within_memory`), with a
            :class:`~gp_couple.kernels.walk_schedule.GramToleranceWarning` if that leaves the
            estimate above ``tolerance``.
        :param p_halt: Termination probability (default: the kernel's).
        :param coupling: Walk-length coupling (default: the kernel's).
        :param seed: Seed of the estimates.
        :return: ``(num_walkers, estimated_error)``.
        """
        fitting = self._walkers_within_memory(self.p_halt if p_halt is None else p_halt,
                                              self.coupling if coupling is None else coupling, int(max_walkers), seed)
        within_memory = int(max_walkers) if fitting is None else min(int(max_walkers), fitting)
        walkers = min(int(start), within_memory)
        error = self._finite_gram_error(walkers, p_halt, coupling, seed)
        for _ in range(WALKER_ROUNDS):
            if error <= tolerance or walkers >= within_memory:
                break
            wanted = walkers * max((error / tolerance) ** 2, WALKER_STEP)
            walkers = int(min(within_memory, 2 * math.ceil(wanted / 2)))
            error = self._finite_gram_error(walkers, p_halt, coupling, seed)
        if error > tolerance and walkers == within_memory < int(max_walkers):
            warnings.warn(f"{walkers} walkers per node are as many as half this machine's memory holds for walks "
                          f"from {self.features_start_nodes.numel()} nodes; they reach an estimated relative Gram "
                          f"error of {error:.3g}, above the tolerance {tolerance:g}. Sample walks from fewer nodes "
                          "(nodes=...), or use an exact kernel (MatrixFreeGraphKernel) at this range",
                          GramToleranceWarning, stacklevel=3)
        return walkers, error

    def _walkers_within_memory(self, p_halt: float, coupling: str | WalkLengthCoupling, upto: int,
                               seed: SeedLike) -> int | None:
        """The most walkers (at most ``upto``) whose features this kernel's rows can train on in half the memory."""
        return walkers_within_memory(self._graph, self.features_start_nodes.cpu().numpy(), p_halt, coupling, upto=upto,
                                     max_length=self.max_length, proposal=self.proposal, directions=self.directions,
                                     seed=seed, dtype=self.features_weights.dtype)

    def halting_for_range(self, max_inflation: float = DEFAULT_MAX_INFLATION) -> float:
        """The termination probability the current hyperparameters need: at most ``p_halt``, within the budget.

        :param max_inflation: Halting-inflation budget (:func:`gp_couple.halting.suggest_p_halt`).
        :return: ``min(p_halt, suggest_p_halt(kernel_family))`` (``p_halt`` when no
            termination probability meets the budget, or for batched hyperparameters).
        """
        try:
            return min(self.p_halt, suggest_p_halt(deepcopy(self.kernel_family).cpu(), max_inflation=max_inflation,
                                                   p_max=max(self.p_halt, MIN_P_HALT + 1e-9)))
        except ValueError:
            return self.p_halt

    def resample_for_prediction(self, num_walkers: int | None = None, *, tolerance: float = PREDICT_GRAM_TOLERANCE,
                                max_walkers: int = MAX_PREDICT_WALKERS, follow_range: bool = True,
                                seed: SeedLike = None, sigma_fit_samples: int = SIGMA_FIT_SAMPLES) -> GRFKernel:
        r"""Redraw the walks for prediction: :math:`\sigma`-coupled walkers, as many as the accuracy needs.

        Fits a :math:`\sigma`-coupling (paper, definition of coupled GRFs; order
        :data:`SIGMA_ORDER`, the paper's value for GPs) for the kernel at its current
        hyperparameters and redraws the walks with it, keeping the start nodes and the
        direction coupling. With ``follow_range`` the termination probability is lowered
        to what the learnt range needs (:meth:`halting_for_range`). Without
        ``num_walkers``, the count starts at :data:`PREDICT_WALKERS` and grows until the
        estimated relative Gram error (:meth:`estimate_gram_error`) is within ``tolerance``
        (at most ``max_walkers``); the estimate is kept in :attr:`gram_error_estimate`.
        Prediction costs one solve and the variances, so many walkers are cheap there.

        :param num_walkers: Walkers per node (even: σ-coupled pairs); ``None`` chooses them.
        :param tolerance: Largest estimated relative Gram error when choosing the count.
        :param max_walkers: Most walkers per node when choosing the count.
        :param follow_range: Lower ``p_halt`` to the learnt range's need.
        :param seed: Seed of the σ fit, the error estimates and (plus one) the new walks;
            ``None`` uses the kernel's seed plus one.
        :param sigma_fit_samples: Walks per node and bin when fitting the σ-coupling.
        :return: ``self``.
        :raises TypeError: If a walker count is not an int or ``tolerance`` not a number.
        :raises ValueError: If a walker count is odd or below 2, or ``tolerance`` is not in (0, 1).
        """
        if num_walkers is not None:
            num_walkers = check_even_walkers("num_walkers", num_walkers)
        tolerance = check_fraction("tolerance", tolerance)
        max_walkers = check_even_walkers("max_walkers", max_walkers)
        base_seed = self.seed + 1 if seed is None else draw_seed(seed)
        p_halt = self.halting_for_range() if follow_range else self.p_halt
        with torch.no_grad():
            # The sigma fit samples walks and weighs them on the CPU.
            sigma = fit_sigma_coupling(_rounded(self.kernel_family), p_halt, SIGMA_ORDER,
                                       samples_per_bin=sigma_fit_samples, seed=base_seed)
        if num_walkers is None:
            num_walkers, error = self.walkers_for(tolerance, start=PREDICT_WALKERS, max_walkers=max_walkers,
                                                  p_halt=p_halt, coupling=sigma, seed=base_seed)
        else:
            error = self.estimate_gram_error(num_walkers=num_walkers, p_halt=p_halt, coupling=sigma, seed=base_seed)
        self.resample(base_seed + 1, num_walkers=int(num_walkers), p_halt=p_halt, coupling=sigma)
        self.gram_error_estimate = error
        return self

    def refine_walks(self, phase: int) -> bool:
        r"""Redraw the training walks if the current hyperparameters need longer walks or more walkers.

        Step 2 of the :class:`~gp_couple.kernels.walk_schedule.WalkSchedule`: the termination
        probability becomes :meth:`halting_for_range`'s, and the walker count grows until
        the estimated relative Gram error (:meth:`walkers_for`) is within
        ``schedule.train_tolerance`` (at most ``schedule.max_train_walkers``). The walks are
        redrawn (seed :attr:`seed` plus one, the same coupling and directions; a
        :math:`\sigma`-coupling, fitted for another termination probability, gives way to
        antithetic lengths) only if the count grows by at least a quarter
        (:data:`~gp_couple.kernels.walk_schedule.WALKER_STEP`) or the termination probability falls
        below four fifths of the current one.

        Walks capped by ``schedule.max_train_walkers`` above the tolerance warn
        (:class:`~gp_couple.kernels.walk_schedule.GramToleranceWarning`) only where training
        ends on them (no training rounds on prediction walks follow, ``schedule.predict`` off
        or ``schedule.refits`` 0).

        :param phase: The training phase about to start (1 for the first redraw).
        :return: Whether the walks were redrawn (never without a schedule, nor after
            ``schedule.phases`` phases).
        """
        schedule = self.schedule
        if schedule is None or phase >= schedule.phases:
            return False
        p_halt = self.halting_for_range()
        coupling = "antithetic" if isinstance(self.coupling, SigmaCoupling) else self.coupling
        seed = self.seed + 1
        walkers, error = self.walkers_for(schedule.train_tolerance, start=self.num_walkers,
                                          max_walkers=max(schedule.max_train_walkers, self.num_walkers),
                                          p_halt=p_halt, coupling=coupling, seed=seed)
        if not (schedule.predict and schedule.refits):
            # Only where training ends on these walks: rounds on the prediction walks follow otherwise.
            warn_if_short("training", error, schedule.train_tolerance, walkers,
                          max(schedule.max_train_walkers, self.num_walkers))
        if not schedule.needs_redraw(walkers, self.num_walkers, p_halt, self.p_halt):
            return False
        _LOG.info("training phase %d: %d walkers per node at p_halt %.3g (estimated Gram error %.3g)",
                  phase, walkers, p_halt, error)
        self.resample(seed, num_walkers=walkers, p_halt=p_halt, coupling=coupling)
        return True

    def prepare_prediction(self, refit: int = 0) -> bool:
        """Draw the prediction walks when training ends, and redraw them while training on them moves the range.

        Steps 3 to 5 of the schedule. With ``refit`` 0 it calls
        :meth:`resample_for_prediction` with the schedule's settings. After each training
        round on those walks (``refit`` 1, 2, ...) it redraws them if the round moved a
        kernel-family hyperparameter by more than ``schedule.refit_tolerance``
        (:func:`~gp_couple.kernels.walk_schedule.hyperparameter_change`) since they were
        drawn. Does nothing without a schedule or when ``schedule.predict`` is off. When a
        round follows and ``schedule.bias_correction`` is on, the kernel pairs its training
        rows with a second, independent draw for that round (:meth:`estimate_difference`;
        above ``max_cholesky_size`` only where that matters, :meth:`pairs_evaluations`),
        provided the prediction walks reach ``schedule.predict_tolerance``: the correction is
        a second-order expansion in the estimate's error, and walks capped above the
        tolerance (by ``schedule.max_predict_walkers`` or memory, with a
        :class:`~gp_couple.kernels.walk_schedule.GramToleranceWarning`) train on the plain
        likelihood. When training ends on the prediction walks and the schedule chooses the
        prediction walkers, the kernel estimates the error its walks add to the predictive
        mean (:meth:`estimate_prediction_error`, from the last evaluation's report, whatever
        the solver) and draws more walkers where it exceeds ``schedule.predict_error_tolerance``.

        :warns BiasCorrectionWarning: When training ends on a bias-corrected round whose last
            evaluation put the estimate's whitened error above
            :data:`~gp_couple.kernels.walk_schedule.BIAS_EXPANSION_LIMIT`, or on one draw,
            uncorrected, whose whitened error against an independent draw is above it
            (measured on a sparse factor of the training covariance where that pays, else on a
            dense one for training sets of up to
            :data:`~gp_couple.predictive_variance.DENSE_VARIANCE_SIZE` points).
        :warns GramToleranceWarning: When the walkers the predictive mean needs exceed
            ``schedule.max_predict_walkers`` or memory, and those leave an estimated error above
            :data:`~gp_couple.kernels.walk_schedule.PREDICT_ERROR_WARNING_FACTOR` times the tolerance.

        When a bias-corrected round ends above the limit on walks the schedule chose, and no
        other round follows, the walks are redrawn once with more walkers for a whitened error of
        ``schedule.expansion_target`` and training goes on for one more round
        (:mod:`~gp_couple.kernels.walk_schedule`), which :meth:`round_regressed` judges.

        :param refit: Training rounds run on prediction walks so far.
        :return: Whether the walks were just drawn and another training round on them follows
            (while ``schedule.refits`` allows, and once more for the whitened error).
        """
        # Kept: redrawing the walks ends the round (and drops them). The next round starts from this report.
        reported, nodes = self._evaluation, self._training_nodes
        if not refit:
            self._expansion_tried = False
            self._expansion_undone = None
        self._expansion_start = None
        # Only the round that training ends on matters: a round on redrawn walks follows the others.
        last = reported if refit else None
        round_walkers = self.num_walkers
        another = self._draw_prediction_walks(refit)
        if last is not None and not another:
            another = self._redraw_for_expansion(last, round_walkers)
        if last is not None and not another:
            corrected = last.expansion_error is not None
            measurable = nodes is not None and last.noise is not None
            error = (last.expansion_error if corrected else
                     self._one_draw_error(nodes, last, dense=nodes.numel() <= DENSE_VARIANCE_SIZE) if measurable
                     else None)
            if error is not None and error > BIAS_EXPANSION_LIMIT:
                warnings.warn(f"the likelihood's bias correction is a second-order expansion in the GRF estimate's "
                              f"error, but where training ended that error is {error:.2g} of the covariance in its "
                              f"worst direction (above {BIAS_EXPANSION_LIMIT:g}), and the correction can overshoot. "
                              f"{self._walkers_for_limit_advice(error, round_walkers, last)}" if corrected else
                              f"training ended on one draw of the walks, on the likelihood without its bias "
                              f"correction (a training set whose dense factor does not fit in memory, walks capped "
                              f"above predict_tolerance, or bias_correction=False), and that draw's error is "
                              f"{error:.2g} of the covariance in its worst direction (above "
                              f"{BIAS_EXPANSION_LIMIT:g}): the likelihood's bias towards a shorter range and more "
                              "noise may have moved the learnt hyperparameters. Train with bias_correction on where "
                              "the dense factor fits, raise max_predict_walkers, or use an exact kernel "
                              "(ExactGraphKernel, MatrixFreeGraphKernel) at this range", BiasCorrectionWarning,
                              stacklevel=3)
            if self.schedule.predict_walkers is None and nodes is not None:
                self._walkers_for_prediction_error(last, nodes)
            self.bias_expansion_error, self.bias_corrected = error, corrected
        self.finish_training()
        self._pairing = (another and self.schedule.bias_correction
                         and self.gram_error_estimate <= self.schedule.predict_tolerance)
        self._round_start = reported if another else None
        return another

    def _redraw_for_expansion(self, last: LikelihoodEvaluation, round_walkers: int) -> bool:
        """Redraw the walks once for the schedule's ``expansion_target`` after a corrected round ended above the limit.

        ``last`` is that round's last report and ``round_walkers`` its walker count; the walks
        may have been redrawn since for the hyperparameters it learnt (their configuration is kept).
        """
        schedule, error = self.schedule, last.expansion_error
        if (self._expansion_tried or schedule.expansion_target is None or schedule.predict_walkers is not None
                or error is None or error <= BIAS_EXPANSION_LIMIT):
            return False
        self._expansion_tried = True
        walkers = min(self._prediction_walker_cap(),
                      2 * math.ceil(round_walkers * (error / schedule.expansion_target) ** 2 / 2))
        # At the learnt hyperparameters the error falls like m^(-1/2); a round whose walkers, capped, would still
        # leave it above the limit is not tried (training moves towards a higher signal-to-noise ratio, where
        # the whitened error is larger still).
        expected = error * math.sqrt(round_walkers / walkers)
        if walkers < WALKER_STEP * self.num_walkers or expected > BIAS_EXPANSION_LIMIT:
            _LOG.info("training round on the prediction walks: it ended with a whitened error of %.3g, above the "
                      "bias correction's limit %g; the %d walkers per node within the cap and memory would leave "
                      "about %.3g: not redrawn", error, BIAS_EXPANSION_LIMIT, walkers, expected)
            return False
        # The same configuration (its sigma-coupling fits hyperparameters within the refit tolerance), more walkers.
        self._redraw_with(walkers)
        self._expansion_start, self._expansion_walkers = last, round_walkers
        _LOG.info("training round on the prediction walks: it ended with a whitened error of %.3g, above the "
                  "bias correction's limit %g; redrawn with %d walkers per node for %g (estimated Gram error %.3g)",
                  error, BIAS_EXPANSION_LIMIT, walkers, schedule.expansion_target, self.gram_error_estimate)
        return True

    def _walkers_for_limit_advice(self, error: float, round_walkers: int, last: LikelihoodEvaluation) -> str:
        """What would bring a corrected round's whitened error within the limit, for the warning that it did not."""
        undone = self._expansion_undone
        if undone is not None:
            round_walkers = undone[0]
        # At fixed hyperparameters the whitened error falls like m^(-1/2).
        needed = 2 * math.ceil(round_walkers * (error / BIAS_EXPANSION_LIMIT) ** 2 / 2)
        cap = self._prediction_walker_cap()
        if undone is None and needed <= cap:
            return (f"About {needed} walkers per node (against {round_walkers}) would bring it within the limit at "
                    "these hyperparameters: set predict_walkers in the WalkSchedule to that, lower predict_tolerance, "
                    "or set bias_correction=False")
        if undone is not None:
            reason = (f"A round on {undone[1]} walkers per node (against {round_walkers}) was tried and undone: it "
                      "ended with a larger error, training having moved where the signal-to-noise ratio is higher")
        else:
            limit = "max_predict_walkers" if cap == self.schedule.max_predict_walkers else "half the memory"
            reason = (f"That would take about {needed} walkers per node (against {round_walkers}), more than the "
                      f"{cap} that {limit} allows")
        noise = ("" if last.noise is None else
                 f" and a noise of {float(last.noise.double().mean()) / last.outputscale:.2g} times the output scale")
        exact = ("an exact kernel (ExactGraphKernel for small graphs, MatrixFreeGraphKernel up to about 10^5 "
                 "nodes; the learnt hyperparameters load into either with load_state_dict(..., strict=False)) is the "
                 "better model" if self.num_nodes <= EXACT_KERNEL_NODES else
                 f"on {self.num_nodes} nodes the exact kernels cost far more, so expect the learnt range to be short "
                 "and the output scale small against the exact GP's")
        return (f"{reason}: at this range{noise} the estimate's noise is large against the observation noise, and "
                f"{exact}. Otherwise {'' if undone else 'raise max_predict_walkers in the WalkSchedule, or '}set "
                "bias_correction=False")

    def round_regressed(self) -> bool:
        """Whether the training round just run on the prediction walks is to be undone.

        Two cases, in which :func:`gp_couple.models.fit_gp` restores the hyperparameters of the
        round before (:meth:`undo_round`) and the kernel keeps its walks for prediction:

        * The round ended at a range beyond the reach of any walks the kernel draws: even at
          :data:`~gp_couple.halting.MIN_P_HALT` the halting inflation
          (:func:`~gp_couple.halting.unreliable_inflation`) exceeds
          :data:`~gp_couple.halting.WARNING_INFLATION`, so the estimate there is no better than
          the zero matrix, the likelihood no longer measures the kernel, and no redraw can
          follow the range. A :class:`~gp_couple.halting.HaltingInflationWarning` says so.
        * The round on walks redrawn for the whitened error ended with a larger one than the
          round before. More walkers lower the estimate's error at fixed hyperparameters, but
          the round can carry L-BFGS to a lower noise and a larger output scale, where the
          error whitened by the noise is larger and the likelihood's second-order correction
          fails.

        Every other round is kept.

        :warns HaltingInflationWarning: In the first case.
        """
        inflation = unreliable_inflation(self.kernel_family, MIN_P_HALT)
        if inflation is not None:
            family = self.kernel_family
            warnings.warn(f"GRFKernel: a training round on the prediction walks ended at {type(family).__name__}"
                          f"({family.extra_repr()}), where even walks at p_halt={MIN_P_HALT:g} inflate the features' "
                          f"second moment by {inflation:.3g} > {WARNING_INFLATION:g} and estimate nothing; the round "
                          "is undone. The "
                          "data may call for a longer range than graph random features estimate at this cost: use "
                          "an exact kernel (MatrixFreeGraphKernel, or gp_couple.recipes.fit_graph_gp, which chooses)",
                          HaltingInflationWarning, stacklevel=4)
            return True
        start, end = self._expansion_start, self._evaluation
        if start is None:
            return False
        regressed = end is None or end.expansion_error is None or end.expansion_error >= start.expansion_error
        _LOG.info("training round on the walks redrawn for the whitened error: it ended at %s (%.3g before it): %s",
                  "no paired evaluation" if end is None or end.expansion_error is None
                  else f"{end.expansion_error:.3g}", start.expansion_error,
                  "undone" if regressed else "kept")
        return regressed

    def undo_round(self) -> None:
        """Take back the report of the round before the one just run (:meth:`round_regressed`)."""
        self._evaluation = self._round_start
        if self._expansion_start is not None:
            self._expansion_undone = (self._expansion_walkers, self.num_walkers)
        self._expansion_start = None

    def estimate_prediction_error(self, evaluation: LikelihoodEvaluation) -> float | None:
        r"""The mean squared error the walks add to the predictive mean away from the data, relative to its scale.

        At up to :data:`~gp_couple.kernels.walk_schedule.HELD_OUT_ROWS` of the kernel's rows
        outside the training set (fixed by the kernel's seed), predicts from this estimate
        and from an independent second draw (that of the bias-corrected rounds,
        :meth:`estimate_difference`; drawn for the check where training had none or the walks
        changed since), each with its own training covariance :math:`\mathbf C^{(k)} = s\widehat{\mathbf K}^{(k)}_{TT} +
        \operatorname{diag}(\sigma^2)`:
        :math:`\mu_*^{(k)} = s\widehat{\mathbf K}^{(k)}_{*T}\mathbf C^{(k)-1}\mathbf r` and
        :math:`v_*^{(k)} = s\widehat k^{(k)}_{**} - s^2\widehat{\mathbf k}^{(k)\top}_{*T}
        \mathbf C^{(k)-1}\widehat{\mathbf k}^{(k)}_{*T}`. The two means differ by twice the
        variance of one draw's error, so

        .. math::

            \hat\rho = \frac{\tfrac12\,\overline{(\mu_*^{(1)} - \mu_*^{(2)})^2}}
            {\tfrac12\,\overline{(v_*^{(1)} + v_*^{(2)})}}

        estimates the mean squared error this draw adds to the predictive mean, as a fraction
        of the latent predictive variance (the exact GP's expected squared error against the
        latent function). The solves are exact: a dense factor, or a sparse one of the GRF
        covariance (:func:`~gp_couple.predictive_variance.posterior_variance`). The test RMSE
        grows by about :math:`\sqrt{1+\hat\rho}` on average, and by a random amount of order
        :math:`\sqrt{\hat\rho}` times the correlation of the walks' error with the exact GP's
        (large on smooth fields, which have few independent test errors).

        :param evaluation: The report of the last training evaluation (its output scale,
            residual and noise, :class:`~gp_couple.kernels.walk_schedule.LikelihoodEvaluation`).
        :return: :math:`\hat\rho`, or ``None`` before a training evaluation, without
            held-out rows (the kernel's rows are the training nodes), without a diagonal noise,
            or where neither a dense nor a sparse factor fits in memory.
        :raises TypeError: If ``evaluation`` is not a
            :class:`~gp_couple.kernels.walk_schedule.LikelihoodEvaluation`.
        """
        if not isinstance(evaluation, LikelihoodEvaluation):
            raise TypeError(f"evaluation must be a LikelihoodEvaluation, got {type(evaluation).__name__}")
        return self._estimate_prediction_error(evaluation, self._training_nodes)

    def _estimate_prediction_error(self, evaluation: LikelihoodEvaluation, nodes: Tensor | None) -> float | None:
        """:meth:`estimate_prediction_error` for the training inputs ``nodes`` (validated node indices)."""
        if nodes is None or evaluation.noise is None:
            return None
        pair = self._pair_draw(nodes)
        if pair.held_out.numel() == 0:
            return None
        with torch.no_grad():
            return self._prediction_error(nodes, pair, evaluation)

    def _prediction_error(self, nodes: Tensor, pair: _PairDraw, evaluation: LikelihoodEvaluation) -> float | None:
        scale, residual, noise = evaluation.outputscale, evaluation.residual, evaluation.noise
        modulation = self.kernel_family.modulation(pair.features.num_terms)
        other_train = SparseFeatureLinearOperator(pair.steps.values(modulation), pattern=pair.pattern)
        other_held = SparseFeatureLinearOperator(pair.held_out_steps.values(modulation), pattern=pair.held_out_pattern)
        means, variances = [], []
        for train, held in ((self.feature_operator(nodes, name="x1"), self.feature_operator(pair.held_out)),
                            (other_train, other_held)):
            # Exact solves whatever the size (dense, or a sparse factor): the two means differ by little.
            covariance = GRFGramLinearOperator(train) * scale + DiagLinearOperator(noise)
            variance, _, mean = posterior_variance(covariance, GRFGramLinearOperator(held, train) * scale,
                                                   scale * GRFGramLinearOperator(held)._diagonal(),
                                                   float(noise.min()), residual=residual)
            if mean is None:
                _LOG.info("prediction walks: the error they add to the predictive mean is not estimated (the "
                          "training covariance has neither a dense nor a sparse factor within memory)")
                return None
            means.append(mean)
            variances.append(variance)
        error = (means[0] - means[1]).square().mean() / 2
        spread = ((variances[0] + variances[1]) / 2).clamp_min(0).mean()
        return float(error / spread.clamp_min(torch.finfo(spread.dtype).tiny))

    def _one_draw_error(self, nodes: Tensor, evaluation: LikelihoodEvaluation, dense: bool) -> float | None:
        r"""The whitened error :math:`\|\mathbf L^{-1}\mathbf H\mathbf L^{-\top}\|_2` of the kernel's draw at ``nodes``.

        :math:`\mathbf C = \mathbf L\mathbf L^\top = s\widehat{\mathbf K} + \operatorname{diag}(\sigma^2)`
        is the covariance at the output scale and noise of ``evaluation`` (which must have a
        diagonal noise), and :math:`\mathbf H = s(\widehat{\mathbf K} -
        \widehat{\mathbf K}_2)/\sqrt2` estimates its error from an independent draw (the
        difference of two draws has twice the variance of one's error). It factorises
        :math:`\mathbf C` sparsely where both draws' Grams are sparse and that factor costs
        less than a dense one (:func:`~gp_couple.predictive_variance.sparse_factor_ordering`),
        else densely in float64 if ``dense``.

        :param dense: Whether a dense factor may be used (the caller checked that it fits).
        :return: The error, or ``None`` where neither factor may be used.
        """
        pair = self._pair_draw(nodes)
        size = nodes.numel()
        scale = evaluation.outputscale
        start = np.random.default_rng([self.seed, PAIR_STREAM]).standard_normal(size)
        with torch.no_grad():
            modulation = self.kernel_family.modulation(pair.features.num_terms)
            other = GRFGramLinearOperator(SparseFeatureLinearOperator(pair.steps.values(modulation),
                                                                      pattern=pair.pattern))
            own = GRFGramLinearOperator(self.feature_operator(nodes, name="x1"))
            own_sparse = sparse_factor_candidate(own, EXPANSION_ITERATIONS)
            if own_sparse is not None:
                covariance = own_sparse * scale + sp.diags(evaluation.noise.double().cpu().numpy())
                order = sparse_factor_ordering(covariance, EXPANSION_ITERATIONS)
                # The other draw's Gram only where this one's factor pays (the draws share its structure).
                other_sparse = None if order is None else sparse_form(other, max_entries=size * size // 4)
                if other_sparse is not None:
                    return sparse_whitened_norm(SparseFactor(covariance, order), covariance,
                                                (own_sparse - other_sparse) * (scale / math.sqrt(2)), start)
            if not dense:
                return None
            # Out of place: the operators may hand out their cached dense matrices.
            own_dense = own.to_dense().double()
            difference = (own_dense - other.to_dense().double()) * (scale / math.sqrt(2))
            dense_covariance = scale * own_dense
            dense_covariance.diagonal().add_(evaluation.noise.double())
            return float(whitened_norm(torch.linalg.cholesky(dense_covariance), difference,
                                       torch.from_numpy(start).unsqueeze(-1).to(dense_covariance)))

    def _walkers_for_prediction_error(self, evaluation: LikelihoodEvaluation, nodes: Tensor) -> None:
        """Step 5 of the schedule: more prediction walkers where the predictive mean needs them."""
        error = self._estimate_prediction_error(evaluation, nodes)
        self.prediction_error_estimate = error
        if error is None:
            return
        tolerance, cap = self.schedule.predict_error_tolerance, self.schedule.max_predict_walkers
        _LOG.info("prediction walks: %d walkers per node add an estimated %.3g of the predictive error to the "
                  "predictive mean (tolerance %g)", self.num_walkers, error, tolerance)
        if error <= tolerance:
            return
        within = self._prediction_walker_cap()
        wanted = 2 * math.ceil(self.num_walkers * error / tolerance / 2)
        walkers = min(wanted, within)
        if walkers >= WALKER_STEP * self.num_walkers:
            drawn = self.num_walkers
            self._redraw_with(walkers)
            self.prediction_error_estimate = error * drawn / walkers
            _LOG.info("prediction walks: redrawn with %d walkers per node (estimated Gram error %.3g, estimated "
                      "error of the predictive mean %.3g)", walkers, self.gram_error_estimate,
                      self.prediction_error_estimate)
        if wanted > within and self.prediction_error_estimate > PREDICT_ERROR_WARNING_FACTOR * tolerance:
            warnings.warn(f"the prediction walks' noise adds an estimated {self.prediction_error_estimate:.3g} times "
                          f"the latent predictive variance to the squared error of the predictive mean with "
                          f"{self.num_walkers} walkers per node, above the schedule's predict_error_tolerance "
                          f"{tolerance:g}: one draw can move the test RMSE by several per cent. The {wanted} walkers "
                          f"it needs exceed {'max_predict_walkers' if within == cap else 'half the memory'}: raise "
                          "max_predict_walkers in the WalkSchedule, or use an exact kernel (ExactGraphKernel, "
                          "MatrixFreeGraphKernel) at this range", GramToleranceWarning, stacklevel=4)

    def _prediction_walker_cap(self) -> int:
        """The most prediction walkers of the current configuration: ``schedule.max_predict_walkers``, within memory."""
        cap = self.schedule.max_predict_walkers
        fitting = self._walkers_within_memory(self.p_halt, self.coupling, cap, self.seed)
        return cap if fitting is None else min(cap, fitting)

    def _redraw_with(self, walkers: int) -> None:
        """Redraw the prediction walks with ``walkers`` per node: their configuration, for the same hyperparameters."""
        drawn_for = self.prediction_hyperparameters
        self.resample(self.seed + 1, num_walkers=walkers)
        self.prediction_hyperparameters = drawn_for
        self.gram_error_estimate = self.estimate_gram_error(seed=self.seed)

    def _draw_prediction_walks(self, refit: int) -> bool:
        schedule = self.schedule
        if schedule is None or not schedule.predict:
            return False
        drawn_for = self.prediction_hyperparameters
        if refit and drawn_for is not None and (
                hyperparameter_change(drawn_for, self.kernel_family.hyperparameters()) <= schedule.refit_tolerance):
            return False
        self.resample_for_prediction(schedule.predict_walkers, tolerance=schedule.predict_tolerance,
                                     max_walkers=schedule.max_predict_walkers,
                                     sigma_fit_samples=schedule.sigma_fit_samples)
        self.prediction_hyperparameters = self.kernel_family.hyperparameters()
        _LOG.info("prediction walks (round %d): %d sigma-coupled walkers per node at p_halt %.3g (estimated Gram "
                  "error %.3g) for %s", refit, self.num_walkers, self.p_halt, self.gram_error_estimate,
                  self.prediction_hyperparameters)
        if schedule.predict_walkers is None:
            warn_if_short("prediction", self.gram_error_estimate, schedule.predict_tolerance, self.num_walkers,
                          schedule.max_predict_walkers)
        return refit < schedule.refits

    def finish_training(self) -> None:
        """Drop the second draw of the bias-corrected training rounds (:meth:`estimate_difference`)."""
        self._pairing = False
        #: Whether this round's paired evaluations factorise densely (decided at its first evaluation).
        self._pairs_densely: bool | None = None
        #: The last report before this round (its output scale and noise; what :meth:`undo_round`
        #: returns to), ``None`` outside rounds.
        self._round_start: LikelihoodEvaluation | None = None
        self._difference: Tensor | None = None
        self._evaluation: LikelihoodEvaluation | None = None
        self._training_nodes: Tensor | None = None
        self._cache.pop("pair", None)

    def pairs_evaluations(self) -> bool:
        r"""Whether the next training evaluation may be bias-corrected: a training round on the prediction walks.

        In such a round (:meth:`prepare_prediction`) a training evaluation is paired when a
        dense factor of the training covariance fits in memory and the correction matters: up
        to gpytorch's ``max_cholesky_size`` points always, and above it where
        :func:`paired_factor_fits` and one draw's whitened error, measured at the output scale
        and noise where the round starts, exceeds the schedule's ``pairing_threshold``
        (decided once per round, at its first evaluation, once the second draw is made). The
        correction needs the dense factor, and it is what keeps the learnt output scale and
        range from the likelihood's second-order bias, which is largest on large training
        sets at high signal-to-noise ratios. So these rounds factorise densely even where
        CG/Lanczos would be cheaper (:meth:`dense_solves_pay`) and where the earlier phases
        solved by it: they are few, and they fix the hyperparameters the model ends with.
        Where one draw's error is within the threshold, the bias (at most a quarter of its
        square per point) is negligible and the round keeps that cheaper solver.
        ``WalkSchedule(bias_correction=False)`` keeps the rounds on one draw and on the
        solver ``max_cholesky_size`` chooses.
        """
        return self._pairing

    def estimate_difference(self) -> Tensor | None:
        r"""The difference :math:`\widehat{\mathbf K}_1 - \widehat{\mathbf K}_2` of the last paired training evaluation.

        In a bias-corrected training round (:class:`~gp_couple.kernels.walk_schedule.WalkSchedule`,
        ``bias_correction``), the training covariance is the mean :math:`\bar{\mathbf K}`
        of two independent estimates at the training nodes: the kernel's own walks and a
        second draw of the same configuration (another seed), made at the first training
        evaluation of the round and dropped when training ends. Their difference, kept by
        that evaluation (and differentiable in the hyperparameters), estimates the error of
        :math:`\bar{\mathbf K}`: its second moment is four times that error's.
        :class:`~gp_couple.marginal_likelihood.DenseMarginalLogLikelihood` takes it (once per
        evaluation) to correct the likelihood's second-order bias.

        :return: The dense difference, or ``None`` when the last evaluation was not paired
            (outside those rounds, in eval mode, or where a dense factor does not fit
            in memory, :meth:`pairs_evaluations`).
        """
        difference, self._difference = self._difference, None
        return difference

    def record_evaluation(self, evaluation: LikelihoodEvaluation) -> None:
        """Keep the report of the last training evaluation (read when the round ends)."""
        self._evaluation = evaluation

    def _paired_gram(self, nodes: Tensor, gram: GRFGramLinearOperator) -> LinearOperator | None:
        """The mean of this estimate and the paired draw's on training ``nodes``, keeping their difference."""
        # Drawn first: its features take memory too (the checks when training ends reuse this draw).
        pair = self._pair_draw(nodes)
        if self._pairs_densely is None:
            # Once per round: a round that switched between the corrected and the plain objective
            # would mislead L-BFGS.
            rows = nodes.numel()
            self._pairs_densely = (rows <= gpytorch.settings.max_cholesky_size.value()
                                   or (paired_factor_fits(rows, gram.dtype.itemsize)
                                       and self._correction_matters(nodes)))
        if not self._pairs_densely:
            return None
        values = pair.steps.values(self.kernel_family.modulation(pair.features.num_terms))
        own = gram.to_dense()
        other = GRFGramLinearOperator(SparseFeatureLinearOperator(values, pattern=pair.pattern)).to_dense()
        self._difference = own - other
        # In place on the new sum: one n x n matrix fewer while both are held.
        return DenseLinearOperator((own + other).div_(2))

    def _correction_matters(self, nodes: Tensor) -> bool:
        """Whether one draw's whitened error where the round starts exceeds the schedule's ``pairing_threshold``.

        Measured (:meth:`_one_draw_error`) at the output scale and noise of the last evaluation
        before the round; ``True`` where there was none or its noise is not diagonal.
        """
        start = self._round_start
        if start is None or start.noise is None or self.schedule.pairing_threshold == 0:
            return True
        error = self._one_draw_error(nodes, start, dense=True)
        matters = error is None or error > self.schedule.pairing_threshold
        _LOG.info("training round on the prediction walks: one draw's whitened error %.3g, %s the pairing "
                  "threshold %g: %s", error, "above" if matters else "within", self.schedule.pairing_threshold,
                  "bias-corrected on a dense factor" if matters else "one draw, solved by CG/Lanczos")
        return matters

    def _pair_draw(self, nodes: Tensor) -> _PairDraw:
        """The second draw at the training ``nodes`` and the held-out rows (made once per walks and inputs)."""

        def draw() -> _PairDraw:
            # Walks of the same configuration from another seed: neither saved nor trained
            # (their values follow this kernel's family).
            rows = np.unique(nodes.cpu().numpy())
            candidates = np.setdiff1d(self.features_start_nodes.cpu().numpy(), rows)
            chooser = np.random.default_rng([self.seed, HELD_OUT_STREAM])
            held_out = np.sort(chooser.choice(candidates, size=min(HELD_OUT_ROWS, candidates.size), replace=False))
            drawn = np.union1d(rows, held_out)
            pair_seed = int(np.random.default_rng([self.seed, PAIR_STREAM]).integers(2**62))
            device = self.features_weights.device
            features = self._sample(self._config(), pair_seed, drawn, self.features_weights.dtype, device)
            starts = torch.as_tensor(drawn, device=device)
            pattern, slots = features.pattern.select_rows(torch.searchsorted(starts, nodes.to(device)))
            held_out_nodes = torch.as_tensor(held_out, device=device)
            held_pattern, held_slots = features.pattern.select_rows(torch.searchsorted(starts, held_out_nodes))
            return _PairDraw(features, pattern, features.step_matrix(slots), held_out_nodes, held_pattern,
                             features.step_matrix(held_slots))

        pairs: InputCache = self._cached("pair", InputCache)
        hit = pairs.get(nodes)
        return pairs.put(nodes, draw()) if hit is None else hit

    def _set_config(self, config: dict[str, Any], seed: int) -> None:
        self._halting_warned = False
        #: The kernel-family hyperparameters (:meth:`~gp_couple.kernel_families.KernelFamily.hyperparameters`)
        #: that :meth:`prepare_prediction` drew the current walks for (``None`` for walks drawn or loaded otherwise).
        self.prediction_hyperparameters: dict[str, Any] | None = None
        #: Estimated relative Gram error of the current walks (set by :meth:`resample_for_prediction`).
        self.gram_error_estimate: float | None = None
        #: Estimated error the current walks add to the predictive mean (:meth:`estimate_prediction_error`;
        #: set when training ends on the prediction walks, scaled to the walkers drawn after it).
        self.prediction_error_estimate: float | None = None
        #: The whitened error of the estimate training ended on
        #: (:data:`~gp_couple.kernels.walk_schedule.BIAS_EXPANSION_LIMIT`): of the mean of a
        #: bias-corrected round, else of the one draw (``None`` where not measured).
        #: Set when training ends on the prediction walks.
        self.bias_expansion_error: float | None = None
        #: Whether the training round that training ended on was bias-corrected (paired draws on a
        #: dense factor, :meth:`pairs_evaluations`) or trained on one draw (``None`` where training did
        #: not end on the prediction walks). Set when training ends on the prediction walks.
        self.bias_corrected: bool | None = None
        self.num_walkers: int = config["num_walkers"]
        self.p_halt: float = config["p_halt"]
        self.coupling: WalkLengthCoupling = config["coupling"]
        self.max_length: int | None = config["max_length"]
        self.proposal: NeighbourProposal = config["proposal"]
        self.directions: DirectionCoupling = config["directions"]
        self.seed: int = seed
        self.finish_training()

    def _config(self) -> dict[str, Any]:
        """The current walk configuration (as :func:`_walk_config` returns it)."""
        return {"num_walkers": self.num_walkers, "p_halt": self.p_halt, "coupling": self.coupling,
                "max_length": self.max_length, "proposal": self.proposal, "directions": self.directions}

    def _check_nodes(self, nodes: Any) -> np.ndarray | None:
        """The ``nodes`` argument: ``None`` (every node) or distinct node indices."""
        return None if nodes is None else node_index_array(nodes, "nodes", self.num_nodes, unique=True)

    def _sample(self, config: dict[str, Any], seed: int, nodes: np.ndarray | None, dtype: torch.dtype,
                device: torch.device) -> GraphRandomFeatures:
        features = GraphRandomFeatures.sample(
            self._graph, config["num_walkers"], config["p_halt"], config["coupling"],
            max_length=config["max_length"], seed=seed, start_nodes=nodes, dtype=dtype,
            proposal=config["proposal"], directions=config["directions"])
        return features.to(device)

    def sample_features(self, nodes: np.ndarray, dtype: torch.dtype | None = None) -> GraphRandomFeatures:
        """The walks of ``nodes`` under this kernel's configuration and seed, on the CPU.

        Walks are keyed by their start node, so these are the kernel's own rows for the
        nodes it holds, and the rows it would hold for any other node: prediction at nodes
        outside :attr:`nodes` samples them chunk by chunk (:mod:`gp_couple.streaming`).

        :param nodes: Validated int64 node indices (distinct).
        :param dtype: Dtype of the weights (default: the kernel's).
        """
        return self._sample(self._config(), self.seed, nodes, self.features_weights.dtype if dtype is None else dtype,
                            torch.device("cpu"))

    def resample(self, seed: SeedLike = None, *, nodes: Any = "keep", num_walkers: int | None = None,
                 p_halt: float | None = None, coupling: str | WalkLengthCoupling | None = None,
                 proposal: str | NeighbourProposal | None = None,
                 directions: str | DirectionCoupling | None = None) -> GRFKernel:
        """Draw new walks (the hyperparameters are kept; on error the kernel is unchanged).

        :param seed: Seed of the new walks (``None``: drawn from torch's global generator).
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
            rows = None if self._rows_are_nodes() else self.features_start_nodes.cpu().numpy()
        else:
            rows = self._check_nodes(nodes)
        config = _walk_config(self.num_walkers if num_walkers is None else num_walkers,
                              self.p_halt if p_halt is None else p_halt,
                              self.coupling if coupling is None else coupling, self.max_length,
                              self.proposal if proposal is None else proposal,
                              self.directions if directions is None else directions)
        seed = _resolve_seed(seed)
        weights = self.features_weights
        features = self._sample(config, seed, rows, weights.dtype, weights.device)
        self._set_config(config, seed)
        self._hold(features)
        return self

    # ---------------------------------------------------------------- state
    def get_extra_state(self) -> dict[str, Any]:
        """Graph identity plus the walk configuration (restored on load)."""
        state = self._graph_state()
        state.update(num_walkers=self.num_walkers, p_halt=self.p_halt, coupling=self.coupling.to_dict(),
                     max_length=self.max_length, seed=self.seed, proposal=self.proposal.to_dict(),
                     directions=self.directions.to_dict(),
                     schedule=None if self.schedule is None else self.schedule.to_dict())
        return state

    def _check_graph_state(self, state: Any, prefix: str
                           ) -> tuple[dict[str, Any], int, WalkSchedule | None | str] | None:
        """Check the graph identity and the whole saved walk configuration; return it validated.

        Loading calls this before anything is copied and :meth:`set_extra_state` applies
        its result, so a bad configuration (``p_halt`` 0, a negative seed, an unknown
        coupling) leaves the kernel as it was.
        """
        super()._check_graph_state(state, prefix)
        if "num_walkers" not in state:  # an ExactGraphKernel state: the walks are kept
            return None
        where = f"{prefix}._extra_state" if prefix else "_extra_state"
        missing = sorted({"p_halt", "coupling", "max_length", "seed"} - set(state))
        if missing:
            raise ValueError(f"{where}: the saved walk configuration lacks {missing}")
        try:
            # States saved before proposals existed were walked uniformly and independently.
            config = _walk_config(
                state["num_walkers"], state["p_halt"], coupling_from_dict(state["coupling"]),
                state["max_length"], proposal_from_dict(state.get("proposal", UniformProposal().to_dict())),
                direction_coupling_from_dict(state.get("directions", IndependentDirections().to_dict())))
            seed = state["seed"]
            if not is_int(seed):
                raise TypeError(f"seed must be an int, got {type(seed).__name__}")
            seed = _resolve_seed(seed)
            # States saved before schedules existed keep the kernel's own.
            schedule = WalkSchedule.from_dict(state["schedule"]) if "schedule" in state else "keep"
        except (TypeError, ValueError) as error:
            raise type(error)(f"{where}: {error}") from error
        return config, seed, schedule

    def _apply_extra_state(self, checked: tuple[dict[str, Any], int, WalkSchedule | None | str] | None) -> None:
        if checked is not None:
            config, seed, schedule = checked
            self._set_config(config, seed)
            if not isinstance(schedule, str):
                self.schedule = schedule

    def _reshaped_on_load(self) -> frozenset[str]:
        return frozenset(f"features_{name}" for name in FEATURE_KEYS)

    def _before_load(self, state_dict: dict[str, Any], prefix: str) -> None:
        saved = {name: state_dict.get(f"{prefix}features_{name}") for name in FEATURE_KEYS}
        if all(isinstance(tensor, Tensor) for tensor in saved.values()):
            # Refuse corrupt features before anything is copied, so the kernel stays intact.
            try:
                GraphRandomFeatures.from_tensors(saved, self.num_nodes)
            except ValueError as error:
                raise ValueError(f"{prefix}features_*: the saved GRF feature tensors are inconsistent "
                                 f"({error})") from error
        # resample() changes the number of feature entries, so a saved kernel's buffers
        # legitimately differ in shape from a freshly built one: adopt the saved shapes.
        for name in FEATURE_KEYS:
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

    def _invalidate(self) -> None:
        super()._invalidate()
        self._cache: dict[str, Any] = {}

    def _copy_memo(self) -> dict[int, Any]:
        return {**super()._copy_memo(), id(self._cache): {}}

    def _cached(self, key: str, build: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    # ---------------------------------------------------------------- features
    def _hold(self, features: GraphRandomFeatures) -> None:
        """Store sampled features as the buffers ``features_<name>`` and as :attr:`features`.

        The buffers are the features' own tensors, so the features (and their pattern) are
        used as they are; features rebuilt from the buffers (after a device move or a
        load) are validated by :meth:`GraphRandomFeatures.from_tensors`.
        """
        for name, tensor in features.tensors().items():
            self.register_buffer(f"features_{name}", tensor)
        # The remembered node indices of inputs stay valid: only what the walks give changes.
        self._cache = {"features": features}

    def _features(self) -> GraphRandomFeatures:
        return self._cached("features", lambda: GraphRandomFeatures.from_tensors(
            {name: getattr(self, f"features_{name}") for name in FEATURE_KEYS}, self.num_nodes))

    @property
    def features(self) -> GraphRandomFeatures:
        """The sampled walk decomposition (:class:`~gp_couple.features.graph_random_features.GraphRandomFeatures`)."""
        return self._features()

    @property
    def nodes(self) -> Tensor:
        """The start node of every feature row (int64)."""
        return self.features_start_nodes

    def _pattern(self) -> CSRPattern:
        return self._features().pattern

    def _rows_are_nodes(self) -> bool:
        def build() -> bool:
            starts = self.features_start_nodes
            return starts.numel() == self.num_nodes and bool(
                torch.equal(starts, torch.arange(self.num_nodes, device=starts.device)))

        return self._cached("rows_are_nodes", build)

    def feature_values(self) -> Tensor:
        r"""Values of :math:`\Phi(\theta)` on the fixed pattern, shape ``(*hyper_batch, nnz)``."""
        features = self._features()
        return features.values(self.kernel_family.modulation(features.num_terms))

    def covered_nodes(self) -> Tensor | None:
        """The nodes with feature rows (the ``nodes`` walks were sampled from), or ``None`` for every node."""
        return None if self._rows_are_nodes() else self.features_start_nodes

    def check_covered(self, index: Tensor, name: str = "nodes") -> None:
        """Raise if a validated node index has no feature row (:meth:`rows`).

        :param index: Validated int64 node indices ``(n,)``, on any device.
        :param name: Argument name used in the message.
        :raises ValueError: If a node is outside the kernel's ``nodes``.
        """
        self.rows(index, name)

    def rows(self, nodes: Tensor, name: str = "x") -> Tensor:
        """Feature rows of validated node indices (int64 ``(n,)``), on the kernel's device.

        A device-side binary search in the sorted start nodes (cached); checking that
        every node has a row reads one flag back to the host.

        :param nodes: Validated int64 node indices ``(n,)``, on any device.
        :param name: Argument name used in the message.
        :return: int64 row positions ``(n,)`` in the feature matrix.
        :raises ValueError: If a node has no feature row (it is outside ``nodes``).
        """
        nodes = nodes.to(self.features_start_nodes.device)
        if self._rows_are_nodes():
            return nodes
        sorted_starts, order = self._cached("row_lookup", lambda: torch.sort(self.features_start_nodes))
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
        r"""The feature rows :math:`\Phi_A` of validated node indices (``(*hyper_batch, n, N)``).

        :param values: :meth:`feature_values` if already computed; by default only the
            selected rows' values are computed (the selection's own step matrix).
        """
        pattern, slots, steps = self._selection(nodes, name)
        if values is None and not torch.is_grad_enabled() and 4 * pattern.nnz >= self._pattern().nnz:
            # Without gradients (prediction), a selection of a large part of the rows takes
            # its values from one pass over all the walks: cheaper than building its own
            # step matrix, which only differentiation needs.
            values = self.feature_values()
        if values is None:
            selected = steps().values(self.kernel_family.modulation(self._features().num_terms))
        else:
            selected = values[..., slots]
        return SparseFeatureLinearOperator(selected, pattern=pattern)

    def _selection(self, nodes: Tensor, name: str) -> tuple[CSRPattern, Tensor, Callable[[], StepMatrix]]:
        # Training evaluates the kernel on the same nodes every iteration: remembering
        # the selected pattern (per index tensor, without reading it) keeps its cached
        # transpose for the CG products and its step matrix for the values, built on first use.
        selections: InputCache = self._cached("selections", InputCache)
        hit = selections.get(nodes)
        if hit is None:
            pattern, slots = self._pattern().select_rows(self.rows(nodes, name))
            features = self._features()
            hit = selections.put(nodes, (pattern, slots, functools.cache(lambda: features.step_matrix(slots))))
        return hit

    def _batched_feature_operator(self, nodes: Tensor, values: Tensor, batch: torch.Size,
                                  name: str) -> SparseFeatureLinearOperator:
        r"""Feature rows for node indices that differ across the batch (``(*batch, n, N)``).

        Row :math:`i` of the shared pattern holds the union of the columns of row
        :math:`i` over all batch entries; each entry stores zeros where its own row has
        no entry. Exact, and never dense, but the pattern grows with the batch, so
        inputs that share their nodes across the batch take the faster path.
        """
        selections: InputCache = self._cached("batched_selections", InputCache)
        selection = selections.get(nodes, batch)
        if selection is None:
            selection = selections.put(nodes, self._padded_selection(nodes, batch, name), batch)
        union, entry, union_slot, slots, num_union = selection
        entry_values = values.expand(*batch, values.shape[-1]).reshape(-1, values.shape[-1])
        padded = entry_values.new_zeros(entry_values.shape[0], num_union)
        padded = padded.index_put((entry, union_slot), entry_values[entry, slots])
        return SparseFeatureLinearOperator(padded.reshape(*batch, -1), pattern=union)

    def _padded_selection(self, nodes: Tensor, batch: torch.Size,
                          name: str) -> tuple[CSRPattern, Tensor, Tensor, Tensor, int]:
        """The union pattern of per-entry rows and where every entry's values go in it."""
        n = nodes.shape[-1]
        entry_nodes = nodes.expand(*batch, n).reshape(-1)
        pattern, slots = self._pattern().select_rows(self.rows(entry_nodes, name))
        owner = pattern.row_indices  # (batch entry) * n + position
        entry, position = owner // n, owner % n
        union_keys, union_slot = torch.unique(position * self.num_nodes + pattern.columns, sorted=True,
                                              return_inverse=True)
        union_rows = union_keys // self.num_nodes
        pointer = torch.zeros(n + 1, dtype=torch.int64, device=union_keys.device)
        pointer[1:] = torch.bincount(union_rows, minlength=n).cumsum(0)
        union = CSRPattern(pointer, union_keys % self.num_nodes, self.num_nodes, validate=False)
        return union, entry, union_slot, slots, union_keys.numel()

    # ---------------------------------------------------------------- gpytorch
    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False,
                **params: Any) -> LinearOperator | Tensor:
        self._check_forward_args(last_dim_is_batch)
        nodes1 = self.node_indices(x1, "x1", allow_batch=True)
        same = same_inputs(x1, x2)
        nodes2 = nodes1 if same else self.node_indices(x2, "x2", allow_batch=True)
        if nodes1.ndim > 1 or nodes2.ndim > 1:
            # Different nodes per batch entry: one padded pattern for the whole batch.
            values = self.feature_values()
            batch = self._output_batch(values.shape[:-1], x1, x2)
            left = self._batched_feature_operator(nodes1, values, batch, "x1")
            right = left if same else self._batched_feature_operator(nodes2, values, batch, "x2")
        else:
            left = self.feature_operator(nodes1, name="x1")
            right = left if same else self.feature_operator(nodes2, name="x2")
            batch = self._output_batch(left.values.shape[:-1], x1, x2)
        gram = GRFGramLinearOperator(left) if right is left else GRFGramLinearOperator(left, right)
        if self.training and right is left and not diag and nodes1.ndim == 1 and not batch:
            # The training covariance: kept for the checks made when training ends.
            self._training_nodes = nodes1
            paired = self._paired_gram(nodes1, gram) if self._pairing else None
            if paired is not None:
                return paired
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
                f"directions={self.directions!r}, seed={self.seed}, schedule={self.schedule!r}")


class _PairDraw(NamedTuple):
    """A second walk draw at the training inputs and the held-out rows, with their row selections."""

    features: GraphRandomFeatures
    pattern: CSRPattern
    steps: StepMatrix
    held_out: Tensor
    held_out_pattern: CSRPattern
    held_out_steps: StepMatrix


def _walk_config(num_walkers: Any, p_halt: Any, coupling: Any, max_length: Any, proposal: Any,
                 directions: Any) -> dict[str, Any]:
    """Validated walk configuration of a :class:`GRFKernel`."""
    return {"num_walkers": check_int("num_walkers", num_walkers, 1), "p_halt": check_p_halt(p_halt),
            "coupling": get_walk_length_coupling(coupling),
            "max_length": None if max_length is None else check_int("max_length", max_length, 0),
            "proposal": get_proposal(proposal), "directions": get_direction_coupling(directions)}


def _rounded(family: KernelFamily) -> KernelFamily:
    """A CPU copy of ``family`` with its raw hyperparameters rounded to :data:`SIGMA_FIT_DIGITS` significant digits.

    The σ-coupling is an optimal assignment, a discrete function of the hyperparameters:
    fitting it at rounded values makes rounding-level differences (sums reduced in another
    order on another number of processes) give the same coupling.
    """
    family = deepcopy(family).cpu()
    with torch.no_grad():
        for parameter in family.parameters():
            parameter.copy_(_round_significant(parameter))
    return family


def _round_significant(values: Tensor) -> Tensor:
    exponent = torch.floor(torch.log10(values.abs().clamp_min(1e-300)))
    scale = torch.pow(10.0, SIGMA_FIT_DIGITS - 1 - exponent)
    return torch.where(values == 0, values, torch.round(values * scale) / scale)


def _resolve_seed(seed: SeedLike) -> int:
    # Ints are used as given (so GRFKernel(seed=s) matches GraphRandomFeatures.sample(seed=s));
    # generators and None are turned into the int that is then stored and saved.
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        draw_seed(seed)  # validates (non-negative)
        return int(seed)
    return draw_seed(seed)
