"""``gp-couple attention``: attention statistics and the PM effect of app:performers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gp_couple.cli import main
from gp_couple.couplings import OrthogonalCoupling
from gp_couple.experiments.attention import attention_statistics, run_attention


def test_statistics_match_direct_estimates() -> None:
    rng = np.random.default_rng(0)
    keys = torch.as_tensor(0.25 * rng.standard_normal((4, 3)))
    frequencies = OrthogonalCoupling().sample(3, 3, batch_shape=(50,), seed=1, dtype=torch.float64)
    stats = attention_statistics(keys, frequencies)
    scaled = torch.exp(frequencies @ keys.T - 0.5 * (keys**2).sum(-1)) / np.sqrt(3)  # (R, m, N)
    estimates = (scaled.mT @ scaled).numpy()  # (R, N, N)
    variance = np.var(estimates, axis=0, ddof=1)
    assert stats["kernel_variance"] == pytest.approx(variance[~np.eye(4, dtype=bool)].mean())
    covariances = [np.cov(estimates[:, i, j], estimates[:, i, k])[0, 1]
                   for i in range(4) for j in range(4) for k in range(4) if len({i, j, k}) == 3]
    assert stats["kernel_covariance"] == pytest.approx(np.mean(covariances))
    exact = np.exp(keys.numpy() @ keys.numpy().T)
    attention = exact / exact.sum(-1, keepdims=True)
    estimated = estimates / estimates.sum(-1, keepdims=True)
    assert stats["attention_mse"] == pytest.approx(((estimated - attention) ** 2).mean())


def test_positive_monotone_lowers_attention_error_and_raises_covariance() -> None:
    report = run_attention(tokens=16, dim=16, num_features=[16], draws=500, repeats=6, seed=0)
    rows = {row["coupling"]: row for row in report["results"]}
    pm = rows["pm"]
    # Paired ratios to orthogonal on the same keys (fig:var_fig).
    assert pm["attention_mse_vs_orthogonal"]["mean"] + 4 * pm["attention_mse_vs_orthogonal"]["se"] < 1.0
    assert pm["kernel_covariance_vs_orthogonal"]["mean"] - 4 * pm["kernel_covariance_vs_orthogonal"]["se"] > 1.0
    assert rows["orthogonal"]["attention_mse_vs_orthogonal"]["mean"] == pytest.approx(1.0)


def test_report_structure_and_seeding() -> None:
    settings = dict(tokens=5, dim=4, num_features=[4, 8], draws=20, repeats=2, seed=3)
    report = run_attention(**settings)
    assert [(r["coupling"], r["num_features"]) for r in report["results"]] == [
        (c, m) for c in ("orthogonal", "pnc", "pm") for m in (4, 8)]
    for row in report["results"]:
        for metric in ("kernel_variance", "kernel_covariance", "attention_mse"):
            assert set(row[metric]) == {"mean", "se", "n"} and row[metric]["n"] == 2
    assert json.dumps(report) == json.dumps(run_attention(**settings))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="draws"):
        run_attention(draws=1, repeats=1)
    with pytest.raises(ValueError, match="keys"):
        run_attention(tokens=2, dim=4, num_features=[4], draws=5, repeats=1)
    with pytest.raises(ValueError, match="unknown frequency coupling"):
        run_attention(couplings=["orthogonal", "ppm"], draws=5, repeats=1)
    with pytest.raises(ValueError, match="key_std"):
        run_attention(key_std=-1.0, draws=5, repeats=1)


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attention", "--json", "--tokens", "4", "--dim", "4", "--num-features", "4",
                 "--draws", "10", "--repeats", "2", "--couplings", "orthogonal", "pm"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["experiment"] == "attention" and len(report["results"]) == 2
