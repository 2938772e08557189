"""The shared training loop: optimisers, the stopping rule and deterministic objectives."""

from __future__ import annotations

import warnings

import gpytorch
import pytest
import torch

from gp_couple import Convergence, GraphGP, GRFKernel, fit_gp
from gp_couple.graphs import grid_graph
from gp_couple.optimize import TrainingHistory, TrainingWarning, minimize

OPTIMUM = torch.tensor([3.0, -2.0], dtype=torch.float64)


def _quadratic() -> tuple[dict[str, torch.nn.Parameter], callable]:
    x = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    scales = torch.tensor([1.0, 4.0], dtype=torch.float64)
    return {"x": x}, lambda: (scales * (x - OPTIMUM) ** 2).sum() + 1.5


@pytest.mark.parametrize("optimizer, lr", [("lbfgs", 0.01), ("adam", 0.05)])
def test_convergence_rule_stops_at_a_known_optimum(optimizer, lr):
    parameters, objective = _quadratic()
    rule = Convergence(loss_tolerance=1e-9, parameter_tolerance=1e-4, window=25)
    history = minimize(objective, parameters, iterations=5000, lr=lr, optimizer=optimizer, convergence=rule)
    assert isinstance(history, TrainingHistory) and history.converged
    assert len(history) < 5000
    torch.testing.assert_close(parameters["x"].detach(), OPTIMUM, atol=1e-3, rtol=0)
    assert history[-1] == pytest.approx(1.5, abs=1e-5)


def test_lbfgs_needs_far_fewer_iterations_than_adam():
    parameters, objective = _quadratic()
    lbfgs = minimize(objective, parameters, iterations=200, optimizer="lbfgs")
    assert lbfgs.converged and len(lbfgs) <= 20


def test_budget_without_convergence_warns():
    parameters, objective = _quadratic()
    with pytest.warns(TrainingWarning, match="did not converge"):
        history = minimize(objective, parameters, iterations=3, lr=0.01, convergence=Convergence())
    assert not history.converged and history.reason == "iterations" and len(history) == 3


def test_without_a_rule_adam_runs_its_whole_budget():
    parameters, objective = _quadratic()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        history = minimize(objective, parameters, iterations=40, lr=0.05)
    assert len(history) == 40 and not history.converged


@pytest.mark.parametrize("kwargs, error", [
    ({"optimizer": "sgd"}, ValueError), ({"convergence": 0.1}, TypeError), ({"iterations": -1}, ValueError),
])
def test_minimize_validates_arguments(kwargs, error):
    parameters, objective = _quadratic()
    with pytest.raises(error):
        minimize(objective, parameters, **{"iterations": 2, **kwargs})


@pytest.mark.parametrize("kwargs", [{"loss_tolerance": 0.0}, {"parameter_tolerance": float("inf")},
                                    {"window": 0}, {"window": 2.5}])
def test_convergence_validates_its_tolerances(kwargs):
    with pytest.raises(ValueError):
        Convergence(**kwargs)


def test_lbfgs_gp_training_on_cg_is_deterministic_and_converges():
    graph = grid_graph(6, 6)
    train = torch.arange(0, 36, 2)
    targets = torch.sin(train.float() / 3.0)

    def run() -> tuple[TrainingHistory, torch.Tensor]:
        kernel = gpytorch.kernels.ScaleKernel(GRFKernel(graph, num_walkers=8, seed=0))
        model = GraphGP(train, targets, gpytorch.likelihoods.GaussianLikelihood(), kernel)
        with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.cg_tolerance(1e-4):
            history = fit_gp(model, model.likelihood, iterations=100, optimizer="lbfgs", seed=1)
        return history, torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    first, parameters = run()
    second, again = run()
    assert first.converged and list(first) == list(second) and torch.equal(parameters, again)
    assert first[-1] < first[0]
