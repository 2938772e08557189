"""The sparse-spectrum GP tutorial runs end to end with tiny settings."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIAL = Path(__file__).resolve().parents[1] / "tutorials" / "sparse_spectrum_gp.py"


def _load_tutorial():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("sparse_spectrum_gp_tutorial", TUTORIAL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tutorial_quick_synthetic(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the tutorial draws figures (plot extra)")
    rows = _load_tutorial().main(["--quick", "--dataset", "synthetic", "--output", str(tmp_path)])
    assert [row["coupling"] for row in rows] == ["iid", "orthogonal", "pnc"]
    for row in rows:
        assert all(math.isfinite(row[key]) for key in ("gram_error", "test_rmse", "test_nlpd"))
    assert "pnc" in capsys.readouterr().out
    assert {path.name for path in tmp_path.glob("*.png")} == {"training.png", "couplings.png"}


def test_tutorial_quick_uci(data_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the tutorial draws figures (plot extra)")
    rows = _load_tutorial().main(["--quick", "--dataset", "boston", "--data-dir", str(data_dir),
                                  "--couplings", "pnc", "--output", str(tmp_path)])
    assert rows[0]["coupling"] == "pnc" and math.isfinite(rows[0]["test_rmse"])


def test_tutorial_script_entry_point(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the tutorial draws figures (plot extra)")
    result = subprocess.run([sys.executable, str(TUTORIAL), "--dataset", "synthetic", "--output", str(tmp_path)],
                            env={**os.environ, "GP_COUPLE_TUTORIAL_QUICK": "1"}, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "test RMSE" in result.stdout
