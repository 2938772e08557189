"""Benchmark: the GRF walk sampler and feature build against baselines measured in the same run.

For each graph and termination probability (m walkers per node) this measures, each in
a fresh subprocess so that peak memory is clean:

* ``ceiling``: a compiled loop doing only the random neighbour gathers
  ``indices[indptr[cur] + floor(u * deg[cur])]`` for the same walk lengths and the same
  random stream, and nothing else (no loads, no output);
* ``sample``: gp_couple's sampler kernel writing the full per-step decomposition for the
  same lengths into output buffers allocated (and touched) beforehand, as the ceiling's
  sink is; ``sample_vs_ceiling`` = ceiling time / sample time. ``sample_api_s`` is
  ``walk_with_lengths`` end to end, including the allocation of a fresh output;
* ``build``: ``GraphRandomFeatures.sample`` end to end (lengths, walks, coalesced Φ_t,
  weights in ``--dtype``), with its peak resident-memory increase (cold: first build in
  a fresh process; warm: best of ``--repeats`` further builds);
* ``numpy``: the obvious vectorised NumPy prototype (all walkers advance together, one
  NumPy gather per step, Φ_t assembled by scipy), time and peak memory;
* ``fast_graph_gp``: fast-graph-gp's walk loop (``grf_gp.sampler._run_walks``, its
  per-process kernel including its per-step accumulation) on a random subset of start
  nodes with the same N, m, p_halt and maximum length, extrapolated per node; and, where
  the graph is small enough (``--fgg-full-limit``), its complete multi-process
  ``GRFSampler`` on all nodes.

All compared runs use the same maximum walk length (``--max-length``, default: the
0.999999-quantile of the length distribution). Prints one JSON document.

With ``--proposals`` it measures instead the neighbour proposals and direction couplings
on weighted graphs (procedural graphs get i.i.d. log-normal edge weights with
``--weight-sigma``; ``traffic`` is the San Jose highway graph): the sampler kernel's walk
steps per second with the uniform and the weighted proposal, each with independent and
repelling directions, on the same lengths, the variants alternated within each repeat
(best of ``--repeats``), and ratios to uniform independent walks; and the whole feature build
(``GraphRandomFeatures.sample`` with the weighted proposal: lengths, walks and coalescing) with
independent and with repelling directions, in seconds. ``--rows`` takes that many evenly spaced
start nodes instead of every node (many walkers per node on a large graph).

Run: ``python benchmarks/bench_walks.py --json-out benchmarks/results/walks_float32.json``
or ``python benchmarks/bench_walks.py --proposals --graphs grid:316x316 traffic --json-out
benchmarks/results/walks_proposals.json``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import dispatch_worker, emit_report, peak_increase, reset_peak, run_in_subprocess  # noqa: E402


def _graph(spec: str):
    from gp_couple.datasets import resolve_graph

    return resolve_graph(spec)


def _weighted_graph(spec: str, sigma: float):
    """``traffic``: the San Jose graph; otherwise ``spec`` with i.i.d. log-normal(0, sigma) edge weights."""
    from gp_couple.graphs import Graph

    if spec == "traffic":
        from gp_couple.datasets import load_traffic

        return load_traffic().graph
    graph = _graph(spec)
    upper = graph.adjacency.tocoo()
    keep = upper.row < upper.col
    weights = np.random.default_rng(0).lognormal(0.0, sigma, int(keep.sum()))
    return Graph.from_edges(np.stack([upper.row[keep], upper.col[keep]], axis=1), weights=weights,
                            num_nodes=graph.num_nodes)


def measure_proposals(spec: str, p_halt: float, walkers: int, max_length: int, repeats: int,
                      sigma: float, rows: int | None = None) -> dict[str, Any]:
    import torch

    from gp_couple.couplings import IIDWalkLengthCoupling
    from gp_couple.couplings.proposals import get_proposal
    from gp_couple.features import GraphRandomFeatures, _walk_compiled as compiled

    graph = _weighted_graph(spec, sigma)
    starts = np.arange(graph.num_nodes, dtype=np.int64)
    if rows is not None and rows < starts.size:
        starts = starts[np.linspace(0, starts.size - 1, rows).round().astype(np.int64)]
    lengths = np.minimum(IIDWalkLengthCoupling().sample_lengths(starts.size, walkers, p_halt, seed=1),
                         max_length)
    steps = int(lengths.sum())
    indptr = np.zeros(starts.size + 1, dtype=np.int64)
    np.cumsum(1 + lengths.sum(axis=1), out=indptr[1:])
    outputs = (np.zeros(int(indptr[-1]), dtype=graph.indices.dtype), np.zeros(int(indptr[-1]), dtype=np.uint16),
               np.zeros(int(indptr[-1]), dtype=np.float64))
    variants = {}
    for proposal in ("uniform", "weighted"):
        tables = get_proposal(proposal).tables(graph)
        for directions, repelling in (("independent", False), ("repelling", True)):
            def run(tables=tables, repelling=repelling) -> None:
                compiled.walk_rows(graph.indptr, graph.indices, tables.ratios, tables.node_scales, tables.cumulative,
                                  tables.choice_degrees, starts, lengths, 7, 1.0 / (1.0 - p_halt),
                                  1.0 / walkers, repelling, indptr, *outputs, compiled.pool_size())

            run()  # compile / load from the numba cache, touch the outputs
            variants[f"{proposal}_{directions}"] = run
    for directions in ("independent", "repelling"):
        def build(directions=directions) -> None:
            GraphRandomFeatures.sample(graph, walkers, p_halt, seed=1, max_length=max_length, start_nodes=starts,
                                       dtype=torch.float32, proposal="weighted", directions=directions)

        build()
        variants[f"build_{directions}"] = build
    best = {name: math.inf for name in variants}
    for _ in range(repeats):
        # Alternating the variants spreads the machine's load drift over all of them.
        for name, run in variants.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    weights = graph.weights
    result: dict[str, Any] = {
        "graph": spec, "nodes": graph.num_nodes, "edges": graph.num_edges, "p_halt": p_halt,
        "walkers": walkers, "max_length": max_length, "start_nodes": int(starts.size), "walk_steps": steps,
        "weights": "San Jose traffic" if spec == "traffic" else f"lognormal(0, {sigma:g})",
        "weight_range": [float(weights.min()), float(weights.max())]}
    builds = {name: best.pop(name) for name in list(best) if name.startswith("build_")}
    for name, seconds in best.items():
        result[f"{name}_steps_per_s"] = steps / seconds
    baseline = result["uniform_independent_steps_per_s"]
    for name in best:
        if name != "uniform_independent":
            result[f"{name}_vs_uniform"] = result[f"{name}_steps_per_s"] / baseline
    for name, seconds in builds.items():
        result[f"{name}_s"] = seconds
    result["build_repelling_vs_independent_s"] = builds["build_repelling"] / builds["build_independent"]
    return result


def default_max_length(p_halt: float) -> int:
    return int(math.ceil(math.log(1e-6) / math.log1p(-p_halt)))


def numpy_prototype(graph, lengths: np.ndarray, p_halt: float, seed: int):
    """All walkers step together; one NumPy gather per step; Φ_t as scipy matrices."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    rows, walkers = lengths.shape
    indptr, indices, degrees = graph.indptr, graph.indices, graph.degrees
    ratios = graph.normalized_weights() * np.repeat(degrees, degrees)
    walker_rows = np.repeat(np.arange(rows), walkers)
    remaining = lengths.ravel().copy()
    current = walker_rows.copy()
    load = np.full(current.size, 1.0 / walkers)
    step_matrices = [sp.identity(rows, format="csr")]
    step = 0
    alive = np.flatnonzero(remaining > 0)
    while alive.size:
        step += 1
        edge = indptr[current[alive]] + (rng.random(alive.size) * degrees[current[alive]]).astype(np.int64)
        load[alive] *= ratios[edge] / (1 - p_halt)
        current[alive] = indices[edge]
        step_matrices.append(sp.csr_matrix((load[alive], (walker_rows[alive], current[alive])),
                                           shape=(rows, graph.num_nodes)))
        remaining[alive] -= 1
        alive = alive[remaining[alive] > 0]
    return step_matrices


def measure(spec: str, p_halt: float, walkers: int, max_length: int, fgg_nodes: int,
            fgg_full_limit: int, repeats: int, dtype_name: str = "float64") -> dict[str, Any]:
    import torch

    from gp_couple.couplings import IIDWalkLengthCoupling
    from gp_couple.couplings.proposals import get_proposal
    from gp_couple.features import _walk_compiled as compiled
    from gp_couple.features.graph_random_features import GraphRandomFeatures
    from gp_couple.features.walks import walk_with_lengths

    dtype = getattr(torch, dtype_name)
    graph = _graph(spec)
    starts = np.arange(graph.num_nodes, dtype=np.int64)
    # Warm-up: load the compiled loops from the numba cache.
    GraphRandomFeatures.sample(graph, 2, p_halt, seed=0, start_nodes=starts[:10])
    walk_with_lengths(graph, np.ones((10, 2), dtype=np.int64), p_halt, start_nodes=starts[:10])
    sink = np.empty(10, dtype=np.int64)
    compiled.gather_ceiling(graph.indptr, graph.indices, graph.degrees, starts[:10],
                           np.ones((10, 2), dtype=np.int64), 1, sink)
    lengths = np.minimum(IIDWalkLengthCoupling().sample_lengths(graph.num_nodes, walkers, p_halt, seed=1), max_length)
    steps = int(lengths.sum())
    result: dict[str, Any] = {"graph": spec, "nodes": graph.num_nodes, "edges": graph.num_edges,
                              "p_halt": p_halt, "walkers": walkers, "max_length": max_length,
                              "walk_steps": steps}

    def best_of(function) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            function()
            times.append(time.perf_counter() - start)
        return min(times)

    sink = np.empty(graph.num_nodes, dtype=np.int64)
    ceiling = best_of(lambda: compiled.gather_ceiling(graph.indptr, graph.indices, graph.degrees,
                                                      starts, lengths, 7, sink))
    # The sampler kernel writing into output buffers that were allocated and touched
    # once, like the ceiling's sink: first-touch page faults of a fresh ~200 MB output
    # vary several-fold between runs on this VM and are not sampling work.
    indptr = np.zeros(graph.num_nodes + 1, dtype=np.int64)
    np.cumsum(1 + lengths.sum(axis=1), out=indptr[1:])
    outputs = (np.zeros(int(indptr[-1]), dtype=graph.indices.dtype), np.zeros(int(indptr[-1]), dtype=np.uint16),
               np.zeros(int(indptr[-1]), dtype=np.float64))
    tables = get_proposal("uniform").tables(graph)
    sample = best_of(lambda: compiled.walk_rows(graph.indptr, graph.indices, tables.ratios, tables.node_scales,
                                               tables.cumulative, tables.choice_degrees, starts, lengths, 7,
                                               1.0 / (1.0 - p_halt), 1.0 / walkers, False, indptr, *outputs,
                                               compiled.pool_size()))
    sample_api = best_of(lambda: walk_with_lengths(graph, lengths, p_halt, seed=7))
    result.update(ceiling_s=ceiling, sample_s=sample, sample_vs_ceiling=ceiling / sample,
                  sample_steps_per_s=steps / sample, ceiling_steps_per_s=steps / ceiling,
                  sample_api_s=sample_api)

    baseline = reset_peak()
    start = time.perf_counter()
    features = GraphRandomFeatures.sample(graph, walkers, p_halt, seed=3, max_length=max_length,
                                          dtype=dtype)
    build_cold = time.perf_counter() - start
    build_peak = peak_increase(baseline)
    result.update(build_cold_s=build_cold, build_peak_gb=build_peak, features_gb=features.nbytes() / 1e9,
                  feature_entries=features.num_entries, feature_nnz=features.nnz,
                  num_terms=features.num_terms)
    del features
    result["build_warm_s"] = best_of(lambda: GraphRandomFeatures.sample(
        graph, walkers, p_halt, seed=3, max_length=max_length, dtype=dtype))
    result["dtype"] = dtype_name
    return result


def measure_numpy(spec: str, p_halt: float, walkers: int, max_length: int) -> dict[str, Any]:
    from gp_couple.couplings import IIDWalkLengthCoupling

    graph = _graph(spec)
    lengths = np.minimum(IIDWalkLengthCoupling().sample_lengths(graph.num_nodes, walkers, p_halt, seed=1), max_length)
    baseline = reset_peak()
    start = time.perf_counter()
    matrices = numpy_prototype(graph, lengths, p_halt, seed=5)
    elapsed = time.perf_counter() - start
    return {"numpy_s": elapsed, "numpy_peak_gb": peak_increase(baseline), "numpy_steps": len(matrices)}


def measure_fast_graph_gp(spec: str, p_halt: float, walkers: int, max_length: int, fgg_nodes: int,
                          fgg_full_limit: int) -> dict[str, Any]:
    try:
        import grf_gp.sampler as fgg
        import torch
    except ImportError:
        return {"fast_graph_gp": "not installed (pip install -e '.[bench]')"}
    graph = _graph(spec)
    crow, col = graph.indptr, graph.indices.astype(np.int64)
    data = graph.normalized_weights()
    fgg._init_worker(crow, col, data)
    subset = np.random.default_rng(0).choice(graph.num_nodes, min(fgg_nodes, graph.num_nodes), replace=False)
    start = time.perf_counter()
    # fast-graph-gp records positions 0..max_walk_length-1, i.e. at most max_walk_length - 1 moves.
    fgg._run_walks(subset, walkers, p_halt, max_length + 1, 0, False)
    per_node = (time.perf_counter() - start) / subset.size
    result: dict[str, Any] = {"fgg_subset_nodes": int(subset.size), "fgg_per_node_s": per_node,
                              "fgg_extrapolated_one_process_s": per_node * graph.num_nodes}
    if graph.num_nodes <= fgg_full_limit:
        adjacency = torch.sparse_csr_tensor(torch.from_numpy(crow), torch.from_numpy(col),
                                            torch.from_numpy(data), size=(graph.num_nodes,) * 2)
        sampler = fgg.GRFSampler(adjacency, walks_per_node=walkers, p_halt=p_halt,
                                 max_walk_length=max_length + 1, seed=0, use_tqdm=False,
                                 n_processes=os.cpu_count())
        start = time.perf_counter()
        sampler()
        result["fgg_full_sampler_s"] = time.perf_counter() - start
        result["fgg_processes"] = os.cpu_count()
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if dispatch_worker(argv, globals()):
        return {}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", nargs="+", default=["grid:316x316", "grid:1000x1000", "icosphere:6"])
    parser.add_argument("--p-halt", nargs="+", type=float, default=[0.1, 0.5])
    parser.add_argument("--walkers", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fgg-nodes", type=int, default=2000, help="fast-graph-gp subset size")
    parser.add_argument("--fgg-full-limit", type=int, default=100_000,
                        help="run fast-graph-gp's full sampler on graphs up to this many nodes")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                        help="weights of the built features (float32: the GP default)")
    parser.add_argument("--skip-numpy", action="store_true")
    parser.add_argument("--proposals", action="store_true",
                        help="measure neighbour proposals and repelling walks on weighted graphs instead")
    parser.add_argument("--weight-sigma", type=float, default=1.0,
                        help="log-normal sigma of the edge weights given to procedural graphs (--proposals)")
    parser.add_argument("--rows", type=int, default=None,
                        help="start nodes, evenly spaced (--proposals; default: every node)")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    rows = []
    for spec in args.graphs:
        for p_halt in args.p_halt:
            max_length = args.max_length or default_max_length(p_halt)
            if args.proposals:
                row = run_in_subprocess(__file__, measure_proposals, spec, p_halt, args.walkers, max_length,
                                        args.repeats, args.weight_sigma, args.rows)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
                continue
            row = run_in_subprocess(__file__, measure, spec, p_halt, args.walkers, max_length,
                                    args.fgg_nodes, args.fgg_full_limit, args.repeats, args.dtype)
            if not args.skip_numpy:
                row.update(run_in_subprocess(__file__, measure_numpy, spec, p_halt, args.walkers,
                                             max_length))
                row["build_speedup_vs_numpy"] = row["numpy_s"] / row["build_cold_s"]
            row.update(run_in_subprocess(__file__, measure_fast_graph_gp, spec, p_halt, args.walkers,
                                         max_length, args.fgg_nodes, args.fgg_full_limit))
            if "fgg_per_node_s" in row:
                row["speedup_vs_fgg_one_process"] = row["fgg_extrapolated_one_process_s"] / row["build_warm_s"]
            if "fgg_full_sampler_s" in row:
                row["speedup_vs_fgg_full_sampler"] = row["fgg_full_sampler_s"] / row["build_warm_s"]
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    report = {"benchmark": "walk_proposals" if args.proposals else "walks",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "platform": platform.platform()},
              "results": rows}
    return emit_report(report, args.json_out)


if __name__ == "__main__":
    main()
