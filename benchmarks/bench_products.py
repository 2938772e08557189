"""Benchmark: the GRF-GP's CG/Lanczos products against the nnz bound, and the 10^6-node protocol.

Issue 14 (section 2) asks for every product of the GRF Gram operator within 2x of an
*nnz-bound* SciPy CSR product, and for the 10^6-node grid protocol in at most 90 s.
The problem is ``bench_graph_gp``'s (smooth signal on a grid, ``10^4`` training and
``10^4`` test nodes, ``--walkers`` i.i.d. walkers, ``p_halt``).

``products`` (per graph, fresh process): the training features :math:`\\Phi` (``10^4``
rows) at the initial hyperparameters, and, timed as medians of ``--repeats``:

* ``train_gram_k``: :math:`(\\Phi\\Phi^\\top + \\sigma^2 I) X` with ``k`` = 33 (one CG
  iteration with gpytorch's 32 probes + 1) and 1 (a Lanczos step);
* ``train_gram_backward_33``: the Gram's ``_bilinear_derivative`` with 33 vectors (the
  values' gradient of the log-determinant and quadratic form);
* ``cross_gram_k``: the test-by-train cross covariance times ``k`` = 1 (the predictive
  mean) and 300 (``fast_pred_var``'s Lanczos root) vectors;
* ``preconditioner``: gpytorch's rank-15 pivoted Cholesky of the training Gram
  (rebuilt every Adam step), forward and backward; ``preconditioner_reused_pivots``: the
  same with the previous step's pivots (``preconditioner_pivot_reuse``, on in
  ``grf_gp_settings``).

Each is divided by its *bound*, measured in the same process just before it: the same
number of SciPy CSR products with the same nnz and the same number of right-hand sides,
on CSR matrices built beforehand (:math:`\\Phi` over its touched columns and its
transpose as a second CSR matrix): two for a Gram product, four for its backward (two
transposed products and two sampled products, which cost one product each), and
``15`` single-vector products (one per pivot) for the preconditioner. SciPy's kernels
are single-threaded; the run's threads (``--threads``) bound torch as well.

``protocol`` (fresh process): features, ``--iterations`` Adam steps and the predictive
mean and variance at the test nodes (``fast_pred_var``), under ``grf_gp_settings``; wall
and CPU seconds and peak resident memory above the process's state before it starts.

``--baseline-tree DIR`` runs the same workers with ``gp_couple`` imported from DIR (e.g.
``git worktree add /tmp/before <commit>``), so before/after ratios come from one run on
the same machine; the predictions of both are compared. The machine load (``os.getloadavg``)
is recorded before and after each worker.

Run: ``python benchmarks/bench_products.py --baseline-tree /tmp/before --json-out benchmarks/results/products.json``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import dispatch_worker, emit_report, peak_increase, reset_peak  # noqa: E402
from bench_graph_gp import problem  # noqa: E402


def _median_time(function: Callable[[], Any], repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _kernel(spec: str, walkers: int, p_halt: float, seed: int) -> tuple[Any, ...]:
    from gp_couple import Diffusion, GRFKernel

    graph, signal, observed, train, test = problem(spec, seed)
    kernel = GRFKernel(graph, num_walkers=walkers, p_halt=p_halt, kernel_family=Diffusion(1.0), seed=seed,
                       nodes=np.concatenate([train, test]), schedule=None)
    return kernel, signal, observed, train, test


def _scipy_features(operator: Any, space: np.ndarray | None = None) -> tuple[Any, Any, np.ndarray]:
    """``Phi`` over its touched columns (or the columns ``space``) and its transpose, as SciPy CSR.

    Entries outside ``space`` are dropped: they meet zeros in a product on that space.
    """
    import scipy.sparse

    pattern = operator.pattern
    columns, values = pattern.columns.numpy(), operator.values.detach().numpy()
    pointer = pattern.row_pointer.numpy()
    if space is None:
        space = np.unique(columns)
    position = np.minimum(np.searchsorted(space, columns), space.size - 1)
    keep = space[position] == columns
    rows = np.repeat(np.arange(pattern.num_rows), np.diff(pointer))[keep]
    matrix = scipy.sparse.csr_array((values[keep], (rows, position[keep])), shape=(pattern.num_rows, space.size))
    matrix.sort_indices()
    return matrix, matrix.T.tocsr(), space


def products(spec: str, walkers: int, p_halt: float, seed: int, repeats: int) -> dict[str, Any]:
    """Each product's median time and its ratio to the nnz bound measured just before it."""
    import torch
    from linear_operator.operators import DiagLinearOperator

    from gp_couple.operators import GRFGramLinearOperator

    torch.manual_seed(seed)
    kernel, _, _, train, test = _kernel(spec, walkers, p_halt, seed)
    noise = 0.1
    x_train = torch.as_tensor(train).unsqueeze(-1)
    x_test = torch.as_tensor(test).unsqueeze(-1)
    values = kernel.feature_values().detach().requires_grad_(True)
    train_features = kernel.feature_operator(torch.as_tensor(train), values)
    gram = GRFGramLinearOperator(train_features)
    noisy = gram + DiagLinearOperator(torch.full((train.size,), noise))
    cross = kernel(x_test, x_train).evaluate_kernel()
    phi, phi_t, touched = _scipy_features(train_features)
    test_phi, _, _ = _scipy_features(cross.left, touched)
    result: dict[str, Any] = {"graph": spec, "nodes": kernel.num_nodes, "rows": int(train.size),
                              "nnz": int(phi.nnz), "touched_columns": int(phi.shape[1]),
                              "threads": torch.get_num_threads(), "load_before": os.getloadavg()[0]}
    rng = np.random.default_rng(seed)

    def record(name: str, ours: Callable[[], Any], bound: Callable[[], Any]) -> None:
        bound_s = _median_time(bound, repeats)
        ours_s = _median_time(ours, repeats)
        result[name] = {"s": ours_s, "bound_s": bound_s, "ratio": ours_s / bound_s}

    with torch.no_grad():
        for k in (33, 1):
            block = rng.standard_normal((train.size, k)).astype(np.float32)
            rhs = torch.from_numpy(block)
            record(f"train_gram_{k}", lambda: noisy._matmul(rhs),  # noqa: B023 - called in this iteration
                   lambda: phi @ (phi_t @ block) + noise * block)  # noqa: B023 - called in this iteration
        for k in (1, 300):
            block = rng.standard_normal((train.size, k)).astype(np.float32)
            rhs = torch.from_numpy(block)
            record(f"cross_gram_{k}", lambda: cross._matmul(rhs), lambda: test_phi @ (phi_t @ block))  # noqa: B023 - called in this iteration
    left = torch.from_numpy(rng.standard_normal((train.size, 33)).astype(np.float32))
    right = torch.from_numpy(rng.standard_normal((train.size, 33)).astype(np.float32))
    dense_left, dense_right = left.numpy(), right.numpy()
    with torch.no_grad():
        record("train_gram_backward_33", lambda: gram._bilinear_derivative(left, right),
               lambda: (phi @ (phi_t @ dense_left), phi @ (phi_t @ dense_right)))
    vector = rng.standard_normal(phi.shape[1]).astype(np.float32)

    train_nodes = torch.as_tensor(train)  # one tensor, as in training: the kernel caches its selection

    def preconditioner() -> None:
        # A fresh operator: linear_operator caches the factor on the operator.
        features = kernel.feature_operator(train_nodes, values)
        factor = GRFGramLinearOperator(features).pivoted_cholesky(rank=15)
        factor.sum().backward()

    record("preconditioner", preconditioner, lambda: [phi @ vector for _ in range(15)])
    try:
        from gp_couple.settings import preconditioner_pivot_reuse
    except ImportError:  # code before the pivots could be reused
        preconditioner_pivot_reuse = None
    if preconditioner_pivot_reuse is not None:
        with preconditioner_pivot_reuse(0.05):
            record("preconditioner_reused_pivots", preconditioner, lambda: [phi @ vector for _ in range(15)])
    result["load_after"] = os.getloadavg()[0]
    return result


def protocol(spec: str, walkers: int, p_halt: float, seed: int, iterations: int, out_file: str) -> dict[str, Any]:
    """Features, Adam steps, then the predictive mean and variance; wall, CPU and peak memory."""
    import gpytorch
    import torch

    from gp_couple import GraphGP, fit_gp, grf_gp_settings, predict

    load_before = os.getloadavg()[0]
    _, signal, observed, train, test = problem(spec, seed)
    baseline = reset_peak()
    cpu_start, start = time.process_time(), time.perf_counter()
    kernel, *_ = _kernel(spec, walkers, p_halt, seed)
    setup = time.perf_counter() - start
    scaled = gpytorch.kernels.ScaleKernel(kernel)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(train, torch.as_tensor(observed[train], dtype=torch.float32), likelihood, scaled)
    cpu_setup = time.process_time() - cpu_start
    with grf_gp_settings():
        start_train, cpu_train = time.perf_counter(), time.process_time()
        losses = fit_gp(model, likelihood, iterations=iterations, lr=0.05, seed=seed)
        training, cpu_train = time.perf_counter() - start_train, time.process_time() - cpu_train
        start_predict, cpu_predict = time.perf_counter(), time.process_time()
        mean, variance = predict(model, likelihood, test, seed=seed)
        prediction, cpu_predict = time.perf_counter() - start_predict, time.process_time() - cpu_predict
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    np.save(out_file, np.stack([mean.numpy(), variance.numpy()]))
    from gp_couple.evaluation import nlpd, rmse

    return {"graph": spec, "setup_s": setup, "train_s": training, "predict_s": prediction, "wall_s": wall,
            "cpu_s": cpu, "setup_cpu_s": cpu_setup, "train_cpu_s": cpu_train, "predict_cpu_s": cpu_predict,
            "peak_gb": peak_increase(baseline), "final_loss": losses[-1],
            "test_rmse": rmse(mean.numpy(), signal[test]),
            "test_nlpd": nlpd(mean.numpy(), variance.numpy(), observed[test]),
            "load_before": load_before, "load_after": os.getloadavg()[0]}


def lanczos(spec: str, walkers: int, p_halt: float, seed: int, hyper: list[float], sizes: list[float],
            subset: int) -> dict[str, Any]:
    """``fast_pred_var`` variances per Lanczos root size against CG-exact variances on ``subset`` test nodes.

    ``hyper`` = (outputscale, gamma, noise), e.g. the trained values of ``graph_gp.json``.
    """
    import gpytorch
    import torch

    from gp_couple import GraphGP, grf_gp_settings, predict

    kernel, _, observed, train, test = _kernel(spec, walkers, p_halt, seed)
    scaled = gpytorch.kernels.ScaleKernel(kernel)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(train, torch.as_tensor(observed[train], dtype=torch.float32), likelihood, scaled)
    scaled.outputscale, likelihood.noise = hyper[0], hyper[2]
    kernel.kernel_family.gamma = hyper[1]
    with grf_gp_settings(eval_cg_tolerance=1e-4, max_cg_iterations=5000):
        _, exact = predict(model, likelihood, test[:subset], variance="dense", seed=seed)
    exact = exact.double().numpy()
    rows: list[dict[str, Any]] = []
    for tolerance in sizes:
        with grf_gp_settings():
            start, cpu = time.perf_counter(), time.process_time()
            prediction = predict(model, likelihood, test, variance="lanczos", variance_tolerance=tolerance, seed=seed)
            variance = prediction.variance
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        error = variance[:subset].double().numpy() / exact - 1
        rows.append({"variance_tolerance": tolerance, "krylov_rank": prediction.estimate.rank,
                     "estimated_error": prediction.estimate.relative_error, "predict_s": wall, "predict_cpu_s": cpu,
                     "variance_rel_error_max": float(np.abs(error).max()),
                     "variance_rel_error_mean": float(error.mean())})
    return {"graph": spec, "hyper": hyper, "subset": subset, "tolerances": rows, "load": os.getloadavg()[0]}


def _run(function: Callable[..., dict[str, Any]], tree: str | None, *args: Any) -> dict[str, Any]:
    """``function(*args)`` in a fresh interpreter, with ``gp_couple`` from ``tree`` if given."""
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree) + os.pathsep + env.get("PYTHONPATH", "")
    completed = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", function.__name__,
                                json.dumps(args)], capture_output=True, text=True, env=env)
    if completed.returncode:
        lines = completed.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit code {completed.returncode}"}
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _prediction_change(after_file: str, before_file: str) -> dict[str, float]:
    after, before = np.load(after_file), np.load(before_file)
    return {"mean_max_abs_change": float(np.abs(after[0] - before[0]).max()),
            "mean_rms_change": float(np.sqrt(np.mean((after[0] - before[0]) ** 2))),
            "variance_max_rel_change": float(np.abs(after[1] / before[1] - 1).max())}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if dispatch_worker(argv, globals()):
        return {}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", nargs="*", default=["grid:316x316", "grid:1000x1000"])
    parser.add_argument("--protocol-graphs", nargs="*", default=["grid:1000x1000"])
    parser.add_argument("--walkers", type=int, default=16)
    parser.add_argument("--p-halt", type=float, default=0.1)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lanczos-graphs", nargs="*", default=[],
                        help="GRAPH=OUTPUTSCALE,GAMMA,NOISE: Krylov variances at each tolerance against dense "
                             "float64 ones")
    parser.add_argument("--lanczos-sizes", nargs="+", type=float, default=[0.05, 0.01, 0.002],
                        help="variance tolerances of the Krylov method")
    parser.add_argument("--lanczos-subset", type=int, default=200)
    parser.add_argument("--baseline-tree", default=None,
                        help="a checkout of the code to compare with (gp_couple imported from there)")
    parser.add_argument("--scratch", default="/tmp", help="where the workers leave their predictions")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    trees = {"after": None} if args.baseline_tree is None else {"before": args.baseline_tree, "after": None}
    rows: list[dict[str, Any]] = []
    for spec in args.graphs:
        for label, tree in trees.items():
            row = {"code": label, **_run(products, tree, spec, args.walkers, args.p_halt, args.seed, args.repeats)}
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    protocols: list[dict[str, Any]] = []
    for spec in args.protocol_graphs:
        files = {}
        for label, tree in trees.items():
            files[label] = os.path.join(args.scratch, f"bench_products_{label}_{spec.replace(':', '_')}.npy")
            row = {"code": label, **_run(protocol, tree, spec, args.walkers, args.p_halt, args.seed,
                                         args.iterations, files[label])}
            print(json.dumps(row), file=sys.stderr, flush=True)
            protocols.append(row)
        if len(files) == 2 and all(os.path.isfile(path) for path in files.values()):
            protocols[-1]["prediction_change_vs_before"] = _prediction_change(files["after"], files["before"])
    lanczos_rows = [_run(lanczos, None, spec, args.walkers, args.p_halt, args.seed,
                         [float(value) for value in hyper.split(",")], args.lanczos_sizes, args.lanczos_subset)
                    for spec, hyper in (item.split("=") for item in args.lanczos_graphs)]
    report = {"benchmark": "products", "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                                  "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
              "config": vars(args), "products": rows, "protocol": protocols,
              "lanczos": lanczos_rows}
    return emit_report(report, args.json_out)


if __name__ == "__main__":
    main()
