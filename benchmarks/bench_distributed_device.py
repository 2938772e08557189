"""Benchmark: the torch.distributed path on one GPU (NCCL), against the same run on the CPU (gloo or none).

Run under torchrun on the device machine, then on its CPU, and compare::

    torchrun --nproc-per-node 1 benchmarks/bench_distributed_device.py --device cuda --out gpu.json
    python benchmarks/bench_distributed_device.py --device cpu --out cpu.json
    python benchmarks/bench_distributed_device.py --compare gpu.json cpu.json

Parts: a sharded GRF-GP (``--grid`` side, ``--observed`` nodes, at most ``--iterations``
L-BFGS iterations, on its first walks: ``schedule=None``) trained on the device and
predicted at every node by streaming; a sharded sparse-spectrum GP: the negative MLL at
``--check-points`` points (compared across devices) and the time of one loss-and-gradient
step at ``--points`` points.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def run(args: argparse.Namespace) -> dict:
    import torch

    from gp_couple.distributed import initialise
    from gp_couple.graphs import grid_graph
    from gp_couple.kernels.random_features import CoupledRFFKernel
    from gp_couple.sharded_gp import fit_sharded_grf_gp
    from gp_couple.sparse_spectrum import ShardedSparseSpectrumGP
    from gp_couple.streaming import StreamedPredictor

    collective = initialise(timeout=300)
    device = torch.device(args.device)
    result: dict = {"device": args.device, "processes": collective.size,
                    "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None}
    side = args.grid
    graph = grid_graph(side, side)
    rng = np.random.default_rng(0)
    observed = np.sort(rng.choice(graph.num_nodes, args.observed, replace=False))
    rows, columns = np.divmod(observed, side)
    targets = np.sin(rows / (side / 8)) * np.cos(columns / (side / 6)) + 0.1 * rng.normal(size=observed.size)
    start = time.perf_counter()
    model, likelihood, history = fit_sharded_grf_gp(graph, observed, targets, collective=collective,
                                                    iterations=args.iterations, schedule=None, seed=0, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    result["grf_train_s"] = time.perf_counter() - start
    kernel = model.covar_module.base_kernel
    result.update(grf_iterations=len(history), grf_losses=list(map(float, history)),
                  gamma=float(kernel.kernel_family.gamma.detach()),
                  outputscale=float(model.covar_module.outputscale.detach()), noise=float(likelihood.noise.detach()))
    start = time.perf_counter()
    kernel.resample_for_prediction(64, seed=0, sigma_fit_samples=20)
    mean, variance = StreamedPredictor(model, likelihood, collective=collective).predict_all(chunk_size=8192)
    result["grf_predict_s"] = time.perf_counter() - start
    result.update(predicted_nodes=int(mean.size), mean_checksum=float(mean.sum()),
                  variance_checksum=float(variance.sum()), mean_head=mean[:5].tolist(),
                  variance_head=variance[:5].tolist())

    def sparse_spectrum(points: int) -> ShardedSparseSpectrumGP:
        generator = torch.Generator().manual_seed(1)
        inputs = torch.rand(points, 8, generator=generator, dtype=torch.float64) * 4 - 2
        outputs = torch.sin(inputs @ torch.linspace(-1, 1, 8, dtype=torch.float64))
        kernel = CoupledRFFKernel(num_features=256, num_dims=8, seed=0)
        return ShardedSparseSpectrumGP(kernel.to(device=device, dtype=torch.float64), inputs.to(device),
                                       outputs.to(device), collective=collective).to(device=device,
                                                                                     dtype=torch.float64)

    with torch.no_grad():
        result["rff_check_loss"] = float(sparse_spectrum(args.check_points).loss())
    if args.points:
        gp = sparse_spectrum(args.points)
        start = time.perf_counter()
        loss = gp.loss()
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        result["rff_points"] = args.points
        result["rff_step_s"] = time.perf_counter() - start
        result["rff_loss"] = float(loss.detach())
    return result


def compare(first: str, second: str) -> dict:
    a, b = (json.loads(Path(path).read_text()) for path in (first, second))

    def relative(key: str) -> float:
        x, y = np.asarray(a[key], dtype=float), np.asarray(b[key], dtype=float)
        return float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-300)))

    keys = ["gamma", "outputscale", "noise", "mean_checksum", "variance_checksum", "mean_head", "variance_head",
            "rff_check_loss"]
    return {"relative_differences": {key: relative(key) for key in keys if key in a and key in b},
            "iterations": [a["grf_iterations"], b["grf_iterations"]],
            "times_s": {key: [a.get(key), b.get(key)] for key in ("grf_train_s", "grf_predict_s", "rff_step_s")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--grid", type=int, default=300)
    parser.add_argument("--observed", type=int, default=3000)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--check-points", type=int, default=100_000)
    parser.add_argument("--points", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--compare", nargs=2, default=None)
    args = parser.parse_args()
    if args.compare:
        report = compare(*args.compare)
    else:
        from gp_couple.distributed import finalise

        try:
            report = run(args)
        finally:
            finalise()  # leave the process group (NCCL warns at exit otherwise)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
