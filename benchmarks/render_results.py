"""Render the JSON files of ``benchmarks/results/`` as the markdown tables of RESULTS.md / README.

Run: ``python benchmarks/render_results.py [SECTION ...]`` with sections ``walks``,
``graph_gp``, ``grf_gram``, ``pagerank``, ``mesh``, ``traffic``, ``kernel_estimation``,
``attention``, ``copula_learning`` (default: all present); ``--update-readme`` rewrites the
condensed tables between the results markers of README.md; ``--update-results`` rewrites
the "Paper experiments" section of RESULTS.md.
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
                 r.get("sample_api_s"), r["build_cold_s"], r["build_warm_s"], r["build_peak_gb"], r.get("numpy_s"),
                 r.get("numpy_peak_gb"), r.get("fgg_full_sampler_s"), r.get("speedup_vs_fgg_full_sampler"),
                 r.get("speedup_vs_fgg_one_process")] for r in report["results"]]
        parts.append(f"weights {report['results'][0]['dtype']} (`{name}`):\n\n" + _table(
            ["graph", "p_halt", "walk steps", "sample / ceiling", "sampler API (s)", "build cold (s)", "build warm (s)",
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


def kernel_estimation() -> str:
    parts = []
    for path in sorted(RESULTS.glob("kernel_estimation_*.json")):
        report = json.loads(path.read_text())
        rows = [[r["features"], r["coupling"], r["num_frequencies"], r["kernel_rmse"], r["kernel_rmse_vs_iid"],
                 r["kl_per_test_point"], r["predictive_rmse"], r["predictive_rmse_vs_iid"]]
                for r in report["results"]]
        exact = report["exact_gp"]
        rows += [[features, "exact GP", None, None, None, None, exact[features]["predictive_rmse"], None]
                 for features in exact]
        parts.append(f"{report['dataset']} (N = {report['num_points']}, d = {report['input_dim']}, "
                     f"{report['settings']['splits']} splits):\n\n" + _table(
                         ["features", "coupling", "m", "kernel RMSE", "kernel RMSE / iid", "KL per test point",
                          "predictive RMSE", "predictive RMSE / iid"], rows))
    return "\n\n".join(parts)


def attention() -> str:
    report = _load("attention.json")
    if not report:
        return ""
    rows = [[r["coupling"], r["num_features"], r["kernel_variance"], r["kernel_covariance"], r["attention_mse"],
             r["attention_mse_vs_orthogonal"]] for r in report["results"]]
    return _table(["coupling", "features", "kernel variance", "kernel covariance", "attention MSE",
                   "attention MSE / orthogonal"], rows)


def copula_learning() -> str:
    report = _load("copula_learning.json")
    if not report:
        return ""
    rows = []
    for r in report["results"]:
        ratio = next(value for key, value in r.items() if key.startswith("loss_vs_"))
        baseline = next(key for key in r if key.startswith("loss_vs_"))[len("loss_vs_"):]
        rows.append([r["features"], r["coupling"], r["loss"], f"{_cell(ratio)} (vs {baseline})"])
    return _table(["features", "coupling", "training kernel RMSE", "ratio"], rows)


# ---------------------------------------------------------------- README summary
COUPLING_ORDER = ("iid", "antithetic", "sigma")
README_START, README_END = "<!-- results:start -->", "<!-- results:end -->"


def _triple(values: list[Any]) -> str:
    return " / ".join(_cell(value["mean"] if isinstance(value, dict) else value) for value in values)


def readme_summary() -> str:
    """Condensed tables for the README (every number is in the full tables of RESULTS.md)."""
    parts = []
    mesh_rows = []
    for path in sorted(RESULTS.glob("mesh_*.json")):
        report = json.loads(path.read_text())
        for name, info in report["meshes"].items():
            def pick(metric: str, walkers: int) -> str:
                return _triple([next(r[metric] for r in report["results"] if r.get("mesh", name) == name
                                     and r["walkers"] == walkers and r["coupling"] == c) for c in COUPLING_ORDER])
            mesh_rows.append([f"{name} ({info['nodes']})", pick("gram_error", 16), pick("test_rmse", 16),
                              info["exact_test_rmse"], pick("kl", 16), pick("kl", 64)])
    if mesh_rows:
        parts.append("**Mesh interpolation** (`gp-couple mesh`, app:grf_gp_details; i.i.d. / antithetic / σ, "
                     "means over 10 repeats):\n\n" + _table(
                         ["mesh (faces)", "Gram error, m = 16", "test RMSE, m = 16", "exact-GP RMSE",
                          "KL to exact, m = 16", "KL to exact, m = 64"], mesh_rows))
    gram_rows = []
    for path in sorted(RESULTS.glob("grf_gram_*.json")):
        report = json.loads(path.read_text())
        for p_halt in (0.3, 0.5):
            here = {r["coupling"]: r["error"] for r in report["results"] if r["kernel"] == "regularised-laplacian"
                    and r["walkers"] == 2 and r["p_halt"] == p_halt}
            if len(here) == 3:
                gram_rows.append([f"{report['graph']['spec']} ({report['graph']['nodes']})", p_halt,
                                  _triple([here[c] for c in COUPLING_ORDER])])
    if gram_rows:
        parts.append("**Gram-matrix estimation** (`gp-couple grf-gram`, fig:grfs_more_graphs; 2-regularised "
                     "Laplacian, m = 2 walkers, relative Frobenius error, i.i.d. / antithetic / σ):\n\n"
                     + _table(["graph (nodes)", "p_halt", "Gram error"], gram_rows))
    report = _load("pagerank.json")
    if report:
        rows = []
        for graph in report["graphs"]:
            here = {(r["p_halt"], r["coupling"]): r for r in report["results"] if r["graph"] == graph}
            rows.append([graph] + [_triple([here[(p, c)]["error"] for c in COUPLING_ORDER]) for p in (0.3, 0.5)])
        parts.append("**PageRank with two coupled walkers** (`gp-couple pagerank`, app:pagerank; "
                     "‖ρ − ρ̂‖₂, i.i.d. / antithetic / σ):\n\n" + _table(["graph", "p_halt = 0.3", "p_halt = 0.5"], rows))
    for path in sorted(RESULTS.glob("kernel_estimation_*.json")):
        report = json.loads(path.read_text())
        by_features: dict[str, list[str]] = {}
        for r in report["results"]:
            by_features.setdefault(r["features"], []).append(f"{r['coupling']} {_cell(r['kernel_rmse_vs_iid']['mean'])}")
        rows = [[features.upper(), ", ".join(entries)] for features, entries in by_features.items()]
        parts.append(f"**Kernel estimation on UCI {report['dataset']}** (`gp-couple kernel-estimation`, tab:rff; "
                     f"kernel RMSE relative to i.i.d., {report['settings']['splits']} splits):\n\n"
                     + _table(["features", "coupling: RMSE / iid"], rows))
    return "\n\n".join(parts)


def update_readme(path: Path) -> None:
    text = path.read_text()
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    path.write_text(text[:start] + "\n" + readme_summary() + "\n" + text[end:])


SECTIONS: dict[str, Callable[[], str]] = {"walks": walks, "graph_gp": graph_gp, "grf_gram": grf_gram,
                                          "pagerank": pagerank, "mesh": mesh, "traffic": traffic,
                                          "kernel_estimation": kernel_estimation, "attention": attention,
                                          "copula_learning": copula_learning}

# ---------------------------------------------------------------- RESULTS.md paper section
PAPER_SECTION = "\n## Paper experiments"
PAPER_INTRO = """
## Paper experiments

The `gp-couple` commands print JSON with `--json`; the files in `benchmarks/results/`
were produced by these commands (data from `$GP_COUPLE_DATA=../shared/datasets`):

```
gp-couple grf-gram --graph cora --kernels regularised-laplacian diffusion --walkers 2 16 --json > benchmarks/results/grf_gram_cora.json
gp-couple grf-gram --graph NAME --kernels regularised-laplacian --walkers 2 --json > benchmarks/results/grf_gram_NAME.json   # karate dolphins football polbooks eurosis citeseer
gp-couple pagerank --graphs karate dolphins polbooks football netscience eurosis citeseer cora --json > benchmarks/results/pagerank.json
gp-couple mesh --mesh NAME --json > benchmarks/results/mesh_NAME.json   # teapot fuze sphere idler_riser busted torus
gp-couple traffic --json > benchmarks/results/traffic.json
gp-couple kernel-estimation --dataset boston --json > benchmarks/results/kernel_estimation_boston.json   # 23 minutes
gp-couple attention --json > benchmarks/results/attention.json
gp-couple copula-learning --json > benchmarks/results/copula_learning.json
```

Only Boston was run through the full kernel-estimation protocol (20 splits, 100 draws,
up to 5000 Adam steps per exact GP: 23 minutes); the other UCI datasets run through the
same command (`--dataset concrete|abalone|cpu|power|airfoil`) and their loaders are
tested, but their tables were not produced for this release.
"""
PAPER_TABLES = {"grf_gram": "Gram-matrix estimation (fig:permuton_grf, fig:grfs_more_graphs)",
                "pagerank": "PageRank estimation with two coupled walkers (app:pagerank)",
                "mesh": "Mesh interpolation (sec:graph_gp_experiments, app:grf_gp_details)",
                "traffic": "San Jose traffic speeds (sec:traffic_expt)",
                "kernel_estimation": "RFF / RLF kernel estimation on UCI data (tab:rff, tab:kld, tab:pred-rmse)",
                "attention": "Performer attention (app:performers, fig:var_fig)",
                "copula_learning": "Learned Gaussian copula (app:copulas, fig:boston-losses)"}


def update_results(path: Path) -> None:
    """Rewrite the "Paper experiments" section (the end of RESULTS.md) from the JSON files."""
    text = path.read_text()
    if PAPER_SECTION in text:
        text = text[:text.index(PAPER_SECTION)]
    parts = [PAPER_INTRO] + [f"### {title}\n\n{SECTIONS[key]()}\n" for key, title in PAPER_TABLES.items()]
    path.write_text(text.rstrip("\n") + "\n" + "\n".join(parts))


if __name__ == "__main__":
    if sys.argv[1:] == ["--update-readme"]:
        update_readme(RESULTS.parents[1] / "README.md")
        sys.exit()
    if sys.argv[1:] == ["--update-results"]:
        update_results(RESULTS.parent / "RESULTS.md")
        sys.exit()
    for section in sys.argv[1:] or list(SECTIONS):
        text = SECTIONS[section]()
        if text:
            print(f"### {section}\n\n{text}\n")
