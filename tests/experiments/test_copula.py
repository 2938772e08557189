"""``gp-couple copula-learning``: the learned copula against PNC (app:copulas)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gp_couple.cli import main
from gp_couple.experiments.copula import run_copula_learning


def _synthetic(n: int = 80, d: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d))
    return x, x.sum(-1) + 0.1 * rng.standard_normal(n)


def test_learned_copula_improves_on_its_start_and_reports_curve() -> None:
    x, y = _synthetic()
    report = run_copula_learning(x, y, features=("rff",), iterations=40, lr=0.1, samples_per_step=8,
                                 eval_draws=200, log_every=20, repeats=2, max_train=40, gp_iterations=30, seed=1)
    rows = {row["coupling"]: row for row in report["results"]}
    assert set(rows) == {"iid", "orthogonal", "pnc", "copula (learned)"}
    curve = report["training_curve"]["rff"]
    assert [point["step"] for point in curve] == [20, 40]
    assert all(point["n"] == 2 for point in curve)
    # The copula starts at orthogonal (independent norms) and learns towards PNC.
    learned, orthogonal = rows["copula (learned)"]["loss"], rows["orthogonal"]["loss"]
    assert learned["mean"] < orthogonal["mean"]
    assert rows["pnc"]["loss_vs_pnc"]["mean"] == pytest.approx(1.0)
    json.dumps(report)


def test_bad_arguments() -> None:
    x, y = _synthetic()
    with pytest.raises(ValueError, match="unknown feature map"):
        run_copula_learning(x, y, features=("orf",), iterations=1, repeats=1)
    with pytest.raises(ValueError, match="iterations"):
        run_copula_learning(x, y, iterations=0)


def test_cli_json_rlf_on_boston(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["copula-learning", "--data-dir", str(data_dir), "--json", "--features", "rlf",
                 "--iterations", "4", "--log-every", "2", "--eval-draws", "20", "--repeats", "2",
                 "--max-train", "30"]) == 0
    report = json.loads(capsys.readouterr().out)
    couplings = [row["coupling"] for row in report["results"]]
    assert couplings == ["iid", "orthogonal+antithetic", "pnc+antithetic", "copula (learned)"]
    assert report["settings"]["num_frequencies"] == {"rlf": 26}
