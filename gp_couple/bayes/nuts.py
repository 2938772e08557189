r"""Fully Bayesian GP hyperparameters: NUTS over the priors of a gpytorch model, then a posterior batch.

The workflow for any :class:`gpytorch.models.ExactGP` built with gp_couple kernels
(:class:`~gp_couple.kernels.GRFKernel`, :class:`~gp_couple.kernels.ExactGraphKernel`,
:class:`~gp_couple.kernels.CoupledRFFKernel`, :class:`~gp_couple.kernels.CoupledRLFKernel`,
and sums/products of them with gpytorch kernels)::

    likelihood = GaussianLikelihood(noise_prior=GammaPrior(1.1, 20.0), noise_constraint=Positive())
    kernel = ScaleKernel(GRFKernel(graph, kernel_family=Diffusion(gamma_prior=GammaPrior(3.0, 2.0))),
                         outputscale_prior=GammaPrior(2.0, 2.0))
    model = GraphGP(train_nodes, y, likelihood, kernel)
    result = run_nuts(model, num_samples=200, warmup_steps=200, seed=0)
    print(result.diagnostics.max_r_hat, result.diagnostics.min_ess)
    load_samples(model, result)                       # the model becomes a posterior batch
    predictive = posterior_predictive(model, test_nodes)   # mixture over the samples

1. Every hyperparameter with a gpytorch prior is a NUTS site; the others stay fixed at
   their current values. Each prior's support must lie inside its parameter's
   constraint (:mod:`gp_couple.bayes.priors`; e.g. a ``Positive()`` noise constraint for
   a Gamma or LogNormal noise prior), else :class:`ValueError`.
2. The potential :math:`-\log p(\mathbf y \mid \theta) - \log p(\theta)` is evaluated
   with exact Cholesky algebra at every size (:mod:`gp_couple.bayes.potential`), so it
   is deterministic; training sets above ``max_train_size`` are refused.
3. Chains run one after another (deterministic, single process), each with its own
   seed; torch's global generator is forked, seeded and restored around each, so the
   same ``seed`` gives the same draws and the caller's random state is untouched.
4. :func:`load_samples` turns the model into a batch of ``num_chains * num_samples``
   models that share the random walks or frequencies of the original kernel (only the
   hyperparameters are batched), and
   :func:`~gp_couple.bayes.predictive.posterior_predictive` averages over them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from gpytorch.models import ExactGP
from pyro.infer.autoguide.initialization import init_to_median, init_to_sample, init_to_value
from pyro.infer.mcmc import MCMC, NUTS
from torch import Tensor

from .._checks import check_int
from .._random import SeedLike, as_numpy_generator, draw_seed, seeded_torch_rng
from .diagnostics import MCMCDiagnostics, summarize_site
from .potential import MAX_NUTS_TRAIN_SIZE, HyperparameterModel, exact_potential_settings
from .priors import prior_sites, support_bounds

__all__ = ["NUTSResult", "run_nuts", "load_samples", "INIT_STRATEGIES"]

#: How chains start: the model's current values, a prior draw, or the prior median.
INIT_STRATEGIES = ("current", "prior", "median")


@dataclass(frozen=True)
class NUTSResult:
    """Posterior draws of the hyperparameters with their diagnostics.

    :ivar chains: Draws per site, ``(num_chains, num_samples, *site_shape)``, in the
        constrained space (the hyperparameters' own values), keyed by prior name.
    :ivar diagnostics: R-hat, ESS, divergences, acceptance, step sizes, wall time.
    """

    chains: dict[str, Tensor]
    diagnostics: MCMCDiagnostics

    @property
    def samples(self) -> dict[str, Tensor]:
        """Draws with the chains concatenated, ``(num_chains * num_samples, *site_shape)``."""
        return {name: draws.reshape(-1, *draws.shape[2:]) for name, draws in self.chains.items()}

    @property
    def num_draws(self) -> int:
        """Total number of kept draws (the batch size after :func:`load_samples`)."""
        return self.diagnostics.num_chains * self.diagnostics.num_samples


def _init_strategy(init: str, pyro_model: HyperparameterModel) -> Any:
    if init == "current":
        return init_to_value(values=pyro_model.initial_values())
    if init == "prior":
        return init_to_sample
    return init_to_median


def run_nuts(model: ExactGP, *, num_samples: int, warmup_steps: int, num_chains: int = 1, seed: SeedLike = 0,
             init: str = "current", target_accept_prob: float = 0.8, max_tree_depth: int = 10,
             max_train_size: int = MAX_NUTS_TRAIN_SIZE) -> NUTSResult:
    r"""Sample the posterior of ``model``'s hyperparameters with NUTS (Hoffman & Gelman 2014).

    The model itself is not changed (NUTS runs on a copy); call :func:`load_samples`
    to load the draws. Step size and a diagonal mass matrix are adapted during the
    warm-up (Pyro's defaults: dual averaging, Stan's windowed adaptation).

    :param model: An ExactGP whose hyperparameters to sample carry gpytorch priors
        (register them with ``*_prior=`` arguments or ``register_prior``).
    :param num_samples: Draws kept per chain.
    :param warmup_steps: Adaptation iterations per chain (discarded).
    :param num_chains: Chains, run one after another with seeds drawn from ``seed``.
        Split R-hat is meaningful from one chain on (module
        :mod:`gp_couple.bayes.diagnostics`); several chains also compare chains.
    :param seed: Seed of the chains (int, generator; ``None`` uses torch's global
        generator as it is).
    :param init: ``"current"`` (start at the model's current hyperparameters, e.g. a
        marginal-likelihood fit), ``"prior"`` (a prior draw per chain, over-dispersed)
        or ``"median"`` (the prior medians).
    :param target_accept_prob: Target acceptance probability of the step-size adaptation.
    :param max_tree_depth: Largest NUTS tree depth (at most :math:`2^d` leapfrog steps).
    :param max_train_size: Largest training set accepted (dense Cholesky per step).
    :return: The draws and diagnostics.
    :raises TypeError: If ``model`` is not an ExactGP or a count is not an int.
    :raises ValueError: If a count or ``init`` is invalid, no hyperparameter has a
        prior, a prior's support does not fit its constraint, or the training set is
        above ``max_train_size``.
    """
    num_samples = check_int("num_samples", num_samples, 1)
    warmup_steps = check_int("warmup_steps", warmup_steps, 0)
    num_chains = check_int("num_chains", num_chains, 1)
    max_tree_depth = check_int("max_tree_depth", max_tree_depth, 1)
    max_train_size = check_int("max_train_size", max_train_size, 1)
    if init not in INIT_STRATEGIES:
        raise ValueError(f"init must be one of {INIT_STRATEGIES}, got {init!r}")
    if isinstance(target_accept_prob, bool) or not isinstance(target_accept_prob, (int, float)) \
            or not 0.0 < target_accept_prob < 1.0:
        raise ValueError(f"target_accept_prob must lie in (0, 1), got {target_accept_prob!r}")
    pyro_model = HyperparameterModel(model, max_train_size=max_train_size)
    rng = None if seed is None else as_numpy_generator(seed)
    draws: dict[str, list[Tensor]] = {site.name: [] for site in pyro_model.sites}
    divergences, acceptance, step_sizes, wall_times = [], [], [], []
    for _ in range(num_chains):
        kernel = NUTS(pyro_model, target_accept_prob=float(target_accept_prob), max_tree_depth=max_tree_depth,
                      init_strategy=_init_strategy(init, pyro_model))
        final_state: dict[str, Any] = {}

        def record(kernel: NUTS, params: Any, stage: str, iteration: int, state: dict = final_state) -> None:
            # The kernel resets its counters when the run ends: keep the last values.
            if stage.startswith("Sample"):
                diagnostics = kernel.diagnostics()
                state.update(divergences=len(diagnostics["divergences"]), step_size=float(kernel.step_size),
                             acceptance=float(diagnostics["acceptance rate"]))

        mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, num_chains=1,
                    disable_progbar=True, hook_fn=record)
        start = time.perf_counter()
        with seeded_torch_rng(None if rng is None else draw_seed(rng)), \
                exact_potential_settings(pyro_model.num_train):
            mcmc.run()
        wall_times.append(time.perf_counter() - start)
        for name, values in mcmc.get_samples().items():
            draws[name].append(values.detach())
        divergences.append(final_state["divergences"])
        acceptance.append(final_state["acceptance"])
        step_sizes.append(final_state["step_size"])
    chains = {name: torch.stack(values) for name, values in draws.items()}
    method = (f"split R-hat over {num_chains} chain(s), each cut in halves "
              f"({2 * num_chains} half-chains of {num_samples // 2} draws)")
    diagnostics = MCMCDiagnostics(
        sites=[summarize_site(name, values) for name, values in chains.items()], num_chains=num_chains,
        num_samples=num_samples, warmup_steps=warmup_steps, divergences=divergences, acceptance_rate=acceptance,
        step_size=step_sizes, wall_time=wall_times, r_hat_method=method)
    return NUTSResult(chains, diagnostics)


def _check_draws(site: Any, value: Tensor) -> None:
    """Refuse draws that the hyperparameter cannot hold: NaN, infinite, outside the prior's support or the
    constraint."""
    values = value.detach()
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"draws of {site.name} contain NaN or infinite values")
    low, high = support_bounds(site.prior.support)
    if not bool(torch.as_tensor(site.prior.support.check(values)).all()):
        raise ValueError(f"draws of {site.name} lie outside the support [{low:g}, {high:g}] of its prior "
                         f"{type(site.prior).__name__} (smallest {float(values.min()):g}, largest "
                         f"{float(values.max()):g}): they are not draws of this model")
    constraint = site.constraint
    if constraint is not None and not (constraint.check(values) and bool(
            torch.isfinite(constraint.inverse_transform(values)).all())):
        raise ValueError(f"draws of {site.name} lie outside its parameter's constraint {constraint} "
                         f"(smallest {float(values.min()):g}, largest {float(values.max()):g})")


def load_samples(model: ExactGP, samples: NUTSResult | Mapping[str, Tensor]) -> ExactGP:
    """Load posterior draws into ``model``: it becomes a batch of one model per draw.

    Uses :meth:`gpytorch.Module.pyro_load_from_samples`: every hyperparameter with a
    prior gets a leading batch dimension of size ``num_draws``; the kernels' random
    walks and frequencies are buffers without that dimension, so all draws share them.
    The change is in place (``copy.deepcopy`` the model first to keep the point
    estimate); prediction caches are cleared.

    :param model: The model NUTS ran on (same priors).
    :param samples: A :class:`NUTSResult` or a dict of draws ``(num_draws, *shape)``
        keyed by prior name.
    :return: ``model``.
    :raises TypeError: If a site's draws are not a real tensor.
    :raises ValueError: If the draws do not match the model's prior sites, or a draw is
        NaN, infinite, outside its prior's support or outside its parameter's constraint
        (the message names the site); nothing is loaded then.
    """
    draws = dict(samples.samples if isinstance(samples, NUTSResult) else samples)
    sites = prior_sites(model)
    expected = {site.name: site.shape for site in sites}
    if set(draws) != set(expected):
        raise ValueError(f"samples have sites {sorted(draws)} but the model's priors are {sorted(expected)}")
    for name, value in draws.items():
        if not isinstance(value, Tensor) or value.dtype == torch.bool or value.dtype.is_complex or value.dim() == 0:
            raise TypeError(f"draws of {name} must be a real tensor (num_draws, *shape), got "
                            f"{value.dtype if isinstance(value, Tensor) else type(value).__name__}")
    sizes = {int(value.shape[0]) for value in draws.values()}
    if len(sizes) != 1:
        raise ValueError(f"every site must have the same number of draws, got {sorted(sizes)}")
    by_name = {site.name: site for site in sites}
    for name, value in draws.items():
        if tuple(value.shape[1:]) != tuple(expected[name]):
            raise ValueError(f"draws of {name} have shape {tuple(value.shape)}; expected "
                             f"(num_draws, {', '.join(map(str, expected[name]))})")
        _check_draws(by_name[name], value)
    was_training = model.training
    model.pyro_load_from_samples(draws)
    model.train()  # drops prediction caches computed with the old hyperparameters
    model.train(was_training)
    return model
