"""Benchmark: GRF-GPs and coupled-RFF GPs on an accelerator, next to the same machine's CPU.

Two parts, each row in a fresh subprocess (clean peak memory) and written to
``--json-out`` as soon as it finishes; rows already in that file are skipped, so an
interrupted run resumes where it stopped (delete the file, or pick another, to redo).

* ``grf``: the GRF-GP protocol of ``bench_graph_gp.py`` on the ``--graph`` grid (default
  10^7 nodes) with ``--observed`` training nodes (default 10^4, 10^5 and 10^6) predicting
  at ``--test`` other nodes (default 10^5): ``ScaleKernel(GRFKernel)`` (diffusion,
  ``--walkers`` i.i.d. walkers, ``--p-halt``, features for the train and test nodes only,
  sampled on the CPU and moved to the device once), ``--iterations`` Adam steps on the
  exact marginal likelihood (CG/Lanczos under ``grf_gp_settings``), then the predictive
  mean and variance (``fast_pred_var``); ``--iterations 0`` predicts at the initial
  hyperparameters without training. Recorded: setup (walks + transfer), training
  and prediction wall time, ``torch.cuda.max_memory_allocated`` on the accelerator (or
  the resident-memory increase on the CPU), the features' own size and their ratio.
  CPU rows run only up to ``--cpu-max-observed`` training nodes.
* ``rff``: one training step (``-mll`` forward, backward, Adam) of an ``ExactGP`` with
  ``ScaleKernel(CoupledRFFKernel)`` (PNC) and with gpytorch's ``RFFKernel`` at
  ``--rff-points`` points (default 10^6, d = 8, 512 frequencies; the models of
  ``bench_random_features.py``): median over ``--rff-steps`` steps after a warm-up.
  CPU rows run only up to ``--cpu-max-rff-points`` points.

Feature sizes: ``feature_matrix_bytes`` is the sparse matrix :math:`\\Phi` as the
operators hold it (float values plus int64 column indices per stored entry, plus the row
pointer); ``walk_buffers_bytes`` is the kernel's stored walk decomposition (per-step
entries, from which :math:`\\Phi(\\theta)` is rebuilt every step).

Run (one H100/H200, under 10 minutes):
``python benchmarks/bench_device.py --json-out benchmarks/results/device.json``;
a CPU-only check at tiny sizes: ``python benchmarks/bench_device.py --smoke --json-out /tmp/device_smoke.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import dispatch_worker, emit_report, peak_increase, reset_peak, run_in_subprocess  # noqa: E402
from bench_graph_gp import problem  # noqa: E402
from bench_random_features import _data, _model, _trainer  # noqa: E402

_LOG = logging.getLogger("bench_device")

#: ``--smoke``: a 10^4-node grid and tiny sizes, to check on a CPU that every row runs.
SMOKE = {"graph": "grid:100x100", "observed": [200, 1000], "test": 2000, "iterations": 3,
         "rff_points": 2000, "rff_features": 64, "rff_steps": 2}


def _synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _start_memory(device: Any) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return reset_peak()


def _memory(device: Any, baseline: float) -> dict[str, float]:
    import torch

    memory = {"host_peak_increase_gb": peak_increase(baseline)}
    if device.type == "cuda":
        memory["device_peak_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    return memory


def _cached_problem(spec: str, seed: int, cache_dir: str) -> tuple[Any, np.ndarray, np.ndarray]:
    """Graph, signal and noisy observations of ``bench_graph_gp.problem``, built once per run.

    Building the 10^7-node grid and smoothing its signal takes minutes on a busy CPU; the
    rows of one run share them through a pickle in ``cache_dir``.
    """
    path = os.path.join(cache_dir, "".join(c if c.isalnum() else "_" for c in spec) + f"_{seed}.pkl")
    if os.path.exists(path):
        with open(path, "rb") as cached:
            return pickle.load(cached)
    graph, signal, noisy, _, _ = problem(spec, seed)
    os.makedirs(cache_dir, exist_ok=True)
    with open(f"{path}.tmp", "wb") as out:
        pickle.dump((graph, signal, noisy), out, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(f"{path}.tmp", path)
    return graph, signal, noisy


def grf_row(spec: str, observed: int, test: int, walkers: int, p_halt: float, iterations: int,
            device_name: str, seed: int, cache_dir: str) -> dict[str, Any]:
    """The GRF-GP protocol with ``observed`` training nodes on ``device_name``."""
    import gpytorch
    import torch

    from gp_couple import Diffusion, GraphGP, GRFKernel, fit_gp, grf_gp_settings, predict
    from gp_couple.evaluation import nlpd, rmse

    # The row's stages and the library's progress lines, streamed by the parent: a row stopped
    # at the run's budget still shows where its time went.
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    device = torch.device(device_name)
    graph, signal, noisy = _cached_problem(spec, seed, cache_dir)
    _LOG.info("grf row, %d observed on %s: problem of %d nodes ready", observed, device_name, graph.num_nodes)
    chosen = np.random.default_rng(seed + 1).choice(graph.num_nodes, observed + test, replace=False)
    train, test_nodes = np.sort(chosen[:observed]), np.sort(chosen[observed:])
    baseline = _start_memory(device)
    start = time.perf_counter()
    base = GRFKernel(graph, num_walkers=walkers, p_halt=p_halt, kernel_family=Diffusion(1.0), seed=seed,
                     nodes=np.concatenate([train, test_nodes]), schedule=None)
    features = base.features
    value_bytes = torch.empty((), dtype=features.dtype).element_size()
    matrix_bytes = features.nnz * (value_bytes + 8) + (features.num_rows + 1) * 8
    kernel = gpytorch.kernels.ScaleKernel(base).to(device)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(device)
    model = GraphGP(train, torch.as_tensor(noisy[train], dtype=torch.float32), likelihood, kernel)
    _synchronize(device)
    setup = time.perf_counter() - start
    _LOG.info("setup (walks of %d rows, %d stored entries, moved to %s) %.1f s", features.num_rows, features.nnz,
              device_name, setup)
    with grf_gp_settings():
        start = time.perf_counter()
        # --iterations 0: prediction alone, at the initial hyperparameters.
        losses = fit_gp(model, likelihood, iterations=iterations, lr=0.05, seed=seed) if iterations else [None]
        _synchronize(device)
        training = time.perf_counter() - start
        _LOG.info("training (%d Adam steps) %.1f s", iterations, training)
        start = time.perf_counter()
        mean, variance = predict(model, likelihood, test_nodes, seed=seed)
        _synchronize(device)
        prediction = time.perf_counter() - start
        _LOG.info("prediction at %d nodes %.1f s", test_nodes.size, prediction)
    mean, variance = mean.double().cpu().numpy(), variance.double().cpu().numpy()
    row = {"nodes": graph.num_nodes, "feature_rows": features.num_rows, "feature_nnz": features.nnz,
           "feature_matrix_bytes": matrix_bytes, "walk_buffers_bytes": features.nbytes(),
           "setup_s": setup, "train_s": training, "predict_s": prediction,
           "total_s": setup + training + prediction, "final_loss": losses[-1],
           "test_rmse": rmse(mean, signal[test_nodes]), "test_nlpd": nlpd(mean, variance, noisy[test_nodes]),
           **_memory(device, baseline)}
    peak = row.get("device_peak_gb", row["host_peak_increase_gb"]) * 1e9
    row["peak_vs_feature_matrix"] = peak / matrix_bytes
    row["peak_vs_walk_buffers"] = peak / features.nbytes()
    return row


def rff_row(kind: str, num_points: int, dim: int, num_features: int, steps: int, device_name: str,
            seed: int) -> dict[str, Any]:
    """Median training-step time of the ``kind`` random-feature GP (``bench_random_features`` models)."""
    import torch

    device = torch.device(device_name)
    torch.manual_seed(seed)
    x, y, _ = _data(num_points, dim, seed)
    baseline = _start_memory(device)
    model = _model(kind, x, y, num_features, "pnc", seed).to(device)
    model.train()
    step = _trainer(model)

    def timed() -> float:
        start = time.perf_counter()
        step()
        _synchronize(device)
        return time.perf_counter() - start

    warm_up = timed()  # lazy initialisation (gpytorch's RFFKernel draws its frequencies here)
    times = [timed() for _ in range(steps)]
    return {"warm_up_s": warm_up, "step_s_median": statistics.median(times), "step_s": times,
            **_memory(device, baseline)}


def _key(row: dict[str, Any]) -> str:
    return json.dumps({name: row[name] for name in ("part", "device", "config")}, sort_keys=True)


def _comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each accelerator row next to the CPU row of the same configuration (time ratios)."""
    cpu = {json.dumps([row["part"], row["config"]], sort_keys=True): row for row in rows if row["device"] == "cpu"}
    out = []
    for row in rows:
        reference = cpu.get(json.dumps([row["part"], row["config"]], sort_keys=True))
        if row["device"] == "cpu" or reference is None or "error" in row or "error" in reference:
            continue
        times = ("setup_s", "train_s", "predict_s", "total_s") if row["part"] == "grf" else ("step_s_median",)
        out.append({"part": row["part"], "device": row["device"], "config": row["config"],
                    **{f"cpu_over_device_{name}": reference["result"][name] / row["result"][name] for name in times}})
    return out


def _write(path: str, report: dict[str, Any]) -> None:
    report["comparisons"] = _comparisons(report["rows"])
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "w") as out:
        json.dump(report, out, indent=2)
        out.write("\n")
    os.replace(temporary, path)  # a crash never leaves a half-written file


def _plan(args: argparse.Namespace, devices: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """Every (part, device, config) to run: accelerator rows first, then the CPU's.

    Within a device the rows run cheapest first: the GRF rows by increasing training set,
    except that the fixed-cost RFF rows (one training step each) come before the largest
    GRF row, so a run stopped at its budget still measures both parts.
    """
    plan = []
    for device in devices:
        grf = [("grf", device, {"graph": args.graph, "observed": observed, "test": args.test,
                                "walkers": args.walkers, "p_halt": args.p_halt,
                                "iterations": args.iterations, "seed": args.seed})
               for observed in sorted(args.observed) if device != "cpu" or observed <= args.cpu_max_observed]
        rff = [("rff", device, {"model": kind, "num_points": args.rff_points, "dim": args.rff_dim,
                                "num_features": args.rff_features, "steps": args.rff_steps, "seed": args.seed})
               for kind in ("coupled-rff", "gpytorch-rff")
               if device != "cpu" or args.rff_points <= args.cpu_max_rff_points]
        plan.extend(grf[:-1] + rff + grf[-1:] if len(grf) > 1 else grf + rff)
    return plan


def _run(part: str, device: str, config: dict[str, Any], cache_dir: str) -> dict[str, Any]:
    if part == "grf":
        return run_in_subprocess(__file__, grf_row, config["graph"], config["observed"], config["test"],
                                 config["walkers"], config["p_halt"], config["iterations"], device, config["seed"],
                                 cache_dir, stream_stderr=True)
    return run_in_subprocess(__file__, rff_row, config["model"], config["num_points"], config["dim"],
                             config["num_features"], config["steps"], device, config["seed"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if dispatch_worker(argv, globals()):
        return {}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json-out", required=True, help="results file: rows are added as they finish")
    parser.add_argument("--graph", default="grid:3163x3163", help="graph spec (default: 1.0e7 nodes)")
    parser.add_argument("--observed", nargs="+", type=int, default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--test", type=int, default=100_000)
    parser.add_argument("--walkers", type=int, default=16)
    parser.add_argument("--p-halt", type=float, default=0.1)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--cpu-max-observed", type=int, default=10_000,
                        help="largest number of observed nodes also run on the CPU")
    parser.add_argument("--rff-points", type=int, default=1_000_000)
    parser.add_argument("--rff-dim", type=int, default=8)
    parser.add_argument("--rff-features", type=int, default=512)
    parser.add_argument("--rff-steps", type=int, default=3)
    parser.add_argument("--cpu-max-rff-points", type=int, default=1_000_000,
                        help="largest RFF training set also run on the CPU")
    parser.add_argument("--devices", nargs="+", default=None,
                        help="devices to run (default: cuda if available, then cpu)")
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "gp_couple_bench_device"),
                        help="where the rows share the built graph and signal (delete to rebuild)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on a 10^4-node grid (a quick check)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    import torch

    from gp_couple.devices import resolve_device

    devices = args.devices or (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]
    for device in devices:
        resolve_device(device, "--devices")
    report: dict[str, Any] = {"benchmark": "device", "rows": []}
    if os.path.exists(args.json_out):
        with open(args.json_out) as existing:
            report = json.load(existing)
    done = {_key(row) for row in report["rows"]}
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
               "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    report.setdefault("machines", [])
    if machine not in report["machines"]:
        report["machines"].append(machine)
    for part, device, config in _plan(args, devices):
        row = {"part": part, "device": device, "config": config}
        if _key(row) in done:
            print(f"skipping (already in {args.json_out}): {part} {device} {config}", file=sys.stderr)
            continue
        start = time.perf_counter()
        result = _run(part, device, config, args.cache_dir)
        row.update(result=result, wall_s=time.perf_counter() - start, machine=machine)
        if "error" in result:
            row["error"] = result["error"]
        report["rows"].append(row)
        _write(args.json_out, report)
        print(json.dumps(row), file=sys.stderr, flush=True)
    report["comparisons"] = _comparisons(report["rows"])
    return emit_report(report, None)


if __name__ == "__main__":
    main()
