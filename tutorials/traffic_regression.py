"""Traffic-speed regression on a road graph, end to end
====================================================

Run: ``python tutorials/traffic_regression.py`` (full mode; ``--quick`` is the smoke run CI
uses; ``benchmarks/RESULTS.md`` has the measured times). Data come from ``--data-dir``
(default ``$GP_COUPLE_DATA``, else ``../shared/datasets``; the file is
``traffic/pems_traffic.npz``). Figures go to ``--output`` (default
``tutorial_figures/traffic_regression``; ``pip install 'gp-couple[plot]'``).

The San Jose highway graph has 1016 road nodes; 325 of them carry a PeMS sensor with one
observed speed (Borovitskiy et al. 2021; the paper's traffic experiment). We

1. load the graph, its node coordinates and the speeds, and split the sensors 250/75;
2. train a graph GP whose kernel is a GRF estimate of the diffusion kernel;
3. predict the speed at every road node, not only at sensors, and draw the map;
4. check the uncertainty: are held-out speeds inside their predictive intervals, and
   does the predictive standard deviation grow away from the training sensors?
"""

# %%
# Imports
# -------
from __future__ import annotations

import argparse
import os
from pathlib import Path

import gpytorch
import numpy as np
import scipy.sparse as sp
import scipy.sparse.csgraph
import torch

from gp_couple import Diffusion, ExactGraphKernel, GraphGP, GRFKernel, fit_gp, grf_gp_settings, predict
from gp_couple.datasets import load_traffic, traffic_split
from gp_couple.evaluation import nlpd, rmse
from gp_couple.experiments.plotting import plot_traffic_map, plot_training_curves

parser = argparse.ArgumentParser(description="Traffic-speed regression on the San Jose road graph.")
parser.add_argument("--data-dir", default=os.environ.get("GP_COUPLE_DATA", "../shared/datasets"),
                    help="data directory holding traffic/ (default $GP_COUPLE_DATA or ../shared/datasets)")
parser.add_argument("--quick", action="store_true", help="few iterations: a smoke run")
parser.add_argument("--output", type=Path, default=Path("tutorial_figures/traffic_regression"),
                    help="folder for the figures (default %(default)s)")
args = parser.parse_args()
iterations, walkers = (5, 8) if args.quick else (300, 64)

# %%
# 1. Data
# -------
#
# `node_lonlat` is there for maps; the graph's edge weights are inverse road-segment
# lengths (a longer segment is a weaker link).
data = load_traffic(args.data_dir)
graph = data.graph
train_positions, test_positions = traffic_split(data.observed_nodes.size, 250, 75, seed=0)
train_nodes, test_nodes = data.observed_nodes[train_positions], data.observed_nodes[test_positions]
shift, scale = data.speeds[train_positions].mean(), data.speeds[train_positions].std()
y_train = torch.as_tensor((data.speeds[train_positions] - shift) / scale)
y_test = data.speeds[test_positions]
print(f"{graph.num_nodes} road nodes, {graph.num_edges} edges, {data.observed_nodes.size} sensors: "
      f"{train_nodes.size} train / {test_nodes.size} test; mean speed {shift:.1f} mph (sd {scale:.1f})")


# %%
# 2. A graph GP with a GRF kernel
# -------------------------------
#
# Walks are sampled for every node (nodes=None), so the trained model can predict
# anywhere. The graph is weighted: the default "weighted" neighbour proposal follows
# the edge weights, which keeps the walkers' loads bounded (see
# gp_couple.couplings.proposals). p_halt = 0.1 gives walks of about 10 steps, long
# enough for the kernel to reach between sensors on a sparse road network. Training
# fits the outputscale, the diffusion lengthscale gamma and the noise.
def make_model(base_kernel: gpytorch.kernels.Kernel) -> GraphGP:
    return GraphGP(train_nodes, y_train, gpytorch.likelihoods.GaussianLikelihood(),
                   gpytorch.kernels.ScaleKernel(base_kernel)).double()


model = make_model(GRFKernel(graph, num_walkers=walkers, p_halt=0.1, coupling="antithetic",
                             kernel_family=Diffusion(2.0), nodes=None, seed=0, schedule=None))
with grf_gp_settings():
    losses = fit_gp(model, model.likelihood, iterations=iterations, lr=0.05, seed=0)
gamma = model.covar_module.base_kernel.kernel_family.gamma.item()
print(f"trained: loss {losses[0]:.3f} -> {losses[-1]:.3f}, gamma {gamma:.2f}, "
      f"noise {model.likelihood.noise.item():.3f} (standardised units)")
figure = plot_training_curves({f"GRF-GP, {walkers} walkers": losses}, args.output / "training.png",
                              ylabel="negative log marginal likelihood per point")
print(f"wrote {figure}")

# %%
# 3. Predict everywhere and draw the map
# --------------------------------------
everywhere = np.arange(graph.num_nodes)
with grf_gp_settings():
    mean, variance = predict(model, model.likelihood, everywhere, seed=0)
mean_mph = mean.numpy() * scale + shift
std_mph = variance.sqrt().numpy() * scale
test_rmse = rmse(mean_mph[test_nodes], y_test)
test_nlpd = nlpd(mean_mph[test_nodes], std_mph[test_nodes] ** 2, y_test)
# Two references: predicting the training mean everywhere, and the exact GP with the
# same hyperparameters (dense: fine for 1016 nodes, impossible for a large network).
exact = make_model(ExactGraphKernel(graph, Diffusion()))
exact.load_state_dict(model.state_dict(), strict=False)
with grf_gp_settings():
    exact_mean = predict(exact, exact.likelihood, test_nodes)[0].numpy() * scale + shift
print(f"test RMSE: GRF-GP {test_rmse:.2f} mph, exact GP {rmse(exact_mean, y_test):.2f} mph, "
      f"training mean {rmse(np.full(y_test.size, shift), y_test):.2f} mph; GRF-GP NLPD {test_nlpd:.3f}")
edges = np.column_stack(sp.triu(graph.adjacency, k=1).nonzero())
figure = plot_traffic_map(data.node_lonlat, edges, data.observed_nodes, data.speeds, mean_mph, std_mph,
                          args.output / "traffic_map.png", test_nodes=test_nodes,
                          title=f"San Jose: GRF-GP speeds ({walkers} walkers per node)")
print(f"wrote {figure}")

# %%
# 4. Is the uncertainty honest?
# -----------------------------
#
# (a) Calibration: a well-calibrated 95 % predictive interval holds about 95 % of the
# held-out speeds (with 75 test sensors, anything from about 88 % to 100 % is consistent).
inside = np.abs(y_test - mean_mph[test_nodes]) <= 1.96 * std_mph[test_nodes]
print(f"95 % intervals hold {inside.mean():.0%} of the {inside.size} held-out speeds")
# (b) The predictive standard deviation should grow with the graph distance (in hops)
# to the nearest training sensor: the GP knows where it has not looked.
hops = scipy.sparse.csgraph.dijkstra(graph.adjacency, unweighted=True, indices=train_nodes,
                                   min_only=True)
for low, high in ((0, 0), (1, 2), (3, 5), (6, np.inf)):
    band = (hops >= low) & (hops <= high)
    if band.any():
        print(f"nodes {low}-{high} hops from a training sensor: {band.sum():4d}, "
              f"mean predictive sd {std_mph[band].mean():.2f} mph")
