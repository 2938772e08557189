"""DenseMarginalLogLikelihood: gpytorch's marginal likelihood with a cheaper backward; the bias-corrected objective."""

from __future__ import annotations

import math

import gpytorch
import numpy as np
import pytest
import torch
from linear_operator.operators import DenseLinearOperator, LowRankRootAddedDiagLinearOperator

from gp_couple._random import seeded_torch_rng
from gp_couple.graphs import grid_graph
from gp_couple.kernel_families import Diffusion
from gp_couple.kernels import (
    CoupledRFFKernel,
    ExactGraphKernel,
    GRFKernel,
    WalkSchedule,
    grf_kernel as grf_kernel_module,
)
from gp_couple.kernels.grf_kernel import PAIRED_DENSE_MATRICES, PAIRED_MEMORY_FRACTION, paired_factor_fits
from gp_couple.kernels.walk_schedule import BiasCorrectionWarning, LikelihoodEvaluation, whitened_norm
from gp_couple.marginal_likelihood import DenseMarginalLogLikelihood, _BiasCorrectedGaussian
from gp_couple.models import GraphGP

GRAPH = grid_graph(7, 7)
TRAIN = np.arange(0, 49, 2)


def _model(kernel: gpytorch.kernels.Kernel, dtype: torch.dtype, batch_shape: torch.Size = torch.Size()) -> GraphGP:
    generator = torch.Generator().manual_seed(0)
    targets = torch.sin(torch.as_tensor(TRAIN, dtype=dtype) / 3) + 0.1 * torch.randn(TRAIN.size, generator=generator,
                                                                                       dtype=dtype)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch_shape)
    model = GraphGP(TRAIN, targets, likelihood,
                    gpytorch.kernels.ScaleKernel(kernel, batch_shape=batch_shape)).to(dtype)
    model.covar_module.outputscale = torch.full(batch_shape, 1.7)
    likelihood.noise = torch.full((*batch_shape, 1), 0.05)
    model.train()
    return model


def _loss_and_gradients(model: GraphGP, mll_class: type, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    mll = mll_class(model.likelihood, model)
    with seeded_torch_rng(seed):
        loss = -mll(model(*model.train_inputs), model.train_targets).sum()
    loss.backward()
    return loss.detach(), [parameter.grad.clone() for parameter in model.parameters() if parameter.grad is not None]


def _assert_same(model: GraphGP, rtol: float, atol: float) -> None:
    expected, expected_gradients = _loss_and_gradients(model, gpytorch.mlls.ExactMarginalLogLikelihood)
    loss, gradients = _loss_and_gradients(model, DenseMarginalLogLikelihood)
    torch.testing.assert_close(loss, expected, rtol=rtol, atol=atol)
    assert len(gradients) == len(expected_gradients) == 3
    for gradient, expected_gradient in zip(gradients, expected_gradients):
        torch.testing.assert_close(gradient, expected_gradient, rtol=rtol, atol=atol)


@pytest.mark.parametrize("batch_shape", [torch.Size(), torch.Size([2])])
def test_the_exact_kernel_gets_gpytorchs_value_and_gradient(batch_shape):
    kernel = ExactGraphKernel(GRAPH, Diffusion(1.5, batch_shape=batch_shape), batch_shape=batch_shape)
    model = _model(kernel, torch.float64, batch_shape)
    with gpytorch.settings.max_cholesky_size(10_000):
        _assert_same(model, rtol=1e-10, atol=1e-12)


def test_a_grf_kernel_gets_gpytorchs_value_and_gradient():
    kernel = GRFKernel(GRAPH, kernel_family=Diffusion(1.5), num_walkers=64, seed=0, schedule=None)
    model = _model(kernel, torch.float32)
    with gpytorch.settings.max_cholesky_size(10_000):
        _assert_same(model, rtol=1e-5, atol=1e-6)


def test_the_value_is_the_gaussian_log_density_per_point_plus_the_priors():
    model = _model(ExactGraphKernel(GRAPH, Diffusion(1.5)), torch.float64)
    model.covar_module.register_prior("outputscale_prior", gpytorch.priors.GammaPrior(2.0, 1.0), "outputscale")
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(10_000):
        value = DenseMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs), model.train_targets)
        covariance = model.likelihood(model(*model.train_inputs)).covariance_matrix
    density = torch.distributions.MultivariateNormal(torch.zeros(TRAIN.size, dtype=torch.float64), covariance)
    prior = gpytorch.priors.GammaPrior(2.0, 1.0).log_prob(torch.tensor(1.7, dtype=torch.float64))
    expected = (density.log_prob(model.train_targets) + prior) / TRAIN.size
    torch.testing.assert_close(value, expected)


def test_larger_training_sets_and_masked_targets_take_gpytorchs_path():
    model = _model(ExactGraphKernel(GRAPH, Diffusion(1.5)), torch.float64)
    with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.cg_tolerance(1e-3):
        _assert_same(model, rtol=0, atol=0)   # the same CG probes, the same arithmetic
    targets = model.train_targets.clone()
    targets[3] = math.nan
    model.set_train_data(targets=targets, strict=False)
    with gpytorch.settings.max_cholesky_size(10_000), gpytorch.settings.observation_nan_policy("mask"):
        _assert_same(model, rtol=0, atol=0)


def test_a_kernel_that_finds_cg_cheaper_gets_gpytorchs_cg_path(monkeypatch):
    kernel = GRFKernel(GRAPH, kernel_family=Diffusion(1.5), num_walkers=16, seed=0, schedule=None)
    model = _model(kernel, torch.float64)
    with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.cg_tolerance(1e-3):
        expected, expected_gradients = _loss_and_gradients(model, gpytorch.mlls.ExactMarginalLogLikelihood)
    monkeypatch.setattr(GRFKernel, "dense_solves_pay", lambda self, nodes: False)
    with gpytorch.settings.max_cholesky_size(10_000), gpytorch.settings.cg_tolerance(1e-3):
        loss, gradients = _loss_and_gradients(model, DenseMarginalLogLikelihood)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    for gradient, expected_gradient in zip(gradients, expected_gradients):
        torch.testing.assert_close(gradient, expected_gradient, rtol=0, atol=0)


def test_grf_kernels_factorise_dense_features_and_leave_sparse_ones_on_many_points_to_cg():
    graph = grid_graph(60, 60)
    train = torch.arange(0, 3600, 2, dtype=torch.float64).unsqueeze(-1)
    sparse = GRFKernel(graph, kernel_family=Diffusion(1.0), num_walkers=2, seed=0, schedule=None)
    dense = GRFKernel(graph, kernel_family=Diffusion(1.0), num_walkers=512, p_halt=0.05, seed=0, schedule=None)
    # 1,800 points: 5.8e9 operations for the factor, against 1.5e5 x nnz(Phi).
    assert not sparse.dense_solves_pay(train)
    assert dense.dense_solves_pay(train)
    assert sparse.dense_solves_pay(train[:200])
    assert ExactGraphKernel(GRAPH).dense_solves_pay(torch.as_tensor(TRAIN, dtype=torch.float64).unsqueeze(-1))


class _EuclideanGP(gpytorch.models.ExactGP):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, likelihood: gpytorch.likelihoods.GaussianLikelihood,
                 kernel: gpytorch.kernels.Kernel | None = None) -> None:
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(
            CoupledRFFKernel(num_features=8, num_dims=2, seed=0) if kernel is None else kernel)

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_a_low_rank_covariance_keeps_its_woodbury_solver(monkeypatch):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(300, 2, generator=generator, dtype=torch.float64)
    model = _EuclideanGP(x, torch.sin(x.sum(-1)), gpytorch.likelihoods.GaussianLikelihood()).double()
    model.train()
    expected, expected_gradients = _loss_and_gradients(model, gpytorch.mlls.ExactMarginalLogLikelihood)

    def forbidden(self):
        raise AssertionError("a low-rank covariance was made dense")

    monkeypatch.setattr(LowRankRootAddedDiagLinearOperator, "to_dense", forbidden)
    with gpytorch.settings.max_cholesky_size(10_000):
        loss, gradients = _loss_and_gradients(model, DenseMarginalLogLikelihood)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    assert len(gradients) == len(expected_gradients) > 0
    for gradient, expected_gradient in zip(gradients, expected_gradients):
        torch.testing.assert_close(gradient, expected_gradient, rtol=0, atol=0)


def test_the_cg_objectives_noise_gradient_has_the_plain_probe_estimates_variance():
    """A kernel matrix above the noise in far more directions than the preconditioner's rank.

    There the preconditioner's control variate adds a variance of about 2 per such direction to
    the noise's derivative; without it the derivative of the total negative log-likelihood in
    log(noise) has the variance of Hutchinson's estimate of sigma^2 tr(C^-1) / 2, which the
    spectrum of C gives. Over eight probe seeds, the root mean square error against the dense
    derivative exceeds twice its predicted standard deviation with probability 1e-4 (chi-square,
    8 degrees of freedom); gpytorch's estimator misses it by several times.
    """
    size, noise = 600, 1e-3
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(size, 2, generator=generator, dtype=torch.float64)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    model = _EuclideanGP(x, torch.zeros(size, dtype=torch.float64), likelihood, gpytorch.kernels.RBFKernel()).double()
    model.covar_module.base_kernel.lengthscale = 0.03
    model.covar_module.outputscale = 1.0
    likelihood.noise = noise
    with torch.no_grad():
        covariance = likelihood(model(x)).covariance_matrix
        targets = torch.linalg.cholesky(covariance) @ torch.randn(size, generator=generator, dtype=torch.float64)
    model.set_train_data(targets=targets, strict=False)
    model.train()
    eigenvalues = torch.linalg.eigvalsh(covariance)
    alpha = torch.linalg.solve(covariance, targets)
    exact = 0.5 * noise * float((1 / eigenvalues).sum() - alpha @ alpha)
    probes = 32
    predicted = 0.5 * noise * math.sqrt(2 * float((eigenvalues ** -2).sum()) / probes)

    def evaluate(mll_class: type, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.min_preconditioning_size(0), \
                gpytorch.settings.max_preconditioner_size(15), gpytorch.settings.num_trace_samples(probes), \
                gpytorch.settings.cg_tolerance(1e-4), seeded_torch_rng(seed):
            loss = -mll_class(likelihood, model)(model(x), targets) * size
        loss.backward()
        return loss.detach(), {name: parameter.grad.clone() for name, parameter in model.named_parameters()}

    def error(mll_class: type, seed: int) -> float:
        raw = likelihood.noise_covar.raw_noise
        gradient = evaluate(mll_class, seed)[1]["likelihood.noise_covar.raw_noise"]
        return float(gradient.sum() / torch.sigmoid(raw.detach()).sum() * noise) - exact

    ours = np.array([error(DenseMarginalLogLikelihood, seed) for seed in range(8)])
    theirs = np.array([error(gpytorch.mlls.ExactMarginalLogLikelihood, seed) for seed in range(8)])
    assert np.sqrt(np.mean(ours ** 2)) <= 2 * predicted
    assert np.sqrt(np.mean(theirs ** 2)) >= 3 * predicted
    # The value and the kernel's gradients are gpytorch's.
    (loss, gradients), (expected, expected_gradients) = (evaluate(DenseMarginalLogLikelihood, 0),
                                                         evaluate(gpytorch.mlls.ExactMarginalLogLikelihood, 0))
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    for name in ("covar_module.raw_outputscale", "covar_module.base_kernel.raw_lengthscale"):
        torch.testing.assert_close(gradients[name], expected_gradients[name], rtol=1e-10, atol=1e-10)


def _corrected_reference(covariance: torch.Tensor, residual: torch.Tensor, perturbation: torch.Tensor,
                         probes: torch.Tensor) -> torch.Tensor:
    """The bias-corrected terms written out with explicit inverses (autograd differentiates them)."""
    inverse = torch.linalg.inv(covariance)
    alpha = inverse @ residual
    second = alpha @ perturbation @ inverse @ perturbation @ alpha
    trace = torch.einsum("ip,ij,jk,kl,lm,mp->", probes, inverse, perturbation, inverse, perturbation, probes)
    return residual @ alpha + torch.logdet(covariance) - second / 4 + trace / (8 * probes.shape[-1])


@pytest.mark.parametrize("scaled", [True, False], ids=["scale-kernel", "bare-kernel"])
def test_the_bias_corrected_terms_take_their_gradient_in_closed_form(scaled: bool):
    """Value and gradients from the covariance's parts s K + diag(noise) and the difference D (H = s D)."""
    generator = torch.Generator().manual_seed(0)
    n = 12
    root = torch.randn(n, n, generator=generator, dtype=torch.float64)
    error = 0.1 * torch.randn(n, n, generator=generator, dtype=torch.float64)
    probes = (2 * torch.randint(0, 2, (n, 5), generator=generator) - 1).double()
    scale = torch.tensor(1.7 if scaled else 1.0, dtype=torch.float64).requires_grad_(scaled)
    inputs = [(root @ root.T / n).requires_grad_(),
              (0.3 + torch.rand(n, generator=generator, dtype=torch.float64)).requires_grad_(),
              (error + error.T).requires_grad_(),
              torch.randn(n, generator=generator, dtype=torch.float64).requires_grad_()]
    differentiated = inputs + ([scale] if scaled else [])

    def symmetric(function):
        # The Gram matrices enter through their symmetric parts, as in a model.
        gram, noise, difference, residual = inputs
        return function((gram + gram.T) / 2, noise, (difference + difference.T) / 2, residual)

    value = symmetric(lambda gram, noise, difference, residual: _BiasCorrectedGaussian.apply(
        gram, scale, noise, difference, residual, probes)[0])
    expected = symmetric(lambda gram, noise, difference, residual: _corrected_reference(
        scale * gram + torch.diag(noise), residual, scale * difference, probes))
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)
    for gradient, expected_gradient in zip(torch.autograd.grad(value, differentiated),
                                           torch.autograd.grad(expected, differentiated)):
        torch.testing.assert_close(gradient, expected_gradient, rtol=1e-10, atol=1e-12)


def test_the_whitened_error_is_the_largest_eigenvalue_of_the_whitened_perturbation():
    generator = torch.Generator().manual_seed(2)
    n = 30
    root = torch.randn(n, n, generator=generator, dtype=torch.float64)
    factor = torch.linalg.cholesky(root @ root.T / n + 0.1 * torch.eye(n, dtype=torch.float64))
    # A perturbation with one dominant direction, as the power iteration needs to converge.
    direction = torch.randn(n, 1, generator=generator, dtype=torch.float64)
    noise = 0.01 * torch.randn(n, n, generator=generator, dtype=torch.float64)
    perturbation = direction @ direction.T + noise + noise.T
    whitened = torch.linalg.solve_triangular(factor, torch.linalg.solve_triangular(
        factor, perturbation, upper=False).T, upper=False)
    expected = torch.linalg.eigvalsh(whitened).abs().max()
    start = torch.ones(n, 1, dtype=torch.float64)
    torch.testing.assert_close(whitened_norm(factor, perturbation, start), expected, rtol=1e-6, atol=0)
    # A zero perturbation (identical draws) has a zero norm, not a NaN.
    assert float(whitened_norm(factor, torch.zeros_like(perturbation), start)) == 0.0


def test_the_correction_removes_the_likelihoods_second_order_bias():
    """Over independent pairs of unbiased estimates, the corrected objective averages to the exact one."""
    generator = torch.Generator().manual_seed(0)
    n, draws, noise, scale = 20, 2000, 1e-2, 5e-4
    identity = torch.eye(n, dtype=torch.float64)
    basis = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))[0]
    kernel = basis @ torch.diag(torch.logspace(0, -4, n, dtype=torch.float64)) @ basis.T
    covariance = kernel + noise * identity
    targets = torch.linalg.cholesky(covariance) @ torch.randn(n, generator=generator, dtype=torch.float64)
    alpha = torch.linalg.solve(covariance, targets)
    exact = float(targets @ alpha + torch.logdet(covariance))
    # The first-order term has mean zero; subtracting it leaves the bias to measure.
    slope = torch.linalg.inv(covariance) - torch.outer(alpha, alpha)

    def estimate() -> torch.Tensor:
        error = scale * torch.randn(n, n, generator=generator, dtype=torch.float64)
        return kernel + (error + error.T) / 2

    plain, corrected = [], []
    for _ in range(draws):
        first, second = estimate(), estimate()
        mean = (first + second) / 2
        linear = float((slope * (mean - kernel)).sum())
        plain.append(float(targets @ torch.linalg.solve(mean + noise * identity, targets)
                           + torch.logdet(mean + noise * identity)) - linear - exact)
        probes = (2 * torch.randint(0, 2, (n, 8), generator=generator) - 1).double()
        value = _BiasCorrectedGaussian.apply(mean, torch.ones((), dtype=torch.float64),
                                             torch.full((n,), noise, dtype=torch.float64),
                                             first - second, targets, probes)[0]
        corrected.append(float(value) - linear - exact)
    plain_bias, corrected_bias = np.mean(plain), np.mean(corrected)
    assert plain_bias > 8 * np.std(plain) / math.sqrt(draws)          # the bias the correction is for
    assert abs(corrected_bias) < 3 * np.std(corrected) / math.sqrt(draws)


def _paired_model(**schedule: object) -> tuple[GraphGP, GRFKernel]:
    kernel = GRFKernel(GRAPH, kernel_family=Diffusion(1.5), seed=0,
                       schedule=WalkSchedule(**{"predict_walkers": 64, "predict_tolerance": 0.5,
                                                "sigma_fit_samples": 5, **schedule}))
    model = _model(kernel, torch.float64)
    kernel.prepare_prediction(0)
    return model, kernel


def test_a_bias_corrected_round_trains_on_the_mean_of_two_draws_minus_the_bias():
    model, kernel = _paired_model()
    x = model.train_inputs[0]
    scale, noise = model.covar_module.outputscale, model.likelihood.noise
    with gpytorch.settings.max_cholesky_size(10_000):
        mll = DenseMarginalLogLikelihood(model.likelihood, model)
        value = mll(model(x), model.train_targets)
        with torch.no_grad():
            mean = model.covar_module(x).to_dense() / scale
            difference = kernel.estimate_difference()
    assert kernel.estimate_difference() is None          # taken once
    kernel.finish_training()
    with torch.no_grad():
        own = kernel(x).to_dense()
    # The kernel's own estimate and an independent draw: mean and difference.
    torch.testing.assert_close(mean + difference / 2, own)
    assert float((difference.abs()).max()) > 0
    covariance = scale * mean + noise * torch.eye(TRAIN.size, dtype=torch.float64)
    terms = _corrected_reference(covariance, model.train_targets, scale * difference,
                                 mll._probes(TRAIN.size, covariance))
    torch.testing.assert_close(value.detach(), -0.5 * (terms + TRAIN.size * math.log(2 * math.pi)) / TRAIN.size)
    # When training ends, the second draw goes and the kernel is its own estimate again.
    with torch.no_grad():
        torch.testing.assert_close(model.covar_module(x).to_dense(), scale * own)
    assert kernel.estimate_difference() is None


def test_a_bias_corrected_round_factorises_densely_above_max_cholesky_size_where_the_factor_fits(
        monkeypatch: pytest.MonkeyPatch):
    values, reports = [], []
    for size in (10_000, 0):
        model, kernel = _paired_model()
        monkeypatch.setattr(kernel, "record_evaluation", reports.append)
        with gpytorch.settings.max_cholesky_size(size):
            values.append(DenseMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs),
                                                                              model.train_targets))
    # Also where CG would be cheaper: the correction needs the factor.
    monkeypatch.setattr(grf_kernel_module, "dense_factor_pays", lambda rows, entries: False)
    model, kernel = _paired_model()
    monkeypatch.setattr(kernel, "record_evaluation", reports.append)
    values.append(DenseMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs),
                                                                      model.train_targets))
    # The same corrected value, to rounding, whatever gpytorch's threshold and the cost rule.
    torch.testing.assert_close(values[1], values[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(values[2], values[0], rtol=1e-12, atol=1e-12)
    assert [report.expansion_error is not None for report in reports] == [True, True, True]
    # Where the factor does not fit in memory, the round solves one draw by CG/Lanczos.
    monkeypatch.setattr(grf_kernel_module, "paired_factor_fits", lambda rows, itemsize: False)
    model, kernel = _paired_model()
    reports.clear()
    monkeypatch.setattr(kernel, "record_evaluation", reports.append)
    with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.cg_tolerance(1e-3):
        value = DenseMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs), model.train_targets)
    assert kernel.estimate_difference() is None and torch.isfinite(value)
    assert [report.expansion_error for report in reports] == [None]
    # The round keeps that decision; a round below the threshold is paired, whatever the memory rule says.
    with gpytorch.settings.max_cholesky_size(10_000):
        DenseMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs), model.train_targets)
    assert reports[-1].expansion_error is None
    model, kernel = _paired_model()
    monkeypatch.setattr(kernel, "record_evaluation", reports.append)
    with gpytorch.settings.max_cholesky_size(10_000):
        DenseMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs), model.train_targets)
    assert reports[-1].expansion_error is not None


def _round_after_an_evaluation(threshold: float) -> tuple[GraphGP, GRFKernel]:
    """A round on the prediction walks that starts from an evaluation on the training walks."""
    kernel = GRFKernel(GRAPH, kernel_family=Diffusion(1.5), seed=0,
                       schedule=WalkSchedule(predict_walkers=64, predict_tolerance=0.5, sigma_fit_samples=5,
                                             pairing_threshold=threshold))
    model = _model(kernel, torch.float64)
    with gpytorch.settings.max_cholesky_size(10_000):
        DenseMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs), model.train_targets)
    assert kernel.prepare_prediction(0)
    return model, kernel


def test_above_max_cholesky_size_a_round_pairs_only_where_one_draws_error_at_its_start_exceeds_the_threshold(
        monkeypatch: pytest.MonkeyPatch):
    model, kernel = _round_after_an_evaluation(0.0)
    x = model.train_inputs[0]
    # One draw's whitened error at the output scale and noise the round starts from.
    noise = torch.full((TRAIN.size,), 0.05, dtype=torch.float64)
    error = kernel._one_draw_error(kernel.node_indices(x), LikelihoodEvaluation(None, 1.7, model.train_targets,
                                                                                noise), dense=True)
    assert 0 < error < 1
    outcomes = {}
    for threshold in (0.0, error / 2, error * 2):
        model, kernel = _round_after_an_evaluation(threshold)
        reports = []
        monkeypatch.setattr(kernel, "record_evaluation", reports.append)
        mll = DenseMarginalLogLikelihood(model.likelihood, model)
        with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.cg_tolerance(1e-3):
            for _ in range(2):    # the round keeps its decision
                value = mll(model(*model.train_inputs), model.train_targets)
        outcomes[threshold] = [report.expansion_error is not None for report in reports]
        assert torch.isfinite(value)
    assert outcomes == {0.0: [True, True], error / 2: [True, True], error * 2: [False, False]}
    # Up to max_cholesky_size the round pairs whatever the threshold: the factor is dense anyway.
    model, kernel = _round_after_an_evaluation(error * 2)
    reports = []
    monkeypatch.setattr(kernel, "record_evaluation", reports.append)
    with gpytorch.settings.max_cholesky_size(10_000):
        DenseMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs), model.train_targets)
    assert [report.expansion_error is not None for report in reports] == [True]


def test_the_pairing_threshold_is_a_finite_non_negative_number_and_round_trips():
    schedule = WalkSchedule(pairing_threshold=0.25)
    assert WalkSchedule.from_dict(schedule.to_dict()) == schedule
    with pytest.raises(ValueError, match="pairing_threshold"):
        WalkSchedule(pairing_threshold=-0.1)
    with pytest.raises(ValueError, match="pairing_threshold"):
        WalkSchedule(pairing_threshold=float("nan"))
    with pytest.raises(TypeError, match="pairing_threshold"):
        WalkSchedule(pairing_threshold="0.1")


def test_the_paired_factor_fits_where_its_dense_matrices_take_at_most_their_share_of_the_available_memory(
        monkeypatch: pytest.MonkeyPatch):
    rows = 10_240
    needed = PAIRED_DENSE_MATRICES * rows ** 2 * 8
    monkeypatch.setattr(grf_kernel_module, "available_memory", lambda: int(needed / PAIRED_MEMORY_FRACTION))
    assert paired_factor_fits(rows, 8) and not paired_factor_fits(rows + 1, 8)
    assert paired_factor_fits(int(rows * math.sqrt(2)), 4)
    monkeypatch.setattr(grf_kernel_module, "available_memory", lambda: None)   # unknown: only small ones
    assert not paired_factor_fits(rows, 8) and paired_factor_fits(512, 8)


def test_rounds_without_the_correction_or_in_eval_mode_train_on_the_kernels_own_walks():
    # Switched off, or prediction walks that miss their tolerance (the expansion needs accurate walks).
    for schedule in ({"bias_correction": False}, {"predict_tolerance": 1e-4}):
        model, kernel = _paired_model(**schedule)
        x = model.train_inputs[0]
        with torch.no_grad():
            model.covar_module(x).to_dense()
        assert kernel.estimate_difference() is None
    model, kernel = _paired_model()
    model.eval()
    with torch.no_grad():
        model.covar_module(x).to_dense()
    assert kernel.estimate_difference() is None


def test_a_covariance_that_is_not_a_scaled_grf_estimate_trains_on_the_mean_and_warns():
    model, kernel = _paired_model()
    model.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.ScaleKernel(kernel)).double()
    with gpytorch.settings.max_cholesky_size(10_000), pytest.warns(BiasCorrectionWarning, match="ScaleKernel"):
        value = DenseMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs), model.train_targets)
    assert torch.isfinite(value)


class _DenseNoiseLikelihood(gpytorch.likelihoods.GaussianLikelihood):
    """A Gaussian likelihood whose noise covariance is handed over as a dense matrix (not a diagonal operator)."""

    def _shaped_noise_covar(self, base_shape: torch.Size, *params: object, **kwargs: object) -> object:
        diagonal = super()._shaped_noise_covar(base_shape, *params, **kwargs)
        return DenseLinearOperator(diagonal.to_dense())


def test_a_paired_round_without_a_diagonal_noise_trains_on_the_mean_and_warns():
    model, kernel = _paired_model()
    likelihood = _DenseNoiseLikelihood().double()
    likelihood.noise = model.likelihood.noise.detach()
    model.likelihood = likelihood
    x = model.train_inputs[0]
    with gpytorch.settings.max_cholesky_size(10_000):
        with pytest.warns(BiasCorrectionWarning, match="diagonal noise"):
            value = DenseMarginalLogLikelihood(likelihood, model)(model(x), model.train_targets)
        with torch.no_grad():
            covariance = model.covar_module(x).to_dense() + likelihood.noise * torch.eye(x.shape[0],
                                                                                         dtype=torch.float64)
    expected = torch.distributions.MultivariateNormal(torch.zeros_like(model.train_targets),
                                                      covariance).log_prob(model.train_targets) / x.shape[0]
    torch.testing.assert_close(value.detach(), expected, rtol=1e-10, atol=1e-12)


def test_a_paired_evaluation_reports_the_scale_residual_and_noise_to_its_kernel(monkeypatch: pytest.MonkeyPatch):
    model, kernel = _paired_model()
    reports = []
    monkeypatch.setattr(kernel, "record_evaluation", reports.append)
    x = model.train_inputs[0]
    with gpytorch.settings.max_cholesky_size(10_000):
        DenseMarginalLogLikelihood(model.likelihood, model)(model(x), model.train_targets)
    (report,) = reports
    assert report.outputscale == pytest.approx(1.7)
    torch.testing.assert_close(report.residual, (model.train_targets - model.mean_module(x)).detach())
    torch.testing.assert_close(report.noise, torch.full((TRAIN.size,), 0.05, dtype=torch.float64))
    assert not report.residual.requires_grad and 0 < report.expansion_error < 1


@pytest.mark.parametrize("solver", ["dense", "cg"])
def test_an_evaluation_on_one_draw_reports_without_an_expansion_error(monkeypatch: pytest.MonkeyPatch, solver: str):
    kernel = GRFKernel(GRAPH, kernel_family=Diffusion(1.5), seed=0)
    model = _model(kernel, torch.float64)
    reports = []
    monkeypatch.setattr(kernel, "record_evaluation", reports.append)
    x = model.train_inputs[0]
    with gpytorch.settings.max_cholesky_size(10_000 if solver == "dense" else 0):
        DenseMarginalLogLikelihood(model.likelihood, model)(model(x), model.train_targets)
    (report,) = reports
    assert report.expansion_error is None and report.outputscale == pytest.approx(1.7)
    torch.testing.assert_close(report.residual, (model.train_targets - model.mean_module(x)).detach())
    torch.testing.assert_close(report.noise, torch.full((TRAIN.size,), 0.05, dtype=torch.float64))


def test_models_of_other_kernels_report_nothing(monkeypatch: pytest.MonkeyPatch):
    kernel = GRFKernel(GRAPH, kernel_family=Diffusion(1.5), seed=0)
    model = _model(kernel, torch.float64)
    model.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.ScaleKernel(kernel)).double()
    reports = []
    monkeypatch.setattr(kernel, "record_evaluation", reports.append)
    with gpytorch.settings.max_cholesky_size(0):
        DenseMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs), model.train_targets)
    assert reports == []


def test_the_prediction_error_is_the_same_from_a_sparse_factor(monkeypatch: pytest.MonkeyPatch):
    """Training sets above the dense size solve by a sparse factor of the GRF covariance: the same estimate."""
    import gp_couple.predictive_variance as predictive_variance

    model, kernel = _paired_model()
    x = model.train_inputs[0]
    with torch.no_grad():
        model.covar_module(x).to_dense()
    residual = (model.train_targets - model.mean_module(x)).detach()
    evaluation = LikelihoodEvaluation(None, 1.7, residual, torch.full((TRAIN.size,), 0.05, dtype=torch.float64))
    dense = kernel.estimate_prediction_error(evaluation)
    monkeypatch.setattr(predictive_variance, "DENSE_VARIANCE_SIZE", 0)
    monkeypatch.setattr(predictive_variance, "_dense_moments", None)    # never the dense factor now
    sparse = kernel.estimate_prediction_error(evaluation)
    assert dense > 0 and sparse == pytest.approx(dense, rel=1e-9)


def _whitened_error(kernel: GRFKernel, nodes: torch.Tensor, noise: torch.Tensor) -> float:
    """The exact spectral norm that ``_one_draw_error`` estimates, at output scale 1.7 (dense eigenvalues)."""
    from gp_couple.operators import GRFGramLinearOperator, SparseFeatureLinearOperator

    pair = kernel._pair_draw(nodes)
    with torch.no_grad():
        own = GRFGramLinearOperator(kernel.feature_operator(nodes)).to_dense().double()
        values = pair.steps.values(kernel.kernel_family.modulation(pair.features.num_terms))
        other = GRFGramLinearOperator(SparseFeatureLinearOperator(values, pattern=pair.pattern)).to_dense().double()
    factor = torch.linalg.cholesky(1.7 * own + torch.diag(noise))
    whitened = torch.linalg.solve_triangular(factor, torch.linalg.solve_triangular(
        factor, 1.7 * (own - other) / math.sqrt(2), upper=False).mT, upper=False)
    return float(torch.linalg.eigvalsh(whitened).abs().max())


def test_the_one_draw_error_is_the_whitened_norm_of_the_draws_difference_over_root_two():
    model, kernel = _paired_model()
    kernel.finish_training()                             # one draw: the evaluation is not paired
    x = model.train_inputs[0]
    nodes = kernel.node_indices(x)
    residual = (model.train_targets - model.mean_module(x)).detach()
    noise = torch.full((TRAIN.size,), 0.05, dtype=torch.float64)
    error = kernel._one_draw_error(nodes, LikelihoodEvaluation(None, 1.7, residual, noise), dense=True)
    expected = _whitened_error(kernel, nodes, noise)
    # Power iteration: ||A v|| / ||v|| never exceeds the norm, and 20 steps come within 2 % here.
    assert 0 < 0.98 * expected <= error <= expected * (1 + 1e-9)


def test_the_one_draw_error_from_a_sparse_factor_is_the_dense_factors(monkeypatch: pytest.MonkeyPatch):
    """Training nodes whose walks seldom meet: the whitened error from a sparse factor, as from the dense one."""
    import gp_couple.predictive_variance as predictive_variance

    graph = grid_graph(40, 40)
    train = np.sort(np.random.default_rng(0).choice(graph.num_nodes, 300, replace=False))
    kernel = GRFKernel(graph, num_walkers=16, p_halt=0.5, kernel_family=Diffusion(1.0), seed=0, schedule=None)
    nodes = torch.as_tensor(train)
    noise = torch.full((train.size,), 0.05, dtype=torch.float64)
    evaluation = LikelihoodEvaluation(None, 1.7, torch.zeros(train.size, dtype=torch.float64), noise)
    # 300 points are below the sparse factor's fixed cost: without it, these walks take the sparse factor.
    monkeypatch.setattr(predictive_variance, "SPARSE_SETUP_WORK", 0)
    chosen = []
    monkeypatch.setattr(grf_kernel_module, "SparseFactor",
                        lambda *args: chosen.append(args) or predictive_variance.SparseFactor(*args))
    sparse = kernel._one_draw_error(nodes, evaluation, dense=False)
    assert len(chosen) == 1 and sparse is not None
    monkeypatch.setattr(grf_kernel_module, "sparse_factor_ordering", lambda *args: None)
    assert kernel._one_draw_error(nodes, evaluation, dense=False) is None      # neither factor allowed
    dense = kernel._one_draw_error(nodes, evaluation, dense=True)
    expected = _whitened_error(kernel, nodes, noise)
    # Power iteration from different starts: both within 2 % below the norm, never above it.
    for error in (sparse, dense):
        assert 0 < 0.98 * expected <= error <= expected * (1 + 1e-9)


def test_the_prediction_error_estimate_is_the_variance_of_one_draws_predictive_mean():
    """Half the squared difference of two draws' predictive means estimates one draw's variance there."""
    held_out = np.setdiff1d(np.arange(GRAPH.num_nodes), TRAIN)
    nodes = torch.as_tensor(np.concatenate([TRAIN, held_out]))
    n, draws = TRAIN.size, 24
    estimates, means = [], []
    for seed in range(draws):
        kernel = GRFKernel(GRAPH, kernel_family=Diffusion(1.5), seed=seed,
                           schedule=WalkSchedule(predict_walkers=16, predict_tolerance=0.9, sigma_fit_samples=5))
        model = _model(kernel, torch.float64)
        kernel.prepare_prediction(0)
        x = model.train_inputs[0]
        scale, noise = model.covar_module.outputscale.item(), model.likelihood.noise.item()
        with torch.no_grad():
            model.covar_module(x).to_dense()               # a paired evaluation: the second draw
            residual = model.train_targets - model.mean_module(x)
            estimates.append(kernel.estimate_prediction_error(LikelihoodEvaluation(
                0.0, scale, residual, torch.full((n,), noise, dtype=torch.float64))))
            kernel.finish_training()
            own = kernel(nodes, nodes).to_dense()
            covariance = scale * own[:n, :n] + noise * torch.eye(n, dtype=torch.float64)
            means.append((scale * own[n:, :n] @ torch.linalg.solve(covariance, residual)).numpy())
    exact = ExactGraphKernel(GRAPH, kernel_family=Diffusion(1.5)).double()
    with torch.no_grad():
        truth = exact(nodes, nodes).to_dense()
        covariance = scale * truth[:n, :n] + noise * torch.eye(n, dtype=torch.float64)
        cross = scale * truth[n:, :n]
        variance = float((scale * truth.diagonal()[n:] - (cross @ torch.linalg.solve(covariance, cross.T)).diagonal())
                         .mean())
    means = np.asarray(means)
    # Each draw's squared deviation from the mean over draws, relative to the exact latent variance.
    spread = ((means - means.mean(0)) ** 2).mean(1) * draws / (draws - 1) / variance
    estimates = np.asarray(estimates)
    error = math.sqrt(np.var(estimates) / draws + np.var(spread) / draws)
    assert abs(estimates.mean() - spread.mean()) < 3 * error
    assert error < 0.2 * spread.mean()                 # a test that can tell a factor of two


def test_the_prediction_error_needs_held_out_rows_and_a_diagonal_noise():
    model, kernel = _paired_model()
    x = model.train_inputs[0]
    with torch.no_grad():
        model.covar_module(x).to_dense()
    residual = (model.train_targets - model.mean_module(x)).detach()
    assert kernel.estimate_prediction_error(LikelihoodEvaluation(0.0, 1.7, residual, None)) is None
    with pytest.raises(TypeError, match="LikelihoodEvaluation"):
        kernel.estimate_prediction_error({"outputscale": 1.7})
    rows_at_the_data = GRFKernel(GRAPH, kernel_family=Diffusion(1.5), seed=0, nodes=TRAIN,
                                 schedule=WalkSchedule(predict_walkers=64, predict_tolerance=0.5, sigma_fit_samples=5))
    model = _model(rows_at_the_data, torch.float64)
    rows_at_the_data.prepare_prediction(0)
    with torch.no_grad():
        model.covar_module(x).to_dense()
    noise = torch.full((TRAIN.size,), 0.05, dtype=torch.float64)
    assert rows_at_the_data.estimate_prediction_error(LikelihoodEvaluation(0.0, 1.7, residual, noise)) is None


def test_the_round_that_training_ends_on_checks_the_prediction_walkers_unless_they_were_given():
    for given in (64, None):
        model, kernel = _paired_model(predict_walkers=given, max_predict_walkers=64)
        with gpytorch.settings.max_cholesky_size(10_000):
            DenseMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs), model.train_targets)
        assert not kernel.prepare_prediction(1)     # the hyperparameters did not move: training ends
        if given is None:
            assert kernel.prediction_error_estimate > 0
        else:
            assert kernel.prediction_error_estimate is None and kernel.num_walkers == given
        assert kernel.num_walkers <= 64 and kernel.estimate_difference() is None
