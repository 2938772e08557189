"""Benchmark: GRF estimates of long-range diffusion kernels against the termination probability.

Where do graph random features stop being useful as the kernel's range grows? On
unweighted graphs small enough for the dense exact kernel (a 2-D grid and an icosphere
mesh with faces as nodes), for every diffusion :math:`\\gamma` (modulation peak at
:math:`t \\approx \\gamma^2/2` steps) and every ``p_halt``, ``--walkers`` walkers per node
with every length coupling (i.i.d., antithetic, σ fitted for that kernel and p_halt) and
every direction scheme (independent, repelling) estimate the full Gram matrix ``--repeats``
times. Each row reports:

* ``gram_error``: relative Frobenius error ``||K - ΦΦᵀ||_F / ||K||_F`` over all nodes
  (mean ± standard error over repeats). The zero matrix has error 1, so an estimate with
  error >= 1 is useless;
* ``halting_inflation``: the rule's prediction :func:`gp_couple.halting.halting_inflation`
  (factor by which halting inflates the features' second moment) at this γ and p_halt;
* ``walk_steps``: total walk steps sampled per estimate (the cost, ∝ (1 - p)/p).

Per graph and γ, ``summary`` gives the p_halt suggested by
:func:`gp_couple.halting.suggest_p_halt`, the smallest error measured, and the error at
the largest measured p_halt not above the suggestion.

Run: ``python benchmarks/bench_long_range.py --json-out benchmarks/results/long_range.json``
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402

from gp_couple.datasets import resolve_graph  # noqa: E402
from gp_couple.evaluation import relative_frobenius_error  # noqa: E402
from gp_couple.exact import exact_kernel_matrix  # noqa: E402
from gp_couple.experiments._couplings import walk_length_couplings  # noqa: E402
from gp_couple.experiments._report import summarize  # noqa: E402
from gp_couple.experiments.exact_baseline import kernel_family_at  # noqa: E402
from gp_couple.features.graph_random_features import GraphRandomFeatures  # noqa: E402
from gp_couple.features.sigma_fit import fit_sigma_coupling  # noqa: E402
from gp_couple.halting import DEFAULT_MAX_INFLATION, halting_inflation, suggest_p_halt  # noqa: E402


def gram_errors(graph: Any, exact: np.ndarray, family: Any, walkers: int, p_halt: float, coupling: Any,
                directions: str, repeats: int, rng: np.random.Generator) -> tuple[list[float], int]:
    """Relative Frobenius errors of ``repeats`` fresh estimates, and the walk steps of one."""
    errors, steps = [], 0
    with torch.no_grad():
        for _ in range(repeats):
            features = GraphRandomFeatures.sample(graph, walkers, p_halt, coupling, seed=rng,
                                                  dtype=torch.float64, directions=directions)
            f = family.modulation(features.num_terms).reshape(-1)
            phi = features.scipy_feature_matrix(f).toarray()
            errors.append(relative_frobenius_error(exact, phi @ phi.T))
            steps = features.num_entries
    return errors, steps


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    couplings_cache: dict[tuple[float, float], dict[str, Any]] = {}
    rows, summary = [], []
    for spec in args.graphs:
        graph = resolve_graph(spec)
        for gamma in args.gammas:
            family = kernel_family_at("diffusion", {"gamma": gamma})
            with torch.no_grad():
                exact = exact_kernel_matrix(family, graph).numpy()
            here = []
            for p_halt in args.p_halts:
                key = (gamma, p_halt)
                if key not in couplings_cache:
                    couplings_cache[key] = walk_length_couplings(args.couplings, lambda: fit_sigma_coupling(
                        family, p_halt, args.order, samples_per_bin=args.fit_samples, seed=args.seed))  # noqa: B023 - called in this iteration
                inflation = halting_inflation(family, p_halt)
                for name, coupling in couplings_cache[key].items():
                    for directions in args.directions:
                        start = time.perf_counter()
                        errors, steps = gram_errors(graph, exact, family, args.walkers, p_halt, coupling,
                                                    directions, args.repeats, rng)
                        row = {"graph": spec, "nodes": graph.num_nodes, "gamma": gamma, "p_halt": p_halt,
                               "halting_inflation": inflation, "coupling": name, "directions": directions,
                               "gram_error": summarize(errors), "walk_steps": steps,
                               "seconds": (time.perf_counter() - start) / args.repeats}
                        rows.append(row)
                        here.append(row)
                        print(f"{spec} gamma={gamma} p={p_halt} {name}/{directions}: "
                              f"{row['gram_error']['mean']:.3g}", file=sys.stderr, flush=True)
            suggested = suggest_p_halt(family)
            within = [row for row in here if row["p_halt"] <= suggested + 1e-12]
            at_rule = max((row["p_halt"] for row in within), default=None)
            summary.append({
                "graph": spec, "gamma": gamma, "suggested_p_halt": suggested,
                "best_gram_error": min(row["gram_error"]["mean"] for row in here),
                "p_halt_at_rule": at_rule,
                "gram_error_at_rule": {f"{row['coupling']}/{row['directions']}": row["gram_error"]["mean"]
                                       for row in here if row["p_halt"] == at_rule}})
    return {"benchmark": "long_range", "settings": vars(args) | {"max_inflation": DEFAULT_MAX_INFLATION},
            "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
            "notes": ["gram_error = ||K - K_hat||_F / ||K||_F over all nodes (dense exact diffusion kernel)",
                      "halting_inflation = sum_t f(t)^2 (1-p)^-t / sum_t f(t)^2 (gp_couple.halting)",
                      "walk_steps = stored (row, node, step) entries of one estimate; seconds per estimate"],
            "results": rows, "summary": summary}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", nargs="+", default=["grid:36x36", "icosphere:3"])
    parser.add_argument("--gammas", nargs="+", type=float, default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--p-halts", nargs="+", type=float, default=[0.5, 0.2, 0.1, 0.05, 0.02, 0.01])
    parser.add_argument("--walkers", type=int, default=16)
    parser.add_argument("--couplings", nargs="+", default=["iid", "antithetic", "sigma"])
    parser.add_argument("--directions", nargs="+", default=["independent", "repelling"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--order", type=int, default=50, help="sigma permutation order")
    parser.add_argument("--fit-samples", type=int, default=100, help="walks per quantile bin when fitting sigma")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    return emit_report(run(args), args.json_out)


if __name__ == "__main__":
    main()
