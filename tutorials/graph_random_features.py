"""Graph random features and walk-length couplings
===============================================

Run: ``python tutorials/graph_random_features.py`` (full mode; ``--quick`` is the smoke run
CI uses; ``benchmarks/RESULTS.md`` has the measured times of both). Figures go to
``--output`` (default ``tutorial_figures/graph_random_features``).

What you will learn, step by step:

1. a graph kernel is a power series in the graph's normalised adjacency, and graph random
   features (GRFs) estimate it without bias from random walks;
2. coupling the lengths of each node's walkers (antithetic, or a fitted permutation
   sigma) lowers the estimator's error at no extra cost, and how that depends on the
   termination probability ``p_halt`` and on the number of walkers;
3. how to fit, save and reload a sigma-coupling;
4. how to write your own coupling and check that it stays unbiased.
"""

# %%
# Imports
# -------
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import networkx as nx
import numpy as np
import torch

from gp_couple import Graph
from gp_couple.couplings import (
    AntitheticWalkLengthCoupling,
    IIDWalkLengthCoupling,
    PairedWalkLengthCoupling,
    SigmaCoupling,
    geometric_quantile,
)
from gp_couple.evaluation import relative_frobenius_error
from gp_couple.exact import exact_kernel_matrix
from gp_couple.experiments.plotting import plot_gram_error_vs_p_halt, plot_metric_curves
from gp_couple.features.graph_random_features import GraphRandomFeatures
from gp_couple.features.sigma_fit import fit_sigma_coupling
from gp_couple.kernel_families import RegularisedLaplacian

parser = argparse.ArgumentParser(description="Graph random features and walk-length couplings.")
parser.add_argument("--quick", action="store_true", help="few repeats: a smoke run")
parser.add_argument("--output", type=Path, default=Path("tutorial_figures/graph_random_features"),
                    help="folder for the figures (default %(default)s)")
args = parser.parse_args()
repeats = 8 if args.quick else 100
fit_samples = 20 if args.quick else 100

# %%
# 1. A graph and a kernel
# -----------------------
#
# Any networkx graph, scipy sparse matrix, edge list or trimesh mesh becomes a `Graph`
# (weights too: pass weight="weight"). Here: the co-appearance network of Les Misérables.
graph = Graph.from_networkx(nx.les_miserables_graph(), weight=None)
print(graph)

# The kernel is the 2-regularised Laplacian (I + sigma^2 L~)^-2 of the paper's Gram
# experiments; like every kernel in gp_couple it is a power series sum_k alpha_k A~^k in
# the normalised adjacency A~. The exact matrix needs an eigendecomposition: fine for
# 77 nodes, impossible for a million, which is why we estimate it.
family = RegularisedLaplacian(sigma=1.0, degree=2).double()
with torch.no_grad():
    exact = exact_kernel_matrix(family, graph).numpy()


# A GRF estimate is Phi Phi^T, where row i of Phi sums, over m random walks from node i,
# the modulation f(t) times the walk's load at every node it visits (t = step number).
# Walks stop with probability p_halt at every step, so their lengths are geometric.
def gram_error(coupling, walkers: int, p_halt: float, seed: int) -> float:
    """Relative Frobenius error ||K - Phi Phi^T||_F / ||K||_F of one GRF estimate."""
    features = GraphRandomFeatures.sample(graph, walkers, p_halt, coupling, seed=seed, dtype=torch.float64)
    with torch.no_grad():
        f = family.modulation(features.num_terms).reshape(-1)  # the modulation function f(t)
    phi = features.scipy_feature_matrix(f)
    return relative_frobenius_error(exact, phi @ phi.T)


def summary(values: list[float]) -> dict[str, float]:
    """Mean and standard error, the format the plotting functions read."""
    array = np.asarray(values)
    return {"mean": float(array.mean()), "se": float(array.std(ddof=1) / np.sqrt(array.size))}


# %%
# 2. Couplings reduce the error at no extra cost
# ----------------------------------------------
#
# With two walkers per node, i.i.d. lengths are the baseline. Antithetic termination
# makes one walker long when the other is short. A sigma-coupling pairs the walkers'
# length quantiles by a permutation sigma fitted by optimal transport (a linear
# assignment problem on a small Erdős–Rényi graph, so it transfers to any graph).
rows, permutations = [], []
for p_halt in (0.3, 0.5):
    sigma = fit_sigma_coupling(family, p_halt=p_halt, order=30, samples_per_bin=fit_samples, seed=0)
    permutations.append({"p_halt": p_halt, "permutation": sigma.permutation.tolist()})
    for name, coupling in [("iid", IIDWalkLengthCoupling()), ("antithetic", AntitheticWalkLengthCoupling()),
                           ("sigma", sigma)]:
        errors = [gram_error(coupling, walkers=2, p_halt=p_halt, seed=s) for s in range(repeats)]
        rows.append({"p_halt": p_halt, "coupling": name, "error": summary(errors)})
        if p_halt == 0.5:
            print(f"{name:>10}: error {rows[-1]['error']['mean']:.3f} ± {rows[-1]['error']['se']:.3f}")

# The figure is the paper's fig:permuton_grf on this graph: the error against p_halt for
# each coupling, with the fitted permutation drawn above each p_halt (points (q, sigma(q));
# an anti-diagonal would be antithetic-like pairing of short with long walks).
figure = plot_gram_error_vs_p_halt(rows, args.output / "gram_error_vs_p_halt.png", permutations=permutations,
                                   panel=(), title="Les Misérables: Gram error with 2 walkers per node")
print(f"wrote {figure}")

# More walkers lower every coupling's error like 1/sqrt(m); the couplings keep their
# advantage. (p_halt = 0.5, where walks are short and coupling them matters most.)
budget_rows = []
for walkers in (2, 4, 8):
    for name, coupling in [("iid", IIDWalkLengthCoupling()), ("sigma", sigma)]:
        errors = [gram_error(coupling, walkers=walkers, p_halt=0.5, seed=s) for s in range(repeats)]
        budget_rows.append({"walkers": walkers, "coupling": name, "error": summary(errors)})
figure = plot_metric_curves(budget_rows, args.output / "gram_error_vs_walkers.png", x="walkers",
                            metrics=("error",), log_x=True, log_y=True,
                            title="Gram error against walkers per node (p_halt = 0.5)")
print(f"wrote {figure}")

# %%
# 3. Save a fitted coupling and use it elsewhere
# ----------------------------------------------
#
# A sigma-coupling is a permutation plus provenance; it round-trips through JSON.
with tempfile.TemporaryDirectory() as directory:
    path = Path(directory) / "sigma_p0.5.json"
    sigma.save(path)
    reloaded = SigmaCoupling.load(path)
    assert np.array_equal(reloaded.permutation, sigma.permutation)
    print(f"saved and reloaded {reloaded} (fitted cost {reloaded.metadata['cost']:.1f})")


# %%
# 4. Your own coupling
# --------------------
#
# A coupling only has to give each walker a geometric length: then every walker's
# estimate is unbiased, whatever the dependence between walkers. Subclassing
# PairedWalkLengthCoupling, we draw a pair of lengths from one uniform u: one walker
# uses quantile u, the other 1 - u (a continuous cousin of antithetic termination).
class QuantileMirror(PairedWalkLengthCoupling):
    """Pair each walker's length quantile u with 1 - u: one long walk, one short."""

    name = "quantile-mirror"

    def sample_pairs(self, num_pairs, p_halt, rng):
        u = rng.random(num_pairs)
        return geometric_quantile(u, p_halt), geometric_quantile(1.0 - u, p_halt)


# Check the marginal: P(l = 0) must equal p_halt for each walker; the pair is
# negatively correlated, which is what lowers the variance.
lengths = QuantileMirror().sample_lengths(50_000, 2, 0.5, seed=0)
print(f"P(l=0) = {np.mean(lengths[:, 0] == 0):.3f} (expected 0.5), "
      f"corr(l1, l2) = {np.corrcoef(lengths.T)[0, 1]:.2f}")
errors = np.array([gram_error(QuantileMirror(), walkers=2, p_halt=0.5, seed=s) for s in range(repeats)])
print(f"quantile-mirror: error {errors.mean():.3f} ± {errors.std(ddof=1) / np.sqrt(repeats):.3f}")
