"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
_DEFAULT_DATA = REPO_ROOT.parent / "shared" / "datasets"


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (the README's ``-n 2``), one thread per pool in each worker process.

    The workers already keep every CPU busy; a worker's pools would only wait for peers
    that the other worker descheduled (:func:`gp_couple.settings.threads`). Tests that set
    their own thread counts still do so inside ``threads(...)`` blocks.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    import numba
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    numba.set_num_threads(1)
    config.stash[_THREAD_LIMITS] = threadpool_limits(limits=1)


_THREAD_LIMITS = pytest.StashKey[object]()


def shared_data_dir() -> Path | None:
    """``$GP_COUPLE_DATA`` if set, else ``../shared/datasets`` beside the repo, if present."""
    candidate = Path(os.environ.get("GP_COUPLE_DATA", _DEFAULT_DATA))
    return candidate if candidate.is_dir() else None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Directory of the real datasets; tests that need it skip when it is absent."""
    path = shared_data_dir()
    if path is None:
        pytest.skip(f"dataset directory not found (set GP_COUPLE_DATA or provide {_DEFAULT_DATA})")
    return path


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA not available"))])
def device(request: pytest.FixtureRequest) -> torch.device:
    """Every available device: the CPU always, CUDA where present (skipped with a reason otherwise)."""
    return torch.device(request.param)
