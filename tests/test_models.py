"""GraphGP input validation, fit_gp and predict."""

from __future__ import annotations

import gpytorch
import numpy as np
import pytest
import torch

from gp_couple.graphs import grid_graph
from gp_couple.kernels import ExactGraphKernel, GRFKernel
from gp_couple.models import GraphGP, fit_gp, predict

GRAPH = grid_graph(5, 5)
TRAIN = torch.arange(0, 25, 2)
TARGETS = torch.linspace(-1.0, 1.0, TRAIN.numel())


def build(train=TRAIN, targets=TARGETS, kernel=None, **kwargs) -> GraphGP:
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    kernel = kernel if kernel is not None else gpytorch.kernels.ScaleKernel(GRFKernel(GRAPH, seed=0, schedule=None))
    return GraphGP(train, targets, likelihood, kernel, **kwargs)


def test_inputs_are_node_index_columns_and_default_mean_is_zero():
    model = build(train=TRAIN.numpy(), targets=TARGETS.tolist())
    assert model.train_inputs[0].shape == (TRAIN.numel(), 1)
    assert torch.equal(model.train_inputs[0][:, 0].long(), TRAIN)
    assert isinstance(model.mean_module, gpytorch.means.ZeroMean)
    assert model.num_nodes == GRAPH.num_nodes
    # A column of float indices is accepted too.
    build(train=TRAIN.double().unsqueeze(-1))


@pytest.mark.parametrize("train, targets, error, message", [
    (torch.tensor([0, 25]), torch.zeros(2), ValueError, "outside"),
    (torch.tensor([-1, 3]), torch.zeros(2), ValueError, r"train_nodes contains node index -1 outside \[0, 25\)"),
    (torch.tensor([0.0, 1.5]), torch.zeros(2), ValueError, "non-integer"),
    (torch.tensor([0.0, float("nan")]), torch.zeros(2), ValueError, "NaN"),
    (torch.tensor([True, False]), torch.zeros(2), TypeError, "integer"),
    (np.array(["a", "b"]), torch.zeros(2), TypeError, "integer"),
    (torch.zeros(2, 2, dtype=torch.long), torch.zeros(2), ValueError, "shape"),
    (torch.tensor([], dtype=torch.long), torch.zeros(0), ValueError, "empty"),
    (torch.tensor([0, 1]), torch.zeros(3), ValueError, "shape"),
    (torch.tensor([0, 1]), torch.zeros(2, 1), ValueError, "shape"),
    (torch.tensor([0, 1]), torch.tensor([0.0, float("nan")]), ValueError, "NaN"),
    (torch.tensor([0, 1]), torch.tensor([float("inf"), 0.0]), ValueError, "infinite"),
    (torch.tensor([0, 1]), np.array(["x", "y"]), TypeError, "real numbers"),
])
def test_bad_training_data_raises_clear_errors(train, targets, error, message):
    with pytest.raises(error, match=message):
        build(train=train, targets=targets)


def test_bad_modules_and_missing_features_raise():
    with pytest.raises(TypeError, match="likelihood"):
        GraphGP(TRAIN, TARGETS, "gaussian", gpytorch.kernels.ScaleKernel(GRFKernel(GRAPH)))
    with pytest.raises(TypeError, match="covar_module"):
        GraphGP(TRAIN, TARGETS, gpytorch.likelihoods.GaussianLikelihood(), GRAPH)
    subset = gpytorch.kernels.ScaleKernel(GRFKernel(GRAPH, nodes=[0, 2, 4]))
    with pytest.raises(ValueError, match="without GRF features"):
        build(kernel=subset)
    mixed = GRFKernel(GRAPH) + ExactGraphKernel(grid_graph(2, 2))
    with pytest.raises(ValueError, match="different sizes"):
        build(kernel=mixed)


def test_fit_gp_decreases_loss_and_restores_mode():
    model = build()
    model.eval()
    history = fit_gp(model, model.likelihood, iterations=20, lr=0.1)
    assert len(history) == 20 and history[-1] < history[0]
    assert not model.training
    stops = []
    short = fit_gp(model, model.likelihood, iterations=50, lr=0.1,
                   callback=lambda step, loss: stops.append(step) or step == 2)
    assert len(short) == 3 and stops == [0, 1, 2]


def test_seeded_cg_training_and_fast_prediction_are_reproducible_and_leave_global_rng():
    def run():
        model = build()
        with gpytorch.settings.max_cholesky_size(0):
            history = fit_gp(model, model.likelihood, iterations=5, lr=0.1, seed=3)
            _, variance = predict(model, model.likelihood, [1, 3, 5], seed=3)
        return history, variance

    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first = run()
    assert torch.equal(torch.rand(3), expected_next)  # the global generator is untouched
    torch.manual_seed(999)  # a different global state must not matter
    second = run()
    assert first[0] == second[0]
    assert torch.equal(first[1], second[1])


@pytest.mark.parametrize("kwargs, error", [
    ({"iterations": -1}, ValueError), ({"iterations": 1.5}, ValueError),
    ({"iterations": 1, "lr": 0.0}, ValueError), ({"iterations": 1, "callback": 3}, TypeError),
])
def test_fit_gp_validates_arguments(kwargs, error):
    model = build()
    with pytest.raises(error):
        fit_gp(model, model.likelihood, **kwargs)
    with pytest.raises(ValueError, match="likelihood"):
        fit_gp(model, gpytorch.likelihoods.GaussianLikelihood(), iterations=1)


def test_predict_observed_and_latent_variances():
    model = build(mean_module=gpytorch.means.ConstantMean())
    fit_gp(model, model.likelihood, iterations=5, lr=0.1)
    nodes = [1, 3, 24]
    mean, variance = predict(model, model.likelihood, nodes)
    latent_mean, latent_variance = predict(model, model.likelihood, nodes, noise=False)
    assert mean.shape == variance.shape == (3,)
    torch.testing.assert_close(mean, latent_mean)
    noise = model.likelihood.noise.detach()
    torch.testing.assert_close(variance, latent_variance + noise, rtol=1e-5, atol=1e-6)
    assert model.training
    with pytest.raises(ValueError, match="outside"):
        predict(model, model.likelihood, [25])


def test_double_precision_model_trains_and_predicts():
    model = build().double()
    history = fit_gp(model, model.likelihood, iterations=3, lr=0.05)
    mean, variance = predict(model, model.likelihood, [1, 3])
    assert mean.dtype == variance.dtype == torch.float64
    assert all(np.isfinite(history))


# ------------------------------------------------------------ diverged or stalled training
def test_fit_gp_reports_diverged_training_with_the_loss_history():
    from gp_couple.optimize import TrainingWarning

    model = build()
    with pytest.warns(TrainingWarning, match=r"training diverged: loss .* at step 0, best .* last .*lr than 1e\+06"):
        fit_gp(model, model.likelihood, iterations=10, lr=1e6, seed=0)


def test_fit_gp_reports_stalled_training():
    from gp_couple.optimize import TrainingWarning

    model = build()
    # Adam's steps of about lr = 1e-30 vanish in float32 rounding: the loss never moves.
    with pytest.warns(TrainingWarning, match="training stalled: the loss stayed at .* for 5 steps"):
        fit_gp(model, model.likelihood, iterations=5, lr=1e-30, seed=0)


def test_a_converged_lbfgs_run_that_starts_at_its_optimum_is_not_a_stall():
    import warnings

    from gp_couple.optimize import TrainingHistory, TrainingWarning, check_training

    def history(converged: bool, steepest: float | None) -> TrainingHistory:
        losses = TrainingHistory([1.5, 1.5])
        losses.converged, losses.steepest = converged, steepest
        return losses

    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        check_training(history(True, 1e-6), lr=0.01)      # a later phase that starts where it converged
    for converged, steepest in ((True, 0.0), (False, 1e-6), (False, None)):
        with pytest.warns(TrainingWarning, match="training stalled"):
            check_training(history(converged, steepest), lr=0.01)


def test_fit_gp_is_silent_when_training_improves():
    import warnings

    from gp_couple.optimize import TrainingWarning

    model = build()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        losses = fit_gp(model, model.likelihood, iterations=20, lr=0.05, seed=0)
    assert losses[-1] < losses[0]


def test_check_training_tolerates_noise_but_not_a_clear_rise():
    import warnings

    from gp_couple.optimize import TrainingWarning, check_training

    rng = np.random.default_rng(0)
    noisy_flat = list(1.0 + 0.02 * rng.standard_normal(50))  # CG-like noise around a minimum
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        check_training(noisy_flat, 0.01)
        check_training([1.0], 0.01)  # nothing to judge
    with pytest.warns(TrainingWarning, match="diverged"):
        check_training([1.0, 0.9, 1.5, 2.0], 0.1)


def test_targets_are_checked_for_finiteness_in_the_models_dtype():
    huge = torch.tensor([1e39] + [0.0] * (TRAIN.numel() - 1), dtype=torch.float64)
    with pytest.raises(ValueError, match="infinite values in the model's dtype torch.float32"):
        build(targets=huge)
    kernel = gpytorch.kernels.ScaleKernel(GRFKernel(GRAPH, seed=0)).double()
    model = GraphGP(TRAIN, huge, gpytorch.likelihoods.GaussianLikelihood().double(), kernel)
    assert model.train_targets.dtype == torch.float64 and float(model.train_targets[0]) == 1e39


def test_fit_grf_gp_refuses_a_networkx_graph_with_the_conversion():
    import networkx as nx

    from gp_couple.recipes import fit_grf_gp

    with pytest.raises(TypeError, match="Graph.from_networkx"):
        fit_grf_gp(nx.path_graph(5), [0, 1], [0.0, 1.0], predict_nodes=[2])
