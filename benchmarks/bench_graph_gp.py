"""Benchmark: end-to-end GRF Gaussian processes on large graphs, next to exact and spectral baselines.

For each graph (2-D grids and icospheres with faces as nodes) a smooth signal is drawn
(lazy random-walk smoothing of white noise, unit variance) and observed with noise 0.1
at ``n_train = min(10^4, N/2)`` random nodes; ``n_test = min(10^4, N - n_train)`` other
nodes are predicted. Each method runs in a fresh subprocess, so times and peak memory
(resident-set increase over the process's state before the method starts) are clean:

* ``grf``: ``ScaleKernel(GRFKernel)`` (diffusion kernel, ``--walkers`` i.i.d. walkers,
  ``p_halt``) with features for the train and test nodes only; ``--iterations`` Adam
  steps on the exact marginal likelihood (CG/Lanczos under ``grf_gp_settings``); then the
  predictive mean and variance at the test nodes (``fast_pred_var``: Lanczos variances).
* ``exact`` (graphs up to ``--exact-limit`` nodes): ``ExactGraphKernel`` (dense
  eigendecomposition) trained and evaluated the same way.
* ``geometric_kernels`` (graphs up to ``--gk-limit`` nodes): GeometricKernels' heat kernel
  with ``--eigenpairs`` eigenpairs of the normalised Laplacian, evaluated at the GRF
  model's trained hyperparameters (it is a kernel approximation, not a trainer).

Accuracy on a common subset S of ``--subset`` test nodes: every method's Gram matrix on S
is compared with the exact kernel at the GRF model's trained hyperparameters (exact
columns by ``expm_multiply``): relative Frobenius error. Test RMSE is against the
noise-free signal; NLPD against the noisy observations.

Run: ``python benchmarks/bench_graph_gp.py --json-out benchmarks/results/graph_gp.json``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import dispatch_worker, emit_report, peak_increase, reset_peak, run_in_subprocess  # noqa: E402


def problem(spec: str, seed: int) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Graph, noise-free signal, noisy observations, train and test nodes.

    ``mesh:NAME`` is a mesh of ``$GP_COUPLE_DATA`` with the paper's protocol: normal-z
    targets (also used as the "noise-free" signal) and a 5 % test split.
    """
    if spec.startswith("mesh:"):
        from gp_couple.datasets import load_mesh, split_test_nodes

        mesh = load_mesh(spec.split(":", 1)[1])
        train, test = split_test_nodes(mesh.graph.num_nodes, seed=seed)
        targets = np.asarray(mesh.targets)
        return mesh.graph, targets, targets, train, test
    from gp_couple.datasets import resolve_graph

    graph = resolve_graph(spec)
    rng = np.random.default_rng(seed)
    walk = graph.normalized_adjacency()
    signal = rng.normal(size=graph.num_nodes)
    for _ in range(30):  # lazy random-walk smoothing: a smooth, graph-shaped signal
        signal = 0.5 * signal + 0.5 * (walk @ signal)
    signal = (signal - signal.mean()) / signal.std()
    observed = signal + 0.1 * rng.normal(size=graph.num_nodes)
    n_train = min(10_000, graph.num_nodes // 2)
    n_test = min(10_000, graph.num_nodes - n_train)
    order = rng.permutation(graph.num_nodes)
    return graph, signal, observed, np.sort(order[:n_train]), np.sort(order[n_train:n_train + n_test])


def _metrics(mean, variance, signal, observed, test) -> dict[str, float]:
    from gp_couple.evaluation import nlpd, rmse

    return {"test_rmse": rmse(mean, signal[test]), "test_nlpd": nlpd(mean, variance, observed[test])}


def scaled_graph_gp(base: Any, train: np.ndarray, observed: np.ndarray) -> tuple[Any, Any, Any]:
    """``ScaleKernel(base)``, a Gaussian likelihood and the ``GraphGP`` on the observed training nodes."""
    import gpytorch
    import torch

    from gp_couple import GraphGP

    kernel = gpytorch.kernels.ScaleKernel(base)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    return kernel, likelihood, GraphGP(train, torch.as_tensor(observed[train], dtype=torch.float32), likelihood, kernel)


def run_gp(method: str, spec: str, walkers: int, p_halt: float, iterations: int, subset: int,
           seed: int) -> dict[str, Any]:
    """Train and predict with ``method`` in {"grf", "exact"}; return timings and accuracy."""
    import torch

    from gp_couple import Diffusion, ExactGraphKernel, GRFKernel, fit_gp, grf_gp_settings, predict

    graph, signal, observed, train, test = problem(spec, seed)
    baseline = reset_peak()
    start = time.perf_counter()
    if method == "grf":
        base = GRFKernel(graph, num_walkers=walkers, p_halt=p_halt, kernel_family=Diffusion(1.0),
                         seed=seed, nodes=np.concatenate([train, test]), schedule=None)
    else:
        base = ExactGraphKernel(graph, Diffusion(1.0))
        from gp_couple.exact import normalized_adjacency_eigh

        normalized_adjacency_eigh(graph)  # the dense eigendecomposition: part of setup
    setup = time.perf_counter() - start
    kernel, likelihood, model = scaled_graph_gp(base, train, observed)
    with grf_gp_settings():
        start = time.perf_counter()
        losses = fit_gp(model, likelihood, iterations=iterations, lr=0.05, seed=seed)
        training = time.perf_counter() - start
        start = time.perf_counter()
        mean, variance = predict(model, likelihood, test, seed=seed)
        prediction = time.perf_counter() - start
    result = {"method": method, "setup_s": setup, "train_s": training, "predict_s": prediction,
              "total_s": setup + training + prediction, "peak_gb": peak_increase(baseline),
              "final_loss": losses[-1], "outputscale": float(kernel.outputscale),
              "gamma": float(base.kernel_family.gamma), "noise": float(likelihood.noise)}
    result.update(_metrics(mean.numpy(), variance.numpy(), signal, observed, test))
    if method == "grf":
        nodes = test[:subset]
        with torch.no_grad():
            rows = base.feature_operator(torch.as_tensor(nodes)).to_dense().double()
            result["subset_gram"] = (float(kernel.outputscale) * (rows @ rows.T)).tolist()
    return result


def run_exact_columns(spec: str, outputscale: float, gamma: float, subset: int, seed: int) -> dict[str, Any]:
    """Exact kernel on the subset via expm_multiply (in chunks of columns)."""
    from gp_couple import Diffusion
    from gp_couple.exact import exact_kernel_columns

    graph, _, _, _, test = problem(spec, seed)
    nodes = test[:subset]
    series = Diffusion().double()
    series.gamma = gamma
    start = time.perf_counter()
    columns = np.concatenate([exact_kernel_columns(series, graph, nodes[i:i + 50])
                              for i in range(0, nodes.size, 50)], axis=1)
    return {"subset_exact": (outputscale * columns[nodes]).tolist(), "exact_columns_s": time.perf_counter() - start}


def run_geometric_kernels(spec: str, eigenpairs: int, outputscale: float, gamma: float, subset: int,
                          seed: int) -> dict[str, Any]:
    """GeometricKernels' truncated heat kernel at the given hyperparameters on the subset."""
    try:
        import geometric_kernels.torch  # noqa: F401  (selects the backend)
        from geometric_kernels.kernels import MaternGeometricKernel
        from geometric_kernels.spaces import Graph as GKGraph
    except ImportError:
        return {"geometric_kernels": "not installed (pip install -e '.[bench]')"}
    graph, _, _, _, test = problem(spec, seed)
    nodes = test[:subset]
    baseline = reset_peak()
    start = time.perf_counter()
    space = GKGraph(graph.adjacency.astype(np.float64), normalize_laplacian=True)
    kernel = MaternGeometricKernel(space, num=eigenpairs, normalize=False)
    params = kernel.init_params()
    params["nu"] = np.array([np.inf])
    # GeometricKernels' heat kernel is exp(-l^2 lambda / 2) with eigenvectors scaled by sqrt(N).
    params["lengthscale"] = np.array([np.sqrt(2.0) * gamma])
    gram = kernel.K(params, nodes[:, None].astype(np.int64)) * outputscale / graph.num_nodes
    elapsed = time.perf_counter() - start
    return {"gk_s": elapsed, "gk_peak_gb": peak_increase(baseline), "subset_gk": np.asarray(gram).tolist()}


def _gram_error(exact: list, estimate: list) -> float:
    exact_array, estimate_array = np.asarray(exact), np.asarray(estimate)
    return float(np.linalg.norm(exact_array - estimate_array) / np.linalg.norm(exact_array))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if dispatch_worker(argv, globals()):
        return {}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", nargs="+", default=["grid:100x100", "mesh:torus", "icosphere:5", "grid:316x316",
                                                        "icosphere:6", "grid:1000x1000", "icosphere:8"])
    parser.add_argument("--walkers", type=int, default=16)
    parser.add_argument("--p-halt", type=float, default=0.1)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--subset", type=int, default=500)
    parser.add_argument("--eigenpairs", type=int, default=500)
    parser.add_argument("--exact-limit", type=int, default=10_000)
    # Its 500-eigenpair eigsh took 71 s at 20 480 nodes here and grows superlinearly.
    parser.add_argument("--gk-limit", type=int, default=30_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    rows = []
    for spec in args.graphs:
        grf = run_in_subprocess(__file__, run_gp, "grf", spec, args.walkers, args.p_halt,
                                args.iterations, args.subset, args.seed)
        row: dict[str, Any] = {"graph": spec, "grf": grf}
        if "error" not in grf:
            exact_subset = run_in_subprocess(__file__, run_exact_columns, spec, grf["outputscale"],
                                             grf["gamma"], args.subset, args.seed)
            if "error" not in exact_subset:
                row["exact_columns_s"] = exact_subset["exact_columns_s"]
                grf["subset_gram_error"] = _gram_error(exact_subset["subset_exact"], grf.pop("subset_gram"))
            nodes = problem(spec, args.seed)[0].num_nodes
            row["nodes"] = nodes
            if nodes <= args.exact_limit:
                exact = run_in_subprocess(__file__, run_gp, "exact", spec, args.walkers, args.p_halt,
                                          args.iterations, args.subset, args.seed)
                row["exact"] = exact
                if "total_s" in exact:
                    row["grf_speedup_vs_exact"] = exact["total_s"] / grf["total_s"]
            if nodes <= args.gk_limit and "error" not in exact_subset:
                gk = run_in_subprocess(__file__, run_geometric_kernels, spec, args.eigenpairs,
                                       grf["outputscale"], grf["gamma"], args.subset, args.seed)
                if "subset_gk" in gk:
                    gk["subset_gram_error"] = _gram_error(exact_subset["subset_exact"], gk.pop("subset_gk"))
                row["geometric_kernels"] = gk
        grf.pop("subset_gram", None)
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    report = {"benchmark": "graph_gp", "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
              "config": vars(args), "results": rows}
    return emit_report(report, args.json_out)


if __name__ == "__main__":
    main()
