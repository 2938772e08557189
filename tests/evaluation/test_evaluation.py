"""Tests for the evaluators: Gram error, RMSE, NLPD, GP posteriors and Gaussian KL."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy import stats

from gp_couple.evaluation import (
    gaussian_kl,
    gp_posterior,
    nlpd,
    posterior_kl,
    relative_frobenius_error,
    rmse,
)
from gp_couple.evaluation.posterior import gp_posterior_from_blocks, stable_cholesky


def random_spd(n: int, seed: int) -> np.ndarray:
    a = np.random.default_rng(seed).normal(size=(n, n))
    return a @ a.T + n * np.eye(n)


def test_point_metrics() -> None:
    k = np.eye(3)
    assert relative_frobenius_error(k, 2 * k) == pytest.approx(1.0)
    assert relative_frobenius_error(torch.eye(3), sp.eye(3)) == 0.0
    assert rmse([1.0, 2.0], [1.0, 4.0]) == pytest.approx(np.sqrt(2.0))
    mean, var, y = np.array([0.0, 1.0]), np.array([1.0, 4.0]), np.array([0.5, -1.0])
    assert nlpd(mean, var, y) == pytest.approx(-stats.norm.logpdf(y, mean, np.sqrt(var)).mean())


def test_gp_posterior_matches_textbook_formulas() -> None:
    gram = random_spd(6, 0)
    train, test = np.array([0, 2, 3, 5]), np.array([1, 4])
    y = np.array([0.3, -1.0, 0.5, 2.0])
    noise = 0.1
    post = gp_posterior(gram, train, test, y, noise)
    inverse = np.linalg.inv(gram[np.ix_(train, train)] + noise * np.eye(4))
    np.testing.assert_allclose(post.mean, gram[np.ix_(test, train)] @ inverse @ y)
    covariance = (gram[np.ix_(test, test)] - gram[np.ix_(test, train)] @ inverse @ gram[np.ix_(train, test)])
    np.testing.assert_allclose(post.covariance, covariance + noise * np.eye(2))
    latent = gp_posterior(gram, train, test, y, noise, include_noise=False)
    np.testing.assert_allclose(latent.covariance, covariance)
    np.testing.assert_allclose(post.variance, np.diag(post.covariance))


def test_gaussian_kl() -> None:
    assert gaussian_kl([0.0], [[1.0]], [1.0], [[4.0]]) == pytest.approx(
        np.log(2.0) + (1.0 + 1.0) / 8.0 - 0.5)
    cov = random_spd(5, 1)
    mean = np.arange(5.0)
    assert gaussian_kl(mean, cov, mean, cov) == pytest.approx(0.0, abs=1e-10)
    other = random_spd(5, 2)
    assert gaussian_kl(mean, cov, mean + 0.1, other) > 0
    # Monte Carlo check of the direction: KL(p || q) = E_p[log p - log q].
    samples = stats.multivariate_normal(mean, cov).rvs(200_000, random_state=0)
    log_ratio = (stats.multivariate_normal(mean, cov).logpdf(samples)
                 - stats.multivariate_normal(mean + 0.1, other).logpdf(samples))
    assert gaussian_kl(mean, cov, mean + 0.1, other) == pytest.approx(
        log_ratio.mean(), abs=5 * log_ratio.std() / np.sqrt(len(log_ratio)))


def test_posterior_kl_direction() -> None:
    gram = random_spd(5, 3)
    exact = gp_posterior(gram, np.arange(3), np.array([3, 4]), [1.0, 0.0, -1.0], 0.2)
    approx = gp_posterior(gram * 1.5, np.arange(3), np.array([3, 4]), [1.0, 0.0, -1.0], 0.2)
    assert posterior_kl(exact, approx) == pytest.approx(
        gaussian_kl(exact.mean, exact.covariance, approx.mean, approx.covariance))
    assert posterior_kl(exact, exact) == pytest.approx(0.0, abs=1e-12)


def test_jitter_for_semidefinite_covariances() -> None:
    singular = np.ones((3, 3))
    with pytest.warns(RuntimeWarning, match="jitter"):
        factor, jitter = stable_cholesky(singular)
    assert jitter > 0 and np.all(np.isfinite(factor))
    with pytest.raises(ValueError, match="not positive definite"):
        stable_cholesky(-np.eye(3))


@pytest.mark.parametrize("call, error, message", [
    (lambda: relative_frobenius_error(np.eye(2), np.eye(3)), ValueError, "shapes"),
    (lambda: relative_frobenius_error(np.zeros((2, 2)), np.eye(2)), ValueError, "zero"),
    (lambda: rmse([], []), ValueError, "zero points"),
    (lambda: rmse(["a"], ["b"]), TypeError, "numeric"),
    (lambda: nlpd([0.0], [0.0], [0.0]), ValueError, "positive"),
    (lambda: nlpd([0.0], [1.0, 2.0], [0.0]), ValueError, "shapes"),
    (lambda: gp_posterior(np.eye(3), [0], [1], [np.nan], 0.1), ValueError, "NaN"),
    (lambda: gp_posterior(np.eye(3), [0], [5], [1.0], 0.1), ValueError, "test_nodes"),
    (lambda: gp_posterior(np.eye(3), [0.5], [1], [1.0], 0.1), TypeError, "train_nodes"),
    (lambda: gp_posterior(np.eye(3), [0], [1], [1.0], 0.0), ValueError, "noise_variance"),
    (lambda: gp_posterior_from_blocks(np.eye(2), np.eye(2), np.eye(2), [1.0], 0.1), ValueError, "shapes"),
    (lambda: gaussian_kl([0.0], [[1.0]], [0.0, 1.0], np.eye(2)), ValueError, "shapes"),
])
def test_errors(call, error, message) -> None:
    with pytest.raises(error, match=message):
        call()


def test_sparse_estimates_are_not_densified_and_agree() -> None:
    exact = random_spd(30, 5)
    estimate = sp.random(30, 30, density=0.1, random_state=1, format="csr")
    estimate = estimate + estimate.T
    assert relative_frobenius_error(exact, estimate) == pytest.approx(
        relative_frobenius_error(exact, estimate.toarray()), rel=1e-12)
    with pytest.raises(ValueError, match="shapes"):
        relative_frobenius_error(exact, sp.eye(3))


NAN = float("nan")


@pytest.mark.parametrize("call, name", [
    (lambda: rmse([1.0, NAN], [1.0, 2.0]), "prediction"),
    (lambda: rmse(torch.tensor([1.0, 2.0]), [1.0, float("inf")]), "target"),
    (lambda: nlpd([NAN], [1.0], [0.0]), "mean"),
    (lambda: nlpd([0.0], [NAN], [0.0]), "variance"),
    (lambda: nlpd([0.0], [1.0], [NAN]), "target"),
    (lambda: relative_frobenius_error(np.eye(2), np.array([[1.0, NAN], [0.0, 1.0]])), "estimate"),
    (lambda: relative_frobenius_error(np.array([[NAN, 0.0], [0.0, 1.0]]), np.eye(2)), "exact"),
    (lambda: relative_frobenius_error(np.eye(2), sp.csr_matrix(np.array([[1.0, NAN], [0.0, 1.0]]))), "estimate"),
    (lambda: relative_frobenius_error(np.eye(2), np.eye(2) * NAN, nodes=[0, 1]), "estimate"),
    (lambda: gaussian_kl([NAN], [[1.0]], [0.0], [[1.0]]), "mean_p"),
    (lambda: gaussian_kl([0.0], [[1.0]], [0.0], [[NAN]]), "cov_q"),
    (lambda: gp_posterior(np.eye(3) * NAN, [0], [1], [1.0], 0.1), "gram"),
    (lambda: gp_posterior_from_blocks(np.eye(1), [[NAN]], np.eye(1), [1.0], 0.1), "test_train"),
])
def test_nan_inputs_raise_naming_the_argument(call, name: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=f"{name} contains .*NaN or infinite"):
        call()


@pytest.mark.parametrize("variance", [[1.0, 0.0], [1.0, -0.5]])
def test_nlpd_refuses_non_positive_variances(variance: list[float]) -> None:
    with pytest.raises(ValueError, match=f"variance must be positive .* got {variance[1]:g} at index 1"):
        nlpd([0.0, 0.0], variance, [0.0, 0.0])


def test_low_rank_posterior_refuses_nan_features() -> None:
    from gp_couple.evaluation import low_rank_posterior

    train, test = torch.ones(3, 2), torch.ones(2, 2)
    train[1, 0] = NAN
    with pytest.raises(ValueError, match="train_features contains NaN"):
        low_rank_posterior(train, test, [1.0, 2.0, 3.0], 0.1)
    with pytest.raises(ValueError, match="train_targets contains"):
        low_rank_posterior(torch.ones(3, 2), test, [1.0, NAN, 3.0], 0.1)
