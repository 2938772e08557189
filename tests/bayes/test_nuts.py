"""NUTS over gp_couple models: draws, diagnostics, posterior batches and a deterministic potential."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import gpytorch
import linear_operator
import pytest
import torch

from gp_couple import predict
from gp_couple.bayes import HyperparameterModel, load_samples, posterior_predictive, run_nuts
from gp_couple.bayes.potential import exact_potential_settings
from gp_couple.bayes.priors import prior_sites

# A short chain: depth-3 trees (at most 7 leapfrog steps per draw) keep the run to seconds;
# six warm-up steps let the step size settle enough for every chain here to move.
SHORT = dict(num_samples=4, warmup_steps=6, max_tree_depth=3, seed=0)


def _check_result(result, model, num_chains: int = 1) -> None:
    sites = {site.name: site.shape for site in HyperparameterModel(model).sites}
    assert set(result.chains) == set(sites)
    for name, draws in result.chains.items():
        assert draws.shape == (num_chains, SHORT["num_samples"], *sites[name])
        assert torch.isfinite(draws).all() and (draws > 0).all()  # every site here is positive
        assert result.samples[name].shape == (num_chains * SHORT["num_samples"], *sites[name])
    diagnostics = result.diagnostics
    assert [summary.name for summary in diagnostics.sites] == list(result.chains)
    for summary in diagnostics.sites:
        # Four draws: the values are computed, not yet meaningful (pyro's ESS can even be < 0).
        assert len(summary.r_hat) == len(summary.ess) == max(1, math.prod(summary.shape))
        assert all(math.isfinite(value) for value in summary.r_hat + summary.ess)
    assert len(diagnostics.divergences) == len(diagnostics.wall_time) == num_chains
    assert all(0 <= d <= SHORT["num_samples"] for d in diagnostics.divergences)
    assert all(t > 0 for t in diagnostics.wall_time)
    report = diagnostics.to_dict()
    assert report["max_r_hat"] == diagnostics.max_r_hat and report["min_ess"] == diagnostics.min_ess


def test_grf_posterior_batch_matches_a_loop_over_draws(graph_model) -> None:
    model = graph_model("grf")
    state = copy.deepcopy(model.state_dict())
    result = run_nuts(model, **SHORT)
    _check_result(result, model)
    # NUTS ran on a copy: the model is unchanged until the draws are loaded.
    assert all(torch.equal(value, state[key]) for key, value in model.state_dict().items()
               if isinstance(value, torch.Tensor))
    test_nodes = [n for n in range(16) if n not in model.train_inputs[0].reshape(-1).long().tolist()]
    point_model = copy.deepcopy(model)

    load_samples(model, result)
    grf = model.covar_module.base_kernel
    assert grf.batch_shape == torch.Size([result.num_draws])
    assert torch.equal(grf.features_columns, state["covar_module.base_kernel.features_columns"])  # shared walks
    predictive = posterior_predictive(model, test_nodes)
    assert predictive.means.shape == predictive.variances.shape == (result.num_draws, len(test_nodes))

    for index in range(result.num_draws):
        single = copy.deepcopy(point_model)
        single.initialize(**{
            "covar_module.outputscale": result.samples["covar_module.outputscale_prior"][index],
            "covar_module.base_kernel.kernel_family.gamma":
                result.samples["covar_module.base_kernel.kernel_family.gamma_prior"][index],
            "likelihood.noise": result.samples["likelihood.noise_covar.noise_prior"][index]})
        with exact_potential_settings(16):
            mean, variance = predict(single, single.likelihood, test_nodes)
        torch.testing.assert_close(predictive.means[index], mean, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(predictive.variances[index], variance, rtol=1e-8, atol=1e-10)
    mixture_variance = predictive.variances.mean(0) + predictive.means.var(0, unbiased=False)
    torch.testing.assert_close(predictive.variance, mixture_variance)


def test_coupled_rff_posterior_batch_matches_a_loop_over_draws(rff_model) -> None:
    point_model = copy.deepcopy(rff_model)
    result = run_nuts(rff_model, **SHORT)
    _check_result(result, rff_model)
    load_samples(rff_model, result)
    test_x = torch.linspace(0, 1, 5, dtype=torch.float64).unsqueeze(-1).repeat(1, 2)
    predictive = posterior_predictive(rff_model, test_x)
    assert predictive.means.shape == (result.num_draws, 5)
    for index in range(result.num_draws):
        single = copy.deepcopy(point_model)
        single.initialize(**{
            "covar_module.outputscale": result.samples["covar_module.outputscale_prior"][index],
            "covar_module.base_kernel.lengthscale": result.samples["covar_module.base_kernel.lengthscale_prior"][index],
            "likelihood.noise": result.samples["likelihood.noise_covar.noise_prior"][index]})
        single_predictive = posterior_predictive(single, test_x)
        torch.testing.assert_close(predictive.means[index], single_predictive.means[0], rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(predictive.variances[index], single_predictive.variances[0],
                                   rtol=1e-8, atol=1e-10)


def test_same_seed_same_draws_and_global_generator_untouched(graph_model) -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first = run_nuts(graph_model(), num_samples=3, warmup_steps=2, max_tree_depth=2, seed=7)
    torch.testing.assert_close(torch.rand(3), expected_next, rtol=0, atol=0)
    second = run_nuts(graph_model(), num_samples=3, warmup_steps=2, max_tree_depth=2, seed=7)
    for name in first.chains:
        assert torch.equal(first.chains[name], second.chains[name])


def test_two_chains(graph_model) -> None:
    model = graph_model("exact")
    result = run_nuts(model, **{**SHORT, "seed": 1}, num_chains=2)
    _check_result(result, model, num_chains=2)
    assert not torch.equal(result.chains["covar_module.outputscale_prior"][0],
                           result.chains["covar_module.outputscale_prior"][1])
    assert "2 chain(s)" in result.diagnostics.r_hat_method


def test_potential_is_deterministic_cholesky_at_any_size(graph_model, monkeypatch) -> None:
    """No CG/Lanczos (the random estimators) runs inside the potential, even above max_cholesky_size."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a stochastic CG/Lanczos routine ran inside the NUTS potential")

    # Every CG solve goes through linear_operator.utils.linear_cg, every stochastic
    # log-determinant through InvQuadLogdet (the Cholesky branch returns before it).
    monkeypatch.setattr(linear_operator.utils, "linear_cg", forbidden)
    monkeypatch.setattr("linear_operator.operators._linear_operator.InvQuadLogdet",
                        SimpleNamespace(apply=forbidden))
    pyro_model = HyperparameterModel(graph_model())
    values = {name: value * 1.3 for name, value in pyro_model.initial_values().items()}
    potentials = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        with gpytorch.settings.max_cholesky_size(0):  # the caller's setting cannot switch it back
            potentials.append(pyro_model.potential(values))
    assert torch.isfinite(potentials[0])
    assert torch.equal(potentials[0], potentials[1])
    with exact_potential_settings(5):
        assert gpytorch.settings.max_cholesky_size.value() == 5


def test_too_many_training_points_are_refused(graph_model) -> None:
    with pytest.raises(ValueError, match="10 training points, above max_train_size=8"):
        run_nuts(graph_model(), num_samples=4, warmup_steps=0, max_train_size=8)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_samples=0, warmup_steps=1), "num_samples must be >= 1"),
    (dict(num_samples=4, warmup_steps=1, init="random"), "init must be one of"),
    (dict(num_samples=4, warmup_steps=1, target_accept_prob=1.0), "target_accept_prob"),
])
def test_bad_arguments(graph_model, kwargs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run_nuts(graph_model(), **kwargs)


def test_load_samples_checks_the_sites(graph_model) -> None:
    with pytest.raises(ValueError, match="samples have sites"):
        load_samples(graph_model(), {"covar_module.outputscale_prior": torch.ones(3)})


class _GammaWithoutExpand(gpytorch.priors.GammaPrior):
    """A user's prior class that does not implement ``expand`` (torch's default raises NotImplementedError)."""

    def expand(self, batch_shape, _instance=None):  # type: ignore[no-untyped-def]
        raise NotImplementedError


def test_a_prior_without_expand_is_a_type_error_naming_it(graph_model) -> None:
    model = graph_model()
    family = model.covar_module.base_kernel.kernel_family
    family.register_prior("gamma_prior", _GammaWithoutExpand(3.0, 2.0), lambda module: module.gamma,
                          lambda module, value: module._set_hyper("gamma", value))
    with pytest.raises(TypeError, match=r"prior covar_module.base_kernel.kernel_family.gamma_prior "
                                        r"\(_GammaWithoutExpand\) does not implement expand\(\)"):
        run_nuts(model, **SHORT)


@pytest.mark.parametrize("value, message", [
    (float("nan"), "contain NaN or infinite values"),
    (float("inf"), "contain NaN or infinite values"),
    (-0.5, r"lie outside the support \[0, inf\] of its prior GammaPrior"),
    (0.0, "lie outside its parameter's constraint Positive"),  # torch's Gamma support holds 0
])
def test_load_samples_refuses_draws_the_model_cannot_hold(graph_model, value: float, message: str) -> None:
    model = graph_model()
    sites = {site.name: site.shape for site in prior_sites(model)}
    draws = {name: torch.full((3, *shape), 0.5, dtype=torch.float64) for name, shape in sites.items()}
    bad = "covar_module.base_kernel.kernel_family.gamma_prior"
    draws[bad][1] = value
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=f"draws of {bad} {message}"):
        load_samples(model, draws)
    after = model.state_dict()
    assert all(torch.equal(before[key], after[key]) for key in before if isinstance(before[key], torch.Tensor))


def test_load_samples_refuses_draws_outside_a_bounded_prior(graph_model) -> None:
    from gpytorch.constraints import Interval
    from gpytorch.priors import UniformPrior

    model = graph_model()
    likelihood = model.likelihood
    likelihood.noise_covar.register_constraint("raw_noise", Interval(0.01, 1.0))
    likelihood.noise_covar.register_prior("noise_prior", UniformPrior(0.01, 1.0), lambda m: m.noise,
                                          lambda m, v: m._set_noise(v))
    sites = {site.name: site.shape for site in prior_sites(model)}
    draws = {name: torch.full((2, *shape), 0.5, dtype=torch.float64) for name, shape in sites.items()}
    draws["likelihood.noise_covar.noise_prior"][0] = 1.5
    with pytest.raises(ValueError, match=r"draws of likelihood.noise_covar.noise_prior lie outside the support "
                                         r"\[0.01, 1\] of its prior UniformPrior \(smallest 0.5, largest 1.5\)"):
        load_samples(model, draws)
    with pytest.raises(TypeError, match=r"must be a real tensor \(num_draws, \*shape\), got list"):
        load_samples(model, {**draws, "likelihood.noise_covar.noise_prior": [[0.5], [0.5]]})
