"""Benchmark: GRF and sparse-spectrum GPs across processes (torch.distributed, gloo), launched by torchrun.

Parts (``--parts``):

* ``grf``: a ``--grid`` graph (default 1000 x 1000 = 10^6 nodes), ``--observed`` nodes
  (default 10^4) of a smooth field plus noise. :func:`gp_couple.sharded_gp.fit_sharded_grf_gp`
  trains on its first walks, without the walk schedule (``schedule=None``: the distributed
  products are what is measured; at most ``--iterations`` L-BFGS iterations), σ-coupled
  prediction walkers are drawn (``--predict-walkers``; default: chosen for a relative Gram
  error of 0.01, the recommended configuration), and :class:`gp_couple.streaming.StreamedPredictor` writes the mean and
  variance of every node to a ``.npy`` file. Reported per process count: wall times of
  each stage, peak RSS of every process (and of each stage, with the RSS at its end; on
  Linux the peak is reset between stages), bytes of one Gram product per CG column, and
  the test RMSE against the noiseless field. The predictor frees the kernel's walks once it
  has read them (``release_kernel_walks``). With ``--predict-subset K`` the prediction of the
  first K nodes is timed too (linearity in the nodes predicted).
* ``rff``: ``--points`` synthetic points in ``--dims`` dimensions (default 10^7 x 8),
  :class:`gp_couple.sparse_spectrum.ShardedSparseSpectrumGP` with ``--features`` frequencies
  (default 256, 2 x 256 RFF columns): the negative MLL and one gradient step, timed, per
  process count; the MLLs of all process counts are compared.

Each configuration runs in fresh processes: ``python -m torch.distributed.run
--nproc-per-node P benchmarks/bench_distributed.py --worker ...``; every process writes its
own JSON, the parent collects them. Run:
``python benchmarks/bench_distributed.py --processes 1 2 --json-out benchmarks/results/distributed.json``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _status_gb(field: str) -> float | None:
    """A size field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in GiB; ``None`` off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None


def _peak_rss_gb() -> float:
    """Peak RSS of this process (since the last reset by :class:`_Memory`), in GiB."""
    peak = _status_gb("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20 if peak is None else peak


class _Memory:
    """Peak RSS per stage: the peak since the last stage (Linux resets it through ``/proc/self/clear_refs``;
    elsewhere the peaks are cumulative) and the RSS at the end of the stage; :attr:`peak` is the process's."""

    def __init__(self) -> None:
        self.stages: dict[str, dict[str, float | None]] = {}
        self.peak = 0.0
        self.resets = True

    def mark(self, stage: str) -> None:
        peak = _peak_rss_gb()
        self.stages[stage] = {"peak_gb": peak, "rss_gb": _status_gb("VmRSS")}
        self.peak = max(self.peak, peak)
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (and ru_maxrss) to the RSS now
        except OSError:
            self.resets = False

    def record(self) -> dict[str, Any]:
        return {"peak_rss_gb": max(self.peak, _peak_rss_gb()), "memory_by_stage": self.stages,
                "stage_peaks_reset": self.resets}


def _field(rows: np.ndarray, columns: np.ndarray, side: int) -> np.ndarray:
    """A smooth field on the grid (a few periods across it)."""
    scale = side / 8.0
    return np.sin(rows / scale) * np.cos(columns / (1.3 * scale)) + 0.5 * np.sin((rows + columns) / (2.1 * scale))


def grf_worker(options: dict[str, Any], out: str) -> None:
    import torch

    from gp_couple.distributed import initialise
    from gp_couple.graphs import grid_graph
    from gp_couple.sharded_gp import fit_sharded_grf_gp
    from gp_couple.streaming import StreamedPredictor

    timings: dict[str, float] = {}
    memory = _Memory()
    start = time.perf_counter()
    collective = initialise("gloo", timeout=1800)
    side = options["grid"]
    graph = grid_graph(side, side)
    timings["graph"] = time.perf_counter() - start
    memory.mark("graph")
    rng = np.random.default_rng(0)
    observed = np.sort(rng.choice(graph.num_nodes, options["observed"], replace=False))
    truth = _field(*np.divmod(observed, side), side)
    targets = truth + 0.1 * rng.normal(size=observed.size)
    offset, scale = float(targets.mean()), float(targets.std())
    mark = time.perf_counter()
    model, likelihood, history = fit_sharded_grf_gp(graph, observed, (targets - offset) / scale,
                                                    collective=collective, iterations=options["iterations"],
                                                    schedule=None, seed=0)
    timings["train"] = time.perf_counter() - mark
    memory.mark("train")
    kernel = model.covar_module.base_kernel
    # Bytes of one Gram product per column: an all-reduce over the shared nodes and an all-gather of the rows.
    inputs = model.train_inputs[0]
    gram = kernel.forward(inputs, inputs)
    shared = gram.shared
    before = collective.bytes_communicated
    with torch.no_grad():
        gram._matmul(torch.ones(observed.size, 1, dtype=torch.float64))
    product_bytes = collective.bytes_communicated - before
    del gram
    mark = time.perf_counter()
    kernel.resample_for_prediction(options["predict_walkers"], max_walkers=options["max_predict_walkers"], seed=0)
    timings["prediction_walkers"] = time.perf_counter() - mark
    memory.mark("prediction_walkers")
    mark = time.perf_counter()
    predictor = StreamedPredictor(model, likelihood, collective=collective, target_offset=offset, target_scale=scale,
                                  release_kernel_walks=True)
    timings["training_side"] = time.perf_counter() - mark
    memory.mark("training_side")
    details = {"predict_walkers": kernel.num_walkers, "predict_p_halt": kernel.p_halt,
               "reused_training_rows": predictor.reused_rows, "walk_block_nodes": predictor.block_size}
    for subset in options["predict_subset"]:
        mark = time.perf_counter()
        predictor.predict_all(np.arange(subset), chunk_size=options["chunk_size"])
        timings[f"predict_first_{subset}"] = time.perf_counter() - mark
        memory.mark(f"predict_first_{subset}")
        # A partial record, kept if the run over every node is cut short.
        partial = {"rank": collective.rank, "timings_s": dict(timings), **memory.record(), **details}
        Path(out + ".partial").write_text(json.dumps(partial))
    if options["subset_only"]:
        Path(out).write_text(json.dumps({"rank": collective.rank, "timings_s": timings, **memory.record(), **details,
                                         "training_shared_nodes": int(shared.num_shared),
                                         "training_touched_nodes": int(shared.num_touched),
                                         "bytes_communicated": collective.bytes_communicated,
                                         "gram_product_bytes_per_column": int(product_bytes)}))
        return
    path = Path(options["folder"]) / "predictions.npy"
    mark = time.perf_counter()
    predictor.write(path, chunk_size=options["chunk_size"])
    timings["predict_all"] = time.perf_counter() - mark
    memory.mark("predict_all")
    timings["total"] = time.perf_counter() - start
    result: dict[str, Any] = {"rank": collective.rank, "timings_s": timings, **memory.record(), **details,
                              "bytes_communicated": collective.bytes_communicated}
    if collective.rank == 0:
        predictions = np.load(path, mmap_mode="r")
        every = np.arange(graph.num_nodes)
        field = _field(*np.divmod(every, side), side)
        sample = rng.choice(graph.num_nodes, 200_000, replace=False) if graph.num_nodes > 200_000 else every
        result.update(
            nodes=graph.num_nodes, observed=int(observed.size), iterations=len(history), converged=history.converged,
            final_loss=float(history[-1]), gamma=float(kernel.kernel_family.gamma.detach()),
            outputscale=float(model.covar_module.outputscale.detach()), noise=float(likelihood.noise.detach()),
            predict_walkers=kernel.num_walkers, predict_p_halt=kernel.p_halt,
            touched_nodes_prediction=int(predictor.touched.size), gram_product_bytes_per_column=int(product_bytes),
            training_touched_nodes=int(shared.num_touched), training_shared_nodes=int(shared.num_shared),
            rmse_vs_field=float(np.sqrt(np.mean((predictions[sample, 0] - field[sample]) ** 2))),
            mean_sd=float(np.sqrt(predictions[sample, 1]).mean()),
            prediction_checksum=float(np.asarray(predictions[:, 0], dtype=np.float64).sum()))
    Path(out).write_text(json.dumps(result))


def rff_worker(options: dict[str, Any], out: str) -> None:
    import torch

    from gp_couple.distributed import initialise
    from gp_couple.kernels.random_features import CoupledRFFKernel
    from gp_couple.sparse_spectrum import ShardedSparseSpectrumGP

    collective = initialise("gloo", timeout=1800)
    points, dims = options["points"], options["dims"]
    block = collective.shard(points)
    # Every process generates only its rows, from a counter-based stream per block of rows.
    rows = []
    for first in range(block.start - block.start % 1_000_000, block.stop, 1_000_000):
        generator = torch.Generator().manual_seed(first)
        chunk = torch.rand(min(1_000_000, points - first), dims, generator=generator, dtype=torch.float64) * 4 - 2
        rows.append(chunk[max(block.start - first, 0):block.stop - first])
    inputs = torch.cat(rows)
    weights = torch.linspace(-1.0, 1.0, dims, dtype=torch.float64)
    targets = torch.sin(inputs @ weights) + 0.1 * torch.cos(3 * inputs[:, 0])
    model = ShardedSparseSpectrumGP(CoupledRFFKernel(num_features=options["features"], num_dims=dims, seed=0),
                                    inputs, targets, collective=collective).double()
    start = time.perf_counter()
    loss = model.loss()
    forward = time.perf_counter() - start
    loss.backward()
    step = time.perf_counter() - start
    result = {"rank": collective.rank, "points": points, "local_points": int(targets.numel()),
              "loss": float(loss.detach()), "forward_s": forward, "step_s": step, "peak_rss_gb": _peak_rss_gb(),
              "lengthscale_grad": float(model.kernel.raw_lengthscale.grad.reshape(-1)[0]),
              "bytes_communicated": collective.bytes_communicated}
    Path(out).write_text(json.dumps(result))


def launch(part: str, processes: int, options: dict[str, Any]) -> list[dict[str, Any]]:
    """Run ``part`` on ``processes`` fresh processes under torchrun; every process's JSON."""
    # Kept after the run (its path is printed): a cut-off run leaves its partial records there.
    folder = tempfile.mkdtemp(prefix=f"bench_distributed_{part}_{processes}_")
    print(f"{part}: {processes} process(es), files in {folder}", file=sys.stderr, flush=True)
    options = {**options, "folder": folder}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes),
               "--master-port", str(options["port"] + processes), __file__, "--worker", part, json.dumps(options)]
    threads = str(max(1, options["cpus"] // processes))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "NUMBA_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "OPENBLAS_NUM_THREADS": threads, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if completed.returncode:
        return [{"error": completed.stderr[-4000:]}]
    results = [json.loads(Path(folder, f"rank{rank}.json").read_text()) for rank in range(processes)]
    for result in results:
        result["launcher_wall_s"] = wall
    return results


def worker_main(part: str, options_json: str) -> None:
    options = json.loads(options_json)
    out = str(Path(options["folder"]) / f"rank{os.environ.get('RANK', '0')}.json")
    {"grf": grf_worker, "rff": rff_worker}[part](options, out)
    from gp_couple.distributed import finalise

    finalise()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", choices=("grf", "rff"), default=["grf", "rff"])
    parser.add_argument("--processes", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--grid", type=int, default=1000, help="grid side (nodes = side^2)")
    parser.add_argument("--observed", type=int, default=10_000)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--predict-walkers", type=int, default=None)
    parser.add_argument("--max-predict-walkers", type=int, default=1024)
    parser.add_argument("--predict-subset", type=int, nargs="*", default=[],
                        help="also time the prediction of the first K nodes, for each K")
    parser.add_argument("--subset-only", action="store_true",
                        help="time only the --predict-subset predictions, not the file of every node")
    parser.add_argument("--chunk-size", type=int, default=8192)
    parser.add_argument("--points", type=int, default=10_000_000)
    parser.add_argument("--dims", type=int, default=8)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1,
                        help="threads shared by the processes of one run")
    parser.add_argument("--port", type=int, default=29500,
                        help="the rendezvous of a run with P processes listens on port + P (other runs on the "
                             "machine need another)")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    options = {key: value for key, value in vars(args).items() if key not in ("parts", "processes", "json_out")}
    report: dict[str, Any] = {"benchmark": "distributed", "machine": platform.platform(), "cpus": os.cpu_count(),
                              "options": options, "runs": []}
    for part in args.parts:
        for processes in args.processes:
            report["runs"].append({"part": part, "processes": processes, "ranks": launch(part, processes, options)})
            if args.json_out:
                Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
