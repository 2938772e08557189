"""End-to-end runs of the grf-gram and pagerank sub-commands (tiny settings)."""

from __future__ import annotations

import json

import pytest

from gp_couple.cli import main


def run_json(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_grf_gram_reports_mean_se_and_repeats(capsys, tmp_path) -> None:
    report = run_json(capsys, [
        "grf-gram", "--graph", "grid:6x6", "--p-halt", "0.5", "--walkers", "2", "--repeats", "4",
        "--order", "6", "--fit-samples", "10", "--kernels", "diffusion", "--json",
        "--save-couplings", str(tmp_path)])
    assert report["experiment"] == "grf-gram" and report["graph"]["nodes"] == 36
    rows = report["results"]
    assert [(row["coupling"], row["directions"]) for row in rows] == [
        (coupling, directions) for coupling in ("iid", "antithetic", "sigma")
        for directions in ("independent", "repelling")]
    for row in rows:
        assert set(row["error"]) == {"mean", "se", "n"} and row["error"]["n"] == 4
        assert 0 < row["error"]["mean"] < 10
    assert rows[0]["error_vs_iid"] == 1.0
    assert list(tmp_path.glob("sigma_Diffusion_p0.5_n6.json"))


def test_sigma_beats_iid_on_karate_at_high_p_halt(capsys, data_dir) -> None:
    """fig:grfs_more_graphs: sigma-coupled GRFs estimate the 2-regularised Laplacian better."""
    # 300 repeats: the improvement is about 4-5 standard errors there (about 3 at 100 repeats,
    # too close to the threshold for a test that must not depend on its seed).
    report = run_json(capsys, [
        "grf-gram", "--graph", "karate", "--data-dir", str(data_dir), "--p-halt", "0.5",
        "--walkers", "2", "--repeats", "300", "--kernels", "regularised-laplacian",
        "--couplings", "iid", "sigma", "--directions", "independent", "--json"])
    iid, sigma = (row["error"] for row in report["results"])
    gap = iid["mean"] - sigma["mean"]
    assert gap > 3 * (iid["se"] ** 2 + sigma["se"] ** 2) ** 0.5


def test_pagerank_experiment(capsys) -> None:
    report = run_json(capsys, [
        "pagerank", "--graphs", "erdos-renyi:40:0.15:2", "--p-halt", "0.5", "--repeats", "20",
        "--fit-samples", "50", "--json"])
    assert [(row["coupling"], row["directions"]) for row in report["results"]] == [
        (coupling, directions) for coupling in ("iid", "antithetic", "sigma")
        for directions in ("independent", "repelling")]
    assert all(row["error"]["n"] == 20 for row in report["results"])


@pytest.mark.parametrize("argv, message", [
    (["grf-gram", "--graph", "grid:axb"], "malformed graph spec"),
    (["grf-gram", "--graph", "grid:4x4", "--walkers", "3", "--couplings", "antithetic"], "even"),
    (["pagerank", "--graphs", "no-such-graph", "--data-dir", "/nonexistent"], "unknown graph"),
])
def test_clear_errors(capsys, argv, message) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["grf-gram", "--graph", "grid:4x4", "--proposal", "greedy"], "invalid choice: 'greedy'"),
    (["pagerank", "--graphs", "grid:4x4", "--directions", "sideways"], "invalid choice: 'sideways'"),
])
def test_walk_options_are_checked(capsys, argv, message) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_table_output(capsys) -> None:
    assert main(["pagerank", "--graphs", "grid:4x4", "--p-halt", "0.5", "--repeats", "3",
                 "--couplings", "iid", "antithetic"]) == 0
    out = capsys.readouterr().out
    assert "coupling" in out and "antithetic" in out and "±" in out
