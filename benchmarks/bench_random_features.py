"""Benchmark: coupled-RFF sparse-spectrum GPs against gpytorch's RFFKernel and the exact RBF GP.

Three parts, each against baselines measured in the same run:

* ``models``: for N training points (default 10^4 and 10^5, synthetic data, d = 8,
  float32) an ``ExactGP`` with ``ScaleKernel(CoupledRFFKernel(m, coupling="pnc"))``,
  with ``ScaleKernel(gpytorch.kernels.RFFKernel(m))`` and with the exact
  ``ScaleKernel(RBFKernel)``: median time per training step (``-mll`` forward, backward,
  Adam step), time of the first prediction on 1000 test points (mean and variance,
  including the prediction caches) and of a repeated one, and the peak resident-memory
  increase over the process before the model was built. Every model runs in a fresh
  subprocess so that peak memory is clean. The exact GP is skipped above
  ``--exact-max-n`` (a dense float32 kernel at N = 10^5 needs 40 GB).
* ``couplings``: training-step time of the coupled-RFF GP at the first N for every
  coupling, relative to i.i.d. frequencies. Couplings are timed in interleaved rounds
  (shuffled order each round) and compared by the median over rounds of the per-round
  ratio, which cancels the machine's slow drifts. Target: every ratio <= 1.05.
* ``draws``: time to draw a set of frequencies (noise and map, ``coupling.sample``)
  per coupling relative to i.i.d., for a few (m, d).

Timings use one torch thread by default (``--threads``): on a shared machine, OpenMP
threads waiting on a busy core make multi-threaded timings erratic. Prints one JSON
document (also written to ``--json-out``).

Run: ``python benchmarks/bench_random_features.py --json-out benchmarks/results/random_features.json``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report, peak_increase, reset_peak  # noqa: E402

COUPLINGS = ("iid", "halton", "sobol", "orthogonal", "pnc", "pm", "antithetic", "copula")
MODELS = ("coupled-rff", "gpytorch-rff", "exact-rbf")


def _data(num_points: int, dim: int, seed: int):  # type: ignore[no-untyped-def]
    import torch

    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(num_points, dim, generator=generator) * 4 - 2
    y = torch.sin(x[:, 0]) * torch.cos(x[:, 1]) + 0.3 * x[:, 2:].sum(-1) / dim
    y = y + 0.1 * torch.randn(num_points, generator=generator)
    test = torch.rand(1000, dim, generator=generator) * 4 - 2
    return x, y, test


def _model(kind: str, x, y, num_features: int, coupling: str, seed: int):  # type: ignore[no-untyped-def]
    import gpytorch

    from gp_couple.kernels import CoupledRFFKernel

    if kind == "coupled-rff":
        base = CoupledRFFKernel(num_features, x.shape[-1], coupling=coupling, seed=seed)
    elif kind == "gpytorch-rff":
        base = gpytorch.kernels.RFFKernel(num_samples=num_features, num_dims=x.shape[-1])
    elif kind == "exact-rbf":
        base = gpytorch.kernels.RBFKernel()
    else:
        raise ValueError(f"unknown model {kind!r}")

    class GP(gpytorch.models.ExactGP):
        def __init__(self) -> None:
            super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(base)

        def forward(self, inputs):  # type: ignore[no-untyped-def]
            return gpytorch.distributions.MultivariateNormal(self.mean_module(inputs), self.covar_module(inputs))

    return GP()


def _trainer(model):  # type: ignore[no-untyped-def]
    import gpytorch
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    x, y = model.train_inputs[0], model.train_targets

    def step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    return step


def worker(config: dict[str, Any]) -> dict[str, Any]:
    """One model at one N in this (fresh) process: step and prediction times, peak memory."""
    import torch

    torch.set_num_threads(config["threads"])
    torch.manual_seed(config["seed"])
    x, y, test = _data(config["num_points"], config["dim"], config["seed"])
    baseline = reset_peak()
    model = _model(config["model"], x, y, config["num_features"], config.get("coupling", "pnc"), config["seed"])
    model.train()
    step = _trainer(model)
    step()  # warm-up: lazy initialisation (gpytorch's RFFKernel draws its frequencies here)
    steps = [step() for _ in range(config["steps"])]
    model.eval()
    predictions = []
    for _ in range(2):
        start = time.perf_counter()
        with torch.no_grad():
            predictive = model.likelihood(model(test))
            predictive.mean, predictive.variance  # noqa: B018 - force both
        predictions.append(time.perf_counter() - start)
    return {"model": config["model"], "num_points": config["num_points"],
            "step_seconds_median": statistics.median(steps), "step_seconds": steps,
            "first_prediction_seconds": predictions[0], "repeat_prediction_seconds": predictions[1],
            "peak_memory_increase_gb": peak_increase(baseline)}


def _run_worker(config: dict[str, Any]) -> dict[str, Any]:
    command = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(config)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return {"model": config["model"], "num_points": config["num_points"],
                "error": result.stderr.strip().splitlines()[-1] if result.stderr else "failed"}
    return json.loads(result.stdout)


def bench_models(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for num_points in args.sizes:
        results = {}
        for model in MODELS:
            if model == "exact-rbf" and num_points > args.exact_max_n:
                gigabytes = num_points**2 * 4 / 1e9
                results[model] = {"model": model, "num_points": num_points,
                                  "skipped": f"dense {num_points}x{num_points} float32 kernel needs {gigabytes:.0f} GB"}
                continue
            steps = args.exact_steps if model == "exact-rbf" else args.steps
            results[model] = _run_worker({"model": model, "num_points": num_points, "dim": args.dim,
                                          "num_features": args.num_features, "steps": steps,
                                          "threads": args.threads, "seed": args.seed})
        reference = results["coupled-rff"]
        for row in results.values():
            if "step_seconds_median" in row and "step_seconds_median" in reference:
                row["step_time_vs_coupled_rff"] = row["step_seconds_median"] / reference["step_seconds_median"]
                row["first_prediction_vs_coupled_rff"] = (row["first_prediction_seconds"]
                                                          / reference["first_prediction_seconds"])
            rows.append(row)
    return rows


def bench_couplings(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.manual_seed(args.seed)
    num_points = args.sizes[0]
    x, y, _ = _data(num_points, args.dim, args.seed)
    steps = {}
    for coupling in COUPLINGS:
        model = _model("coupled-rff", x, y, args.num_features, coupling, args.seed)
        model.train()
        steps[coupling] = _trainer(model)
        steps[coupling]()  # warm-up
    times: dict[str, list[float]] = {c: [] for c in COUPLINGS}
    order = list(COUPLINGS)
    shuffler = random.Random(args.seed)
    for _ in range(args.rounds):
        shuffler.shuffle(order)
        for coupling in order:
            times[coupling].append(statistics.median(steps[coupling]() for _ in range(args.steps)))
    rows = []
    for coupling in COUPLINGS:
        ratios = [t / b for t, b in zip(times[coupling], times["iid"])]
        rows.append({"coupling": coupling, "step_seconds_median": statistics.median(times[coupling]),
                     "step_time_vs_iid": statistics.median(ratios),
                     "step_time_vs_iid_range": [min(ratios), max(ratios)]})
    return {"num_points": num_points, "dim": args.dim, "num_features": args.num_features,
            "rounds": args.rounds, "steps_per_round": args.steps, "target_max_ratio": 1.05,
            "all_within_target": all(row["step_time_vs_iid"] <= 1.05 for row in rows), "results": rows}


def bench_draws(args: argparse.Namespace) -> list[dict[str, Any]]:
    from gp_couple.couplings import get_frequency_coupling

    rows = []
    for num_features, dim in args.draw_shapes:
        couplings = {name: get_frequency_coupling(name, dim=dim) for name in COUPLINGS}
        times: dict[str, list[float]] = {name: [] for name in COUPLINGS}
        for repeat in range(args.draw_repeats):
            for name, coupling in couplings.items():
                start = time.perf_counter()
                coupling.sample(num_features, dim, seed=repeat)
                times[name].append(time.perf_counter() - start)
        baseline = statistics.median(times["iid"])
        for name in COUPLINGS:
            median = statistics.median(times[name])
            rows.append({"coupling": name, "num_features": num_features, "dim": dim,
                         "draw_seconds_median": median, "draw_time_vs_iid": median / baseline})
    return rows


def _shape(text: str) -> tuple[int, int]:
    m, d = text.lower().split("x")
    return int(m), int(d)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", nargs="+", type=int, default=[10_000, 100_000])
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--num-features", type=int, default=64, help="frequencies m (2m RFF features)")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per measurement")
    parser.add_argument("--exact-steps", type=int, default=2, help="timed training steps of the exact GP")
    parser.add_argument("--exact-max-n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds of the coupling comparison")
    parser.add_argument("--draw-shapes", nargs="+", type=_shape, default=[(64, 8), (512, 64)],
                        help="MxD frequency-set shapes of the draw benchmark")
    parser.add_argument("--draw-repeats", type=int, default=50)
    parser.add_argument("--parts", nargs="+", choices=("models", "couplings", "draws"),
                        default=["models", "couplings", "draws"])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: robust timings on a shared machine)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(json.loads(args.worker))))
        return {}
    import torch

    torch.set_num_threads(args.threads)
    report: dict[str, Any] = {
        "benchmark": "random_features",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "settings": {key: value for key, value in vars(args).items() if key not in {"worker", "json_out"}},
    }
    if "models" in args.parts:
        report["models"] = bench_models(args)
    if "couplings" in args.parts:
        report["couplings"] = bench_couplings(args)
    if "draws" in args.parts:
        report["draws"] = bench_draws(args)
    return emit_report(report, args.json_out)


if __name__ == "__main__":
    main()
