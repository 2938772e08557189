r"""``gp-couple traffic``: probabilistic interpolation of San Jose traffic speeds (Appendix F.3
"Probabilistic traffic interpolation" [sec:traffic_expt]).

The 1016-node highway graph has speeds at 325 sensor nodes; 250 random sensors train
and 75 test. GRF-GP hyperparameters are trained with 8 i.i.d. walkers, then 4, 8 and 16
i.i.d., antithetic and :math:`\sigma`-coupled walkers, each with independent and with
repelling directions, are compared (protocol of :mod:`gp_couple.experiments.graph_gp`).
Walks choose the next node in proportion to edge weight (the weights span 0.17 to 290, and
the uniform proposal's importance weights make long walks' loads heavy-tailed).

Two exact references are reported separately:

* ``exact_ml``: the exact GP of the same kernel family fitted by its *own* maximum
  likelihood, with restarts (:mod:`gp_couple.experiments.exact_baseline`): how well an
  exact GP does on this task;
* ``exact_at_trained``: the exact kernel at the GRF-trained hyperparameters: the
  reference of the Gram error and KL columns.

The walks must be long enough for the kernel's range: the diffusion kernel the exact
likelihood picks here (:math:`\gamma \approx 8`) has its modulation's mass around
:math:`\gamma^2/2 = 32` steps. ``--p-halt auto`` (the default) takes the rule of
:func:`gp_couple.halting.suggest_p_halt` at the exact maximum-likelihood kernel (the
largest p_halt whose halting inflation stays within the budget, about 0.02 here); the
report records the rule's value for the GRF-trained kernel too.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..datasets import TrafficDataset, load_traffic, traffic_split
from ..halting import halting_inflation, suggest_p_halt
from ._report import figure_folder, log_figures
from .exact_baseline import exact_predictions, fit_exact_gp, kernel_family_at
from .graph_gp import protocol_figures, run_protocol
from .mesh import protocol_from_args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the protocol on the traffic graph."""
    folder = figure_folder(args)
    data = load_traffic(args.data_dir)
    split_seed = args.seed if args.split_seed is None else args.split_seed
    train, test = traffic_split(data.observed_nodes.size, args.train, args.test, seed=split_seed)
    train_nodes, test_nodes = data.observed_nodes[train], data.observed_nodes[test]
    targets = np.full(data.graph.num_nodes, np.nan)
    targets[data.observed_nodes] = data.speeds
    # The protocol's standardisation (training mean and standard deviation).
    shift, scale = float(data.speeds[train].mean()), float(data.speeds[train].std())
    standardised = (targets - shift) / scale

    exact_fit = fit_exact_gp(data.graph, args.kernel, train_nodes, standardised[train_nodes],
                             initial_values=args.exact_starts)
    exact_family = kernel_family_at(args.kernel, exact_fit.hyperparameters)
    exact_ml = {**exact_fit.to_dict(), **exact_predictions(
        data.graph, exact_family, exact_fit.outputscale, exact_fit.noise, train_nodes, test_nodes,
        standardised, shift, scale)}
    suggested = suggest_p_halt(exact_family, max_inflation=args.max_inflation)
    p_halt = suggested if args.p_halt == "auto" else args.p_halt

    report = run_protocol(data.graph, targets, train_nodes, test_nodes, protocol_from_args(args, p_halt=p_halt),
                          node_posterior=folder is not None)
    if folder is not None:
        log_figures(traffic_figures(data, test_nodes, report, folder))
    trained = report["trained"]
    trained_family = kernel_family_at(trained["family_name"], trained["hyperparameters"])
    report.update(experiment="traffic", dataset=data.name, exact_ml=exact_ml, target_scale=scale, p_halt={
        "used": p_halt, "choice": "auto" if args.p_halt == "auto" else "given",
        "max_inflation": args.max_inflation,
        "suggested_for_exact_ml": suggested,
        "suggested_for_trained": suggest_p_halt(trained_family, max_inflation=args.max_inflation),
        "halting_inflation_at_exact_ml": halting_inflation(exact_family, p_halt),
        "halting_inflation_at_trained": halting_inflation(trained_family, p_halt)})
    report["notes"] += [
        "speeds in mph; test_nlpd per test point in mph units (subtract log(target_scale) for "
        "standardised units)",
        f"exact GP by its own maximum likelihood ({len(exact_fit.restarts)} restarts): "
        f"{_hyper(exact_fit.hyperparameters)}, test RMSE {exact_ml['test_rmse']:.2f} mph, "
        f"NLPD {exact_ml['test_nlpd']:.3f}",
        f"exact kernel at the GRF-trained hyperparameters ({_hyper(trained['hyperparameters'])}): "
        f"test RMSE {report['exact_at_trained']['test_rmse']:.2f} mph, "
        f"NLPD {report['exact_at_trained']['test_nlpd']:.3f}",
        f"p_halt {p_halt:.4g} ({report['p_halt']['choice']}; rule at the exact-ML kernel {suggested:.4g}, "
        f"at the GRF-trained kernel {report['p_halt']['suggested_for_trained']:.4g})"]
    return report


def _hyper(values: dict[str, Any]) -> str:
    return ", ".join(f"{name} {value:.3g}" if isinstance(value, float) else f"{name} {value}"
                     for name, value in values.items())


def traffic_figures(data: TrafficDataset, test_nodes: np.ndarray, report: dict[str, Any],
                    folder: Path) -> list[Path]:
    """The road map (observed, predicted, uncertainty), metrics against walkers, training curve.

    :param data: The traffic dataset.
    :param test_nodes: Held-out sensor nodes.
    :param report: :func:`~gp_couple.experiments.graph_gp.run_protocol`'s report, run with
        ``node_posterior=True``; its ``node_posterior`` entry is removed once drawn.
    :param folder: Output folder.
    :return: The PNG files written.
    """
    from . import plotting

    posterior = report.pop("node_posterior")  # drawn here; too long to print with the report
    edges = np.column_stack(sp.triu(data.graph.adjacency, k=1).nonzero())
    speed_map = plotting.plot_traffic_map(
        data.node_lonlat, edges, data.observed_nodes, data.speeds, posterior["mean"], posterior["std"],
        folder / "traffic_map.png", test_nodes=test_nodes,
        title=f"San Jose traffic speeds: GRF-GP with {posterior['walkers']} {posterior['coupling']} "
              "walkers per node")
    return [speed_map, *protocol_figures(report, folder, "traffic")]
