"""GRFKernel's constructor defaults, the halting-inflation warning and the prediction walkers."""

from __future__ import annotations

import warnings

import gpytorch
import numpy as np
import pytest
import torch

from gp_couple import Diffusion, GraphGP, GRFKernel, fit_gp, predict
from gp_couple.couplings.walk_lengths import SigmaCoupling
from gp_couple.datasets import default_mesh
from gp_couple.exact import exact_kernel_matrix
from gp_couple.graphs import grid_graph
from gp_couple.halting import HaltingInflationWarning, halting_inflation
from gp_couple.kernels import ExactGraphKernel
from gp_couple.kernels.grf_kernel import PREDICT_WALKERS, TRAIN_P_HALT, TRAIN_WALKERS
from gp_couple.kernels.walk_schedule import NOISE_FLOOR_FACTOR, NoiseFloorWarning

MESH = default_mesh().graph
GAMMA = 3.0   # the range training selects on the built-in mesh


def _gram_errors(seeds: range, **kwargs) -> np.ndarray:
    family = Diffusion(GAMMA)
    with torch.no_grad():
        exact = exact_kernel_matrix(family, MESH).double().numpy()
    errors = []
    for seed in seeds:
        kernel = GRFKernel(MESH, kernel_family=Diffusion(GAMMA), seed=seed, **kwargs).double()
        nodes = torch.arange(MESH.num_nodes, dtype=torch.float64).unsqueeze(-1)
        with torch.no_grad():
            estimate = kernel(nodes).to_dense().numpy()
        errors.append(np.linalg.norm(estimate - exact) / np.linalg.norm(exact))
    return np.asarray(errors)


def test_defaults_beat_the_old_defaults_by_a_statistical_margin_on_a_small_mesh():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HaltingInflationWarning)
        old = _gram_errors(range(4), num_walkers=16, p_halt=0.5, coupling="iid", directions="independent")
    new = _gram_errors(range(4))
    difference = old.mean() - new.mean()
    standard_error = np.sqrt(old.var(ddof=1) / old.size + new.var(ddof=1) / new.size)
    assert difference > 5 * standard_error
    assert new.mean() < 0.5 * old.mean()


def test_defaults_are_the_recommended_training_configuration():
    kernel = GRFKernel(grid_graph(3, 3))
    assert (kernel.num_walkers, kernel.p_halt) == (TRAIN_WALKERS, TRAIN_P_HALT)
    assert kernel.coupling.name == "antithetic" and kernel.directions.name == "repelling"


def test_halting_inflation_warning_fires_once_and_names_the_remedy():
    graph = grid_graph(6, 6)
    kernel = GRFKernel(graph, num_walkers=4, p_halt=0.5, kernel_family=Diffusion(8.0))
    assert halting_inflation(kernel.kernel_family, 0.5) > 1e6
    with pytest.warns(HaltingInflationWarning, match=r"p_halt=0.5.*suggest_p_halt"):
        kernel.check_estimator()
    with warnings.catch_warnings():
        warnings.simplefilter("error", HaltingInflationWarning)
        kernel.check_estimator()   # once per configuration
        kernel.resample(1, p_halt=0.02)
        kernel.check_estimator()   # the remedy silences it


def test_halting_inflation_warning_stays_quiet_for_reliable_estimates_and_fires_when_training_gets_there():
    graph = grid_graph(6, 6)
    kernel = gpytorch.kernels.ScaleKernel(GRFKernel(graph, num_walkers=4, kernel_family=Diffusion(1.0)))
    model = GraphGP(np.arange(0, 36, 2), torch.linspace(-1, 1, 18), gpytorch.likelihoods.GaussianLikelihood(), kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HaltingInflationWarning)
        fit_gp(model, model.likelihood, iterations=2, lr=0.01)
        predict(model, model.likelihood, [1, 3])
    # Training (here: a hyperparameter set as an optimiser might) moves gamma to where
    # p_halt = 0.1 inflates the features' second moment by far more than the bound.
    kernel.base_kernel.kernel_family.gamma = 12.0
    with pytest.warns(HaltingInflationWarning, match="gamma=12"):
        predict(model, model.likelihood, [1, 3])


def test_resample_for_prediction_draws_sigma_coupled_walkers_at_the_learnt_hyperparameters():
    graph = grid_graph(5, 5)
    kernel = GRFKernel(graph, num_walkers=4, kernel_family=Diffusion(2.0), seed=3)
    kernel.resample_for_prediction(8, sigma_fit_samples=10)
    assert kernel.num_walkers == 8 and isinstance(kernel.coupling, SigmaCoupling)
    assert kernel.directions.name == "repelling" and kernel.p_halt == TRAIN_P_HALT
    again = GRFKernel(graph, num_walkers=4, kernel_family=Diffusion(2.0), seed=3)
    again.resample_for_prediction(8, sigma_fit_samples=10)
    assert torch.equal(kernel.features_columns, again.features_columns)
    with pytest.raises(ValueError, match="even"):
        kernel.resample_for_prediction(7)
    assert PREDICT_WALKERS % 2 == 0


def _floor_model(kernel: gpytorch.kernels.Kernel, floor: float) -> GraphGP:
    """A GP on smooth data with little noise whose noise constraint's lower bound is ``floor``."""
    nodes = np.arange(0, 36, 2)
    targets = torch.sin(torch.as_tensor(nodes, dtype=torch.float32) / 6.0)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(floor))
    return GraphGP(nodes, targets, likelihood, gpytorch.kernels.ScaleKernel(kernel))


def test_a_noise_on_its_lower_bound_warns_for_grf_kernels_only():
    graph = grid_graph(6, 6)
    grf = _floor_model(GRFKernel(graph, num_walkers=8, schedule=None, seed=1), floor=0.3)
    floor_message = r"noise on its lower bound 0.3.*8 walkers per node at p_halt 0.1.*a lower p_halt"
    with pytest.warns(NoiseFloorWarning, match=floor_message):
        fit_gp(grf, grf.likelihood, iterations=200, optimizer="lbfgs")
    assert float(grf.likelihood.noise.detach()) <= NOISE_FLOOR_FACTOR * 0.3
    # An exact kernel's noise on its bound is the data's: no warning.
    exact = _floor_model(ExactGraphKernel(graph), floor=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoiseFloorWarning)
        fit_gp(exact, exact.likelihood, iterations=200, optimizer="lbfgs")
    assert float(exact.likelihood.noise.detach()) <= NOISE_FLOOR_FACTOR * 0.3
    # A noise above its bound is quiet, and so is one the likelihood does not learn.
    kernel = GRFKernel(graph, num_walkers=8, schedule=None, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoiseFloorWarning)
        kernel.check_learnt_noise(torch.tensor([0.5]), 0.3)
        fixed = _floor_model(GRFKernel(graph, num_walkers=8, schedule=None, seed=1), floor=0.3)
        fixed.likelihood.noise_covar.raw_noise.requires_grad_(False)
        fit_gp(fixed, fixed.likelihood, iterations=200, optimizer="lbfgs")
    with pytest.warns(NoiseFloorWarning, match=r"max_train_walkers \(1024\) and max_predict_walkers \(8192\)"):
        GRFKernel(graph, num_walkers=8, seed=1).check_learnt_noise(torch.tensor([0.31, 0.32]), 0.3)
