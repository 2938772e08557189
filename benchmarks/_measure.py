"""Measurement helpers shared by the benchmarks: peak memory, fresh-process workers and best CPU times.

Each measured configuration runs in a fresh interpreter (``python bench.py --worker
NAME ARGS_JSON``) so that its peak resident memory is its own; the peak is reset with
``/proc/self/clear_refs`` (Linux) just before the measured work starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def memory_gb(field: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in GB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) / 1e6
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> float:
    """Reset the peak-RSS counter and return the current RSS in GB (the baseline)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    return memory_gb("VmRSS")


def peak_increase(baseline: float) -> float:
    """Peak RSS since :func:`reset_peak`, above ``baseline``, in GB."""
    return max(memory_gb("VmHWM") - baseline, 0.0)


def run_in_subprocess(script: str, function: Callable[..., dict[str, Any]], *args: Any,
                      stream_stderr: bool = False) -> dict[str, Any]:
    """Run ``function(*args)`` of ``script`` in a fresh interpreter; its dict, or ``{"error": ...}``.

    With ``stream_stderr`` the worker's standard error is copied to this process's as it
    arrives (progress lines of long rows, which a run stopped at its budget would otherwise
    lose); its last line is still the error reported when the worker fails.
    """
    command = [sys.executable, script, "--worker", function.__name__, json.dumps(args)]
    if not stream_stderr:
        completed = subprocess.run(command, capture_output=True, text=True)
        returncode, stdout, lines = completed.returncode, completed.stdout, completed.stderr.strip().splitlines()
    else:
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as worker:
            lines = []
            # stdout carries one JSON line: it cannot fill its pipe while stderr is read to its end.
            for line in worker.stderr:
                sys.stderr.write(line)
                sys.stderr.flush()
                lines = [line.strip()] if line.strip() else lines  # only the last one is reported
            stdout, returncode = worker.stdout.read(), worker.wait()
    if returncode:
        return {"error": lines[-1] if lines else f"exit code {returncode}"}
    return json.loads(stdout.strip().splitlines()[-1])


def dispatch_worker(argv: list[str], namespace: dict[str, Any]) -> bool:
    """Handle ``--worker NAME ARGS_JSON``: run it, print its JSON and return ``True``."""
    if not argv or argv[0] != "--worker":
        return False
    print(json.dumps(namespace[argv[1]](*json.loads(argv[2]))))
    return True


def emit_report(report: dict[str, Any], json_out: str | None) -> dict[str, Any]:
    """Print ``report`` as indented JSON and, if given, write it to ``json_out``."""
    text = json.dumps(report, indent=2)
    print(text)
    if json_out:
        os.makedirs(os.path.dirname(os.path.abspath(json_out)), exist_ok=True)
        with open(json_out, "w") as out:
            out.write(text + "\n")
    return report


def best_cpu(function: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """The least process CPU time of ``repeats`` calls of ``function``, and the last call's result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.process_time()
        result = function()
        best = min(best, time.process_time() - start)
    return best, result
