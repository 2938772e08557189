"""The one-call graph GPs: :func:`gp_couple.recipes.fit_graph_gp` and its choice of kernel."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from gp_couple import Diffusion, Graph, grf_gp_settings, predict
from gp_couple.graphs import grid_graph
from gp_couple.kernels import ExactGraphKernel, GRFKernel, MatrixFreeGraphKernel
from gp_couple.marginal_likelihood import DenseMarginalLogLikelihood
from gp_couple.operators.chebyshev_basis import kept_terms_entries
from gp_couple.recipes import (
    KEPT_TERMS_DEGREE,
    MATRIX_FREE_MIN_NODES,
    MATRIX_FREE_NODES_PER_OBSERVED,
    MATRIX_FREE_NODES_PER_OBSERVED_KEPT,
    MATRIX_FREE_OBSERVED,
    choose_graph_kernel,
    fit_graph_gp,
    fit_graph_kernel,
    fit_grf_gp,
    matrix_free_nodes_per_observed,
)
from gp_couple.settings import kept_chebyshev_terms

GRAPH = grid_graph(12, 12)
#: Small GRF walker counts, so that the GRF tests run in seconds.
QUICK_GRF = {"max_train_walkers": 64, "max_predict_walkers": 256, "sigma_fit_samples": 20}


def prior_draw(graph: Graph, gamma: float, noise: float, seed: int) -> np.ndarray:
    """Noisy observations of a draw from the diffusion-kernel prior (dense, for small graphs)."""
    kernel = ExactGraphKernel(graph, Diffusion(gamma)).double()
    with torch.no_grad():
        covariance = kernel(torch.arange(graph.num_nodes, dtype=torch.float64)[:, None]).to_dense().numpy()
    rng = np.random.default_rng(seed)
    signal = np.linalg.cholesky(covariance + 1e-9 * np.eye(graph.num_nodes)) @ rng.normal(size=graph.num_nodes)
    return signal / signal.std() + noise * rng.normal(size=graph.num_nodes)


def path_graph(num_nodes: int) -> Graph:
    return Graph(sp.diags([np.ones(num_nodes - 1), np.ones(num_nodes - 1)], [-1, 1], format="csr"))


def hyperparameters(model, likelihood) -> np.ndarray:
    return np.array([float(model.covar_module.outputscale.detach()),
                     float(model.covar_module.base_kernel.kernel_family.gamma.detach()),
                     float(likelihood.noise.detach())])


def training_loss(model, likelihood) -> float:
    """The dense negative log marginal likelihood per point (``fit_gp``'s training loss)."""
    model.train()
    with torch.no_grad():
        return float(-DenseMarginalLogLikelihood(likelihood, model)(model(*model.train_inputs), model.train_targets))


def test_auto_chooses_the_matrix_free_kernel_up_to_its_limit_and_grf_above():
    small = path_graph(MATRIX_FREE_MIN_NODES)
    assert choose_graph_kernel(small, 1) == "matrix_free"
    # The limit grows with the observed nodes.
    observed = 10_000
    assert choose_graph_kernel(path_graph(MATRIX_FREE_NODES_PER_OBSERVED * observed), observed) == "matrix_free"
    assert choose_graph_kernel(path_graph(MATRIX_FREE_NODES_PER_OBSERVED * observed + 1), observed) == "grf"
    # Up to MATRIX_FREE_OBSERVED observed nodes: the matrix-free kernel on any graph for training.
    huge = path_graph(10**6)
    for observed in (1, 1024, MATRIX_FREE_OBSERVED):
        assert matrix_free_nodes_per_observed(observed) is None
        assert choose_graph_kernel(huge, observed) == "matrix_free"
    above = MATRIX_FREE_OBSERVED + 1
    assert matrix_free_nodes_per_observed(above) == MATRIX_FREE_NODES_PER_OBSERVED
    limit = max(MATRIX_FREE_MIN_NODES, MATRIX_FREE_NODES_PER_OBSERVED * above)
    assert choose_graph_kernel(path_graph(limit), above) == "matrix_free"
    assert choose_graph_kernel(path_graph(limit + 1), above) == "grf"
    # To predict every node: 50 nodes per observed node where all the observed nodes' terms to
    # KEPT_TERMS_DEGREE fit the bound, 15 above.
    kept = 1024  # the symmetric half of their terms to KEPT_TERMS_DEGREE fits 2^26, the default bound
    assert kept_terms_entries(kept, KEPT_TERMS_DEGREE) <= kept_chebyshev_terms.value()
    assert kept_terms_entries(kept + 1, KEPT_TERMS_DEGREE) > kept_chebyshev_terms.value()
    for observed, per_observed in [(1, MATRIX_FREE_NODES_PER_OBSERVED_KEPT),
                                   (kept, MATRIX_FREE_NODES_PER_OBSERVED_KEPT),
                                   (kept + 1, MATRIX_FREE_NODES_PER_OBSERVED)]:
        assert matrix_free_nodes_per_observed(observed, predict_all_nodes=True) == per_observed
        limit = max(MATRIX_FREE_MIN_NODES, per_observed * observed)
        assert choose_graph_kernel(path_graph(limit), observed, predict_all_nodes=True) == "matrix_free"
        assert choose_graph_kernel(path_graph(limit + 1), observed, predict_all_nodes=True) == "grf"
    # A lower bound lowers the any-graph limit to the observed nodes whose terms fit it.
    with kept_chebyshev_terms(kept_terms_entries(512, KEPT_TERMS_DEGREE)):
        assert matrix_free_nodes_per_observed(512) is None
        assert matrix_free_nodes_per_observed(513) == MATRIX_FREE_NODES_PER_OBSERVED
    with kept_chebyshev_terms(0):  # nothing kept: the recurrences run in every evaluation
        assert choose_graph_kernel(path_graph(MATRIX_FREE_MIN_NODES + 1), 1) == "grf"
        assert choose_graph_kernel(path_graph(MATRIX_FREE_MIN_NODES), 1) == "matrix_free"
    for bad in (0, -5):
        with pytest.raises(ValueError, match="num_observed must be >= 1"):
            choose_graph_kernel(small, bad)
    for bad in (2.5, True, "10"):
        with pytest.raises(TypeError, match="num_observed must be an int"):
            choose_graph_kernel(small, bad)


def test_predicting_every_node_keeps_the_rule_up_to_the_dense_limit():
    """Exact variances at every node need a dense factor of the observed nodes' covariance."""
    from gp_couple.predictive_variance import DENSE_VARIANCE_SIZE

    observed = DENSE_VARIANCE_SIZE
    large = path_graph(MATRIX_FREE_NODES_PER_OBSERVED * observed)
    assert choose_graph_kernel(large, observed, predict_all_nodes=True) == "matrix_free"
    assert choose_graph_kernel(large, observed + 1) == "matrix_free"
    assert choose_graph_kernel(large, observed + 1, predict_all_nodes=True) == "grf"
    small = path_graph(MATRIX_FREE_MIN_NODES)
    assert choose_graph_kernel(small, 1, predict_all_nodes=True) == "matrix_free"
    assert choose_graph_kernel(path_graph(MATRIX_FREE_MIN_NODES + 1), 1, predict_all_nodes=True) == "grf"
    with pytest.raises(TypeError, match="predict_all_nodes must be a bool"):
        choose_graph_kernel(small, 1, predict_all_nodes=1)


def test_fit_graph_kernel_returns_the_history_of_the_training_fit_graph_gp_runs():
    observed = prior_draw(GRAPH, 2.0, 0.1, seed=0)
    train = np.arange(0, GRAPH.num_nodes, 2)
    targets = torch.as_tensor(observed[train])
    model, likelihood, history = fit_graph_kernel(MatrixFreeGraphKernel(GRAPH, Diffusion(1.0)), train, targets)
    expected, _ = fit_graph_gp(GRAPH, train, targets, predict_nodes=train, kernel="matrix_free")
    assert history.converged and len(history) > 1
    for ours, theirs in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(ours, theirs)
    with pytest.raises(TypeError, match="kernel must be a graph kernel"):
        fit_graph_kernel("matrix_free", train, targets)


def test_auto_trains_the_exact_gp_matrix_free_as_the_dense_kernel_does(caplog):
    observed = prior_draw(GRAPH, 2.0, 0.1, seed=0)
    order = np.random.default_rng(1).permutation(GRAPH.num_nodes)
    train, test = np.sort(order[:90]), np.sort(order[90:])
    with caplog.at_level(logging.INFO, logger="gp_couple.recipes"):
        auto, auto_likelihood = fit_graph_gp(GRAPH, train, observed[train], predict_nodes=test)
    assert "matrix_free kernel for a graph of 144 nodes" in caplog.text
    assert type(auto.covar_module.base_kernel) is MatrixFreeGraphKernel
    dense, dense_likelihood = fit_graph_gp(GRAPH, train, observed[train], predict_nodes=test, kernel="exact")
    assert type(dense.covar_module.base_kernel) is ExactGraphKernel
    # Both are the exact GP (the matrix-free kernel to 1e-8 of its norm), trained to the
    # stopping rule (the loss per point changing by at most 1e-4 relatively): the dense
    # likelihood at the matrix-free model's hyperparameters is the dense model's optimum to
    # that tolerance (the noise is weakly identified, so the parameters are compared by it).
    optimum = training_loss(dense, dense_likelihood)
    dense.load_state_dict(auto.state_dict(), strict=False)
    dense_likelihood.load_state_dict(auto_likelihood.state_dict())
    assert abs(training_loss(dense, dense_likelihood) - optimum) <= 1e-4 * abs(optimum)
    assert 1.0 < hyperparameters(auto, auto_likelihood)[1] < 4.0  # the draw's range (2) was learnt
    dense, dense_likelihood = fit_graph_gp(GRAPH, train, observed[train], predict_nodes=test, kernel="exact")
    with grf_gp_settings():
        first, second = predict(auto, auto_likelihood, test), predict(dense, dense_likelihood, test)
    assert float((first.mean - second.mean).abs().max()) < 0.05 * float(second.variance.sqrt().min())


# The quick walker caps leave the prediction walks above the schedule's Gram tolerance.
@pytest.mark.filterwarnings("ignore::gp_couple.kernels.walk_schedule.GramToleranceWarning")
def test_kernel_grf_is_the_grf_recipe_with_its_options():
    observed = prior_draw(GRAPH, 2.0, 0.1, seed=2)
    train, test = np.arange(0, 144, 2), np.arange(1, 144, 2)
    model, likelihood = fit_graph_gp(GRAPH, train, observed[train], predict_nodes=test, kernel="grf",
                                     grf_options=QUICK_GRF, seed=3)
    recipe, recipe_likelihood = fit_grf_gp(GRAPH, train, observed[train], predict_nodes=test, seed=3, **QUICK_GRF)
    assert type(model.covar_module.base_kernel) is GRFKernel
    assert model.covar_module.base_kernel.num_walkers == recipe.covar_module.base_kernel.num_walkers
    assert np.array_equal(hyperparameters(model, likelihood), hyperparameters(recipe, recipe_likelihood))


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"kernel": "dense"}, ValueError, "kernel must be one of"),
    ({"grf_options": {"walkers": 8}}, ValueError, r"does not take here: \['walkers'\]"),
    ({"grf_options": {"seed": 1}}, ValueError, r"does not take here: \['seed'\]"),
    ({"kernel": "matrix_free", "grf_options": {"max_train_walkers": 64}}, ValueError, "does not use them"),
    ({"grf_options": [("max_train_walkers", 64)]}, TypeError, "grf_options must be a mapping"),
    ({"train_nodes": [0, 144]}, ValueError, "train_nodes"),
    ({"predict_nodes": [-1]}, ValueError, "predict_nodes"),
])
def test_fit_graph_gp_rejects_bad_arguments_before_training(kwargs, error, message):
    arguments = {"train_nodes": [0, 1, 2], "predict_nodes": [3], **kwargs}
    with pytest.raises(error, match=message):
        fit_graph_gp(GRAPH, arguments.pop("train_nodes"), [0.0, 1.0, 0.5][:len(kwargs.get("train_nodes", [0] * 3))],
                     **arguments)


def test_fit_graph_gp_refuses_a_networkx_graph_and_a_dense_kernel_too_large():
    import networkx as nx

    with pytest.raises(TypeError, match="Graph.from_networkx"):
        fit_graph_gp(nx.path_graph(5), [0, 1], [0.0, 1.0], predict_nodes=[2])
    with pytest.raises(ValueError, match="dense eigendecomposition"):
        fit_graph_gp(path_graph(30_000), [0, 1], [0.0, 1.0], predict_nodes=[2], kernel="exact")
