"""Fixtures shared by the dataset-loader tests."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def corrupted_copy(data_dir: Path, tmp_path: Path) -> Callable[[str], Path]:
    """Copy ``<data_dir>/<relative>`` to ``tmp_path/<relative>`` with one byte changed.

    Returns the copy's data directory (``tmp_path``) so a loader can be pointed at it.
    """

    def make(relative: str) -> Path:
        target = tmp_path.joinpath(*relative.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data_dir.joinpath(*relative.split("/")), target)
        content = bytearray(target.read_bytes())
        # Change one digit near the middle, so text formats still parse and only the
        # checksum can tell.
        position = next((i for i in range(len(content) // 2, len(content))
                         if chr(content[i]).isdigit()), len(content) // 2)
        content[position] = ord("7") if content[position] != ord("7") else ord("3")
        target.write_bytes(bytes(content))
        return tmp_path

    return make


@pytest.fixture
def no_env_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset ``GP_COUPLE_DATA`` for the test."""
    monkeypatch.delenv("GP_COUPLE_DATA", raising=False)


@pytest.fixture
def memory_16_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with 16 GiB available, so that size refusals do not depend on this one."""
    monkeypatch.setattr("gp_couple._checks.available_memory", lambda: 16 * 2 ** 30)
