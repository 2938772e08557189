"""Benchmark: ``gp-couple predict-graph`` against the dense exact GP on a smooth field with a long range.

A ``--grid`` × ``--grid`` grid, ``--observed`` nodes drawn at random (``--seed``) with
values of a smooth field plus noise of standard deviation 0.1; the field's wavelengths scale
with the grid (``--field 1``: sin(r/25s) cos(c/31s) + 0.5 sin((r+c)/47s), ``--field 2``:
cos(r/20s) sin(c/37s) + 0.4 cos((r−c)/53s), s = grid/316; field 1 on the 316 × 316 grid is
the 10⁵-node run of ``benchmarks/RESULTS.md``). The command runs as a user would (its
defaults, ``--threads``, ``--kernel``; ``--kept-chebyshev-terms`` runs it under
:class:`gp_couple.settings.kept_chebyshev_terms`), in this process, on a CSV of the observations; the exact GP is
:func:`gp_couple.recipes.fit_graph_gp` with ``kernel="exact"`` (dense eigendecomposition, to
the same stopping rule), predicting every node in float64. Both are scored at the unobserved
nodes: RMSE against the noisy values and the latent field, NLPD of the noisy values, the mean
predictive variance against the mean squared error, and the learnt hyperparameters in the
data's units. Run from a checkout with ``PYTHONPATH=CHECKOUT`` to measure that checkout's
command (``--skip-exact`` then leaves the exact GP out).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def field(side: int, observed: int, seed: int, kind: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Observed nodes, their noisy values, the latent field and the noisy values of every node."""
    scale = side / 316
    rng = np.random.default_rng(seed)
    count = side * side
    nodes = np.sort(rng.choice(count, observed, replace=False))
    rows, columns = np.divmod(np.arange(count), side)
    if kind == 1:
        latent = (np.sin(rows / (25 * scale)) * np.cos(columns / (31 * scale))
                  + 0.5 * np.sin((rows + columns) / (47 * scale)))
    else:
        latent = (np.cos(rows / (20 * scale)) * np.sin(columns / (37 * scale))
                  + 0.4 * np.cos((rows - columns) / (53 * scale)))
    noisy = latent + 0.1 * rng.standard_normal(count)
    return nodes, noisy[nodes], latent, noisy


def score(mean: np.ndarray, variance: np.ndarray, test: np.ndarray, latent: np.ndarray,
          noisy: np.ndarray) -> dict[str, float]:
    """Accuracy of predictions of noisy values at the ``test`` nodes."""
    m, v, y = mean[test], variance[test], noisy[test]
    return {"rmse": float(np.sqrt(np.mean((m - y) ** 2))),
            "rmse_latent": float(np.sqrt(np.mean((m - latent[test]) ** 2))),
            "nlpd": float(np.mean(0.5 * np.log(2 * np.pi * v) + 0.5 * (y - m) ** 2 / v)),
            "mean_variance": float(v.mean()), "mse": float(np.mean((m - y) ** 2))}


def exact_gp(side: int, nodes: np.ndarray, values: np.ndarray) -> dict:
    import torch

    from gp_couple import fit_graph_gp, grf_gp_settings, predict
    from gp_couple.graphs import grid_graph

    offset, scale = float(values.mean()), float(values.std())
    graph = grid_graph(side, side)
    start = time.perf_counter()
    model, likelihood = fit_graph_gp(graph, nodes, torch.as_tensor((values - offset) / scale, dtype=torch.float64),
                                     predict_nodes=np.arange(graph.num_nodes), kernel="exact")
    trained = time.perf_counter() - start
    model.double()
    likelihood.double()
    with grf_gp_settings():
        mean, variance = predict(model, likelihood, torch.arange(graph.num_nodes), noise=True)
    covariance = model.covar_module
    return {"mean": mean.detach().double().numpy() * scale + offset,
            "variance": variance.detach().double().numpy() * scale ** 2,
            "hyperparameters": {"outputscale": float(covariance.outputscale.detach()) * scale ** 2,
                                "noise variance": float(likelihood.noise.detach()) * scale ** 2,
                                "gamma": float(covariance.base_kernel.kernel_family.gamma.detach())},
            "training seconds": trained}


def command(side: int, nodes: np.ndarray, values: np.ndarray, threads: int, folder: Path, kernel: str = "auto",
            kept_terms: int | None = None) -> dict:
    from gp_couple.cli import main
    from gp_couple.settings import kept_chebyshev_terms

    observations, output, report = folder / "values.csv", folder / "predictions.npy", folder / "report.json"
    np.savetxt(observations, np.c_[nodes, values], delimiter=",", header="node,value", comments="",
               fmt=["%d", "%.10f"])
    start = time.perf_counter()
    with kept_chebyshev_terms(kept_chebyshev_terms.value() if kept_terms is None else kept_terms):
        code = main(["predict-graph", "--graph", f"grid:{side}x{side}", "--observations", str(observations),
                     "--output", str(output), "--kernel", kernel, "--threads", str(threads), "--json", str(report)])
    if code != 0:
        raise RuntimeError(f"gp-couple predict-graph exited with {code}")
    wall = time.perf_counter() - start
    predictions = np.load(output)
    quantities = {row["quantity"]: row["value"] for row in json.loads(report.read_text())["results"]}
    return {"mean": predictions[:, 0], "variance": predictions[:, 1], "report": quantities, "wall seconds": wall}


def add_field_arguments(parser: argparse.ArgumentParser) -> None:
    """``--grid``, ``--observed``, ``--seed``, ``--field`` and ``--json-out``: the problem of :func:`field`."""
    parser.add_argument("--grid", type=int, default=100)
    parser.add_argument("--observed", type=int, default=500)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--field", type=int, choices=(1, 2), default=1)
    parser.add_argument("--json-out", type=Path, required=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_field_arguments(parser)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-exact", action="store_true")
    parser.add_argument("--kernel", choices=("auto", "matrix_free", "grf"), default="auto",
                        help="the command's --kernel")
    parser.add_argument("--kept-chebyshev-terms", type=int, default=None,
                        help="run the command under gp_couple.settings.kept_chebyshev_terms(this many numbers)")
    args = parser.parse_args(argv)
    nodes, values, latent, noisy = field(args.grid, args.observed, args.seed, args.field)
    test = np.setdiff1d(np.arange(args.grid ** 2), nodes)
    result: dict = {"grid": args.grid, "observed": args.observed, "seed": args.seed, "field": args.field,
                    "threads": args.threads, "kernel": args.kernel, "kept_chebyshev_terms": args.kept_chebyshev_terms}
    with tempfile.TemporaryDirectory() as folder:
        run = command(args.grid, nodes, values, args.threads, Path(folder), args.kernel, args.kept_chebyshev_terms)
    result["command"] = {**score(run["mean"], run["variance"], test, latent, noisy), "report": run["report"],
                         "wall seconds": run["wall seconds"]}
    if not args.skip_exact:
        exact = exact_gp(args.grid, nodes, values)
        result["exact"] = {**score(exact["mean"], exact["variance"], test, latent, noisy),
                           "hyperparameters": exact["hyperparameters"], "training seconds": exact["training seconds"]}
        result["ratios"] = {"rmse": result["command"]["rmse"] / result["exact"]["rmse"],
                            "rmse_latent": result["command"]["rmse_latent"] / result["exact"]["rmse_latent"],
                            "nlpd_difference": result["command"]["nlpd"] - result["exact"]["nlpd"]}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2))
    print(json.dumps({key: value for key, value in result.items() if key != "command"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
