r"""The recommended GRF-GP in one call: :func:`fit_grf_gp`.

A :class:`~gp_couple.kernels.grf_kernel.GRFKernel` with its default
:class:`~gp_couple.kernels.walk_schedule.WalkSchedule`, trained by
:func:`gp_couple.models.fit_gp`, is the recommended model: training runs to convergence on
walks that follow the learnt range, and ends with :math:`\sigma`-coupled prediction walkers
(the module docstring of :mod:`gp_couple.kernels.walk_schedule` gives the schedule).
:func:`fit_grf_gp` builds that model from a graph and observations, samples walks only from
the observed and predicted nodes, and trains it with L-BFGS under
:func:`gp_couple.settings.grf_gp_settings`. ``benchmarks/RESULTS.md`` has the measurements
against the exact GP trained to the same convergence criterion.
"""

from __future__ import annotations

from typing import Any

import gpytorch
import numpy as np
import torch

from ._nodes import node_index_array
from ._random import SeedLike, draw_seed
from .devices import resolve_device
from .graphs import Graph
from .kernel_families import Diffusion, KernelFamily
from .kernels.grf_kernel import TRAIN_P_HALT, TRAIN_WALKERS, GRFKernel
from .kernels.walk_schedule import (
    EXPANSION_TARGET,
    MAX_PHASES,
    MAX_PREDICT_WALKERS,
    MAX_TRAIN_WALKERS,
    PREDICT_ERROR_TOLERANCE,
    PREDICT_GRAM_TOLERANCE,
    REFIT_TOLERANCE,
    REFITS,
    SIGMA_FIT_SAMPLES,
    TRAIN_GRAM_TOLERANCE,
    WalkSchedule,
)
from .models import GraphGP, fit_gp
from .optimize import Convergence
from .settings import grf_gp_settings

__all__ = ["fit_grf_gp"]


def fit_grf_gp(graph: Graph, train_nodes: Any, train_targets: Any, *, predict_nodes: Any,
               iterations: int = 200, optimizer: str = "lbfgs", lr: float = 0.05,
               convergence: Convergence | None = None, kernel_family: KernelFamily | None = None,
               train_walkers: int = TRAIN_WALKERS, max_train_walkers: int = MAX_TRAIN_WALKERS,
               train_tolerance: float = TRAIN_GRAM_TOLERANCE, predict_walkers: int | None = None,
               max_predict_walkers: int = MAX_PREDICT_WALKERS, predict_tolerance: float = PREDICT_GRAM_TOLERANCE,
               p_halt: float = TRAIN_P_HALT, phases: int = MAX_PHASES, sigma_fit_samples: int = SIGMA_FIT_SAMPLES,
               refits: int = REFITS, refit_tolerance: float = REFIT_TOLERANCE, bias_correction: bool = True,
               predict_error_tolerance: float = PREDICT_ERROR_TOLERANCE,
               expansion_target: float | None = EXPANSION_TARGET, seed: SeedLike = 0,
               device: torch.device | str | None = None) -> tuple[GraphGP, gpytorch.likelihoods.Likelihood]:
    r"""Train a GRF-GP to convergence with walks that follow the learnt range, and make it ready to predict.

    ``ScaleKernel(GRFKernel(graph, ..., schedule=WalkSchedule(...)))`` on the training and
    prediction nodes, trained by :func:`gp_couple.models.fit_gp` inside
    :func:`gp_couple.settings.grf_gp_settings`; the walk arguments are those of
    :class:`~gp_couple.kernels.walk_schedule.WalkSchedule`.

    :param graph: The graph.
    :param train_nodes: Observed node indices.
    :param train_targets: Observations (standardise them: the mean is zero).
    :param predict_nodes: Nodes that will be predicted (walks are drawn only from the
        training and these nodes).
    :param iterations: Most optimiser iterations per phase.
    :param optimizer: ``"lbfgs"`` (default) or ``"adam"`` (:func:`gp_couple.optimize.minimize`).
    :param lr: Adam learning rate.
    :param convergence: Stopping rule of each phase (default :class:`gp_couple.optimize.Convergence`).
    :param kernel_family: Kernel family and initial hyperparameters (default
        :class:`~gp_couple.kernel_families.Diffusion` with :math:`\gamma = 1`).
    :param train_walkers: Walkers per node of the first phase (even: antithetic pairs).
    :param max_train_walkers: Most walkers per node in later phases.
    :param train_tolerance: Estimated relative Gram error the training walks aim for.
    :param predict_walkers: Walkers per node for prediction; ``None`` chooses them for
        ``predict_tolerance``.
    :param max_predict_walkers: Most prediction walkers per node when choosing.
    :param predict_tolerance: Estimated relative Gram error the prediction walks aim for.
    :param p_halt: Termination probability of the first phase (later phases lower it
        to the learnt range's need).
    :param phases: Most training phases (1: train once on the first walks).
    :param sigma_fit_samples: Walks per node and bin when fitting the sigma-coupling.
    :param refits: Most training rounds on the prediction walks (0: none).
    :param refit_tolerance: Relative change of the kernel's hyperparameters in such a round
        above which the prediction walks are redrawn for the new ones.
    :param bias_correction: Train those rounds on the likelihood corrected for the
        estimate's second-order bias (:mod:`gp_couple.kernels.walk_schedule`).
    :param predict_error_tolerance: Largest estimated error the prediction walks add to the
        predictive mean at held-out rows, relative to the latent predictive variance there,
        when training ends on a bias-corrected round; more walkers are drawn above it
        (unless ``predict_walkers`` is given).
    :param expansion_target: Whitened error for which a bias-corrected round that ended above
        :data:`~gp_couple.kernels.walk_schedule.BIAS_EXPANSION_LIMIT` redraws the prediction
        walkers once and trains again (kept only if it ends with a smaller one); ``None``: never.
    :param seed: Seed of the walks, the CG probes, the error estimates and the sigma fit.
    :param device: Torch device of the model (default the CPU; walks are sampled on the CPU
        and moved there once).
    :return: ``(model, likelihood)``; predict with :func:`gp_couple.models.predict`
        inside :func:`gp_couple.settings.grf_gp_settings`.
    :raises TypeError: If ``graph`` is not a :class:`~gp_couple.graphs.Graph` (e.g. a networkx graph).
    :raises ValueError: If a walker count is odd or an argument is out of range.
    """
    if not isinstance(graph, Graph):
        hint = (" (convert a networkx graph with gp_couple.Graph.from_networkx(graph); its nodes are numbered "
                "in graph.nodes order)" if type(graph).__module__.startswith("networkx") else "")
        raise TypeError(f"graph must be a gp_couple Graph, got {type(graph).__name__}{hint}")
    schedule = WalkSchedule(train_tolerance=train_tolerance, max_train_walkers=max_train_walkers, phases=phases,
                            predict_walkers=predict_walkers, predict_tolerance=predict_tolerance,
                            max_predict_walkers=max_predict_walkers, sigma_fit_samples=sigma_fit_samples,
                            refits=refits, refit_tolerance=refit_tolerance, bias_correction=bias_correction,
                            predict_error_tolerance=predict_error_tolerance, expansion_target=expansion_target)
    base_seed = draw_seed(seed)
    train = node_index_array(train_nodes, "train_nodes", graph.num_nodes)
    rows = np.union1d(train, node_index_array(predict_nodes, "predict_nodes", graph.num_nodes))
    base = GRFKernel(graph, num_walkers=train_walkers, p_halt=p_halt, coupling="antithetic",
                     directions="repelling", kernel_family=Diffusion(1.0) if kernel_family is None else kernel_family,
                     nodes=rows, seed=base_seed, schedule=schedule)
    device = resolve_device(device)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(device)
    model = GraphGP(train, train_targets, likelihood, gpytorch.kernels.ScaleKernel(base).to(device))
    with grf_gp_settings():
        fit_gp(model, likelihood, iterations=iterations, lr=lr, optimizer=optimizer,
               convergence=Convergence() if convergence is None else convergence, seed=base_seed)
    return model, likelihood
