"""ShardedGRFKernel in one process: the same Gram matrix, hyperparameter gradients and walk schedule as GRFKernel."""

from __future__ import annotations

import warnings
from typing import Any

import gpytorch
import numpy as np
import pytest
import torch

from gp_couple import Diffusion, GRFKernel, grf_gp_settings
from gp_couple.couplings.walk_lengths import SigmaCoupling
from gp_couple.graphs import grid_graph
from gp_couple.kernels.sharded_grf import ShardedGRFKernel
from gp_couple.kernels.walk_schedule import SHARDED_SCHEDULE, BiasCorrectionWarning, WalkSchedule
from gp_couple.models import GraphGP, fit_gp
from gp_couple.optimize import Convergence
from gp_couple.sharded_gp import fit_sharded_grf_gp
from tests import _distributed_workers as workers


def test_one_process_sharded_gram_and_its_gradients_equal_the_grf_kernels() -> None:
    graph = grid_graph(9, 9)
    train = np.arange(0, 81, 3)
    config = {"num_walkers": 16, "p_halt": 0.2, "seed": 5}
    sharded = ShardedGRFKernel(graph, train, kernel_family=Diffusion(1.3), **config).double()
    plain = GRFKernel(graph, kernel_family=Diffusion(1.3), nodes=train, schedule=None, **config).double()
    inputs = torch.as_tensor(train, dtype=torch.float64).unsqueeze(-1)
    generator = torch.Generator().manual_seed(0)
    left = torch.randn(train.size, 3, dtype=torch.float64, generator=generator)
    right = torch.randn(train.size, 3, dtype=torch.float64, generator=generator)
    gradients = []
    for kernel in (sharded, plain):
        gram = kernel(inputs, inputs).evaluate_kernel()
        torch.testing.assert_close(gram @ right, plain(inputs, inputs).to_dense() @ right, rtol=1e-12, atol=1e-12)
        # d(left^T K right)/d(gamma) through the operator's _bilinear_derivative.
        kernel.zero_grad()
        (left * (gram @ right)).sum().backward()
        gradients.append(kernel.kernel_family.raw_gamma.grad.clone())
    torch.testing.assert_close(gradients[0], gradients[1], rtol=1e-10, atol=1e-12)


def _smooth_problem() -> tuple[Any, np.ndarray, np.ndarray]:
    """The distributed tests' problem, its targets standardised."""
    graph, train, targets = workers.graph_problem()
    return graph, train, (targets - targets.mean()) / targets.std()


SMALL_SCHEDULE = workers.small_schedule()


def test_sharded_training_follows_the_walk_schedule_like_a_grf_kernel() -> None:
    graph, train, targets = _smooth_problem()
    sharded_model, sharded_likelihood, history = fit_sharded_grf_gp(graph, train, targets, num_walkers=16,
                                                                    iterations=30, schedule=SMALL_SCHEDULE, seed=3)
    # The same schedule on an unsharded kernel over the same rows, trained by fit_gp.
    kernel = GRFKernel(graph, num_walkers=16, kernel_family=Diffusion(1.0), nodes=train, seed=3,
                       schedule=SMALL_SCHEDULE)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(train, torch.as_tensor(targets), likelihood, gpytorch.kernels.ScaleKernel(kernel)).double()
    # The unsharded kernel measures its one draw's error when training ends and may warn; the sharded one cannot.
    with grf_gp_settings(max_preconditioner_size=0), warnings.catch_warnings():
        warnings.simplefilter("ignore", BiasCorrectionWarning)
        plain_history = fit_gp(model, likelihood, iterations=30, optimizer="lbfgs", convergence=Convergence(), seed=3)
    sharded = sharded_model.covar_module.base_kernel
    # Phases ran on redrawn walks, and training ended on sigma-coupled prediction walks for its hyperparameters.
    assert history.phases >= 3 and sharded.num_walkers > 16 and isinstance(sharded.coupling, SigmaCoupling)
    assert sharded.prediction_hyperparameters is not None
    assert (history.phases, sharded.num_walkers, sharded.p_halt) == (plain_history.phases, kernel.num_walkers,
                                                                    kernel.p_halt)
    # The two Gram products round differently (they agree to 1e-12, above), and L-BFGS's line
    # searches carry that into the path (the losses on the way agree to 1e-5); the end points agree closely.
    np.testing.assert_allclose(np.asarray(history), np.asarray(plain_history), rtol=1e-5)
    torch.testing.assert_close(sharded.kernel_family.gamma, kernel.kernel_family.gamma, rtol=1e-6, atol=0)
    torch.testing.assert_close(sharded_model.covar_module.outputscale, model.covar_module.outputscale, rtol=1e-6,
                               atol=0)
    torch.testing.assert_close(sharded_likelihood.noise, likelihood.noise, rtol=1e-6, atol=0)


def test_a_sharded_kernel_refuses_the_bias_correction_and_saves_its_schedule() -> None:
    graph, train, _ = _smooth_problem()
    with pytest.raises(ValueError, match="bias_correction=False"):
        ShardedGRFKernel(graph, train, schedule=WalkSchedule())
    with pytest.raises(ValueError, match="bias_correction=False"):
        fit_sharded_grf_gp(graph, train, np.zeros(train.size), schedule=WalkSchedule())
    with pytest.raises(TypeError, match="schedule must be a WalkSchedule or None, got dict"):
        fit_sharded_grf_gp(graph, train, np.zeros(train.size), schedule={"phases": 2})
    kernel = ShardedGRFKernel(graph, train, num_walkers=8, schedule=SMALL_SCHEDULE)
    assert ShardedGRFKernel(graph, train, num_walkers=8).schedule == SHARDED_SCHEDULE
    restored = ShardedGRFKernel(graph, train, num_walkers=8, schedule=None)
    restored.load_state_dict(kernel.state_dict())
    assert restored.schedule == SMALL_SCHEDULE
    state = kernel.state_dict()
    state["_extra_state"] = {**state["_extra_state"], "schedule": WalkSchedule().to_dict()}
    with pytest.raises(ValueError, match="_extra_state: a ShardedGRFKernel trains"):
        restored.load_state_dict(state)
    assert restored.schedule == SMALL_SCHEDULE
