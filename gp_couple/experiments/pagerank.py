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

from ..features.sigma_fit import fit_pagerank_sigma_coupling
from ..couplings.walk_lengths import SigmaCoupling
from ..pagerank import estimate_pagerank, exact_pagerank
from ..progress import progress
from ._couplings import (COUPLINGS, add_walk_arguments, coupling_choices, walk_length_couplings,
                         with_direction_labels)
from ._graphs import PROCEDURAL_HELP, resolve_graph
from ._report import (add_common_arguments, add_ratio_to_baseline, emit, figure_folder, log_figures,
                      positive_int, probability, summarize, walkers_int)



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
                p_halt, args.order, samples_per_bin=args.fit_samples, seed=args.seed))
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
        from ..plotting import plot_gram_error_vs_p_halt

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


def register(subparsers: Any) -> None:
    """Add the ``pagerank`` sub-command."""
    parser = subparsers.add_parser("pagerank", help="PageRank error with iid / antithetic / sigma walkers",
                                   description="PageRank estimation with two coupled walkers (paper, Appendix E).")
    parser.add_argument("--graphs", nargs="+", default=["karate", "dolphins", "polbooks", "football"],
                        help=f"graphs (largest component of each): {PROCEDURAL_HELP}")
    parser.add_argument("--data-dir", default=None, help="dataset directory (default $GP_COUPLE_DATA)")
    parser.add_argument("--p-halt", nargs="+", type=probability,
                        default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
                        help="termination (teleport) probabilities to sweep")
    parser.add_argument("--walkers", type=walkers_int, default=2,
                        help="walkers per node (even, for the paired couplings)")
    parser.add_argument("--couplings", nargs="+", choices=coupling_choices(), default=list(COUPLINGS),
                        help="walk-length couplings compared")
    add_walk_arguments(parser)
    parser.add_argument("--order", type=positive_int, default=10, help="sigma permutation order n")
    parser.add_argument("--fit-samples", type=positive_int, default=1000,
                        help="walks per node and quantile bin when fitting sigma")
    add_common_arguments(parser, repeats=1000)
    parser.set_defaults(func=lambda args: emit(run(args), as_json=args.json, columns=(
        "graph", "p_halt", "coupling", "directions", "error", "error_vs_iid")))
