"""Benchmark: the memory and time of sampling graph random features where the table of walk lengths dominates.

``GraphRandomFeatures.sample`` draws every walk's length first (one table of ``rows x m``
lengths, :data:`gp_couple.features.walks.LENGTH_DTYPE`), then walks and coalesces the rows chunk
by chunk. With many walkers and short walks the table is most of the peak. Each configuration
runs in a fresh interpreter: it builds the graph, resets the peak-RSS counter, samples the walks of
every node (antithetic lengths, repelling directions: the constructor's configuration) and
reports the peak above the baseline, the table's size in the dtype the sampler stores it in, the
features' own bytes and the wall time. Run it from two checkouts (``PYTHONPATH``) to compare them:

    python benchmarks/bench_walk_lengths.py --graph icosphere:5 --walkers 2048 8192 \\
        --json-out benchmarks/results/walk_lengths.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import dispatch_worker, emit_report, peak_increase, reset_peak, run_in_subprocess  # noqa: E402


def sample_walks(graph_spec: str, walkers: int, p_halt: float) -> dict[str, Any]:
    """Peak memory and time of sampling the features of every node of ``graph_spec``."""
    import numpy as np

    import gp_couple
    from gp_couple.datasets import resolve_graph
    from gp_couple.features.graph_random_features import GraphRandomFeatures
    from gp_couple.features.walks import sample_walk_lengths

    graph = resolve_graph(graph_spec)
    GraphRandomFeatures.sample(graph, 2, p_halt, "antithetic", seed=0, directions="repelling",
                               start_nodes=np.arange(min(64, graph.num_nodes)))  # compiled before the peak is reset
    # Read off a sampled table rather than a constant, so that checkouts from before LENGTH_DTYPE run too.
    table_itemsize = sample_walk_lengths(graph, 2, p_halt, "antithetic", seed=0, start_nodes=[0])[1].itemsize
    baseline = reset_peak()
    start = time.perf_counter()
    features = GraphRandomFeatures.sample(graph, walkers, p_halt, "antithetic", seed=1, directions="repelling")
    seconds = time.perf_counter() - start
    return {"graph": graph_spec, "rows": features.num_rows, "walkers": walkers, "p_halt": p_halt,
            "code": os.path.dirname(os.path.dirname(os.path.abspath(gp_couple.__file__))),
            "table_gb": features.num_rows * walkers * table_itemsize / 1e9, "features_gb": features.nbytes() / 1e9,
            "entries": features.num_entries, "peak_increase_gb": peak_increase(baseline), "seconds": seconds}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", default="icosphere:5")
    parser.add_argument("--walkers", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--p-halt", type=float, default=0.5,
                        help="termination probability (0.5: one step a walk on average, so the table dominates)")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    rows = []
    for walkers in args.walkers:
        row = run_in_subprocess(__file__, sample_walks, args.graph, walkers, args.p_halt)
        print(row, file=sys.stderr, flush=True)
        rows.append(row)
    return emit_report({"benchmark": "walk_lengths", "machine": platform.platform(), "cpus": os.cpu_count(),
                        "rows": rows}, args.json_out)


if __name__ == "__main__":
    if not dispatch_worker(sys.argv[1:], globals()):
        main()
