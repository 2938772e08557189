r"""``gp-couple pagerank``: PageRank estimation with two coupled walkers (paper, Appendix E
"Estimating PageRank" [app:pagerank], Figure 9, Appendix E.3 [fig:pagerank_results]).

For each graph (largest connected component) and termination probability, the error
:math:`\|\rho - \widehat\rho\|_2` of the two-walker estimator is measured over repeats
for i.i.d., antithetic and :math:`\sigma`-coupled walkers; :math:`\sigma` is fitted for
the PageRank objective (eq. (82), the PageRank matching problem, Appendix E.2
[eq:matching_pagerank]) on an Erdős–Rényi graph with N = 100 and permutation order 10.
"""

from __future__ import annotations

import argparse
from itertools import product
from typing import Any

import numpy as np

from ..couplings.walk_lengths import SigmaCoupling
from ..datasets.graph_specs import resolve_graph
from ..features.sigma_fit import fit_pagerank_sigma_coupling
from ..pagerank import estimate_pagerank, exact_pagerank
from ..progress import progress
from ._couplings import walk_length_couplings, with_direction_labels
from ._report import (
    add_ratio_to_baseline,
    figure_folder,
    log_figures,
    summarize,
)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the experiment and return its report."""
    if args.walkers % 2 and any(c != "iid" for c in args.couplings):
        raise ValueError(f"paired couplings need an even number of walkers, got {args.walkers}")
    folder = figure_folder(args)
    results: list[dict[str, Any]] = []
    permutations: dict[float, list[int]] = {}
    graphs = {}
    for spec in args.graphs:
        graph = resolve_graph(spec, args.data_dir, largest_component=True)
        graphs[spec] = {"nodes": graph.num_nodes, "edges": graph.num_edges}
        for p_halt in args.p_halt:
            exact = exact_pagerank(graph, p_halt, args.proposal)
            couplings = walk_length_couplings(args.couplings, lambda: fit_pagerank_sigma_coupling(
                p_halt, args.order, samples_per_bin=args.fit_samples, seed=args.seed))  # noqa: B023 - called in this iteration
            if isinstance(couplings.get(SigmaCoupling.name), SigmaCoupling):
                # Fitted on the same ER graph with the same seed for every target graph.
                permutations[p_halt] = couplings[SigmaCoupling.name].permutation.tolist()
            rows = []
            for (name, coupling), directions in product(couplings.items(), args.directions):
                errors = [np.linalg.norm(exact - estimate_pagerank(
                    graph, p_halt, args.walkers, coupling,
                    seed=int(np.random.SeedSequence([args.seed, repeat]).generate_state(1)[0]),
                    proposal=args.proposal, directions=directions))
                    for repeat in progress(range(args.repeats), description=f"{spec} {name} {directions} "
                                           f"p_halt {p_halt:g}", unit="repeat")]
                rows.append({"graph": spec, "p_halt": p_halt, "coupling": name, "directions": directions,
                             "error": summarize(errors)})
            add_ratio_to_baseline(rows, "error")
            results.extend(rows)
    if folder is not None:
        from .plotting import plot_gram_error_vs_p_halt

        log_figures([plot_gram_error_vs_p_halt(
            with_direction_labels(results), folder / "pagerank_error_vs_p_halt.png", panel=("graph",),
            permutations=[{"p_halt": p, "permutation": order} for p, order in permutations.items()],
            title=f"PageRank error with {args.walkers} walkers; insets: fitted sigma permutations")])
    return {
        "experiment": "pagerank",
        "graphs": graphs,
        "config": {"walkers": args.walkers, "repeats": args.repeats, "order": args.order,
                   "fit_samples": args.fit_samples, "seed": args.seed, "proposal": args.proposal},
        "notes": ["error = ||rho - rho_hat||_2 (mean ± standard error over repeats), largest component",
                  "sigma-couplings fitted for the paper's eq. (82), Appendix E.2, on Erdos-Renyi(N=100, p=0.1)"],
        "results": results,
    }
