"""Choosing a coupling, a neighbour proposal and a walker budget for a new graph
=============================================================================

Run: ``python tutorials/choosing_a_coupling.py`` (full mode; ``--quick`` is the smoke run CI
uses; ``benchmarks/RESULTS.md`` has the measured times). Figures go to ``--output``
(default ``tutorial_figures/choosing_a_coupling``; ``pip install 'gp-couple[plot]'``).

Graph random features have four knobs besides the kernel: how many walkers start at each
node (``num_walkers``), how their lengths are coupled (``coupling``: i.i.d., antithetic or
a fitted sigma permutation), how a walker picks its next node (``proposal``: uniform over
neighbours, or in proportion to edge weights) and whether the walkers of one node spread
out on purpose (``directions``: independent or repelling). All choices give unbiased
kernel estimates; they differ in variance and cost. This script *measures* them on a new
graph instead of guessing:

1. build the graph and the exact kernel we want to estimate (the reference);
2. compare the two neighbour proposals;
3. compare the three length couplings (fitting sigma once);
4. compare independent and repelling directions;
5. with the winning combination, find the smallest walker budget that reaches a target
   error, against the i.i.d. baseline, and time both.

A choice is kept only when it beats the alternative by more than two standard errors;
otherwise the simpler option wins. Use the same recipe on your own graph: replace step 1.
"""

# %%
# Imports
# -------
from __future__ import annotations

import argparse
import time
from pathlib import Path

import networkx as nx
import numpy as np
import torch

from gp_couple import Diffusion, Graph
from gp_couple.evaluation import relative_frobenius_error
from gp_couple.exact import exact_kernel_matrix
from gp_couple.experiments.plotting import plot_metric_bars, plot_metric_curves
from gp_couple.features.graph_random_features import GraphRandomFeatures
from gp_couple.features.sigma_fit import fit_sigma_coupling

parser = argparse.ArgumentParser(description="Choose a coupling, proposal and walker budget for a graph.")
parser.add_argument("--quick", action="store_true", help="a small graph and few repeats: a smoke run")
parser.add_argument("--target-error", type=float, default=0.3,
                    help="relative Frobenius error the walker budget must reach (default %(default)s)")
parser.add_argument("--output", type=Path, default=Path("tutorial_figures/choosing_a_coupling"),
                    help="folder for the figures (default %(default)s)")
args = parser.parse_args()
nodes, repeats = (120, 6) if args.quick else (400, 40)
P_HALT, WALKERS = 0.3, 8

# %%
# 1. The new graph and the reference kernel
# -----------------------------------------
#
# A sensor network: nodes scattered in the unit square, linked when closer than a radius,
# with weights that fall off with distance, so some links are much stronger than others
# (on such uneven weights the neighbour proposal matters most).
geometric = nx.random_geometric_graph(nodes, radius=1.6 / np.sqrt(nodes), seed=1)
for u, v in geometric.edges:
    distance = np.linalg.norm(np.subtract(geometric.nodes[u]["pos"], geometric.nodes[v]["pos"]))
    geometric.edges[u, v]["weight"] = float(np.exp(-(distance * np.sqrt(nodes)) ** 2))
graph = Graph.from_networkx(geometric, weight="weight")
print(graph)
family = Diffusion(gamma=1.0).double()
with torch.no_grad():
    exact = exact_kernel_matrix(family, graph).numpy()  # affordable here; the point of GRFs is not to need it


def measure(label: str, walkers: int = WALKERS, **options) -> dict:
    """Gram error (mean and standard error over repeats) and seconds per feature draw."""
    errors, seconds = [], []
    for seed in range(repeats):
        start = time.perf_counter()
        features = GraphRandomFeatures.sample(graph, walkers, P_HALT, seed=seed, dtype=torch.float64, **options)
        with torch.no_grad():
            phi = features.scipy_feature_matrix(family.modulation(features.num_terms).reshape(-1))
        seconds.append(time.perf_counter() - start)
        errors.append(relative_frobenius_error(exact, phi @ phi.T))
    errors = np.asarray(errors)
    row = {"setting": label, "walkers": walkers,
           "error": {"mean": errors.mean(), "se": errors.std(ddof=1) / np.sqrt(repeats)},
           "seconds": float(np.median(seconds))}
    print(f"  {label:<32} m={walkers:<3} error {row['error']['mean']:.3f} ± {row['error']['se']:.3f}, "
          f"{1e3 * row['seconds']:.1f} ms per draw")
    return row


def clearly_better(candidate: dict, baseline: dict) -> bool:
    """True when ``candidate``'s error is lower by more than two standard errors of the difference."""
    gap = baseline["error"]["mean"] - candidate["error"]["mean"]
    return gap > 2 * np.hypot(baseline["error"]["se"], candidate["error"]["se"])


rows = []
# %%
# 2. Neighbour proposal
# ---------------------
#
# "uniform" picks any neighbour with probability 1/degree and corrects by an importance
# weight; "weighted" picks in proportion to the edge weight, so the corrections cancel.
print(f"2. proposal ({WALKERS} i.i.d. walkers, p_halt {P_HALT}):")
uniform = measure("uniform proposal", coupling="iid", proposal="uniform")
weighted = measure("weighted proposal", coupling="iid", proposal="weighted")
rows += [uniform, weighted]
proposal = "weighted" if clearly_better(weighted, uniform) else "uniform"
print(f"  -> proposal: {proposal}")

# %%
# 3. Length coupling
# ------------------
#
# The sigma-coupling is fitted for this kernel and p_halt on a small Erdős–Rényi graph
# (a one-off cost, reported below; save it with .save() and reuse it).
start = time.perf_counter()
sigma = fit_sigma_coupling(family, P_HALT, order=30, samples_per_bin=20 if args.quick else 100, seed=0)
print(f"3. length coupling (sigma fitted in {time.perf_counter() - start:.1f} s):")
by_coupling = {"iid": uniform if proposal == "uniform" else weighted}
for name, coupling in (("antithetic", "antithetic"), ("sigma", sigma)):
    by_coupling[name] = measure(f"{name} lengths, {proposal}", coupling=coupling, proposal=proposal)
    rows.append(by_coupling[name])
coupling_name = "iid"
for name in ("antithetic", "sigma"):
    if clearly_better(by_coupling[name], by_coupling[coupling_name]):
        coupling_name = name
coupling = sigma if coupling_name == "sigma" else coupling_name
print(f"  -> coupling: {coupling_name}")

# %%
# 4. Directions
# -------------
#
# Repelling walkers of one node take different neighbours where they can, exploring
# more of the graph per walker.
print("4. directions:")
independent = by_coupling[coupling_name]
repelling = measure(f"repelling, {coupling_name}, {proposal}", coupling=coupling, proposal=proposal,
                    directions="repelling")
rows.append(repelling)
directions = "repelling" if clearly_better(repelling, independent) else "independent"
print(f"  -> directions: {directions}")
figure = plot_metric_bars(rows, args.output / "choices.png", category="setting", metrics=("error", "seconds"),
                          title=f"{graph.num_nodes}-node geometric graph, {WALKERS} walkers per node")
print(f"wrote {figure}")

# %%
# 5. Walker budget
# ----------------
#
# Error falls like 1/sqrt(m) for every scheme; the question is how many walkers each
# scheme needs for the accuracy you want, and what that costs in time.
print(f"5. walker budget for a Gram error below {args.target_error}:")
budget_rows, needed = [], {}
for label, options in (("chosen", dict(coupling=coupling, proposal=proposal, directions=directions)),
                       ("iid baseline", dict(coupling="iid", proposal="uniform", directions="independent"))):
    for walkers in (2, 4, 8, 16, 32, 64):
        row = measure(label, walkers=walkers, **options)
        budget_rows.append({**row, "scheme": label})
        if row["error"]["mean"] <= args.target_error:
            needed[label] = row
            break
figure = plot_metric_curves(budget_rows, args.output / "budget.png", x="walkers", metrics=("error", "seconds"),
                            group="scheme", log_x=True, log_y=True,
                            title="Gram error and time per draw against walkers per node")
print(f"wrote {figure}")
choice = needed.get("chosen")
if choice is None:
    print(f"choice: no budget up to 64 walkers reached {args.target_error}; raise the budget or p_halt")
else:
    baseline = needed.get("iid baseline")
    versus = (f"; the i.i.d. baseline needs m = {baseline['walkers']} ({1e3 * baseline['seconds']:.1f} ms)"
              if baseline else "; the i.i.d. baseline does not reach it with 64 walkers")
    print(f"choice: coupling={coupling_name}, proposal={proposal}, directions={directions}, "
          f"num_walkers={choice['walkers']} ({1e3 * choice['seconds']:.1f} ms per draw){versus}")
