"""Process bodies for the multi-process tests (spawned: they must be importable functions).

Each worker joins a gloo group through a rendezvous file, runs the same code a single
process runs, and rank 0 saves what it got to ``out`` (``.npz``) for the test to compare.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np


def run_ranks(target: Any, size: int, folder: Path, *args: Any, timeout: float = 240.0) -> list[int | None]:
    """Run ``target(rank, size, rendezvous, folder, *args)`` in ``size`` spawned processes; return exit codes."""
    context = multiprocessing.get_context("spawn")
    rendezvous = folder / "rendezvous"
    processes = [context.Process(target=_guarded, args=(target, rank, size, str(rendezvous), str(folder), *args))
                 for rank in range(size)]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    codes = []
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
            codes.append(None)
        else:
            codes.append(process.exitcode)
    return codes


def _guarded(target: Any, rank: int, size: int, rendezvous: str, folder: str, *args: Any) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        target(rank, size, rendezvous, folder, *args)
        if target is not dying_peer:
            from gp_couple.distributed import finalise

            finalise()
    except BaseException:
        Path(folder, f"error_{rank}.txt").write_text(traceback.format_exc())
        raise


def _join(rank: int, size: int, rendezvous: str, timeout: float = 60.0) -> Any:
    from gp_couple.distributed import initialise

    return initialise("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=size, timeout=timeout)


def graph_problem() -> tuple[Any, np.ndarray, np.ndarray]:
    """A 12 x 12 grid with 60 observed nodes of a smooth field."""
    from gp_couple.graphs import grid_graph

    graph = grid_graph(12, 12)
    rng = np.random.default_rng(5)
    train = np.sort(rng.choice(graph.num_nodes, 60, replace=False))
    rows, columns = np.divmod(train, 12)
    targets = np.sin(rows / 3.0) * np.cos(columns / 4.0) + 0.05 * rng.normal(size=train.size)
    return graph, train, targets


def small_schedule() -> Any:
    """A walk schedule small enough for a test: a training phase on more walkers, a round on the prediction walks."""
    from gp_couple.kernels.walk_schedule import SHARDED_SCHEDULE

    return replace(SHARDED_SCHEDULE, max_train_walkers=64, phases=2, max_predict_walkers=64, predict_tolerance=0.2,
                   sigma_fit_samples=10, refits=1)


def grf_gp(rank: int, size: int, rendezvous: str, folder: str, chunk_size: int) -> None:
    """Fit a sharded GRF-GP, choose prediction walkers, predict every node (in memory and to a file)."""
    collective = _join(rank, size, rendezvous) if size > 1 else None
    result = fit_and_predict_grf(collective, chunk_size, Path(folder) / f"predictions_{size}.npy")
    if rank == 0:
        np.savez(Path(folder) / f"grf_{size}.npz", **result)


def fit_and_predict_grf(collective: Any, chunk_size: int, path: Path) -> dict[str, np.ndarray]:
    from gp_couple.sharded_gp import fit_sharded_grf_gp
    from gp_couple.streaming import StreamedPredictor

    graph, train, targets = graph_problem()
    model, likelihood, history = fit_sharded_grf_gp(graph, train, targets, collective=collective, iterations=30,
                                                    num_walkers=16, schedule=small_schedule(), seed=3)
    kernel = model.covar_module.base_kernel
    predictor = StreamedPredictor(model, likelihood, collective=collective, release_kernel_walks=True)
    mean, variance = predictor.predict_all(chunk_size=chunk_size)
    predictor.write(path, chunk_size=chunk_size)
    return {"losses": np.asarray(history), "phases": np.asarray(history.phases),
            "gamma": np.asarray(float(kernel.kernel_family.gamma.detach())),
            "outputscale": np.asarray(float(model.covar_module.outputscale.detach())),
            "noise": np.asarray(float(likelihood.noise.detach())), "walkers": np.asarray(kernel.num_walkers),
            "p_halt": np.asarray(kernel.p_halt), "permutation": kernel.coupling.permutation,
            "reused_rows": np.asarray(predictor.reused_rows), "mean": mean, "variance": variance}


def predict_graph_command(rank: int, size: int, rendezvous: str, folder: str, argv: list[str],
                          cross_entries: int) -> None:
    """Run ``gp-couple predict-graph`` with ``argv`` in a group joined here (as under ``torchrun``), with
    :data:`gp_couple.streaming.CROSS_ENTRIES` set to ``cross_entries``."""
    _join(rank, size, rendezvous)
    import gp_couple.streaming
    from gp_couple.cli import main

    gp_couple.streaming.CROSS_ENTRIES = cross_entries

    if main(argv) != 0:
        raise RuntimeError(f"gp-couple predict-graph exited with an error on rank {rank}")


def tabular_problem() -> tuple[Any, Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(2)
    inputs = torch.randn(400, 3, generator=generator, dtype=torch.float64)
    targets = torch.sin(inputs @ torch.tensor([1.0, -0.5, 0.3], dtype=torch.float64)) \
        + 0.1 * torch.randn(400, generator=generator, dtype=torch.float64)
    test = torch.randn(50, 3, generator=generator, dtype=torch.float64)
    return inputs, targets, test


def sparse_spectrum_gp(rank: int, size: int, rendezvous: str, folder: str) -> None:
    """Fit a sharded sparse-spectrum GP on this rank's rows; predict this rank's test rows."""
    collective = _join(rank, size, rendezvous) if size > 1 else None
    result = fit_and_predict_sparse_spectrum(collective)
    if rank == 0:
        np.savez(Path(folder) / f"rff_{size}.npz", **result)


def fit_and_predict_sparse_spectrum(collective: Any) -> dict[str, np.ndarray]:

    from gp_couple.distributed import Collective
    from gp_couple.kernels.random_features import CoupledRFFKernel
    from gp_couple.sparse_spectrum import ShardedSparseSpectrumGP, shard_rows

    collective = Collective() if collective is None else collective
    inputs, targets, test = tabular_problem()
    local_inputs, local_targets = shard_rows(collective, inputs, targets)
    model = ShardedSparseSpectrumGP(CoupledRFFKernel(num_features=16, num_dims=3, seed=0), local_inputs,
                                    local_targets, collective=collective).double()
    history = model.fit(iterations=60)
    (local_test,) = shard_rows(collective, test)
    mean, variance = model.predict(local_test)
    return {"losses": np.asarray(history), "lengthscale": model.kernel.lengthscale.detach().numpy(),
            "mean": collective.all_gather_rows(mean).numpy(), "variance": collective.all_gather_rows(variance).numpy()}


def dying_peer(rank: int, size: int, rendezvous: str, folder: str, timeout: float) -> None:
    """Rank 1 dies after joining; rank 0 records how its next collective failed and how long it took."""
    import torch

    collective = _join(rank, size, rendezvous, timeout)
    collective.barrier()
    if rank == 1:
        os._exit(3)
    time.sleep(0.5)
    start = time.monotonic()
    try:
        collective.all_reduce(torch.ones(4))
        outcome = "no error"
    except Exception as error:  # the test checks the type and message
        outcome = f"{type(error).__name__}: {error}"
    Path(folder, "outcome.txt").write_text(f"{time.monotonic() - start:.3f}\n{outcome}")
    # Leave the group without the barrier of finalise() (its peer is dead): gloo aborts a
    # process that exits with its group still open, some of the time.
    torch.distributed.destroy_process_group()
