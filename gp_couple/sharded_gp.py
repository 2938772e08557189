r"""Training a GRF-GP with its observed nodes sharded across processes (torch.distributed).

:func:`fit_sharded_grf_gp` is :func:`gp_couple.models.fit_gp` on a
:class:`~gp_couple.kernels.sharded_grf.ShardedGRFKernel`: every process holds the targets
(:math:`n` numbers) and the walks of its block of the observed nodes, gpytorch's exact
marginal likelihood runs on the sharded Gram operator, and the kernel-family gradients
are summed over the processes. Every process then holds the same trained model; predict
with :class:`gp_couple.streaming.StreamedPredictor`, which splits the prediction nodes
across the processes (with ``release_kernel_walks=True`` when the model is only predicted
from: each process's walks are freed once the predictor has read them).

What is replicated and what is sharded (``docs/scaling_out.rst`` has the measurements):

* sharded: walk sampling and storage of the training rows, the sparse products;
* replicated: the :math:`n`-vectors of CG and Lanczos and their small dense work, the
  hyperparameters, the optimiser's state;
* communicated per product with :math:`b` vectors: an all-reduce of :math:`|S| b` and an
  all-gather of :math:`n b` numbers, :math:`S` being the nodes that the walks of more than one
  process touch (the boundaries between the blocks of sorted training nodes).

Training starts on the recipe's first walks
(:data:`~gp_couple.kernels.grf_kernel.TRAIN_WALKERS` antithetic, repelling walkers at
:math:`p_\mathrm{halt} =` :data:`~gp_couple.kernels.grf_kernel.TRAIN_P_HALT`) and follows the
kernel's walk schedule (:data:`~gp_couple.kernels.walk_schedule.SHARDED_SCHEDULE`), as
:func:`gp_couple.recipes.fit_grf_gp` does on one process: longer walks and more walkers as
the learnt range needs them, then :math:`\sigma`-coupled prediction walkers, trained on
while that moves the range, identically on every process. Its rounds on the prediction
walks train on the plain likelihood, not on the bias-corrected one of
:func:`~gp_couple.recipes.fit_grf_gp` (which needs a dense factor of the whole training
covariance on one process).
"""

from __future__ import annotations

from typing import Any

import gpytorch
import numpy as np
import torch

from ._checks import check_even_walkers
from ._nodes import node_index_array
from .devices import resolve_device
from .distributed import Collective
from .graphs import Graph
from .kernel_families import Diffusion, KernelFamily
from .kernels.grf_kernel import TRAIN_P_HALT, TRAIN_WALKERS
from .kernels.sharded_grf import ShardedGRFKernel, check_sharded_schedule
from .kernels.walk_schedule import SHARDED_SCHEDULE, WalkSchedule
from .models import GraphGP, fit_gp
from .optimize import Convergence, TrainingHistory
from .settings import grf_gp_settings

__all__ = ["fit_sharded_grf_gp"]


def fit_sharded_grf_gp(graph: Graph, train_nodes: Any, train_targets: Any, *, collective: Collective | None = None,
                       kernel_family: KernelFamily | None = None, num_walkers: int = TRAIN_WALKERS,
                       p_halt: float = TRAIN_P_HALT, coupling: str = "antithetic", directions: str = "repelling",
                       iterations: int = 200, optimizer: str = "lbfgs", lr: float = 0.05,
                       convergence: Convergence | None = None, schedule: WalkSchedule | None = SHARDED_SCHEDULE,
                       seed: int = 0, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None,
                       ) -> tuple[GraphGP, gpytorch.likelihoods.Likelihood, TrainingHistory]:
    r"""Train a GRF-GP whose observed nodes are sharded across the processes of ``collective``.

    Call it in every process with the same arguments (checked). One process gives the
    same model as :func:`gp_couple.models.fit_gp` on a
    :class:`~gp_couple.kernels.grf_kernel.GRFKernel` with the same walks; more processes give
    the same losses and hyperparameters up to the rounding of the reductions.

    :param graph: The graph (loaded by every process).
    :param train_nodes: Observed node indices (distinct; sorted here together with the targets).
    :param train_targets: Observations (standardise them: the mean is zero).
    :param collective: The processes (default: the default process group, or this process alone).
    :param kernel_family: Kernel family and initial hyperparameters (default
        :class:`~gp_couple.kernel_families.Diffusion` with :math:`\gamma = 1`).
    :param num_walkers: Walkers per observed node (even: antithetic pairs).
    :param p_halt: Termination probability.
    :param coupling: Walk-length coupling.
    :param directions: Direction coupling.
    :param iterations: Most optimiser iterations per phase.
    :param optimizer: ``"lbfgs"`` (default, deterministic objective) or ``"adam"``.
    :param lr: Adam learning rate.
    :param convergence: Stopping rule of each phase (default :class:`gp_couple.optimize.Convergence`).
    :param schedule: How training redraws the walks
        (:class:`~gp_couple.kernels.walk_schedule.WalkSchedule`, without its bias correction;
        ``None`` trains once on the first walks, and
        :meth:`~gp_couple.kernels.grf_kernel.GRFKernel.resample_for_prediction` must draw the
        prediction walkers).
    :param seed: Seed of the walks and of the CG/Lanczos probes (the same on every process).
    :param dtype: Dtype of the model (float64 by default: reductions in a different order
        then agree to about 1e-12).
    :param device: Torch device of the model (default the CPU; with NCCL, each process's GPU).
        Walks are sampled on the CPU and moved there once.
    :return: ``(model, likelihood, history)``, the same on every process; with a schedule
        that draws prediction walks (the default), ready to predict.
    :raises ValueError: If an argument differs between processes or is out of range, or
        ``schedule`` asks for the bias correction.
    """
    collective = Collective() if collective is None else collective
    nodes = node_index_array(train_nodes, "train_nodes", graph.num_nodes)
    targets = np.asarray(train_targets, dtype=np.float64)
    if targets.shape != nodes.shape:
        raise ValueError(f"train_targets has shape {targets.shape} but train_nodes has {nodes.size} nodes")
    if np.unique(nodes).size != nodes.size:
        raise ValueError("train_nodes contains repeated nodes")
    order = np.argsort(nodes)
    nodes, targets = nodes[order], targets[order]
    num_walkers = check_even_walkers("num_walkers", num_walkers)
    check_sharded_schedule(schedule)
    collective.check_same("train_targets", targets)
    collective.check_same("walk configuration", (num_walkers, float(p_halt), coupling, directions, int(seed),
                                                 None if schedule is None else schedule.to_dict()))
    kernel = ShardedGRFKernel(graph, nodes, collective=collective, num_walkers=num_walkers, p_halt=p_halt,
                              coupling=coupling, directions=directions, seed=seed, schedule=schedule,
                              kernel_family=Diffusion(1.0) if kernel_family is None else kernel_family)
    device = resolve_device(device)
    covariance = gpytorch.kernels.ScaleKernel(kernel).to(device=device, dtype=dtype)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(device=device, dtype=dtype)
    model = GraphGP(nodes, torch.as_tensor(targets, dtype=dtype), likelihood, covariance).to(device=device, dtype=dtype)
    # The pivoted-Cholesky preconditioner reads rows of the operator, which live on other processes.
    with grf_gp_settings(max_preconditioner_size=0), collective.summed_gradients(kernel.hyperparameters_to_reduce()):
        history = fit_gp(model, likelihood, iterations=iterations, lr=lr, optimizer=optimizer,
                         convergence=Convergence() if convergence is None else convergence, seed=seed)
    return model, likelihood, history
