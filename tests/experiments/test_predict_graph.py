"""``gp-couple predict-graph``: your edge list and node values in, every node's prediction out."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from gp_couple.cli import main
from gp_couple.graphs import grid_graph


@pytest.fixture()
def files(tmp_path):  # type: ignore[no-untyped-def]
    graph = grid_graph(10, 10)
    rows = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    upper = rows < graph.indices
    edges = tmp_path / "edges.csv"
    np.savetxt(edges, np.c_[rows[upper], graph.indices[upper]], delimiter=",", header="source,target",
               comments="", fmt="%d")
    rng = np.random.default_rng(0)
    nodes = np.sort(rng.choice(graph.num_nodes, 40, replace=False))
    values = 10.0 + np.sin(nodes / 9.0) + 0.05 * rng.normal(size=nodes.size)
    observations = tmp_path / "values.csv"
    np.savetxt(observations, np.c_[nodes, values], delimiter=",", header="node,speed", comments="",
               fmt=["%d", "%.6f"])
    return edges, observations, nodes, values


def test_predicts_every_node_in_the_data_units(files, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    edges, observations, nodes, values = files
    output = tmp_path / "out" / "predictions.npy"
    assert main(["predict-graph", "--graph", str(edges), "--observations", str(observations), "--output",
                 str(output), "--iterations", "20", "--predict-walkers", "32", "--chunk-size", "7", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    quantities = {row["quantity"]: row["value"] for row in report["results"]}
    assert quantities["nodes"] == 100 and quantities["observed nodes"] == 40 and quantities["processes"] == 1
    # Training followed the walk schedule: it ended on rounds on the 32 sigma-coupled prediction walkers.
    assert quantities["training phases"] >= 2 and quantities["prediction walkers per node"] == 32
    predictions = np.load(output)
    assert predictions.shape == (100, 2) and np.all(np.isfinite(predictions)) and np.all(predictions[:, 1] > 0)
    # The means are in the data's units: close to the observations where observed.
    assert np.sqrt(np.mean((predictions[nodes, 0] - values) ** 2)) < 0.5 * np.std(values)
    # The written file is the streamed prediction whatever the chunk size.
    again = tmp_path / "again.npy"
    assert main(["predict-graph", "--graph", str(edges), "--observations", str(observations), "--output",
                 str(again), "--iterations", "20", "--predict-walkers", "32", "--chunk-size", "1000",
                 "--json", str(tmp_path / "report.json")]) == 0
    np.testing.assert_array_equal(np.load(again), predictions)


@pytest.mark.parametrize("rows, message", [
    ("node,a,b\n1,2,3\n2,3,4\n", "must have two columns, a node column and a value column; it has 3"),
    ("node,value\n1.5,2\n2,3\n", r"node index 1.5 \(data row 1\) is not an integer"),
    ("node,value\n1,2\n100,3\n", "100"),
    ("node,value\n1,2\n1,3\n", "repeated|duplicate"),
    ("node,value\n1,2\n", "at least two observations"),
    ("node,value\n1,nan\n2,3\n", "NaN or infinite"),
])
def test_bad_observations_are_refused_with_the_file_named(files, tmp_path, capsys, rows: str,
                                                          message: str) -> None:  # type: ignore[no-untyped-def]
    edges, _, _, _ = files
    observations = tmp_path / "bad.csv"
    observations.write_text(rows)
    code = main(["predict-graph", "--graph", str(edges), "--observations", str(observations), "--output",
                 str(tmp_path / "p.npy")])
    error = capsys.readouterr().err
    assert code != 0 and "predict-graph" in error
    assert re.search(message, error), error
    assert not (tmp_path / "p.npy").exists()


def test_a_bad_output_is_refused_before_any_work(files, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    edges, observations, _, _ = files
    (tmp_path / "folder.npy").mkdir()
    code = main(["predict-graph", "--graph", str(edges), "--observations", str(observations), "--output",
                 str(tmp_path / "folder.npy")])
    assert code != 0 and "--output" in capsys.readouterr().err


def test_auto_trains_and_streams_the_exact_gp_on_a_small_graph(files, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Without GRF options a small graph gets the exact GP: the file is its float64 posterior at the reported
    hyperparameters."""
    import torch

    from gp_couple.kernel_families import Diffusion
    from gp_couple.kernels.exact_graph import ExactGraphKernel

    edges, observations, nodes, values = files
    output = tmp_path / "exact.npy"
    assert main(["predict-graph", "--graph", str(edges), "--observations", str(observations), "--output",
                 str(output), "--chunk-size", "30", "--json"]) == 0
    quantities = {row["quantity"]: row["value"] for row in json.loads(capsys.readouterr().out)["results"]}
    assert quantities["kernel"] == "matrix_free" and quantities["converged"] is True
    assert "prediction walkers per node" not in quantities and "training phases" not in quantities
    graph = grid_graph(10, 10)
    with torch.no_grad():
        gram = ExactGraphKernel(graph, Diffusion(quantities["gamma"])).double()(
            torch.arange(100)).to_dense().numpy() * quantities["outputscale"]
    noise, offset = quantities["noise variance"], float(np.mean(values))
    observed = gram[np.ix_(nodes, nodes)] + noise * np.eye(nodes.size)
    cross = gram[:, nodes]
    mean = offset + cross @ np.linalg.solve(observed, values - offset)
    variance = np.diag(gram) - np.einsum("ij,ji->i", cross, np.linalg.solve(observed, cross.T)) + noise
    predictions = np.load(output)
    np.testing.assert_allclose(predictions[:, 0], mean, rtol=1e-6, atol=1e-6 * np.std(values))
    # The matrix-free kernel's Chebyshev series is exact to 1e-8 of the prior scale; the variances
    # subtract two such numbers.
    np.testing.assert_allclose(predictions[:, 1], variance, rtol=1e-6, atol=1e-6 * quantities["outputscale"])


def test_the_grf_kernel_is_chosen_by_name_or_by_its_options(files, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    edges, observations, _, _ = files
    common = ["predict-graph", "--graph", str(edges), "--observations", str(observations), "--iterations", "5"]
    assert main([*common, "--output", str(tmp_path / "grf.npy"), "--kernel", "grf", "--phases", "1",
                 "--json"]) == 0
    quantities = {row["quantity"]: row["value"] for row in json.loads(capsys.readouterr().out)["results"]}
    assert quantities["kernel"] == "grf" and quantities["training phases"] >= 1
    assert quantities["prediction walkers per node"] >= 2
    code = main([*common, "--output", str(tmp_path / "bad.npy"), "--kernel", "matrix_free", "--predict-walkers",
                 "32", "--phases", "2"])
    error = capsys.readouterr().err
    assert code != 0 and "--kernel matrix_free" in error and "--phases, --predict-walkers" in error
    assert not (tmp_path / "bad.npy").exists()
    with pytest.raises(SystemExit):
        main([*common, "--output", str(tmp_path / "bad.npy"), "--kernel", "exact"])
    assert "invalid choice: 'exact'" in capsys.readouterr().err


def test_the_exact_gp_beyond_its_dense_factor_is_refused_before_training(files, tmp_path, capsys,  # type: ignore[no-untyped-def]
                                                                         monkeypatch) -> None:
    edges, observations, _, _ = files
    monkeypatch.setattr("gp_couple.experiments.predict_graph.DENSE_VARIANCE_SIZE", 39)
    monkeypatch.setattr("gp_couple.experiments.predict_graph.fit_graph_kernel",
                        lambda *args, **kwargs: pytest.fail("trained"))
    code = main(["predict-graph", "--graph", str(edges), "--observations", str(observations), "--output",
                 str(tmp_path / "p.npy"), "--kernel", "matrix_free"])
    error = capsys.readouterr().err
    assert code != 0 and "at most 39 observed nodes, got 40" in error and not (tmp_path / "p.npy").exists()
