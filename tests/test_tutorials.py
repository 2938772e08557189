"""The graph tutorials run end to end (``--quick`` settings, as a user would run them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"


@pytest.mark.parametrize("script, expected", [
    ("graph_random_features.py", ["sigma: error", "quantile-mirror: error"]),
    ("mesh_interpolation.py", ["exact GP:", "sigma walkers", "reloaded model predicts identically"]),
    ("pyro_nuts.py", ["posterior gamma", "Bayesian model average"]),
])
def test_tutorial_runs(script: str, expected: list[str]) -> None:
    result = subprocess.run([sys.executable, str(TUTORIALS / script), "--quick"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    for text in expected:
        assert text in result.stdout
