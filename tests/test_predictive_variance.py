"""Predictive variances against a float64 dense posterior, on training sets of 2,000+ nodes."""

from __future__ import annotations

import gpytorch
import numpy as np
import pytest
import torch

from gp_couple import Diffusion, ExactGraphKernel, GraphGP, GRFKernel, grf_gp_settings, predict, predictive_variance
from gp_couple.graphs import grid_graph
from gp_couple.kernels.matrix_free import MatrixFreeGraphKernel
from gp_couple.predictive_variance import (
    DENSE_VARIANCE_SIZE,
    VarianceEstimate,
    VarianceToleranceWarning,
    posterior_variance,
)

GRAPH = grid_graph(52, 52)
ORDER = np.random.default_rng(0).permutation(GRAPH.num_nodes)
TRAIN, TEST = np.sort(ORDER[:2100]), np.sort(ORDER[2100:2400])
NOISE = 0.01


def _model(kind: str) -> GraphGP:
    family = Diffusion(3.0)
    if kind == "exact":
        base = ExactGraphKernel(GRAPH, family)
    elif kind == "matrix_free":
        base = MatrixFreeGraphKernel(GRAPH, family)
    else:
        base = GRFKernel(GRAPH, num_walkers=16, p_halt=0.1, coupling="antithetic", directions="repelling",
                         kernel_family=family, nodes=np.concatenate([TRAIN, TEST]), seed=0)
    kernel = gpytorch.kernels.ScaleKernel(base)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    targets = torch.as_tensor(np.sin(TRAIN / 40.0), dtype=torch.float32)
    model = GraphGP(TRAIN, targets, likelihood, kernel)
    kernel.outputscale = 1.0
    likelihood.noise = NOISE
    return model


def _dense_variance(model: GraphGP) -> np.ndarray:
    """The float64 posterior variance of the latent function, from the model's kernel blocks."""
    kernel = model.covar_module
    train = torch.as_tensor(TRAIN, dtype=torch.float32).unsqueeze(-1)
    test = torch.as_tensor(TEST, dtype=torch.float32).unsqueeze(-1)
    with torch.no_grad():
        k_train = kernel(train).to_dense().double().numpy()
        k_cross = kernel(test, train).to_dense().double().numpy()
        prior = kernel(test, diag=True).double().numpy()
    noise = float(model.likelihood.noise)
    factor = np.linalg.cholesky(k_train + noise * np.eye(len(TRAIN)))
    solved = np.linalg.solve(factor, k_cross.T)
    return prior - (solved ** 2).sum(0)


@pytest.mark.parametrize("kind", ["exact", "matrix_free", "grf"])
@pytest.mark.parametrize("method", ["auto", "lanczos"])
def test_variances_match_a_float64_dense_posterior(kind, method):
    model = _model(kind)
    truth = _dense_variance(model)
    with grf_gp_settings():
        prediction = predict(model, model.likelihood, TEST, noise=False, variance=method, seed=0)
    ratio = prediction.variance.double().numpy() / truth
    estimate = prediction.estimate
    assert estimate.method == ("dense" if method == "auto" else "lanczos")
    assert estimate.converged and estimate.relative_error <= 0.01
    # The Krylov variances converge from above; their error is at most the tolerance on
    # the probed points, and the estimate speaks for the others.
    assert np.median(np.abs(ratio - 1)) <= 0.01
    assert np.max(np.abs(ratio - 1)) <= 0.03
    if method == "lanczos":
        assert np.all(ratio >= 1 - 1e-4)
    # Observation variances add the noise.
    with grf_gp_settings():
        observed = predict(model, model.likelihood, TEST, variance=method, seed=0).variance
    torch.testing.assert_close(observed, prediction.variance + NOISE, rtol=1e-5, atol=1e-6)


def test_fixed_rank_lanczos_caches_are_what_the_default_replaced():
    """gpytorch's fast_pred_var cache of rank 300 inflates these variances: the regression this guards."""
    model = _model("exact")
    truth = _dense_variance(model)
    model.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var(), \
            grf_gp_settings(max_root_decomposition_size=300, max_cholesky_size=0):
        cached = model.likelihood(model(model.node_inputs(TEST))).variance.double().numpy() - NOISE
    assert np.median(cached / truth) > 1.2


def test_prediction_unpacks_and_reports_its_method():
    model = _model("grf")
    prediction = predict(model, model.likelihood, TEST[:5], seed=0)
    mean, variance = prediction
    assert torch.equal(prediction[0], mean) and torch.equal(prediction[1], variance) and len(prediction) == 2
    assert isinstance(prediction.estimate, VarianceEstimate)
    assert len(TRAIN) <= DENSE_VARIANCE_SIZE and prediction.estimate.method == "dense"


def test_lanczos_is_seeded_and_exact_once_the_subspace_is_the_whole_space():
    generator = torch.Generator().manual_seed(0)
    root = torch.randn(47, 30, generator=generator, dtype=torch.float64)
    joint = root @ root.T / 30    # a covariance of 40 training and 7 test points
    train = joint[:40, :40] + 0.1 * torch.eye(40, dtype=torch.float64)
    cross, prior = joint[40:, :40], joint.diagonal()[40:]
    exact = prior - (cross @ torch.linalg.solve(train, cross.T)).diagonal()
    first, estimate, no_shift = posterior_variance(train, cross, prior, 0.1, method="lanczos", tolerance=1e-12,
                                                   seed=1, residual=torch.ones(40, dtype=torch.float64))
    second, _, _ = posterior_variance(train, cross, prior, 0.1, method="lanczos", tolerance=1e-12, seed=1)
    assert no_shift is None
    assert torch.equal(first, second)
    torch.testing.assert_close(first, exact, rtol=1e-8, atol=1e-10)
    residual = torch.linspace(-1, 1, 40, dtype=torch.float64)
    dense, dense_estimate, shift = posterior_variance(train, cross, prior, 0.1, method="dense", residual=residual)
    torch.testing.assert_close(shift, cross @ torch.linalg.solve(train, residual), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dense, exact, rtol=1e-10, atol=1e-12)
    assert dense_estimate == VarianceEstimate("dense", 40, 0.0, True)
    # Batches are computed entry by entry.
    batched, _, _ = posterior_variance(torch.stack([train, 2 * train]), cross, prior, 0.1, method="dense")
    assert batched.shape == (2, 7)
    torch.testing.assert_close(batched[0], exact)


@pytest.mark.parametrize("method", ["auto", "sparse"])
def test_grf_variances_from_the_sparse_factor_are_exact(method, monkeypatch):
    """Above the dense limit, a GRF model's variances and mean come from a sparse LU factor, exactly."""
    model = _model("grf")
    truth = _dense_variance(model)
    with grf_gp_settings():
        dense = predict(model, model.likelihood, TEST, noise=False, variance="dense", seed=0)
    monkeypatch.setattr(predictive_variance, "DENSE_VARIANCE_SIZE", len(TRAIN) - 1)
    with grf_gp_settings():
        sparse = predict(model, model.likelihood, TEST, noise=False, variance=method, seed=0)
    assert sparse.estimate == VarianceEstimate("sparse", len(TRAIN), 0.0, True)
    np.testing.assert_allclose(sparse.variance.double().numpy(), truth, rtol=1e-5)
    torch.testing.assert_close(sparse.mean, dense.mean, rtol=1e-5, atol=1e-6)


def test_auto_falls_back_to_krylov_without_a_sparse_form_and_sparse_says_why(monkeypatch):
    model = _model("exact")
    monkeypatch.setattr(predictive_variance, "DENSE_VARIANCE_SIZE", len(TRAIN) - 1)
    assert predict(model, model.likelihood, TEST[:40], seed=0).estimate.method == "lanczos"
    with pytest.raises(ValueError, match="variance='sparse' needs sparse kernel matrices"):
        predict(model, model.likelihood, TEST[:40], variance="sparse", seed=0)
    # A GRF model whose factor would not fit in memory goes to the Krylov method too.
    grf = _model("grf")
    monkeypatch.setattr(predictive_variance, "physical_memory", lambda: 10**6)
    with pytest.warns(VarianceToleranceWarning):
        assert predict(grf, grf.likelihood, TEST[:40], seed=0).estimate.method == "lanczos"


def test_krylov_variances_stop_at_the_memory_limit_with_a_warning_and_stay_upper_bounds(monkeypatch):
    model = _model("exact")
    truth = _dense_variance(model)
    # Room for a subspace of rank 128 only (two training-side and one test-side float64 columns each).
    memory = 128 * 8 * (2 * len(TRAIN) + len(TEST)) / predictive_variance.KRYLOV_MEMORY_FRACTION
    monkeypatch.setattr(predictive_variance, "physical_memory", lambda: memory)
    with pytest.warns(VarianceToleranceWarning, match="stopped at rank 128 of 2100"):
        prediction = predict(model, model.likelihood, TEST, noise=False, variance="lanczos", seed=0)
    estimate = prediction.estimate
    assert (estimate.method, estimate.rank, estimate.converged) == ("lanczos", 128, False)
    ratio = prediction.variance.double().numpy() / truth
    assert estimate.relative_error > 0.01 and np.all(ratio >= 1 - 1e-4)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"variance": "fast"}, ValueError, "variance must be one of"),
    ({"variance_tolerance": 0.0}, ValueError, "variance_tolerance"),
    ({"variance_tolerance": float("nan")}, ValueError, "variance_tolerance"),
    ({"variance_tolerance": True}, TypeError, "variance_tolerance"),
])
def test_predict_rejects_bad_variance_options(kwargs, error, message):
    model = _model("grf")
    with pytest.raises(error, match=message):
        predict(model, model.likelihood, TEST[:3], **kwargs)


def test_predictions_follow_resampled_walks_and_changed_hyperparameters():
    model = _model("grf")
    before = predict(model, model.likelihood, TEST[:20], seed=0).mean
    model.eval()
    model.covar_module.base_kernel.resample(5)
    after = predict(model, model.likelihood, TEST[:20], seed=0).mean
    fresh = _model("grf")
    fresh.covar_module.base_kernel.resample(5)
    torch.testing.assert_close(after, predict(fresh, fresh.likelihood, TEST[:20], seed=0).mean)
    assert not torch.equal(before, after)
    # A hyperparameter set in evaluation mode is used too.
    model.eval()
    model.covar_module.outputscale = 2.0
    fresh.covar_module.outputscale = 2.0
    torch.testing.assert_close(predict(model, model.likelihood, TEST[:20], seed=0).mean,
                               predict(fresh, fresh.likelihood, TEST[:20], seed=0).mean)


def test_an_evaluating_model_called_directly_drops_caches_built_before_a_resample():
    model = _model("grf")
    model.eval()
    inputs = model.node_inputs(TEST[:10])
    with torch.no_grad():
        before = model(inputs).mean
        model.covar_module.base_kernel.resample(7)
        after = model(inputs).mean
    fresh = _model("grf")
    fresh.covar_module.base_kernel.resample(7)
    fresh.eval()
    with torch.no_grad():
        torch.testing.assert_close(after, fresh(fresh.node_inputs(TEST[:10])).mean)
    assert not torch.equal(before, after)


def test_sparse_variances_of_a_hyperparameter_batch_match_the_dense_ones():
    family = Diffusion(batch_shape=torch.Size([2]))
    family.gamma = torch.tensor([1.0, 2.5])
    kernel = GRFKernel(grid_graph(20, 20), num_walkers=8, p_halt=0.2, kernel_family=family, seed=0, schedule=None,
                       batch_shape=torch.Size([2]))
    train = torch.arange(0, 400, 3.0).unsqueeze(-1)
    test = torch.arange(1, 400, 7.0).unsqueeze(-1)
    with torch.no_grad():
        covariance = kernel(train).add_diagonal(torch.tensor(0.1))
        cross, prior = kernel(test, train), kernel(test, diag=True)
        residual = torch.linspace(-1, 1, train.shape[0]).expand(2, -1)
        dense, _, dense_shift = posterior_variance(covariance, cross, prior, 0.1, method="dense", residual=residual)
        sparse, estimate, sparse_shift = posterior_variance(covariance, cross, prior, 0.1, method="sparse",
                                                            residual=residual)
    assert estimate == VarianceEstimate("sparse", train.shape[0], 0.0, True) and sparse.shape == (2, 57)
    torch.testing.assert_close(sparse, dense, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(sparse_shift, dense_shift, rtol=1e-6, atol=1e-8)
    assert not torch.allclose(sparse[0], sparse[1])


def test_sparse_forms_of_grf_operators_and_none_for_dense_ones():
    from linear_operator import to_linear_operator
    from linear_operator.operators import ConstantMulLinearOperator, DiagLinearOperator

    from gp_couple.predictive_variance import sparse_form

    kernel = GRFKernel(grid_graph(6, 6), num_walkers=4, p_halt=0.3, seed=0, schedule=None)
    nodes = torch.arange(0, 36, 2.0).unsqueeze(-1)
    with torch.no_grad():
        gram = kernel(nodes).evaluate_kernel()
        dense = gram.to_dense().double().numpy()
        scaled = ConstantMulLinearOperator(gram, torch.tensor(2.5))
        noisy = gram + DiagLinearOperator(torch.full((18,), 0.1))
        np.testing.assert_allclose(sparse_form(kernel(nodes)).toarray(), dense, rtol=1e-6)
        np.testing.assert_allclose(sparse_form(scaled).toarray(), 2.5 * dense, rtol=1e-6)
        np.testing.assert_allclose(sparse_form(noisy).toarray(), dense + 0.1 * np.eye(18), rtol=1e-6, atol=1e-7)
        assert sparse_form(to_linear_operator(torch.eye(3))) is None
        assert sparse_form(to_linear_operator(torch.eye(3)) + DiagLinearOperator(torch.ones(3))) is None
        assert sparse_form(torch.eye(3)) is None
        # A bound on the stored entries, checked before assembling.
        entries = int(np.count_nonzero(dense))
        assert gram.sparse_entries(entries) == entries and gram.sparse_entries(entries - 1) is None
        assert sparse_form(noisy, max_entries=entries) is not None
        assert sparse_form(noisy, max_entries=entries - 1) is None
        assert sparse_form(scaled, max_entries=entries - 1) is None
        cross = kernel(nodes[:5], nodes).evaluate_kernel()
        assert cross.sparse_entries() is None and sparse_form(cross, max_entries=10**6) is None
        assert sparse_form(cross) is not None


def test_auto_factors_sparsely_below_the_dense_size_where_the_walks_seldom_meet():
    """Scattered training nodes on a large graph: ``"auto"`` takes the sparse factor, with the dense factor's result."""
    from gp_couple.predictive_variance import SPARSE_SETUP_WORK, SPARSE_WORK_COST, sparse_factor_ordering, sparse_form

    graph = grid_graph(300, 300)
    chosen = np.random.default_rng(1).choice(graph.num_nodes, 2300, replace=False)
    train, test = np.sort(chosen[:2000]), np.sort(chosen[2000:])
    base = GRFKernel(graph, num_walkers=16, p_halt=0.5, kernel_family=Diffusion(1.0), seed=0, schedule=None,
                     nodes=chosen)
    model = GraphGP(train, torch.as_tensor(np.sin(train / 900.0), dtype=torch.float32),
                    gpytorch.likelihoods.GaussianLikelihood(), gpytorch.kernels.ScaleKernel(base))
    model.likelihood.noise = NOISE
    auto = predict(model, model.likelihood, test, noise=False, seed=0)
    dense = predict(model, model.likelihood, test, noise=False, variance="dense", seed=0)
    assert len(train) <= DENSE_VARIANCE_SIZE
    assert auto.estimate == VarianceEstimate("sparse", len(train), 0.0, True)
    torch.testing.assert_close(auto.variance, dense.variance, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(auto.mean, dense.mean, rtol=1e-5, atol=1e-6)
    # The rule: the sparse factor's weighted work against the dense factor's, both counted beforehand.
    with torch.no_grad():
        matrix = sparse_form(model.covar_module(torch.as_tensor(train, dtype=torch.float32).unsqueeze(-1)))
    assert sparse_factor_ordering(matrix, len(test)) is not None
    small = matrix[:300][:, :300]            # 300 points: the dense factor costs less than the setup
    assert (300 ** 3 / 3 + 300 ** 3) < SPARSE_SETUP_WORK and sparse_factor_ordering(small, 300) is None
    assert SPARSE_WORK_COST > 1


def test_auto_keeps_the_dense_factor_where_the_sparse_one_would_fill_in(monkeypatch):
    """Where the training nodes' walks overlap (a dense Gram), ``"auto"`` stays dense, even with no fixed cost."""
    monkeypatch.setattr(predictive_variance, "SPARSE_SETUP_WORK", 0)
    model = _model("grf")
    assert predict(model, model.likelihood, TEST[:20], seed=0).estimate.method == "dense"
