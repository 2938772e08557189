"""A GRF Gaussian process on a mesh, in plain GPyTorch
===================================================

Run: ``python tutorials/mesh_interpolation.py`` (full mode; ``--quick`` is the smoke run CI
uses; ``benchmarks/RESULTS.md`` has the measured times). Figures go to ``--output``
(default ``tutorial_figures/mesh_interpolation``); they need the plot extra
(``pip install 'gp-couple[plot]'``).

The task: interpolate the z-component of the face normals over the faces of a mesh,
holding out 5 % of the faces. The steps:

1. build a GP whose kernel is ``ScaleKernel(GRFKernel(...))`` — a drop-in GPyTorch kernel
   whose Gram matrix is a sparse, unbiased random-walk estimate of the diffusion kernel
   exp(-gamma^2 L~) — and train its hyperparameters;
2. predict at every face and look at the posterior mean and uncertainty on the mesh;
3. compare with the exact GP at the same hyperparameters;
4. swap i.i.d. walkers for antithetic and sigma-coupled ones, and add walkers;
5. save and reload the model.
"""

# %%
# Imports
# -------
from __future__ import annotations

import argparse
from pathlib import Path

import gpytorch
import numpy as np
import torch

from gp_couple import Diffusion, ExactGraphKernel, GraphGP, GRFKernel, fit_gp, grf_gp_settings, predict
from gp_couple.datasets import default_mesh, load_mesh, split_test_nodes
from gp_couple.evaluation import nlpd, rmse
from gp_couple.experiments.plotting import plot_mesh_posterior, plot_metric_curves, plot_training_curves
from gp_couple.features.sigma_fit import fit_sigma_coupling

parser = argparse.ArgumentParser(description="A GRF Gaussian process on a mesh.")
parser.add_argument("--mesh", default=None, help="a mesh file or a name in $GP_COUPLE_DATA/meshes")
parser.add_argument("--quick", action="store_true", help="few iterations: a smoke run")
parser.add_argument("--output", type=Path, default=Path("tutorial_figures/mesh_interpolation"),
                    help="folder for the figures (default %(default)s)")
args = parser.parse_args()
iterations = 5 if args.quick else 200

# %%
# Data: faces are nodes, the target is the z-component of each face normal
# ------------------------------------------------------------------------
#
# Two faces are neighbours when they share an edge. The built-in mesh is a bumpy
# icosphere (1280 faces), so no download is needed.
mesh = default_mesh() if args.mesh is None else load_mesh(args.mesh)
graph, targets = mesh.graph, mesh.targets
train, test = split_test_nodes(graph.num_nodes, seed=0)
all_faces = np.arange(graph.num_nodes)
print(f"{mesh.name}: {graph.num_nodes} faces, {train.size} train, {test.size} test")


# %%
# 1. A GRF-GP is an ordinary GPyTorch ExactGP
# -------------------------------------------
#
# GraphGP takes node indices as inputs. GRFKernel samples its walks at construction,
# for the nodes it will ever see (`nodes=`). By default fit_gp also redraws them as the
# learnt range needs and ends with prediction walkers (the kernel's WalkSchedule); this
# tutorial studies a fixed, deliberately small configuration, so it passes
# schedule=None: training then only changes the modulation function, i.e. the kernel's
# hyperparameters, not the walks.
def make_model(base_kernel: gpytorch.kernels.Kernel) -> GraphGP:
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    return GraphGP(train, torch.as_tensor(targets[train], dtype=torch.float32), likelihood,
                   gpytorch.kernels.ScaleKernel(base_kernel))


model = make_model(GRFKernel(graph, num_walkers=8, p_halt=0.4, kernel_family=Diffusion(1.0),
                             nodes=all_faces, seed=0, schedule=None))
# grf_gp_settings() applies the recommended gpytorch settings (CG on the sparse operator
# for large problems) and restores yours on exit; seed= makes the CG probes reproducible.
with grf_gp_settings():
    losses = fit_gp(model, model.likelihood, iterations=iterations, lr=0.05, seed=0)
    mean, variance = predict(model, model.likelihood, test)
kernel = model.covar_module
print(f"trained: loss {losses[0]:.3f} -> {losses[-1]:.3f}, gamma={kernel.base_kernel.kernel_family.gamma.item():.3f}, "
      f"outputscale={kernel.outputscale.item():.3f}, noise={model.likelihood.noise.item():.4f}")
print(f"GRF-GP (8 iid walkers): RMSE {rmse(mean, targets[test]):.4f}, NLPD {nlpd(mean, variance, targets[test]):.3f}")
figure = plot_training_curves({"GRF-GP, 8 i.i.d. walkers": losses}, args.output / "training.png",
                              ylabel="negative log marginal likelihood per point")
print(f"wrote {figure}")

# %%
# 2. Look at the posterior on the mesh
# ------------------------------------
#
# Predict at every face: the mean should reproduce the normals' pattern, and the
# standard deviation should be smallest on training faces and larger on the held-out
# (outlined) ones.
with grf_gp_settings():
    mean_all, variance_all = predict(model, model.likelihood, all_faces, seed=0)
figure = plot_mesh_posterior(mesh.mesh.vertices, mesh.mesh.faces, targets, mean_all, variance_all.sqrt(),
                             args.output / "posterior.png", test_faces=test,
                             title=f"{mesh.name}: GRF-GP posterior (8 i.i.d. walkers per face)")
print(f"wrote {figure}")

# %%
# 3. The exact GP with the same hyperparameters, for reference (dense: small graphs only)
# ---------------------------------------------------------------------------------------
#
# ExactGraphKernel has the same hyperparameter names, so the trained state loads into it.
exact = make_model(ExactGraphKernel(graph, Diffusion()))
exact.load_state_dict(model.state_dict(), strict=False)
with grf_gp_settings():
    exact_mean, exact_variance = predict(exact, exact.likelihood, test)
print(f"exact GP:               RMSE {rmse(exact_mean, targets[test]):.4f}, "
      f"NLPD {nlpd(exact_mean, exact_variance, targets[test]):.3f}")

# %%
# 4. Coupled walkers: same hyperparameters, fresh walks, coupled lengths
# ----------------------------------------------------------------------
#
# resample() draws new walks in place. The sigma-coupling is fitted for the trained
# kernel (order 50, as in the paper's GP experiments).
sigma = fit_sigma_coupling(kernel.base_kernel.kernel_family, p_halt=0.4, order=50,
                           samples_per_bin=20 if args.quick else 100, seed=0)
rows = []
for walkers in (8, 32):
    for name, coupling in [("iid", "iid"), ("antithetic", "antithetic"), ("sigma", sigma)]:
        kernel.base_kernel.resample(seed=1, num_walkers=walkers, coupling=coupling)
        with grf_gp_settings():
            mean, variance = predict(model, model.likelihood, test, seed=0)
        rows.append({"walkers": walkers, "coupling": name, "test_rmse": rmse(mean, targets[test]),
                     "test_nlpd": nlpd(mean, variance, targets[test])})
        print(f"{walkers} {name:>10} walkers: RMSE {rows[-1]['test_rmse']:.4f}, NLPD {rows[-1]['test_nlpd']:.3f}")
# One draw per point here (the `gp-couple mesh` command averages over repeats, with
# standard errors); coupled walkers usually come closer to the exact GP's numbers.
figure = plot_metric_curves(rows, args.output / "metrics_vs_walkers.png", x="walkers",
                            metrics=("test_rmse", "test_nlpd"), log_x=True,
                            title=f"{mesh.name}: one draw of walks per point")
print(f"wrote {figure}")

# %%
# 5. Saving and reloading: the walks are buffers, so predictions are identical
# ----------------------------------------------------------------------------
state = model.state_dict()
fresh = make_model(GRFKernel(graph, num_walkers=8, p_halt=0.4, kernel_family=Diffusion(), nodes=all_faces,
                             schedule=None))
fresh.load_state_dict(state)
with grf_gp_settings():
    assert torch.equal(predict(fresh, fresh.likelihood, test, seed=0)[0],
                       predict(model, model.likelihood, test, seed=0)[0])
print("reloaded model predicts identically")
