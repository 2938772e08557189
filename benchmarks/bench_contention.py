"""How a run slows down when other processes compete for the CPU, with and without bounded thread pools.

Run: ``python benchmarks/bench_contention.py [--workload short|demo|lapack] [--competitors K]
[--threads N ...] [--env NAME=VALUE ...] [--json-out benchmarks/results/contention.json]``.

For each thread setting (``default``: the pools as the libraries size them, i.e. every
CPU of the process; ``N``: the run inside :func:`gp_couple.settings.threads`), the
workload runs in a fresh interpreter twice: *quiet* (next to one probe process) and
*loaded* (next to the probe and ``K`` competitors). Probe and competitors are
single-threaded busy loops that end when the workload ends (or after a time bound),
local processes only. Measured per run: the workload's wall time and CPU time (its
``rusage``), and the probe's CPU rate (CPU seconds per wall second), which is the share
of a core that one runnable thread gets at that load.

A run that loses CPU only in proportion to the competition slows by the *fair* factor
``probe share quiet / probe share loaded``; the reported ``ratio_to_fair_share`` is the
observed slowdown divided by that factor (1 = proportional; above 1 = worse than its
share, e.g. thread pools busy-waiting for a descheduled worker). ``cpu_inflation`` is
loaded CPU time over quiet CPU time (spinning burns CPU without progress).

Workloads: ``short`` (default, about 10 s of CPU on a quiet core) samples GRF walks on the
built-in mesh (numba), trains a GRF-GP for 30 Adam steps with CG/Lanczos (torch) and
solves a dense 800 x 800 eigenproblem (LAPACK/BLAS); ``demo`` runs ``python -m gp_couple
demo`` as a user starts it, with its defaults (``--threads N`` for a thread count N;
minutes); ``lapack`` factorises and inverts a 1,500 x 1,500 SPD
matrix ten times through scipy (OpenBLAS's threaded potrf and potri). ``--env`` sets
environment variables of the workload's interpreter (e.g. ``OPENBLAS_THREAD_TIMEOUT=4``, or
``GOMP_SPINCOUNT=10000`` in place of the commands' own setting), read when its libraries load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import emit_report  # noqa: E402

#: A single-threaded busy loop that stops when its stop file appears (or at its time
#: bound) and prints its CPU and wall seconds.
_BUSY = """
import os, sys, time, json
stop, bound = sys.argv[1], float(sys.argv[2])
start, cpu0 = time.monotonic(), time.process_time()
while time.monotonic() - start < bound and not os.path.exists(stop):
    for _ in range(20000):
        pass
print(json.dumps({"cpu": time.process_time() - cpu0, "wall": time.monotonic() - start}))
"""

_SHORT = """
import numpy as np, scipy.linalg, torch, gpytorch
from gp_couple import GRFKernel, GraphGP, fit_gp, grf_gp_settings
from gp_couple.datasets import default_mesh
mesh = default_mesh()
kernel = GRFKernel(mesh.graph, num_walkers=32, p_halt=0.2, seed=0, schedule=None)
train = np.arange(0, mesh.graph.num_nodes, 2)
model = GraphGP(train, torch.as_tensor(mesh.targets[train], dtype=torch.float32),
                gpytorch.likelihoods.GaussianLikelihood(), gpytorch.kernels.ScaleKernel(kernel))
with grf_gp_settings(max_cholesky_size=0):
    fit_gp(model, model.likelihood, iterations=30, lr=0.05, seed=0)
matrix = np.random.default_rng(0).standard_normal((800, 800))
scipy.linalg.eigh(matrix + matrix.T)
"""

_LAPACK = """
import numpy as np, scipy.linalg
vectors = np.random.default_rng(0).standard_normal((1500, 1600))
matrix = vectors @ vectors.T / 1600 + np.eye(1500)
for _ in range(10):
    factor = scipy.linalg.cholesky(matrix, lower=True)
    scipy.linalg.lapack.dpotri(factor, lower=True)
"""

_WORKLOADS = {"short": _SHORT, "demo": None, "lapack": _LAPACK}


def _command(workload: str, threads: int | None) -> list[str]:
    """The workload's command line: the demo as a user starts it (the CLI sets up its process
    before torch loads, and bounds its pools with ``--threads``), the others in a driver
    inside :func:`gp_couple.settings.threads`."""
    if workload == "demo":
        return [sys.executable, "-m", "gp_couple", "--quiet", "demo", "--json",
                *([] if threads is None else ["--threads", str(threads)])]
    indented = "\n".join("    " + line for line in _WORKLOADS[workload].strip().splitlines())
    return [sys.executable, "-c", f"from gp_couple.settings import threads\nwith threads({threads!r}):\n{indented}\n"]


def _start_busy(stop: str, bound: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _BUSY, stop, str(bound)], stdout=subprocess.PIPE, text=True)


def measure(workload: str, threads: int | None, competitors: int, bound: float,
            environment: dict[str, str] | None = None) -> dict[str, Any]:
    """One run of the workload next to a probe and ``competitors`` busy loops (``environment`` added to its own)."""
    with tempfile.TemporaryDirectory() as folder:
        stop = os.path.join(folder, "stop")
        probe = _start_busy(stop, bound)
        others = [_start_busy(stop, bound) for _ in range(competitors)]
        time.sleep(0.5)  # let the load settle before the workload starts
        start = time.perf_counter()
        process = subprocess.Popen(_command(workload, threads),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, **(environment or {})})
        stderr = process.stderr.read() if process.stderr else ""
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        Path(stop).touch()
        probe_report = json.loads(probe.communicate()[0])
        for other in others:
            other.communicate()
    if process.returncode:
        raise RuntimeError(f"workload failed ({process.returncode}): {stderr.strip().splitlines()[-1:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "probe_share": probe_report["cpu"] / probe_report["wall"]}


def summarise(threads: int | str | None, quiet: dict[str, float], loaded: dict[str, float]) -> dict[str, Any]:
    """Ratios of a quiet and a loaded run of one thread setting.

    ``share_seconds`` (wall time x probe share) is the wall time rescaled to a run that
    had one core to itself: it compares thread settings measured at different
    background loads.
    """
    slowdown = loaded["wall_s"] / quiet["wall_s"]
    fair = quiet["probe_share"] / loaded["probe_share"]
    for run in (quiet, loaded):
        run["share_seconds"] = run["wall_s"] * run["probe_share"]
    return {"threads": "default" if threads is None else threads, "quiet": quiet, "loaded": loaded,
            "slowdown": slowdown, "fair_slowdown": fair, "ratio_to_fair_share": slowdown / fair,
            "cpu_inflation": loaded["cpu_s"] / quiet["cpu_s"]}


def compare(workload: str, threads: int | None, competitors: int, bound: float,
            environment: dict[str, str] | None = None) -> dict[str, Any]:
    """Quiet and loaded runs of one thread setting, and their ratios."""
    quiet = measure(workload, threads, 0, bound, environment)
    print(f"threads={threads or 'default'} quiet: {quiet}", file=sys.stderr, flush=True)
    loaded = measure(workload, threads, competitors, bound, environment)
    print(f"threads={threads or 'default'} loaded: {loaded}", file=sys.stderr, flush=True)
    return summarise(threads, quiet, loaded)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=tuple(_WORKLOADS), default="short")
    parser.add_argument("--competitors", type=int, default=None,
                        help="busy loops of the loaded runs (default: 4 per available CPU)")
    parser.add_argument("--threads", nargs="+", default=["default", "1"],
                        help="thread settings to compare: 'default' or a count")
    parser.add_argument("--bound", type=float, default=3600.0, help="seconds after which busy loops stop")
    parser.add_argument("--env", nargs="*", default=[], metavar="NAME=VALUE",
                        help="environment variables of the workload's interpreter")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    from gp_couple.settings import available_cpus

    cpus = available_cpus()
    competitors = 4 * cpus if args.competitors is None else args.competitors
    settings = [None if value == "default" else int(value) for value in args.threads]
    if any("=" not in item for item in args.env):
        parser.error("--env takes NAME=VALUE items")
    environment = dict(item.split("=", 1) for item in args.env)
    results = [compare(args.workload, threads, competitors, args.bound, environment) for threads in settings]
    report = {"benchmark": "contention", "workload": args.workload, "environment": environment,
              "available_cpus": cpus,
              "competitors": competitors, "load_average_at_end": list(os.getloadavg()),
              "results": results,
              "notes": ["ratio_to_fair_share = (loaded wall / quiet wall) / (probe share quiet / probe share "
                        "loaded); 1 means the run slowed in proportion to the CPU it lost",
                        "share_seconds = wall x probe share: the wall time rescaled to one core of one's own, "
                        "comparable across thread settings measured at different background loads",
                        "other processes on the machine (load_average_at_end) are part of both the quiet "
                        "and the loaded runs"]}
    return emit_report(report, args.json_out)


if __name__ == "__main__":
    main()
