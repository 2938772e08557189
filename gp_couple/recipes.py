r"""The recommended GRF-GP: trained to convergence on walks that follow the learnt range.

What separates a GRF-GP from the exact GP is the noise of the kernel estimate
:math:`\widehat{\mathbf K} = \Phi\Phi^\top` (paper, Appendix C.1 "Constructing graph random
features" [app:grf_approx]). Training on a noisy estimate biases the marginal likelihood
towards short ranges and large noise: :math:`\log\det` is concave and the quadratic form
convex in :math:`\widehat{\mathbf K}`, and the estimate's noise grows with the range (the
halting inflation of :mod:`gp_couple.halting`). So the walks must follow the
hyperparameters as training moves them. :func:`fit_grf_gp`

1. trains :math:`\kappa`, the graph-kernel hyperparameters and :math:`\sigma_n^2` to
   convergence (:func:`gp_couple.optimize.minimize`; L-BFGS on a deterministic objective by
   default) with ``train_walkers`` walkers per node (antithetic lengths, repelling
   directions, :math:`p_\mathrm{halt} = 0.1`);
2. then, phase after phase, lowers :math:`p_\mathrm{halt}` to what the learnt range needs
   (:meth:`~gp_couple.kernels.grf_kernel.GRFKernel.halting_for_range`) and raises the walker count
   until the estimated relative Gram error at the learnt hyperparameters
   (:meth:`~gp_couple.kernels.grf_kernel.GRFKernel.estimate_gram_error`, two independent draws)
   is within ``train_tolerance``, redraws the walks and trains to convergence again from
   where it stopped, until the walks no longer change (more walkers, or a termination
   probability lower by a fifth);
3. fits a :math:`\sigma`-coupling (paper, definition of coupled GRFs) for the learnt kernel
   and redraws as many prediction walkers as a relative Gram error of
   ``predict_tolerance`` needs (:meth:`~gp_couple.kernels.grf_kernel.GRFKernel.resample_for_prediction`).

The cost follows the range the data support: short-range kernels keep the first walks,
long-range ones get longer walks and more walkers. ``benchmarks/RESULTS.md`` has the
measurements against the exact GP trained to the same convergence criterion.
"""

from __future__ import annotations

import logging
from typing import Any

import gpytorch
import numpy as np
import torch

from ._checks import check_even_walkers, check_fraction, check_int
from ._nodes import node_index_array
from ._random import SeedLike, draw_seed
from .devices import resolve_device
from .graphs import Graph
from .kernel_families import Diffusion, KernelFamily
from .kernels.grf_kernel import MAX_PREDICT_WALKERS, PREDICT_GRAM_TOLERANCE, TRAIN_P_HALT, TRAIN_WALKERS, GRFKernel
from .models import GraphGP, fit_gp
from .optimize import Convergence
from .settings import grf_gp_settings

__all__ = ["MAX_TRAIN_WALKERS", "RECOMMENDED_P_HALT", "RECOMMENDED_TRAIN_WALKERS", "TRAIN_GRAM_TOLERANCE",
           "fit_grf_gp"]

_LOG = logging.getLogger(__name__)

#: Termination probability of the first training phase.
RECOMMENDED_P_HALT = TRAIN_P_HALT
#: Walkers per node of the first training phase.
RECOMMENDED_TRAIN_WALKERS = TRAIN_WALKERS
#: Most walkers per node in training.
MAX_TRAIN_WALKERS = 1024
#: Estimated relative Gram error the training walks aim for.
TRAIN_GRAM_TOLERANCE = 0.03
#: Most training phases (the walks are redrawn between phases).
MAX_PHASES = 4
#: The walks are redrawn for a lower termination probability only below this fraction of the current one.
_P_HALT_STEP = 0.8


def fit_grf_gp(graph: Graph, train_nodes: Any, train_targets: Any, *, predict_nodes: Any,
               iterations: int = 200, optimizer: str = "lbfgs", lr: float = 0.05,
               convergence: Convergence | None = None, kernel_family: KernelFamily | None = None,
               train_walkers: int = RECOMMENDED_TRAIN_WALKERS, max_train_walkers: int = MAX_TRAIN_WALKERS,
               train_tolerance: float = TRAIN_GRAM_TOLERANCE, predict_walkers: int | None = None,
               max_predict_walkers: int = MAX_PREDICT_WALKERS, predict_tolerance: float = PREDICT_GRAM_TOLERANCE,
               p_halt: float = RECOMMENDED_P_HALT, phases: int = MAX_PHASES, sigma_fit_samples: int = 100,
               seed: SeedLike = 0,
               device: torch.device | str | None = None) -> tuple[GraphGP, gpytorch.likelihoods.Likelihood]:
    r"""Train a GRF-GP to convergence with walks that follow the learnt range, and make it ready to predict.

    See the module docstring for the schedule. Training runs inside
    :func:`gp_couple.settings.grf_gp_settings`.

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
    train_walkers = check_even_walkers("train_walkers", train_walkers)
    max_train_walkers = check_even_walkers("max_train_walkers", max_train_walkers)
    if predict_walkers is not None:
        predict_walkers = check_even_walkers("predict_walkers", predict_walkers)
    max_predict_walkers = check_even_walkers("max_predict_walkers", max_predict_walkers)
    train_tolerance = check_fraction("train_tolerance", train_tolerance)
    predict_tolerance = check_fraction("predict_tolerance", predict_tolerance)
    phases = check_int("phases", phases, 1)
    base_seed = draw_seed(seed)
    train = node_index_array(train_nodes, "train_nodes", graph.num_nodes)
    rows = np.union1d(train, node_index_array(predict_nodes, "predict_nodes", graph.num_nodes))
    base = GRFKernel(graph, num_walkers=train_walkers, p_halt=p_halt, coupling="antithetic",
                     directions="repelling", kernel_family=Diffusion(1.0) if kernel_family is None else kernel_family,
                     nodes=rows, seed=base_seed)
    device = resolve_device(device)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(device)
    model = GraphGP(train, train_targets, likelihood, gpytorch.kernels.ScaleKernel(base).to(device))
    convergence = Convergence() if convergence is None else convergence
    with grf_gp_settings():
        for phase in range(phases):
            if phase:
                p_next = base.halting_for_range()
                walkers, error = base.walkers_for(train_tolerance, start=base.num_walkers,
                                                  max_walkers=max(max_train_walkers, base.num_walkers),
                                                  p_halt=p_next, seed=base_seed + phase)
                if p_next > _P_HALT_STEP * base.p_halt and walkers <= base.num_walkers:
                    break
                _LOG.info("training phase %d: %d walkers per node at p_halt %.3g (estimated Gram error %.3g)",
                          phase, walkers, p_next, error)
                base.resample(base_seed + phase, num_walkers=walkers, p_halt=p_next)
            fit_gp(model, likelihood, iterations=iterations, lr=lr, optimizer=optimizer, convergence=convergence,
                   seed=base_seed + phase)
    base.resample_for_prediction(predict_walkers, tolerance=predict_tolerance, max_walkers=max_predict_walkers,
                                 seed=base_seed, sigma_fit_samples=sigma_fit_samples)
    return model, likelihood
