"""Coupled RFF / RLF GPyTorch kernels: gpytorch's kernel contract, GP inference, state and errors."""

from __future__ import annotations

import io
import pickle
import unittest

import gpytorch
import numpy as np
import pytest
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase
from linear_operator.operators import LowRankRootLinearOperator, MatmulLinearOperator

from gp_couple.couplings import GaussianCopulaCoupling, IIDFrequencyCoupling, PairwiseNormCoupling
from gp_couple.features.fourier import gaussian_kernel, random_fourier_features, random_laplace_features
from gp_couple.kernels import CoupledRandomFeatureKernel, CoupledRFFKernel, CoupledRLFKernel, fit_coupling, gram_rmse
from tests.stats import mean_and_standard_error

# --------------------------------------------------------------------------- gpytorch's contract


class _RandomFeatureKernelContract(BaseKernelTestCase):
    """gpytorch's kernel tests with a fixed frequency seed.

    The base tests create their kernels with no input dimension and infer it from the
    data; these kernels draw frequencies at construction, so :meth:`create_kernel_no_ard`
    uses ``num_dims=2`` (the dimension of the base tests' batched data) unless
    ``active_dims`` fixes it, and every kernel uses the same seed so that two kernels
    built alike estimate with the same frequencies.
    """

    kernel_class: type = CoupledRFFKernel
    coupling: object = None
    seed = 0

    def _make(self, **kwargs):  # type: ignore[no-untyped-def]
        kwargs.setdefault("num_dims", len(kwargs["active_dims"]) if "active_dims" in kwargs else 2)
        return self.kernel_class(num_features=5, coupling=self.coupling, seed=3, **kwargs)

    def create_kernel_no_ard(self, **kwargs):  # type: ignore[no-untyped-def]
        return self._make(**kwargs)

    def create_kernel_ard(self, num_dims, **kwargs):  # type: ignore[no-untyped-def]
        return self._make(num_dims=num_dims, ard_num_dims=num_dims, **kwargs)

    # The two active_dims tests of the base class compare against a kernel built with
    # create_kernel_no_ard() and evaluated on 4 (resp. 6) dimensions, which a kernel
    # with eagerly drawn frequencies cannot infer: same checks, explicit num_dims.
    def _check_active_dims(self, active_dims: list[int]) -> None:
        kernel = self.create_kernel_no_ard(active_dims=active_dims)
        x = self.create_data_no_batch()
        covar_mat = kernel(x).evaluate_kernel().to_dense()
        kernel_basic = self.create_kernel_no_ard(num_dims=len(active_dims))
        covar_mat_actual = kernel_basic(x[:, active_dims]).evaluate_kernel().to_dense()
        self.assertAllClose(covar_mat, covar_mat_actual, rtol=1e-3, atol=1e-5)

    def test_active_dims_list(self) -> None:
        self._check_active_dims([0, 2, 4, 6])

    def test_active_dims_range(self) -> None:
        self._check_active_dims(list(range(3, 9)))


class TestCoupledRFFKernelContract(_RandomFeatureKernelContract, unittest.TestCase):
    kernel_class = CoupledRFFKernel


class TestCoupledRLFKernelContract(_RandomFeatureKernelContract, unittest.TestCase):
    kernel_class = CoupledRLFKernel


class TestCopulaRFFKernelContract(_RandomFeatureKernelContract, unittest.TestCase):
    kernel_class = CoupledRFFKernel
    coupling = "copula"


class TestIIDRLFKernelContract(_RandomFeatureKernelContract, unittest.TestCase):
    kernel_class = CoupledRLFKernel
    coupling = "iid"


# --------------------------------------------------------------------------- helpers


class _GP(gpytorch.models.ExactGP):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, kernel: gpytorch.kernels.Kernel) -> None:
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel)

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _regression_data(n: int = 60, d: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.standard_normal((n, d)))
    y = torch.sin(x.sum(-1)) + 0.1 * torch.as_tensor(rng.standard_normal(n))
    return x, y


def _model(kernel: gpytorch.kernels.Kernel, n: int = 60) -> _GP:
    x, y = _regression_data(n)
    model = _GP(x, y, kernel).double()
    model.likelihood.noise = 0.05
    model.covar_module.outputscale = 1.7
    return model


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize("kernel_class, fmap", [(CoupledRFFKernel, random_fourier_features),
                                                (CoupledRLFKernel, random_laplace_features)])
def test_kernel_is_feature_inner_product_with_ard_lengthscales(kernel_class, fmap) -> None:  # type: ignore[no-untyped-def]
    kernel = kernel_class(num_features=6, num_dims=3, ard_num_dims=3, seed=0).double()
    kernel.lengthscale = torch.tensor([[0.5, 2.0, 1.3]], dtype=torch.float64)
    x, _ = _regression_data(8)
    y = x[:5] + 0.2
    features_x = fmap(x / kernel.lengthscale, kernel.frequencies)
    features_y = fmap(y / kernel.lengthscale, kernel.frequencies)
    torch.testing.assert_close(kernel(x, y).to_dense(), features_x @ features_y.T)
    torch.testing.assert_close(kernel.features(x), features_x)
    torch.testing.assert_close(kernel(x, diag=True), (features_x**2).sum(-1))


@pytest.mark.parametrize("kernel_class", [CoupledRFFKernel, CoupledRLFKernel])
def test_kernel_is_unbiased_over_seeds(kernel_class) -> None:  # type: ignore[no-untyped-def]
    x, _ = _regression_data(4)
    x = 0.3 * x
    kernel = kernel_class(num_features=3, num_dims=3, batch_shape=torch.Size([4000]), seed=0).double()
    kernel.lengthscale = 1.0
    estimates = kernel(x).to_dense().detach().numpy().reshape(4000, -1)
    exact = gaussian_kernel(x).numpy().reshape(-1)
    mean, se = mean_and_standard_error(estimates)
    assert np.all(np.abs(mean - exact) <= 5 * np.maximum(se, 1e-12))


def test_low_rank_operators() -> None:
    kernel = CoupledRFFKernel(num_features=4, num_dims=3, seed=0)
    x = torch.randn(20, 3)
    assert kernel.num_feature_columns == 8 == kernel.features(x).shape[-1]
    assert CoupledRLFKernel(num_features=4, num_dims=3).num_feature_columns == 4
    assert isinstance(kernel(x).evaluate_kernel(), LowRankRootLinearOperator)
    assert isinstance(kernel(x, x[:7]).evaluate_kernel(), MatmulLinearOperator)
    # With more feature columns than points a low-rank root would be wasteful.
    assert not isinstance(kernel(x[:5]).evaluate_kernel(), LowRankRootLinearOperator)


@pytest.mark.parametrize("kernel_class", [CoupledRFFKernel, CoupledRLFKernel])
def test_exact_gp_marginal_likelihood_and_predictions_match_dense_algebra(kernel_class) -> None:  # type: ignore[no-untyped-def]
    model = _model(kernel_class(num_features=4, num_dims=3, seed=1))
    x, y = model.train_inputs[0], model.train_targets
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()
    with gpytorch.settings.max_cholesky_size(0):  # force the Woodbury path, not a dense Cholesky
        value = mll(model(x), y)
    noise = model.likelihood.noise.item()
    gram = model.covar_module(x).to_dense().detach()
    covariance = gram + noise * torch.eye(len(y), dtype=torch.float64)
    mean = model.mean_module.constant.detach()
    dense = torch.distributions.MultivariateNormal(mean.expand(len(y)), covariance).log_prob(y) / len(y)
    torch.testing.assert_close(value.detach(), dense, rtol=1e-8, atol=1e-8)
    value.backward()
    assert model.covar_module.base_kernel.raw_lengthscale.grad is not None

    model.eval()
    test = torch.as_tensor(np.random.default_rng(5).standard_normal((7, 3)))
    with torch.no_grad():
        prediction = model(test)
        joint = model.covar_module(torch.cat([x, test])).to_dense()
    k_dd, k_pd, k_pp = joint[:60, :60], joint[60:, :60], joint[60:, 60:]
    solve = torch.linalg.solve(k_dd + noise * torch.eye(60, dtype=torch.float64),
                               torch.cat([(y - mean)[:, None], k_pd.T], dim=1))
    torch.testing.assert_close(prediction.mean, mean + k_pd @ solve[:, 0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(prediction.covariance_matrix, k_pp - k_pd @ solve[:, 1:], rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- state


def test_same_seed_same_frequencies_and_resample() -> None:
    first = CoupledRFFKernel(num_features=6, num_dims=4, seed=7)
    second = CoupledRFFKernel(num_features=6, num_dims=4, seed=7)
    assert torch.equal(first.frequencies, second.frequencies)
    before = first.frequencies.clone()
    first.resample(seed=8)
    assert not torch.equal(before, first.frequencies)
    first.resample(seed=7)
    assert torch.equal(before, first.frequencies)
    first.resample(seed=1, num_features=13)
    assert first.frequencies.shape == (13, 4) and first.num_features == 13


def test_batch_members_get_independent_frequencies() -> None:
    kernel = CoupledRFFKernel(num_features=4, num_dims=4, batch_shape=torch.Size([2]), seed=0)
    frequencies = kernel.frequencies
    assert frequencies.shape == (2, 4, 4)
    assert not torch.allclose(frequencies[0], frequencies[1])


@pytest.mark.parametrize("coupling", ["pnc", "iid", "halton", "antithetic", "copula"])
def test_state_dict_round_trip_into_fresh_model(coupling: str) -> None:
    kernel = CoupledRFFKernel(num_features=5, num_dims=3, coupling=coupling, seed=0)
    model = _model(kernel)
    if coupling == "copula":
        with torch.no_grad():
            kernel.coupling.theta.normal_()
    kernel.resample(seed=4, num_features=9)  # saved noise shapes differ from a fresh kernel's
    test = torch.as_tensor(np.random.default_rng(1).standard_normal((6, 3)))
    model.eval()
    with torch.no_grad():
        expected = model(test)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)

    fresh = _model(CoupledRFFKernel(num_features=2, num_dims=3, coupling=coupling, seed=123))
    fresh.load_state_dict(torch.load(buffer))
    fresh.eval()
    assert fresh.covar_module.base_kernel.num_features == 9
    with torch.no_grad():
        reloaded = fresh(test)
    assert torch.equal(reloaded.mean, expected.mean)
    assert torch.equal(reloaded.covariance_matrix, expected.covariance_matrix)


def test_load_state_dict_rejects_other_couplings_and_dimensions() -> None:
    state = CoupledRFFKernel(num_features=4, num_dims=3, coupling="pnc", seed=0).state_dict()
    for other in ("orthogonal", "iid"):
        kernel = CoupledRFFKernel(num_features=4, num_dims=3, coupling=other, seed=1)
        before = kernel.frequencies.clone()
        with pytest.raises(ValueError, match="'pnc' coupling"):
            kernel.load_state_dict(state)
        assert torch.equal(kernel.frequencies, before)
    with pytest.raises(ValueError, match="num_dims"):
        CoupledRFFKernel(num_features=4, num_dims=5, coupling="pnc").load_state_dict(state)


def test_pickle_and_dtype_conversion_keep_frequencies() -> None:
    kernel = CoupledRLFKernel(num_features=6, num_dims=3, seed=0)
    clone = pickle.loads(pickle.dumps(kernel))
    assert torch.equal(clone.frequencies, kernel.frequencies)
    double = kernel.double()
    assert double.frequencies.dtype == torch.float64
    double.resample(seed=2)
    assert double.frequencies.dtype == torch.float64


def test_seed_none_follows_torch_manual_seed_and_int_seeds_are_unchanged() -> None:
    torch.manual_seed(0)
    first = CoupledRFFKernel(num_features=5, num_dims=3).frequencies
    torch.manual_seed(0)
    assert torch.equal(CoupledRFFKernel(num_features=5, num_dims=3).frequencies, first)
    assert not torch.equal(CoupledRFFKernel(num_features=5, num_dims=3).frequencies, first)  # it advanced
    torch.manual_seed(0)
    kernel = CoupledRFFKernel(num_features=5, num_dims=3, seed=1)
    torch.manual_seed(0)
    assert torch.equal(kernel.resample().frequencies, first)  # resample() too
    # An int seed draws what it always drew, whatever the global generator holds.
    torch.manual_seed(1)
    frequencies = CoupledRFFKernel(num_features=3, num_dims=2, seed=0).double().frequencies
    expected = [[0.2412991277940666, -1.2290872897040188], [1.083398001788261, 0.21269684836485148],
                [-0.888610425534921, 2.163177680784429]]
    assert frequencies.tolist() == expected


# --------------------------------------------------------------------------- coupling fitting


def test_fit_coupling_trains_copula_parameters_only() -> None:
    kernel = CoupledRFFKernel(num_features=4, num_dims=4, coupling="copula", seed=0).double()
    kernel.lengthscale = 2.0
    x = torch.as_tensor(np.random.default_rng(0).standard_normal((30, 4)))
    noise_before = {k: v.clone() for k, v in kernel.noise.items()}
    lengthscale = kernel.lengthscale.clone()
    losses = fit_coupling(kernel, x, iterations=5, samples_per_step=4, seed=0)
    assert len(losses) == 5 and all(np.isfinite(losses))
    assert kernel.coupling.theta.abs().max() > 0
    assert torch.equal(kernel.lengthscale, lengthscale)
    for key, value in kernel.noise.items():
        assert torch.equal(value, noise_before[key])
    again = CoupledRFFKernel(num_features=4, num_dims=4, coupling="copula", seed=0).double()
    again.lengthscale = 2.0
    assert fit_coupling(again, x, iterations=5, samples_per_step=4, seed=0) == losses


def test_gram_rmse_matches_direct_computation() -> None:
    x = torch.as_tensor(0.5 * np.random.default_rng(0).standard_normal((10, 3)))
    values = gram_rmse("pnc", x, 3, "rff", num_draws=4, seed=0)
    frequencies = PairwiseNormCoupling().sample(3, 3, batch_shape=(4,), seed=0, dtype=torch.float64)
    features = random_fourier_features(x, frequencies)
    expected = ((features @ features.mT - gaussian_kernel(x)) ** 2).mean((-2, -1)).sqrt()
    torch.testing.assert_close(values, expected)


def test_fit_coupling_rejects_fixed_couplings() -> None:
    with pytest.raises(ValueError, match="no trainable parameters"):
        fit_coupling(CoupledRFFKernel(num_features=3, num_dims=3), torch.randn(5, 3), iterations=1)
    with pytest.raises(ValueError, match="num_dims=3"):
        fit_coupling(CoupledRFFKernel(num_features=3, num_dims=3, coupling="copula"), torch.randn(5, 4))


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)])
def test_rejects_bad_feature_counts(bad, error) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match="num_features"):
        CoupledRFFKernel(num_features=bad, num_dims=3)
    kernel = CoupledRFFKernel(num_features=3, num_dims=3)
    with pytest.raises(error, match="num_features"):
        kernel.resample(num_features=bad)


def test_rejects_bad_dimensions() -> None:
    with pytest.raises(ValueError, match="num_dims is required"):
        CoupledRFFKernel(num_features=3)
    with pytest.raises(ValueError, match="ard_num_dims implies 4"):
        CoupledRFFKernel(num_features=3, num_dims=3, ard_num_dims=4)
    with pytest.raises(ValueError, match="num_dims"):
        CoupledRFFKernel(num_features=3, num_dims=0)
    assert CoupledRFFKernel(num_features=3, active_dims=[0, 2]).num_dims == 2
    kernel = CoupledRFFKernel(num_features=3, num_dims=3)
    with pytest.raises(ValueError, match="x1 has 4 input dimensions .* num_dims=3"):
        kernel(torch.randn(5, 4)).to_dense()
    with pytest.raises(ValueError, match="x has 2 input dimensions"):
        kernel.features(torch.randn(4, 2))
    with pytest.raises(ValueError, match="dim=4"):
        CoupledRFFKernel(num_features=3, num_dims=3, coupling=GaussianCopulaCoupling(4))


def test_rejects_nan_inputs() -> None:
    kernel = CoupledRLFKernel(num_features=3, num_dims=2)
    x = torch.randn(5, 2)
    x[3, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        kernel(x).to_dense()
    with pytest.raises(ValueError, match="NaN"):
        kernel.features(x)


def test_base_class_needs_a_feature_map() -> None:
    with pytest.raises(TypeError, match="feature_map_name"):
        CoupledRandomFeatureKernel(num_features=3, num_dims=2)


def test_rejects_unknown_coupling_and_last_dim_is_batch() -> None:
    with pytest.raises(ValueError, match="unknown frequency coupling"):
        CoupledRFFKernel(num_features=3, num_dims=2, coupling="sobolev")
    kernel = CoupledRFFKernel(num_features=3, num_dims=2, coupling=IIDFrequencyCoupling())
    with pytest.raises(ValueError, match="last_dim_is_batch"):
        kernel.forward(torch.randn(4, 2), torch.randn(4, 2), last_dim_is_batch=True)


# --------------------------------------------------------------------------- the public edge


def test_rlf_underflow_far_from_the_origin_raises() -> None:
    kernel = CoupledRLFKernel(num_features=16, num_dims=3, seed=0).double()
    far = 100 * torch.ones(2, 3, dtype=torch.float64)
    for call in (lambda: kernel(far).to_dense(), lambda: kernel.features(far),
                 lambda: kernel(torch.zeros(4, 3, dtype=torch.float64), far).to_dense()):
        with pytest.raises(ValueError, match=r"row 0: the random Laplace features underflow to 0 at "
                                             r"\|x / lengthscale\| = 250"):
            call()
    near = 0.2 * torch.ones(2, 3, dtype=torch.float64)
    assert torch.all(torch.isfinite(kernel(near).to_dense())) and torch.all(kernel(near).to_dense() > 0)


@pytest.mark.parametrize("kernel_class", [CoupledRFFKernel, CoupledRLFKernel])
def test_active_dims_out_of_range_or_invalid(kernel_class) -> None:  # type: ignore[no-untyped-def]
    kernel = kernel_class(num_features=4, active_dims=[0, 5], seed=0)
    message = r"has 4 input dimensions but active_dims=\[0, 5\] selects dimension 5"
    with pytest.raises(ValueError, match=f"x1 {message}"):
        kernel(torch.rand(3, 4)).to_dense()
    with pytest.raises(ValueError, match=f"x2 {message}"):
        kernel(torch.rand(3, 6), torch.rand(2, 4)).to_dense()
    with pytest.raises(ValueError, match=f"x {message}"):
        kernel.features(torch.rand(3, 4))
    assert kernel(torch.rand(3, 6)).to_dense().shape == (3, 3)
    for bad, error in (([-1], ValueError), ([1, 1], ValueError), ([0.5], TypeError)):
        with pytest.raises(error, match="active_dims"):
            kernel_class(num_features=4, active_dims=bad)


def test_batch_shapes_that_do_not_match_the_kernel() -> None:
    kernel = CoupledRFFKernel(num_features=4, num_dims=2, batch_shape=torch.Size([2]), seed=0)
    with pytest.raises(ValueError, match=r"input batch shapes \(x1 \(3,\), x2 \(3,\)\) do not broadcast with the "
                                         r"kernel's batch_shape \(2,\)"):
        kernel(torch.rand(3, 5, 2)).to_dense()
    with pytest.raises(ValueError, match=r"x1 \(2,\), x2 \(3,\)"):
        kernel(torch.rand(2, 5, 2), torch.rand(3, 4, 2)).to_dense()
    with pytest.raises(ValueError, match=r"input batch shapes \(x \(3,\)\)"):
        kernel.features(torch.rand(3, 5, 2))
    assert kernel(torch.rand(5, 2)).to_dense().shape == (2, 5, 5)
    assert kernel(torch.rand(2, 5, 2)).to_dense().shape == (2, 5, 5)
