"""Tiny end-to-end runs of the graph-GP protocol and its sub-commands (mesh, traffic, demo)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gp_couple.cli import main
from gp_couple.experiments.graph_gp import GraphGPProtocol, run_protocol
from gp_couple.graphs import grid_graph

TINY = ["--train-iterations", "3", "--walkers", "4", "--repeats", "2", "--order", "6",
        "--fit-samples", "5", "--json"]


def smooth_signal(rows: int, cols: int) -> np.ndarray:
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return (np.sin(r / 3.0) + np.cos(c / 4.0)).ravel()


def test_protocol_report_structure() -> None:
    graph = grid_graph(8, 8)
    targets = smooth_signal(8, 8)
    rng = np.random.default_rng(0)
    nodes = rng.permutation(64)
    protocol = GraphGPProtocol(train_iterations=5, walkers=(4,), repeats=2, sigma_order=6,
                               sigma_fit_samples=5)
    report = run_protocol(graph, targets, nodes[:50], nodes[50:], protocol)
    assert report["train"] == 50 and report["test"] == 14
    trained = report["trained"]
    assert trained["outputscale"] > 0 and trained["hyperparameters"]["gamma"] > 0 and trained["noise"] > 0
    assert trained["family_name"] == "diffusion"
    assert set(report["exact_at_trained"]) == {"test_rmse", "test_nlpd"}
    assert [(row["coupling"], row["directions"]) for row in report["results"]] == [
        (coupling, directions) for coupling in ("iid", "antithetic", "sigma")
        for directions in ("independent", "repelling")]
    for row in report["results"]:
        assert row["kl"]["mean"] >= 0 and row["gram_error"]["n"] == 2
        assert np.isfinite(row["test_rmse"]["mean"])


@pytest.mark.parametrize("change, message", [
    ({"walkers": (3,)}, "even"), ({"couplings": ("iid", "halton")}, "couplings"),
    ({"repeats": 0}, "repeats"), ({"p_halt": 1.0}, "p_halt"),
    ({"proposal": "greedy"}, "unknown neighbour proposal 'greedy'"),
    ({"directions": ("sideways",)}, "unknown direction coupling 'sideways'"), ({"directions": ()}, "directions")])
def test_protocol_validation(change, message) -> None:
    protocol = GraphGPProtocol(**change)
    with pytest.raises(ValueError, match=message):
        protocol.validate()


def test_protocol_input_errors() -> None:
    graph = grid_graph(4, 4)
    protocol = GraphGPProtocol(train_iterations=1, walkers=(2,), repeats=1)
    with pytest.raises(ValueError, match="one value per graph node"):
        run_protocol(graph, np.zeros(3), np.arange(10), np.arange(10, 16), protocol)
    with pytest.raises(ValueError, match="overlap"):
        run_protocol(graph, np.zeros(16), np.arange(10), np.arange(9, 16), protocol)
    targets = np.zeros(16)
    targets[12] = np.nan
    with pytest.raises(ValueError, match="finite"):
        run_protocol(graph, targets, np.arange(10), np.arange(10, 16), protocol)


def test_demo_runs_without_data(capsys) -> None:
    assert main(["demo", "--train-iterations", "3", "--walkers", "4", "--repeats", "1", "--json",
                 "--max-train-walkers", "8", "--max-predict-walkers", "8"]) == 0
    report = json.loads(capsys.readouterr().out)
    # iid, antithetic and sigma, each with independent and repelling directions.
    assert report["nodes"] == 1280 and len(report["results"]) == 6


def test_mesh_command_on_a_paper_mesh(capsys, data_dir) -> None:
    assert main(["mesh", "--mesh", "teapot", "--data-dir", str(data_dir), *TINY]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["meshes"]["teapot"]["nodes"] == 894 and report["meshes"]["teapot"]["test"] == 44


def test_missing_data_directory_is_a_clear_error(capsys, monkeypatch) -> None:
    monkeypatch.delenv("GP_COUPLE_DATA", raising=False)
    assert main(["traffic", *TINY]) == 2
    assert "GP_COUPLE_DATA" in capsys.readouterr().err
