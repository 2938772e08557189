"""Every command's ``--plot DIR`` writes its figures (tiny settings; Agg, no display needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")

from gp_couple.cli import main  # noqa: E402

GRAPH_GP = ["--train-iterations", "3", "--walkers", "2", "4", "--repeats", "2", "--order", "6",
            "--fit-samples", "5", "--json"]


def run_and_list(argv: list[str], folder: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    """Run a command with ``--plot folder``; return its JSON report after checking the log."""
    assert main([*argv, "--plot", str(folder)]) == 0
    captured = capsys.readouterr()
    for png in folder.glob("*.png"):
        assert f"wrote {png}" in captured.err  # the user is told where each figure went
        assert png.stat().st_size > 5000
    return json.loads(captured.out)


def names(folder: Path) -> set[str]:
    return {path.name for path in folder.glob("*.png")}


def test_demo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_and_list(["demo", "--train-iterations", "3", "--walkers", "2", "--repeats", "1", "--json",
                           "--max-train-walkers", "8", "--max-predict-walkers", "8"],
                          tmp_path, capsys)
    assert names(tmp_path) == {"bumpy_icosphere_posterior.png", "bumpy_icosphere_metrics_vs_walkers.png",
                               "bumpy_icosphere_training.png"}
    assert "node_posterior" not in report and 1 <= len(report["trained"]["losses"]) <= 4


def test_mesh(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import trimesh

    mesh_file = tmp_path / "ball.obj"
    trimesh.creation.icosphere(subdivisions=2).export(mesh_file)  # 320 faces: fast
    figures = tmp_path / "figures"
    run_and_list(["mesh", "--mesh", str(mesh_file), *GRAPH_GP], figures, capsys)
    assert names(figures) == {"ball_posterior.png", "ball_metrics_vs_walkers.png", "ball_training.png"}


def test_traffic(tmp_path: Path, capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    run_and_list(["traffic", "--data-dir", str(data_dir), *GRAPH_GP], tmp_path, capsys)
    assert names(tmp_path) == {"traffic_map.png", "traffic_metrics_vs_walkers.png", "traffic_training.png"}


def test_grf_gram(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_and_list(["grf-gram", "--graph", "grid:4x4", "--kernels", "diffusion", "--p-halt", "0.3", "0.5",
                           "--walkers", "2", "--repeats", "2", "--order", "4", "--fit-samples", "5", "--json"],
                          tmp_path, capsys)
    assert names(tmp_path) == {"grf_gram_error_vs_p_halt.png"}
    assert [fit["p_halt"] for fit in report["sigma_permutations"]] == [0.3, 0.5]
    assert sorted(report["sigma_permutations"][0]["permutation"]) == [0, 1, 2, 3]


def test_pagerank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_and_list(["pagerank", "--graphs", "grid:4x4", "--p-halt", "0.5", "--repeats", "3", "--order", "4",
                  "--fit-samples", "5", "--json"], tmp_path, capsys)
    assert names(tmp_path) == {"pagerank_error_vs_p_halt.png"}


def test_attention(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_and_list(["attention", "--tokens", "4", "--dim", "4", "--num-features", "4", "8", "--draws", "10",
                  "--repeats", "2", "--json"], tmp_path, capsys)
    assert names(tmp_path) == {"attention_vs_features.png"}


def test_kernel_estimation(tmp_path: Path, capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    run_and_list(["kernel-estimation", "--dataset", "boston", "--data-dir", str(data_dir), "--json", "--splits", "1",
                  "--draws", "3", "--gp-iterations", "10", "--max-train", "30", "--max-test", "20",
                  "--rff-couplings", "iid", "pnc", "--rlf-couplings", "iid"], tmp_path, capsys)
    assert names(tmp_path) == {"kernel_estimation_boston.png"}


def test_copula_learning(tmp_path: Path, capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    run_and_list(["copula-learning", "--data-dir", str(data_dir), "--json", "--features", "rlf", "--iterations", "4",
                  "--log-every", "2", "--eval-draws", "20", "--repeats", "2", "--max-train", "30"], tmp_path, capsys)
    assert names(tmp_path) == {"copula_training.png", "copula_loss.png"}


def test_traffic_nuts(tmp_path: Path, capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    run_and_list(["traffic-nuts", "--data-dir", str(data_dir), "--train", "30", "--test", "10", "--num-samples", "4",
                  "--warmup", "4", "--max-tree-depth", "2", "--train-iterations", "5", "--walkers", "4", "--no-exact",
                  "--p-halt", "0.4", "--json"], tmp_path, capsys)
    assert names(tmp_path) == {"traffic_nuts_scores.png", "traffic_nuts_point_fit.png"}
