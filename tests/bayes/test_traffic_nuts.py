"""``gp-couple traffic-nuts`` end to end on a small traffic split (real data; skipped without it)."""

from __future__ import annotations

import json
import math

from gp_couple.cli import main


def test_traffic_nuts_reports_point_and_posterior_rows(data_dir, capsys) -> None:
    status = main(["traffic-nuts", "--data-dir", str(data_dir), "--train", "30", "--test", "10",
                   "--num-samples", "4", "--warmup", "4", "--max-tree-depth", "2", "--train-iterations", "5",
                   "--walkers", "4", "--json", "--quiet"])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    assert report["train"] == 30 and report["test"] == 10 and report["nodes"] == 1016
    rows = {row["model"]: row for row in report["results"]}
    assert set(rows) == {"grf_point", "grf_nuts", "exact_point", "exact_nuts"}
    for row in rows.values():
        assert math.isfinite(row["test_rmse"]) and row["test_rmse"] > 0
        assert math.isfinite(row["test_nlpd"]) and row["seconds"] > 0
    for kind in ("grf", "exact"):
        posterior = rows[f"{kind}_nuts"]["posterior"]
        assert set(posterior) == {"outputscale", "gamma", "noise"}
        assert all(site["mean"] > 0 and site["r_hat"] is not None for site in posterior.values())
    assert report["settings"]["num_samples"] == 4 and "split R-hat" in report["notes"][1]
    assert report["settings"]["p_halt_choice"] == "auto" and 0 < report["settings"]["p_halt"] <= 0.5


def test_automatic_p_halt_needs_the_exact_gp(capsys) -> None:
    assert main(["traffic-nuts", "--no-exact", "--quiet"]) == 2
    assert "--p-halt auto is chosen at the exact GP's estimate" in capsys.readouterr().err
