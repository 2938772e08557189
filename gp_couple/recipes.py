r"""The recommended GRF-GP configuration: train with a moderate walker budget, predict with a large one.

Measured in ``benchmarks/bench_graph_gp_accuracy.py`` (issue on GRF-GPs that predict like
exact GPs): what separates GRF-GP predictions from exact-GP ones is the noise of the kernel
estimate :math:`\widehat{\mathbf K} = \Phi\Phi^\top` (paper, appendix on the GRF
approximation), which shrinks like :math:`1/m`. Its upward diagonal bias (the footnote of
the same appendix) also shrinks like :math:`1/m`, and the unbiased split-half diagonal
(which is not positive semi-definite) did not close the gap in that benchmark, so the
plain diagonal is kept. Walkers are cheapest at prediction time, which is one solve and a
Lanczos cache instead of many Adam steps with stochastic trace estimates, so

1. train :math:`\kappa`, the graph-kernel hyperparameters and :math:`\sigma_n^2` with
   ``train_walkers`` walkers per node (antithetic lengths, repelling directions) and a
   termination probability low enough for the long-range kernels training selects
   (:math:`p_\mathrm{halt} = 0.1`);
2. fit a :math:`\sigma`-coupling (paper, definition of coupled GRFs) for the learnt kernel
   and redraw ``predict_walkers`` walkers per node with it before predicting.

With 48 training and 512 prediction walkers the benchmark measured test RMSE 0.99-1.05x
the exact GP's and NLPD within +0.043 on the built-in mesh, the torus and the 100x100
grid, 23-40x faster than the dense exact GP end to end; 32 training walkers moved the
learnt hyperparameters enough to cost +0.068 NLPD on the grid, and 64 / 1024 gained
little accuracy (1.03x, +0.029) for 1.3x the time.
"""

from __future__ import annotations

from typing import Any

import gpytorch
import numpy as np
import torch

from ._checks import is_int
from ._deprecation import renamed_keywords
from ._random import SeedLike, draw_seed
from .devices import resolve_device
from .graphs import Graph
from .kernels.grf import PREDICT_WALKERS, TRAIN_P_HALT, TRAIN_WALKERS, GRFKernel
from .models import GraphGP, fit_gp, node_index_array
from .kernel_families import Diffusion, KernelFamily
from .settings import grf_gp_settings

__all__ = ["RECOMMENDED_P_HALT", "RECOMMENDED_TRAIN_WALKERS", "RECOMMENDED_PREDICT_WALKERS", "fit_grf_gp"]

#: Termination probability of the recommended configuration.
RECOMMENDED_P_HALT = TRAIN_P_HALT
#: Walkers per node while training.
RECOMMENDED_TRAIN_WALKERS = TRAIN_WALKERS
#: Walkers per node for prediction (redrawn after training).
RECOMMENDED_PREDICT_WALKERS = PREDICT_WALKERS


@renamed_keywords(graph_kernel="kernel_family")
def fit_grf_gp(graph: Graph, train_nodes: Any, train_targets: Any, *, predict_nodes: Any,
               iterations: int = 300, lr: float = 0.05, kernel_family: KernelFamily | None = None,
               train_walkers: int = RECOMMENDED_TRAIN_WALKERS,
               predict_walkers: int = RECOMMENDED_PREDICT_WALKERS, p_halt: float = RECOMMENDED_P_HALT,
               sigma_fit_samples: int = 100, seed: SeedLike = 0,
               device: torch.device | str | None = None) -> tuple[GraphGP, gpytorch.likelihoods.Likelihood]:
    r"""Train a GRF-GP with the recommended configuration and make it ready to predict.

    :param graph: The graph.
    :param train_nodes: Observed node indices.
    :param train_targets: Observations (standardise them: the mean is zero).
    :param predict_nodes: Nodes that will be predicted (walks are drawn only from the
        training and these nodes).
    :param iterations: Adam steps on the exact marginal likelihood.
    :param lr: Adam learning rate.
    :param kernel_family: Kernel family and initial hyperparameters (default
        :class:`~gp_couple.kernel_families.Diffusion` with :math:`\gamma = 1`).
    :param train_walkers: Walkers per node while training (even: antithetic pairs).
    :param predict_walkers: Walkers per node redrawn for prediction (even).
    :param p_halt: Termination probability.
    :param sigma_fit_samples: Walks per node and bin when fitting the sigma-coupling.
    :param seed: Seed of the walks, the CG probes and the sigma fit.
    :param device: Torch device of the model (default the CPU; walks are sampled on the CPU
        and moved there once).
    :return: ``(model, likelihood)``; predict with :func:`gp_couple.models.predict`
        inside :func:`gp_couple.settings.grf_gp_settings`.
    :raises ValueError: If a walker count is odd or an argument is out of range.
    """
    for name, value in (("train_walkers", train_walkers), ("predict_walkers", predict_walkers)):
        if not is_int(value) or value < 2 or value % 2:
            raise ValueError(f"{name} must be an even int >= 2 (antithetic and sigma-coupled pairs), got {value!r}")
    base_seed = draw_seed(seed)
    train = node_index_array(train_nodes, "train_nodes", graph.num_nodes)
    rows = np.union1d(train, node_index_array(predict_nodes, "predict_nodes", graph.num_nodes))
    base = GRFKernel(graph, num_walkers=int(train_walkers), p_halt=p_halt, coupling="antithetic",
                     directions="repelling", kernel_family=Diffusion(1.0) if kernel_family is None else kernel_family,
                     nodes=rows, seed=base_seed)
    device = resolve_device(device)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(device)
    model = GraphGP(train, train_targets, likelihood, gpytorch.kernels.ScaleKernel(base).to(device))
    with grf_gp_settings():
        fit_gp(model, likelihood, iterations=iterations, lr=lr, seed=base_seed)
    base.resample_for_prediction(int(predict_walkers), seed=base_seed, sigma_fit_samples=sigma_fit_samples)
    return model, likelihood
