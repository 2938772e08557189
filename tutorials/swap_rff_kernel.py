"""Swap gpytorch's RBF or RFF kernel for a coupled RFF kernel in an existing ExactGP
=================================================================================

Run: ``python tutorials/swap_rff_kernel.py`` (full mode, UCI ``kin8nm``; ``--quick`` is the
smoke run CI uses; ``benchmarks/RESULTS.md`` has the measured times). Data come from
``--data-dir`` (default ``$GP_COUPLE_DATA``, else ``../shared/datasets``; the UCI files
are under ``uci/``). Figures go to ``--output`` (default ``tutorial_figures/swap_rff_kernel``;
``pip install 'gp-couple[plot]'``).

You already have a gpytorch model. Its kernel is one line:

* ``RBFKernel()`` — exact, O(N^3) per training step;
* ``RFFKernel(num_samples=m)`` — gpytorch's random Fourier features, i.i.d. frequencies,
  O(N m^2) per step;
* ``CoupledRFFKernel(num_features=m, coupling=...)`` — the same features with *coupled*
  frequencies (orthogonal directions; pairwise norm-coupled, "pnc", by default), also
  O(N m^2) per step, with a lower-variance kernel estimate (Reid et al., ICLR 2025).

This tutorial swaps that line, trains each model the same way, and compares test
accuracy (RMSE, NLPD) and time. Nothing else in the model changes: the coupled kernel
returns a low-rank ``LinearOperator``, so gpytorch's Woodbury solves and its fast
predictive caches work as with ``RFFKernel``.
"""

# %%
# Imports
# -------
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import gpytorch
import numpy as np
import torch

from gp_couple import CoupledRFFKernel
from gp_couple.datasets import load_uci
from gp_couple.evaluation import nlpd, rmse
from gp_couple.experiments.plotting import plot_metric_bars, plot_training_curves

parser = argparse.ArgumentParser(description="Swap RBFKernel/RFFKernel for a coupled RFF kernel.")
parser.add_argument("--dataset", default="kin8nm", help="UCI dataset (default %(default)s)")
parser.add_argument("--data-dir", default=os.environ.get("GP_COUPLE_DATA", "../shared/datasets"),
                    help="data directory holding uci/ (default $GP_COUPLE_DATA or ../shared/datasets)")
parser.add_argument("--num-features", type=int, default=64, help="random frequencies m (default %(default)s)")
parser.add_argument("--train-points", type=int, default=2000, help="training points (default %(default)s)")
parser.add_argument("--iterations", type=int, default=150, help="Adam steps (default %(default)s)")
parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
parser.add_argument("--output", type=Path, default=Path("tutorial_figures/swap_rff_kernel"),
                    help="folder for the figures (default %(default)s)")
args = parser.parse_args()
if args.quick:
    args.train_points, args.iterations, args.num_features = 200, 5, 16

# %%
# Data: a random train/test split, standardised with training statistics
# ----------------------------------------------------------------------
x, y = load_uci(args.dataset, data_dir=args.data_dir)
order = np.random.default_rng(0).permutation(len(x))
train, test = order[:args.train_points], order[args.train_points:args.train_points + 1000]
x_mean, x_std = x[train].mean(0), x[train].std(0) + 1e-12
y_mean, y_std = y[train].mean(), y[train].std()
x_train, x_test = (torch.as_tensor((x[i] - x_mean) / x_std) for i in (train, test))
y_train, y_test = (torch.as_tensor((y[i] - y_mean) / y_std) for i in (train, test))
dim = x.shape[1]
print(f"{args.dataset}: {len(train)} training / {len(test)} test points, d = {dim}, m = {args.num_features}")


# %%
# Your existing model: only `base_kernel` will change
# ---------------------------------------------------
class RegressionGP(gpytorch.models.ExactGP):
    def __init__(self, base_kernel: gpytorch.kernels.Kernel) -> None:
        super().__init__(x_train, y_train, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(base_kernel)

    def forward(self, inputs: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(inputs), self.covar_module(inputs))


# The swap. Every kernel gets one lengthscale per input dimension (ARD). gpytorch's
# RFFKernel draws its frequencies from torch's global generator, so we seed that once;
# the coupled kernels take a seed of their own.
m = args.num_features
torch.manual_seed(0)
kernels = {
    "RBFKernel (exact)": lambda: gpytorch.kernels.RBFKernel(ard_num_dims=dim),
    "RFFKernel (iid)": lambda: gpytorch.kernels.RFFKernel(num_samples=m, num_dims=dim, ard_num_dims=dim),
    "CoupledRFFKernel iid": lambda: CoupledRFFKernel(m, dim, coupling="iid", ard_num_dims=dim, seed=0),
    "CoupledRFFKernel orthogonal": lambda: CoupledRFFKernel(m, dim, coupling="orthogonal", ard_num_dims=dim, seed=0),
    "CoupledRFFKernel pnc": lambda: CoupledRFFKernel(m, dim, coupling="pnc", ard_num_dims=dim, seed=0),
}


# %%
# Train, predict and time every variant the same way
# --------------------------------------------------
def train_and_evaluate(model: RegressionGP) -> dict[str, float | list[float]]:
    model = model.double()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()
    losses, start = [], time.perf_counter()
    for _ in range(args.iterations):
        optimizer.zero_grad()
        loss = -mll(model(x_train), y_train)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    train_seconds = time.perf_counter() - start
    model.eval()
    start = time.perf_counter()
    with torch.no_grad():
        predictive = model.likelihood(model(x_test))
        mean, variance = predictive.mean, predictive.variance
    return {"test_rmse": rmse(mean, y_test) * y_std, "test_nlpd": nlpd(mean, variance, y_test) + np.log(y_std),
            "train_seconds": train_seconds, "predict_seconds": time.perf_counter() - start, "losses": losses}


rows, curves = [], {}
for name, make_kernel in kernels.items():
    result = train_and_evaluate(RegressionGP(make_kernel()))
    curves[name] = result.pop("losses")
    rows.append({"kernel": name, **result})

# %%
# Compare: accuracy in the targets' units, time on this machine
# -------------------------------------------------------------
#
# Expect the coupled kernels to train as fast as RFFKernel (same O(N m^2) algebra) and
# PNC / orthogonal frequencies to sit closer to the exact RBF GP than i.i.d. ones,
# especially in NLPD; the exact GP is the accuracy reference and the slowest to train.
print(f"{'kernel':<30}{'test RMSE':>10}{'test NLPD':>10}{'train s':>9}{'predict s':>10}")
for row in rows:
    print(f"{row['kernel']:<30}{row['test_rmse']:>10.4f}{row['test_nlpd']:>10.3f}"
          f"{row['train_seconds']:>9.2f}{row['predict_seconds']:>10.3f}")
for figure in (plot_metric_bars(rows, args.output / "accuracy_and_time.png", category="kernel",
                                metrics=("test_rmse", "test_nlpd", "train_seconds"),
                                title=f"{args.dataset}: exact RBF vs {m} random Fourier frequencies"),
               plot_training_curves(curves, args.output / "training.png",
                                    ylabel="negative log marginal likelihood per point")):
    print(f"wrote {figure}")
