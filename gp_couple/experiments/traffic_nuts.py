r"""``gp-couple traffic-nuts``: the posterior over the traffic GRF-GP's hyperparameters with NUTS.

An extension of the paper's probabilistic traffic-interpolation experiment (section on
San Jose traffic speeds, Appendix F.3 "Probabilistic traffic interpolation" [sec:traffic_expt]),
which trains the hyperparameters by marginal likelihood only. The traffic protocol
(:mod:`gp_couple.experiments.traffic`: 250 random training sensors,
75 test sensors, targets standardised with the training mean and standard deviation)
with the diffusion GRF-GP :math:`\kappa\exp(-\gamma^2\widetilde{\mathbf L})` and Gaussian
noise :math:`\sigma_n^2`, compared four ways on the test sensors:

1. ``grf_point``: the GRF-GP at its marginal-likelihood estimate (Adam, as in the
   appendix on GRF-GP experimental details, Appendix F.2 "Scalable GPs on graphs", paragraph
   "Training GRF-GPs: technical details" [app:grf_gp_details]) of :math:`(\kappa, \gamma,
   \sigma_n^2)`;
2. ``grf_nuts``: the GRF-GP averaged over the NUTS posterior of :math:`(\kappa, \gamma,
   \sigma_n^2)` (one set of walks shared by every draw), started at the estimate of 1;
3. ``exact_point`` and 4. ``exact_nuts``: the same for the exact diffusion kernel
   (:class:`~gp_couple.kernels.ExactGraphKernel`), the reference posterior.

The GRF walks halt with ``--p-halt``, by default (``auto``) the traffic protocol's rule
(:func:`gp_couple.halting.suggest_p_halt` at the exact GP's estimate of 3): the
largest :math:`p_\mathrm{halt}` whose walks still represent that kernel's range.

Priors (on the standardised scale): :math:`\kappa \sim \Gamma(2, 1.5)`,
:math:`\gamma \sim \Gamma(2, 2)`, :math:`\sigma_n^2 \sim \Gamma(2, 4)`. RMSE and NLPD are in
mph; NUTS predictions are the mixture over the draws
(:mod:`gp_couple.bayes.predictive`). R-hat is split R-hat (one chain cut in halves
unless ``--chains`` is larger).
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import gpytorch
import numpy as np
import torch
from gpytorch.constraints import Positive
from gpytorch.priors import GammaPrior

from .._random import seeded_torch_rng
from ..bayes import exact_potential_settings, load_samples, posterior_predictive, run_nuts
from ..datasets import load_traffic, traffic_split
from ..evaluation import rmse
from ..halting import suggest_p_halt
from ..kernel_families import Diffusion
from ..kernels.exact_graph import ExactGraphKernel
from ..kernels.grf_kernel import GRFKernel
from ..models import GraphGP, fit_gp
from ._report import figure_folder, log_figures

#: Gamma priors (concentration, rate) on the standardised scale.
PRIORS = {"outputscale": (2.0, 1.5), "gamma": (2.0, 2.0), "noise": (2.0, 4.0)}


def _model(kind: str, graph: Any, train: np.ndarray, nodes: np.ndarray, targets: np.ndarray,
           p_halt: float | None, args: argparse.Namespace) -> GraphGP:
    """A float64 GP with the priors on κ, γ and σ_n² (noise constraint Positive() to fit its prior)."""
    family = Diffusion(1.0, gamma_prior=GammaPrior(*PRIORS["gamma"]))
    base = (GRFKernel(graph, num_walkers=args.walkers, p_halt=p_halt, kernel_family=family, seed=args.seed,
                      nodes=nodes, schedule=None) if kind == "grf" else ExactGraphKernel(graph, kernel_family=family))
    kernel = gpytorch.kernels.ScaleKernel(base, outputscale_prior=GammaPrior(*PRIORS["outputscale"]))
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_prior=GammaPrior(*PRIORS["noise"]),
                                                         noise_constraint=Positive())
    return GraphGP(train, targets, likelihood, kernel).double()


def _finite(value: float) -> float | None:
    # NaN (e.g. R-hat of a chain too short to split) is not valid JSON.
    return value if np.isfinite(value) else None


def _hyperparameters(model: GraphGP) -> dict[str, float]:
    return {"outputscale": float(model.covar_module.outputscale.detach()),
            "gamma": float(model.covar_module.base_kernel.kernel_family.gamma.detach()),
            "noise": float(model.likelihood.noise.detach())}


def _scores(model: GraphGP, test: np.ndarray, speeds: np.ndarray, shift: float, scale: float) -> dict[str, float]:
    predictive = posterior_predictive(model, test).rescaled(shift, scale)
    return {"test_rmse": rmse(predictive.mean.cpu().numpy(), speeds), "test_nlpd": predictive.nlpd(speeds)}


def fit_point(kind: str, graph: Any, train: np.ndarray, test: np.ndarray, standardised: np.ndarray,
              speeds: np.ndarray, shift: float, scale: float, p_halt: float | None,
              args: argparse.Namespace) -> tuple[GraphGP, dict[str, Any]]:
    """The marginal-likelihood point estimate of one kernel (``"grf"`` or ``"exact"``) and its report row."""
    model = _model(kind, graph, train, np.concatenate([train, test]), standardised, p_halt, args)
    start = time.perf_counter()
    with exact_potential_settings(train.size):
        losses = fit_gp(model, model.likelihood, iterations=args.train_iterations, lr=args.lr, seed=args.seed)
    point = {"model": f"{kind}_point", "seconds": time.perf_counter() - start, "final_loss": losses[-1],
             "losses": losses,
             "hyperparameters": _hyperparameters(model), **_scores(model, test, speeds, shift, scale)}
    return model, point


def sample_posterior(kind: str, model: GraphGP, test: np.ndarray, speeds: np.ndarray, shift: float, scale: float,
                     args: argparse.Namespace) -> dict[str, Any]:
    """NUTS from the point estimate, and the report row of the posterior mixture."""
    result = run_nuts(model, num_samples=args.num_samples, warmup_steps=args.warmup, num_chains=args.chains,
                      seed=args.seed, max_tree_depth=args.max_tree_depth)
    posterior_model = load_samples(copy.deepcopy(model), result)
    diagnostics = result.diagnostics
    names = {"covar_module.outputscale_prior": "outputscale", "likelihood.noise_covar.noise_prior": "noise",
             "covar_module.base_kernel.kernel_family.gamma_prior": "gamma"}
    sites = {names[site.name]: {"mean": site.mean[0], "std": site.std[0], "r_hat": _finite(site.r_hat[0]),
                                "ess": _finite(site.ess[0])} for site in diagnostics.sites}
    return {"model": f"{kind}_nuts", "seconds": diagnostics.total_wall_time,
            "max_r_hat": _finite(diagnostics.max_r_hat), "min_ess": _finite(diagnostics.min_ess),
            "divergences": int(sum(diagnostics.divergences)),
            "step_size": diagnostics.step_size, "acceptance_rate": diagnostics.acceptance_rate,
            "posterior": sites, **_scores(posterior_model, test, speeds, shift, scale)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Fit, sample and score the GRF-GP and the exact GP on one traffic split."""
    if args.p_halt == "auto" and args.no_exact:
        raise ValueError("--p-halt auto is chosen at the exact GP's estimate: drop --no-exact or give a number")
    folder = figure_folder(args)
    data = load_traffic(args.data_dir)
    train_positions, test_positions = traffic_split(data.observed_nodes.size, args.train, args.test, seed=args.seed)
    train, test = data.observed_nodes[train_positions], data.observed_nodes[test_positions]
    speeds_train, speeds_test = data.speeds[train_positions], data.speeds[test_positions]
    shift, scale = float(speeds_train.mean()), float(speeds_train.std())
    standardised = (speeds_train - shift) / scale
    common = (data.graph, train, test, standardised, speeds_test, shift, scale)
    points: dict[str, tuple[GraphGP, dict[str, Any]]] = {}
    with seeded_torch_rng(args.seed):
        if not args.no_exact:
            points["exact"] = fit_point("exact", *common, None, args)
        # The traffic protocol's rule: walks long enough for the exact estimate's range.
        p_halt = (suggest_p_halt(points["exact"][0].covar_module.base_kernel.kernel_family)
                  if args.p_halt == "auto" else args.p_halt)
        points = {"grf": fit_point("grf", *common, p_halt, args), **points}
        rows: list[dict[str, Any]] = []
        for kind, (model, point) in points.items():
            rows += [point, sample_posterior(kind, model, test, speeds_test, shift, scale, args)]
    if folder is not None:
        from .plotting import plot_metric_bars, plot_training_curves

        log_figures([
            plot_metric_bars(rows, folder / "traffic_nuts_scores.png", category="model",
                             metrics=("test_rmse", "test_nlpd"), title="Traffic: point estimates and NUTS"),
            plot_training_curves({row["model"]: row["losses"] for row in rows if "losses" in row},
                                 folder / "traffic_nuts_point_fit.png",
                                 ylabel="negative log marginal likelihood per point")])
    return {
        "experiment": "traffic-nuts", "dataset": data.name, "nodes": data.graph.num_nodes,
        "train": int(train.size), "test": int(test.size),
        "settings": {"walkers": args.walkers, "p_halt": p_halt, "p_halt_choice": "auto" if args.p_halt == "auto"
                     else "given", "num_samples": args.num_samples,
                     "warmup": args.warmup, "chains": args.chains, "max_tree_depth": args.max_tree_depth,
                     "train_iterations": args.train_iterations, "lr": args.lr, "seed": args.seed,
                     "priors_gamma_concentration_rate": PRIORS, "torch_threads": torch.get_num_threads()},
        "notes": ["test_rmse in mph; test_nlpd per test sensor, in log mph (mixture density for *_nuts)",
                  f"max_r_hat: split R-hat over {args.chains} chain(s), each cut in halves",
                  "grf_* use one set of walks (seed) for the fit and every posterior draw, drawn with "
                  "GRFKernel's default neighbour proposal and i.i.d. walk lengths",
                  "seconds: Adam fit (point) or all NUTS chains (nuts), wall clock"],
        "results": rows,
    }
