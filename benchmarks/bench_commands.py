"""Benchmark: how long the commands a new user runs first take (the README quotes these).

Each entry runs as a fresh process, as the user would start it, from the repository root:

* ``gp-couple --help`` (several repeats; the median is reported) against a baseline
  measured in the same run: ``python -c "import torch, gpytorch"``, the heavy imports
  that ``--help`` used to pay before the package imported them lazily;
* ``gp-couple demo`` with its defaults;
* every tutorial in ``--quick`` (smoke, what CI runs) and full mode, figures written to
  a temporary folder.

For every run: wall-clock seconds, CPU seconds of the process tree (user + system, from
``getrusage(RUSAGE_CHILDREN)``), the exit status, and the 1-minute load average before and
after (the machine is shared: compare wall times only at similar load; CPU seconds are
steadier). A reference workload timed in the same run (a fixed single-threaded NumPy
computation) gives every wall time a machine-independent ratio.

Run: ``python benchmarks/bench_commands.py --json-out benchmarks/results/commands.json``
(``--only demo tutorial:mesh_interpolation:quick`` to select entries; ``--data-dir`` for
the tutorials that read the shared datasets).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402

from gp_couple.progress import progress  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ("graph_random_features", "mesh_interpolation", "sparse_spectrum_gp", "swap_rff_kernel",
             "traffic_regression", "choosing_a_coupling", "pyro_nuts")
#: Tutorials that read the shared datasets (given --data-dir).
NEEDS_DATA = {"swap_rff_kernel", "traffic_regression"}
#: Tutorials without an --output option (no figures).
NO_OUTPUT = {"pyro_nuts"}


def reference_seconds() -> float:
    """Seconds of a fixed single-threaded NumPy workload (best of 3): the machine's speed now."""
    import numpy as np

    rng = np.random.default_rng(0)
    data = rng.standard_normal(2_000_000)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(20):
            np.sort(data)
        best = min(best, time.perf_counter() - start)
    return best


def timed(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run ``command`` once; wall and CPU seconds, exit status, load before and after."""
    load_before = os.getloadavg()[0]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    result = {"wall_seconds": round(wall, 3), "cpu_seconds": round(cpu, 3), "returncode": completed.returncode,
              "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}
    if completed.returncode:
        lines = completed.stderr.strip().splitlines()
        result["error"] = lines[-1] if lines else ""
    return result


def entries(data_dir: str | None, output: Path) -> dict[str, list[str]]:
    """Every benchmark entry: name -> command line."""
    python = sys.executable
    table = {"help": [python, "-m", "gp_couple", "--help"],
             "help-baseline:import-torch-gpytorch": [python, "-c", "import torch, gpytorch"],
             "demo": [python, "-m", "gp_couple", "demo"]}
    for name in TUTORIALS:
        for mode in ("quick", "full"):
            command = [python, f"tutorials/{name}.py"] + (["--quick"] if mode == "quick" else [])
            if name not in NO_OUTPUT:
                command += ["--output", str(output / f"{name}_{mode}")]
            if name in NEEDS_DATA and data_dir:
                command += ["--data-dir", data_dir]
            table[f"tutorial:{name}:{mode}"] = command
    return table


def markdown_table(report: dict[str, Any]) -> str:
    """The RESULTS.md table of a report (``--markdown FILE.json`` prints it)."""
    lines = ["| entry | command | wall (s) | CPU (s) | load before / after | wall / reference |",
             "|---|---|---|---|---|---|"]
    for row in report["results"]:
        loads = " / ".join(f"{row['runs'][0][key]:.1f}" for key in ("load_before", "load_after"))
        failed = " (failed)" if any(run["returncode"] for run in row["runs"]) else ""
        lines.append(f"| {row['name']}{failed} | `{row['command']}` | {row['wall_seconds']:.2f} | "
                     f"{row['cpu_seconds']:.2f} | {loads} | {row['wall_vs_reference']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=None, help="entry names to run (default: all)")
    parser.add_argument("--help-repeats", type=int, default=5, help="repeats of the --help entries")
    parser.add_argument("--data-dir",
                        default=os.environ.get("GP_COUPLE_DATA", str(ROOT.parent / "shared" / "datasets")))
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--markdown", metavar="JSON", default=None,
                        help="print the RESULTS.md table of a saved report and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        with open(args.markdown) as saved:
            report = json.load(saved)
        print(markdown_table(report))
        return report
    env = {**os.environ, "GP_COUPLE_DATA": args.data_dir}
    output = Path(tempfile.mkdtemp(prefix="bench_commands_"))
    table = entries(args.data_dir, output)
    unknown = set(args.only or ()) - set(table)
    if unknown:
        parser.error(f"unknown entries {sorted(unknown)}; choose from {sorted(table)}")
    reference = reference_seconds()
    results: list[dict[str, Any]] = []
    report = {"benchmark": "commands",
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version(), "reference_seconds": round(reference, 3)},
              "notes": ["wall_seconds: median over runs; cpu_seconds: user + system of the process tree",
                        "wall_vs_reference: wall time over the reference NumPy workload timed in the same run",
                        "load_before/after: 1-minute load average (the machine is shared)"],
              "results": results}
    try:
        selected = [(name, command) for name, command in table.items() if not args.only or name in args.only]
        for name, command in progress(selected, description="commands", unit="command"):
            repeats = args.help_repeats if name.startswith("help") else 1
            runs = [timed(command, env) for _ in range(repeats)]
            wall = statistics.median(run["wall_seconds"] for run in runs)
            results.append({"name": name, "command": " ".join(Path(part).name if part == sys.executable else part
                                                              for part in command).replace(str(output), "OUT"),
                            "wall_seconds": wall, "wall_vs_reference": round(wall / reference, 2),
                            "cpu_seconds": statistics.median(run["cpu_seconds"] for run in runs),
                            "runs": runs})
            print(f"{name}: {wall:.2f} s wall", file=sys.stderr, flush=True)
            if args.json_out:  # after every entry: an interrupted run keeps what it measured
                Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    finally:
        shutil.rmtree(output, ignore_errors=True)
    return emit_report(report, args.json_out)


if __name__ == "__main__":
    main()
