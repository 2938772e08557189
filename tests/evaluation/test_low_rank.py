"""Low-rank (Woodbury) GP posteriors of random-feature kernels against the dense formulas."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gp_couple.evaluation.low_rank import low_rank_posterior
from gp_couple.evaluation.posterior import GaussianPosterior, gp_posterior_from_blocks, posterior_kl

N_TRAIN, N_TEST, WIDTH, DRAWS, NOISE = 25, 18, 5, 3, 0.2


@pytest.fixture(scope="module")
def problem() -> dict:
    rng = np.random.default_rng(0)
    points = rng.standard_normal((N_TRAIN + N_TEST, 2))
    gram = np.exp(-0.5 * ((points[:, None] - points[None]) ** 2).sum(-1))
    return {"gram": gram, "targets": rng.standard_normal(N_TRAIN),
            "train": torch.as_tensor(rng.standard_normal((DRAWS, N_TRAIN, WIDTH))),
            "test": torch.as_tensor(rng.standard_normal((DRAWS, N_TEST, WIDTH)))}


def _exact(problem: dict, include_noise: bool) -> GaussianPosterior:
    k = problem["gram"]
    return gp_posterior_from_blocks(k[:N_TRAIN, :N_TRAIN], k[N_TRAIN:, :N_TRAIN], k[N_TRAIN:, N_TRAIN:],
                                    problem["targets"], NOISE, include_noise=include_noise)


def _dense(problem: dict, draw: int, include_noise: bool) -> GaussianPosterior:
    train, test = problem["train"][draw].numpy(), problem["test"][draw].numpy()
    return gp_posterior_from_blocks(train @ train.T, test @ train.T, test @ test.T, problem["targets"], NOISE,
                                    include_noise=include_noise)


@pytest.mark.parametrize("include_noise", [True, False])
def test_mean_and_covariance_match_the_dense_posterior(problem: dict, include_noise: bool) -> None:
    posterior = low_rank_posterior(problem["train"], problem["test"], problem["targets"], NOISE,
                                   include_noise=include_noise)
    for draw in range(DRAWS):
        dense = _dense(problem, draw, include_noise)
        np.testing.assert_allclose(posterior.mean[draw].numpy(), dense.mean, rtol=0, atol=1e-12)
        np.testing.assert_allclose(posterior.covariance[draw].numpy(), dense.covariance, rtol=0, atol=1e-12)


def test_kl_matches_the_dense_kl(problem: dict) -> None:
    exact = _exact(problem, include_noise=True)
    kl = low_rank_posterior(problem["train"], problem["test"], problem["targets"], NOISE).kl_from(exact)
    assert kl.shape == (DRAWS,)
    for draw in range(DRAWS):
        assert float(kl[draw]) == pytest.approx(posterior_kl(exact, _dense(problem, draw, True)), rel=1e-10)


def test_latent_kl_needs_a_jitter_and_then_matches_the_dense_kl(problem: dict) -> None:
    exact = _exact(problem, include_noise=False)
    latent = low_rank_posterior(problem["train"], problem["test"], problem["targets"], NOISE,
                                include_noise=False)
    with pytest.raises(ValueError, match=r"rank <= 5 < 18 test points.*infinite"):
        latent.kl_from(exact)
    jitter = 1e-3
    jittered_exact = GaussianPosterior(exact.mean, exact.covariance + jitter * np.eye(N_TEST))
    kl = low_rank_posterior(problem["train"], problem["test"], problem["targets"], NOISE,
                            include_noise=False, jitter=jitter).kl_from(jittered_exact)
    dense = _dense(problem, 1, False)
    reference = posterior_kl(jittered_exact, GaussianPosterior(dense.mean, dense.covariance + jitter * np.eye(N_TEST)))
    assert float(kl[1]) == pytest.approx(reference, rel=1e-8)


def test_the_kl_of_the_exact_kernel_is_zero_in_feature_space() -> None:
    # With as many features as points (K = Psi Psi^T exactly), the approximate posterior is exact.
    rng = np.random.default_rng(1)
    features = rng.standard_normal((12, 12))
    gram = features @ features.T
    targets = rng.standard_normal(8)
    exact = gp_posterior_from_blocks(gram[:8, :8], gram[8:, :8], gram[8:, 8:], targets, NOISE)
    posterior = low_rank_posterior(torch.as_tensor(features[:8]), torch.as_tensor(features[8:]), targets, NOISE)
    assert float(posterior.kl_from(exact)) == pytest.approx(0.0, abs=1e-9)


def test_bad_inputs(problem: dict) -> None:
    with pytest.raises(TypeError, match="train_features"):
        low_rank_posterior(problem["train"].numpy(), problem["test"], problem["targets"], NOISE)
    with pytest.raises(ValueError, match="inconsistent shapes"):
        low_rank_posterior(problem["train"], problem["test"][..., :2], problem["targets"], NOISE)
    with pytest.raises(ValueError, match="noise_variance"):
        low_rank_posterior(problem["train"], problem["test"], problem["targets"], 0.0)
    with pytest.raises(ValueError, match="jitter"):
        low_rank_posterior(problem["train"], problem["test"], problem["targets"], NOISE, jitter=-1.0)
    with pytest.raises(ValueError, match="test points"):
        low_rank_posterior(problem["train"], problem["test"][:, :3], problem["targets"], NOISE).kl_from(
            _exact(problem, True))
