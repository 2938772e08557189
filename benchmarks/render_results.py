"""Render the JSON files of ``benchmarks/results/`` as the markdown tables of RESULTS.md / README.

Run: ``python benchmarks/render_results.py [SECTION ...]`` with sections ``walks``,
``graph_gp``, ``grf_gram``, ``pagerank``, ``mesh``, ``traffic`` (default: all present).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

RESULTS = Path(__file__).resolve().parent / "results"


def _load(name: str) -> Any:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


def _cell(value: Any, digits: int = 3) -> str:
    if isinstance(value, dict) and "mean" in value:
        se = value.get("se")
        return f"{value['mean']:.{digits}g} ± {se:.1g}" if se is not None else f"{value['mean']:.{digits}g}"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return "–" if value is None else str(value)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def walks() -> str:
    parts = []
    for name in ("walks_float32.json", "walks_float64.json"):
        report = _load(name)
        if not report:
            continue
        rows = [[r["graph"], r["p_halt"], f"{r['walk_steps'] / 1e6:.1f} M", r["sample_vs_ceiling"],
                 r["build_cold_s"], r["build_warm_s"], r["build_peak_gb"], r.get("numpy_s"),
                 r.get("numpy_peak_gb"), r.get("fgg_full_sampler_s"), r.get("speedup_vs_fgg_full_sampler"),
                 r.get("speedup_vs_fgg_one_process")] for r in report["results"]]
        parts.append(f"weights {report['results'][0]['dtype']} (`{name}`):\n\n" + _table(
            ["graph", "p_halt", "walk steps", "sample / ceiling", "build cold (s)", "build warm (s)",
             "build peak (GB)", "NumPy (s)", "NumPy peak (GB)", "fast-graph-gp full (s)",
             "× vs fgg full", "× vs fgg 1-process"], rows))
    return "\n\n".join(parts)


def graph_gp() -> str:
    report = _load("graph_gp.json")
    if not report:
        return ""
    rows = []
    for r in report["results"]:
        for method in ("grf", "exact"):
            m = r.get(method)
            if not m or "error" in m:
                if m:
                    rows.append([r["graph"], r.get("nodes"), method, m["error"]] + [None] * 8)
                continue
            rows.append([r["graph"], r.get("nodes"), method, m["setup_s"], m["train_s"], m["predict_s"],
                         m["total_s"], m["peak_gb"], m["test_rmse"], m["test_nlpd"], m.get("subset_gram_error")])
        gk = r.get("geometric_kernels")
        if gk and "gk_s" in gk:
            rows.append([r["graph"], r.get("nodes"), "GeometricKernels (500 eigenpairs)", gk["gk_s"], None, None,
                         gk["gk_s"], gk["gk_peak_gb"], None, None, gk.get("subset_gram_error")])
    return _table(["graph", "nodes", "method", "setup (s)", "50 train iterations (s)", "predict (s)",
                   "total (s)", "peak (GB)", "test RMSE", "test NLPD", "Gram error on subset"], rows)


def grf_gram() -> str:
    parts = []
    for path in sorted(RESULTS.glob("grf_gram_*.json")):
        report = json.loads(path.read_text())
        for kernel in sorted({r["kernel"] for r in report["results"]}):
            for walkers in sorted({r["walkers"] for r in report["results"]}):
                rows_here = [r for r in report["results"] if r["kernel"] == kernel and r["walkers"] == walkers]
                ps = sorted({r["p_halt"] for r in rows_here})
                table = [[coupling] + [next(r["error"] for r in rows_here if r["p_halt"] == p and r["coupling"] == coupling)
                                       for p in ps] for coupling in ("iid", "antithetic", "sigma")]
                parts.append(f"{report['graph']['spec']} ({report['graph']['nodes']} nodes), {kernel}, "
                             f"m = {walkers}:\n\n" + _table(["coupling"] + [f"p = {p}" for p in ps], table))
    return "\n\n".join(parts)


def pagerank() -> str:
    report = _load("pagerank.json")
    if not report:
        return ""
    rows = []
    for graph in report["graphs"]:
        for p in sorted({r["p_halt"] for r in report["results"]}):
            here = {r["coupling"]: r for r in report["results"] if r["graph"] == graph and r["p_halt"] == p}
            rows.append([graph, report["graphs"][graph]["nodes"], p] + [here[c]["error"] for c in ("iid", "antithetic", "sigma")]
                        + [here["sigma"].get("error_vs_iid")])
    return _table(["graph", "nodes", "p_halt", "iid", "antithetic", "sigma", "sigma / iid"], rows)


def _gp_rows(report: dict[str, Any], label: str) -> list[list[Any]]:
    return [[label, r["walkers"], r["coupling"], r["gram_error"], r["test_rmse"], r["kl"]] for r in report["results"]]


def mesh() -> str:
    rows = []
    for path in sorted(RESULTS.glob("mesh_*.json")):
        report = json.loads(path.read_text())
        for name, info in report["meshes"].items():
            label = f"{name} ({info['nodes']})"
            rows += [[label] + row[1:] for row in _gp_rows(report, label)]
            rows.append([label, "exact GP", "", None, info["exact_test_rmse"], 0.0])
    return _table(["mesh (faces)", "walkers", "coupling", "Gram error", "test RMSE", "KL to exact"], rows)


def traffic() -> str:
    report = _load("traffic.json")
    if not report:
        return ""
    rows = _gp_rows(report, "traffic") + [["traffic", "exact GP", "", None, report["exact_test_rmse"], 0.0]]
    return _table(["data", "walkers", "coupling", "Gram error", "test RMSE (mph)", "KL to exact"], rows)


SECTIONS: dict[str, Callable[[], str]] = {"walks": walks, "graph_gp": graph_gp, "grf_gram": grf_gram,
                                          "pagerank": pagerank, "mesh": mesh, "traffic": traffic}

if __name__ == "__main__":
    for section in sys.argv[1:] or list(SECTIONS):
        text = SECTIONS[section]()
        if text:
            print(f"### {section}\n\n{text}\n")
