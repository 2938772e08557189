"""Variational GPs on graph nodes: inducing nodes, the learn-locations error, the tutorial."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import gpytorch
import numpy as np
import pytest
import torch

from gp_couple.graphs import Graph, grid_graph
from gp_couple.kernels import ExactGraphKernel, GRFKernel
from gp_couple.variational import (
    GraphVariationalGP,
    fit_variational_gp,
    predict_variational,
    select_inducing_nodes,
)

GRAPH = grid_graph(6, 6)
TUTORIAL = Path(__file__).resolve().parents[1] / "tutorials" / "variational_graph_gp.py"


def hops_to_nearest(graph: Graph, chosen: np.ndarray) -> np.ndarray:
    from scipy.sparse.csgraph import shortest_path

    return shortest_path(graph.adjacency, unweighted=True, indices=chosen).min(axis=0)


def test_k_center_covers_the_graph_within_twice_the_optimal_radius() -> None:
    chosen = select_inducing_nodes(GRAPH, 4)
    assert chosen.dtype == np.int64 and len(set(chosen.tolist())) == 4
    assert chosen[0] == np.argmax(GRAPH.degrees)  # starts at the (first) highest-degree node
    # Four centres cover the 6x6 grid within 2 hops (the 3x3 quadrants' centres do);
    # the greedy farthest-point rule is a 2-approximation of that radius.
    assert hops_to_nearest(GRAPH, chosen).max() <= 2 * 2
    assert np.array_equal(select_inducing_nodes(GRAPH, 4), chosen)  # deterministic


def test_k_center_reaches_every_component_first() -> None:
    graph = Graph.from_edges([[0, 1], [1, 2], [3, 4]], num_nodes=6)  # node 5 isolated
    assert sorted(select_inducing_nodes(graph, 3).tolist()) == [1, 3, 5]


def test_random_and_degree_stratified_selection() -> None:
    for method in ("random", "degree"):
        chosen = select_inducing_nodes(GRAPH, 9, method=method, seed=3)
        assert len(set(chosen.tolist())) == 9 and np.array_equal(
            chosen, select_inducing_nodes(GRAPH, 9, method=method, seed=3))
    # Degree strata: the 4 corners (degree 2) are the lowest stratum of 36 / 9 = 4 nodes.
    chosen = select_inducing_nodes(GRAPH, 9, method="degree", seed=0)
    assert GRAPH.degrees[chosen].min() == 2 and GRAPH.degrees[chosen].max() == 4
    assert set(select_inducing_nodes(GRAPH, 3, candidates=[5, 7, 9]).tolist()) == {5, 7, 9}


@pytest.mark.parametrize("kwargs, error, message", [
    ({"num_inducing": 0}, ValueError, r"num_inducing must lie in \[1, 36\]"),
    ({"num_inducing": 37}, ValueError, "num_inducing"),
    ({"num_inducing": 2.0}, TypeError, "num_inducing"),
    ({"num_inducing": 2, "method": "kmeans"}, ValueError, "method"),
    ({"num_inducing": 2, "candidates": [0, 99]}, ValueError, "candidates"),
])
def test_selection_errors(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        select_inducing_nodes(GRAPH, **kwargs)


def covariance(kernel=None) -> gpytorch.kernels.Kernel:
    return gpytorch.kernels.ScaleKernel(kernel if kernel is not None else GRFKernel(GRAPH, 8, 0.3, seed=0))


def test_inducing_nodes_are_fixed_float_inputs() -> None:
    model = GraphVariationalGP(covariance(), [0, 14, 35])
    points = model.variational_strategy.inducing_points
    assert points.dtype == torch.get_default_dtype() and not points.requires_grad
    assert model.inducing_nodes.tolist() == [0, 14, 35]
    assert "inducing_points" not in dict(model.named_parameters())
    chosen = GraphVariationalGP(covariance(), 5).inducing_nodes.numpy()
    assert np.array_equal(chosen, select_inducing_nodes(GRAPH, 5))


def test_learning_inducing_locations_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"learn_inducing_locations=True.*node indices.*select_inducing_nodes"):
        GraphVariationalGP(covariance(), [0, 1], learn_inducing_locations=True)


@pytest.mark.parametrize("kernel", [GRFKernel(GRAPH, 8, 0.3, seed=0), ExactGraphKernel(GRAPH)],
                         ids=["grf", "exact"])
def test_graph_kernels_refuse_inputs_that_require_grad(kernel) -> None:
    # What gpytorch's default learn_inducing_locations=True feeds the kernel: the
    # gradient would be None and the points would silently never move.
    learned = torch.nn.Parameter(torch.tensor([[0.0], [3.0]]))
    with pytest.raises(ValueError, match="x1 requires grad.*learn_inducing_locations=False"):
        kernel(learned, torch.tensor([[1.0]])).to_dense()


@pytest.mark.parametrize("inducing, error, message", [
    ([0, 0, 1], ValueError, "duplicate"),
    ([0, 36], ValueError, "outside"),
    ([0.5], ValueError, "non-integer"),
])
def test_bad_inducing_nodes(inducing, error, message) -> None:
    with pytest.raises(error, match=message):
        GraphVariationalGP(covariance(), inducing)


def test_inducing_nodes_need_grf_features() -> None:
    subset = covariance(GRFKernel(GRAPH, 8, 0.3, nodes=[0, 1, 2, 3], seed=0))
    with pytest.raises(ValueError, match="without GRF features"):
        GraphVariationalGP(subset, [0, 10])
    assert set(GraphVariationalGP(subset, 2).inducing_nodes.tolist()) <= {0, 1, 2, 3}


def test_bernoulli_fit_and_predict_on_a_small_grid() -> None:
    labels = (np.arange(36) % 6 < 3).astype(float)  # left half of the grid vs right half
    train = np.arange(0, 36, 2)
    scaled = covariance(ExactGraphKernel(GRAPH))
    scaled.outputscale = 4.0  # probit classification needs latent values of a few units
    model = GraphVariationalGP(scaled, 8)
    likelihood = gpytorch.likelihoods.BernoulliLikelihood()
    losses = fit_variational_gp(model, likelihood, train, labels[train], iterations=40, lr=0.1, seed=0)
    assert losses[-1] < losses[0]
    latent, predictive = predict_variational(model, likelihood, np.arange(36))
    assert latent.mean.shape == (36,) and bool(((predictive.probs > 0) & (predictive.probs < 1)).all())
    assert np.mean((predictive.probs.numpy() > 0.5) == (labels > 0.5)) >= 0.9
    with pytest.raises(ValueError, match="train_targets must have shape"):
        fit_variational_gp(model, likelihood, train, labels, iterations=1)
    with pytest.raises(ValueError, match="lr"):
        fit_variational_gp(model, likelihood, train, labels[train], iterations=1, lr=float("nan"))


def test_tutorial_smoke_run_matches_the_exact_kernel_within_its_margin() -> None:
    result = subprocess.run([sys.executable, str(TUTORIAL), "--quick"], capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    match = re.search(r"accuracy GRF ([\d.]+) vs exact ([\d.]+): within the margin ([\d.]+)", result.stdout)
    assert match, result.stdout
    grf, exact, margin = (float(value) for value in match.groups())
    assert grf >= exact - margin and exact >= 0.8  # the exact-kernel model learns the task
    assert "learn_inducing_locations=True -> ValueError" in result.stdout


def test_saved_model_reloads_and_predicts_identically() -> None:
    likelihood = gpytorch.likelihoods.BernoulliLikelihood()
    model = GraphVariationalGP(covariance(), 6)
    train = np.arange(0, 36, 3)
    fit_variational_gp(model, likelihood, train, (train % 2).astype(float), iterations=3, lr=0.1, seed=0)
    fresh = GraphVariationalGP(covariance(GRFKernel(GRAPH, 8, 0.3, seed=5)), 6)
    fresh.load_state_dict(model.state_dict())
    before = predict_variational(model, likelihood, np.arange(36))[0].mean
    after = predict_variational(fresh, likelihood, np.arange(36))[0].mean
    assert torch.equal(before, after)
