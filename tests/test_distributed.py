"""Graph and sparse-spectrum GPs across processes: 2 and 4 gloo processes (spawned here, no torchrun)
give the single process's losses, hyperparameters and predictions; a dead peer is an error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gp_couple.distributed import Collective, DistributedError, initialise
from tests import _distributed_workers as workers

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")


def _close(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


def _ran(codes: list[int | None], folder) -> None:  # type: ignore[no-untyped-def]
    errors = "".join(path.read_text() for path in sorted(folder.glob("error_*.txt")))
    assert codes == [0] * len(codes), f"exit codes {codes}\n{errors}"


@pytest.fixture(scope="module")
def single_grf(tmp_path_factory) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """The single process's GRF-GP run, which every group size is compared with."""
    return workers.fit_and_predict_grf(None, 50, tmp_path_factory.mktemp("single") / "single.npy")


@pytest.fixture(scope="module")
def single_sparse_spectrum() -> dict[str, np.ndarray]:
    """The single process's sparse-spectrum GP run, which every group size is compared with."""
    return workers.fit_and_predict_sparse_spectrum(None)


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_fit_and_predict_a_grf_gp_like_one(tmp_path, processes: int,  # type: ignore[no-untyped-def]
                                                     single_grf: dict[str, np.ndarray]) -> None:
    single = single_grf
    _ran(workers.run_ranks(workers.grf_gp, processes, tmp_path, 17), tmp_path)
    double = np.load(tmp_path / f"grf_{processes}.npz")
    assert len(single["losses"]) > 3 and single["losses"][-1] < single["losses"][0]
    # The walk schedule ran (a training phase on redrawn walks, a round on the prediction walks) and
    # every process made the same choices.
    assert int(single["phases"]) >= 3
    for key in ("losses", "gamma", "outputscale", "noise"):
        _close(double[key], single[key])
    for key in ("phases", "walkers", "p_halt", "permutation"):
        np.testing.assert_array_equal(double[key], single[key])
    # The predictor reuses the rows each process's kernel holds (its block of the 60 observed nodes).
    assert int(single["reused_rows"]) == 60 and int(double["reused_rows"]) == 60 // processes
    for key in ("mean", "variance"):
        _close(double[key], single[key])
    written = np.load(tmp_path / f"predictions_{processes}.npy")
    _close(written[:, 0], single["mean"])
    _close(written[:, 1], single["variance"])


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_fit_and_predict_a_sparse_spectrum_gp_like_one(  # type: ignore[no-untyped-def]
        tmp_path, processes: int, single_sparse_spectrum: dict[str, np.ndarray]) -> None:
    single = single_sparse_spectrum
    _ran(workers.run_ranks(workers.sparse_spectrum_gp, processes, tmp_path), tmp_path)
    double = np.load(tmp_path / f"rff_{processes}.npz")
    assert len(single["losses"]) > 3
    for key in ("losses", "lengthscale", "mean", "variance"):
        _close(double[key], single[key])


def test_processes_run_predict_graph_on_the_exact_gp_like_one(tmp_path,  # type: ignore[no-untyped-def]
                                                              monkeypatch) -> None:
    """``predict-graph`` choosing the exact GP: every process trains, rank 0's model predicts, the file is the same.

    Blocks of 12 nodes and 5 columns: the cross-covariances' column blocks are shared between the processes.
    """
    from gp_couple.cli import main

    cross_entries = 5 * 144
    monkeypatch.setattr("gp_couple.streaming.CROSS_ENTRIES", cross_entries)

    _, train, targets = workers.graph_problem()
    observations = tmp_path / "values.csv"
    np.savetxt(observations, np.c_[train, targets], delimiter=",", header="node,value", comments="",
               fmt=["%d", "%.10f"])
    argv = ["predict-graph", "--graph", "grid:12x12", "--observations", str(observations), "--chunk-size", "20",
            "--threads", "1"]
    assert main([*argv, "--output", str(tmp_path / "one.npy")]) == 0
    _ran(workers.run_ranks(workers.predict_graph_command, 2, tmp_path, [*argv, "--output", str(tmp_path / "two.npy")],
                           cross_entries), tmp_path)
    one, two = np.load(tmp_path / "one.npy"), np.load(tmp_path / "two.npy")
    assert one.shape == (144, 2) and np.all(one[:, 1] > 0)
    _close(two, one)


def test_a_dead_process_is_an_error_within_the_timeout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    timeout = 10.0
    codes = workers.run_ranks(workers.dying_peer, 2, tmp_path, timeout, timeout=120.0)
    assert codes == [0, 3], codes
    elapsed, outcome = (tmp_path / "outcome.txt").read_text().split("\n", 1)
    assert outcome.startswith("DistributedError: all_reduce across 2 processes failed on rank 0"), outcome
    assert float(elapsed) < timeout + 5.0


def test_one_process_is_the_trivial_group() -> None:
    collective = initialise()
    assert isinstance(collective, Collective) and (collective.rank, collective.size) == (0, 1)
    tensor = torch.arange(3.0)
    assert collective.all_reduce(tensor) is tensor
    assert collective.shard(10) == slice(0, 10)
    collective.check_same("anything", 1)


def test_rows_are_shared_in_contiguous_nearly_equal_blocks() -> None:
    collective = Collective()
    collective.size = 4
    assert collective.shard_bounds(10) == [0, 2, 5, 7, 10]


@pytest.mark.parametrize("kwargs, error, message", [
    ({"backend": "mpi"}, ValueError, "backend must be 'gloo', 'nccl' or None"),
    ({"timeout": 0}, ValueError, "timeout must be a positive number"),
    ({"timeout": True}, ValueError, "timeout must be a positive number"),
])
def test_bad_initialise_arguments_are_refused(kwargs, error, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=message):
        initialise(**kwargs)


def test_a_failed_rendezvous_is_an_error_within_the_timeout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import time

    start = time.monotonic()
    with pytest.raises(DistributedError, match="the rendezvous of the process group failed"):
        initialise("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=2, timeout=3)
    assert time.monotonic() - start < 30
