"""Thread limits of the Euclidean experiments: torch and BLAS pools bounded inside, restored after."""

from __future__ import annotations

import pytest
import torch
from threadpoolctl import threadpool_info

from gp_couple.experiments._runtime import bounded_threads, with_bounded_threads


def _blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


def test_bounded_threads_limits_and_restores() -> None:
    torch_before, blas_before = torch.get_num_threads(), _blas_threads()
    with bounded_threads(1):
        assert torch.get_num_threads() == 1
        assert all(count == 1 for count in _blas_threads())
    assert torch.get_num_threads() == torch_before and _blas_threads() == blas_before


def test_restored_also_when_the_work_fails() -> None:
    before = torch.get_num_threads()

    @with_bounded_threads
    def failing() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        failing(threads=1)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_bad_thread_counts(threads: object) -> None:
    with pytest.raises(ValueError, match="threads"):
        with bounded_threads(threads):  # type: ignore[arg-type]
            pass
