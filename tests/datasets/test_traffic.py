"""San Jose traffic-speed graph loader and the 250/75 splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from gp_couple.datasets import load_traffic, traffic_split
from gp_couple.datasets.traffic import TRAFFIC_FILE


@pytest.fixture(scope="module")
def arrays(data_dir: Path) -> dict[str, np.ndarray]:
    with np.load(data_dir / TRAFFIC_FILE) as archive:
        return {key: archive[key] for key in archive.files}


def _write(directory: Path, arrays: dict[str, np.ndarray], **changes: np.ndarray | None) -> Path:
    content = {k: v for k, v in {**arrays, **changes}.items() if v is not None}
    (directory / "traffic").mkdir(parents=True, exist_ok=True)
    np.savez(directory / TRAFFIC_FILE, **content)
    return directory


# ------------------------------------------------------------------ real data
def test_readme_numbers(data_dir: Path) -> None:
    dataset = load_traffic(data_dir)
    graph = dataset.graph
    assert dataset.name == "pems_traffic"
    assert graph.num_nodes == 1016 and graph.num_edges == 1172
    assert graph.connected_components()[0] == 1 and len(graph.isolated_nodes) == 0
    assert graph.degrees.min() == 1 and graph.degrees.max() == 4
    assert graph.degrees.mean() == pytest.approx(2.31, abs=0.005)
    assert np.all(graph.weights > 0)
    assert dataset.observed_nodes.shape == (325,) and dataset.observed_nodes.dtype == np.int64
    assert len(np.unique(dataset.observed_nodes)) == 325
    assert dataset.speeds.shape == (325,) and dataset.speeds.dtype == np.float64
    assert dataset.speeds.min() == 9.0 and dataset.speeds.max() == 70.7
    assert dataset.speeds.mean() == pytest.approx(51.27, abs=0.005)
    assert dataset.speeds.std() == pytest.approx(17.10, abs=0.005)  # README: population sd
    lon, lat = dataset.node_lonlat.T
    assert dataset.node_lonlat.shape == (1016, 2)
    assert np.all((lon > -122.10) & (lon < -121.80) & (lat > 37.21) & (lat < 37.45))
    for array in (dataset.observed_nodes, dataset.speeds, dataset.node_lonlat):
        assert not array.flags.writeable


def test_adjacency_sums_parallel_edges(data_dir: Path, arrays: dict[str, np.ndarray]) -> None:
    edges, weights = arrays["edge_index"], arrays["edge_weight"]
    expected = sp.coo_matrix((weights, (edges[:, 0], edges[:, 1])), shape=(1016, 1016))
    expected = (expected + expected.T).toarray()
    adjacency = load_traffic(data_dir).graph.adjacency.toarray()
    np.testing.assert_allclose(adjacency, expected, rtol=1e-15, atol=0)
    parallel = (edges[:, 0] == 123) & (edges[:, 1] == 606)
    assert parallel.sum() == 2
    assert adjacency[123, 606] == pytest.approx(weights[parallel].sum(), rel=1e-15)


def test_env_var_fallback(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GP_COUPLE_DATA", str(data_dir))
    assert load_traffic().graph.num_nodes == 1016


def test_checksum_mismatch(corrupted_copy) -> None:
    copy_dir = corrupted_copy(TRAFFIC_FILE)
    with pytest.raises(ValueError, match=r"checksum mismatch for traffic/pems_traffic\.npz"):
        load_traffic(copy_dir)


@pytest.mark.parametrize("change, message", [
    ({"num_nodes": np.int64(1015)}, "num_nodes = 1015"),
    ({"obs_nodes": None}, r"missing arrays \['obs_nodes'\]"),
    ({"edge_index": np.zeros((10, 2), np.int64)}, r"edge_index has shape \(10, 2\)"),
    ({"obs_speed_mph": np.full(325, np.nan)}, "obs_speed_mph contains NaN"),
])
def test_invalid_contents(arrays: dict[str, np.ndarray], tmp_path: Path,
                          change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_traffic(_write(tmp_path, arrays, **change), verify=False)


def test_nonpositive_weight(arrays: dict[str, np.ndarray], tmp_path: Path) -> None:
    weights = arrays["edge_weight"].copy()
    weights[5] = 0.0
    with pytest.raises(ValueError, match="edge_weight must be positive"):
        load_traffic(_write(tmp_path, arrays, edge_weight=weights), verify=False)


def test_unreadable_archive(tmp_path: Path) -> None:
    (tmp_path / "traffic").mkdir()
    (tmp_path / TRAFFIC_FILE).write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="pems_traffic.npz is invalid"):
        load_traffic(tmp_path, verify=False)


def _damaged(arrays: dict[str, np.ndarray], directory: Path, damage) -> Path:  # type: ignore[no-untyped-def]
    path = _write(directory, arrays) / TRAFFIC_FILE
    path.write_bytes(damage(path.read_bytes()))
    return directory


def _flip_middle(content: bytes) -> bytes:
    middle = len(content) // 2
    return content[:middle] + bytes(b ^ 0xFF for b in content[middle:middle + 64]) + content[middle + 64:]


@pytest.mark.parametrize("damage", [
    lambda content: content[:len(content) // 2],   # truncated: zipfile.BadZipFile
    lambda content: content[:-30],                  # truncated inside the directory
    lambda content: content[:100],                  # only the first member's header
    lambda content: b"",                            # empty
    _flip_middle,                                   # corrupt: bad CRC or zlib error
])
def test_damaged_archive_is_a_value_error_naming_the_file(arrays: dict[str, np.ndarray], tmp_path: Path,
                                                          damage) -> None:  # type: ignore[no-untyped-def]
    directory = _damaged(arrays, tmp_path, damage)
    with pytest.raises(ValueError, match=rf"pems_traffic.npz is invalid: {tmp_path / TRAFFIC_FILE} cannot be read"):
        load_traffic(directory, verify=False)


def test_single_array_file_is_a_value_error(tmp_path: Path) -> None:
    (tmp_path / "traffic").mkdir()
    with open(tmp_path / TRAFFIC_FILE, "wb") as handle:
        np.save(handle, np.arange(3))
    with pytest.raises(ValueError, match="holds a single ndarray, not named arrays"):
        load_traffic(tmp_path, verify=False)


# ------------------------------------------------------------------ no data needed
def test_missing_file_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        load_traffic(tmp_path)
    assert "traffic/pems_traffic.npz" in str(info.value) and str(tmp_path) in str(info.value)


def test_no_data_dir(no_env_data: None) -> None:
    with pytest.raises(FileNotFoundError, match=r"data_dir.*GP_COUPLE_DATA"):
        load_traffic()


def test_split() -> None:
    train, test = traffic_split(325, seed=0)
    assert len(train) == 250 and len(test) == 75
    assert len(np.intersect1d(train, test)) == 0
    assert train.min() >= 0 and max(train.max(), test.max()) < 325
    assert train.dtype == test.dtype == np.int64
    again = traffic_split(seed=0)
    assert np.array_equal(train, again[0]) and np.array_equal(test, again[1])
    other = traffic_split(seed=1)
    assert not np.array_equal(test, other[1])
    small_train, small_test = traffic_split(325, 100, 25, seed=2)
    assert len(small_train) == 100 and len(small_test) == 25


def test_split_errors() -> None:
    with pytest.raises(ValueError, match="exceeds num_observed"):
        traffic_split(325, 300, 75, seed=0)
    with pytest.raises(ValueError, match="num_test"):
        traffic_split(325, 250, 0, seed=0)
    with pytest.raises(TypeError, match="num_train"):
        traffic_split(325, 250.0, 75, seed=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        traffic_split(325)  # type: ignore[call-arg]  # seed is required
