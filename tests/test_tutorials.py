"""The tutorials run end to end in their ``--quick`` smoke mode, as a user would run them,
and write their figures into the folder given by ``--output``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"


def run_tutorial(script: str, *options: str) -> str:
    result = subprocess.run([sys.executable, str(TUTORIALS / script), "--quick", *options],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def check_figures(folder: Path, expected: set[str], stdout: str) -> None:
    assert {path.name for path in folder.glob("*.png")} == expected
    for name in expected:
        assert (folder / name).stat().st_size > 5000
        assert f"wrote {folder / name}" in stdout


@pytest.mark.parametrize("script, expected, figures", [
    ("graph_random_features.py", ["sigma: error", "quantile-mirror: error", "saved and reloaded"],
     {"gram_error_vs_p_halt.png", "gram_error_vs_walkers.png"}),
    ("mesh_interpolation.py", ["exact GP:", "sigma walkers", "reloaded model predicts identically"],
     {"training.png", "posterior.png", "metrics_vs_walkers.png"}),
    ("choosing_a_coupling.py", ["-> proposal:", "-> coupling:", "-> directions:", "choice:"],
     {"choices.png", "budget.png"}),
])
def test_tutorial_without_data(script: str, expected: list[str], figures: set[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the tutorials draw figures (plot extra)")
    stdout = run_tutorial(script, "--output", str(tmp_path))
    for text in expected:
        assert text in stdout
    check_figures(tmp_path, figures, stdout)


@pytest.mark.parametrize("script, expected, figures", [
    ("swap_rff_kernel.py", ["RBFKernel (exact)", "RFFKernel (iid)", "CoupledRFFKernel pnc"],
     {"accuracy_and_time.png", "training.png"}),
    ("traffic_regression.py", ["test RMSE: GRF-GP", "95 % intervals hold", "hops from a training sensor"],
     {"training.png", "traffic_map.png"}),
])
def test_tutorial_on_shared_data(script: str, expected: list[str], figures: set[str], tmp_path: Path,
                                 data_dir: Path) -> None:
    pytest.importorskip("matplotlib", reason="the tutorials draw figures (plot extra)")
    stdout = run_tutorial(script, "--data-dir", str(data_dir), "--output", str(tmp_path))
    for text in expected:
        assert text in stdout
    check_figures(tmp_path, figures, stdout)


def test_pyro_nuts_tutorial() -> None:
    stdout = run_tutorial("pyro_nuts.py")
    for text in ("posterior gamma", "Bayesian model average"):
        assert text in stdout
