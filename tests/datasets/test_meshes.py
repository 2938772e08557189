"""Mesh loaders: faces-as-nodes graphs, normal-z targets and the 5 % test split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trimesh

from gp_couple.datasets import MESHES, default_mesh, load_mesh, mesh_from_trimesh, split_test_nodes
from gp_couple.graphs import Graph

# datasets/meshes.md: faces, face-adjacency pairs, components, largest component.
# bunny's face_adjacency lists 17 face pairs twice (duplicated faces with opposite
# orientation), so its graph has 24090 - 17 = 24073 edges.
DUPLICATED_PAIRS = {"bunny": 17}
README_MESHES = {
    "teapot": (894, 1309, 4, 398),
    "fuze": (1000, 1342, 8, 309),
    "sphere": (1280, 1920, 1, 1280),
    "idler_riser": (1572, 2358, 1, 1572),
    "featuretype": (3476, 5214, 1, 3476),
    "busted": (3878, 5817, 1, 3878),
    "fandisk": (5750, 8625, 1, 5750),
    "torus": (8700, 13050, 1, 8700),
    "bunny": (16301, 24090, 94, 16133),
    "cycloidal": (43368, 64568, 119, 5802),
}


# ------------------------------------------------------------------ no data needed
def test_default_mesh_needs_no_data_and_is_deterministic(no_env_data: None) -> None:
    first, second = default_mesh(), default_mesh()
    assert first.name == "bumpy_icosphere"
    assert first.num_nodes == 1280 and first.graph.connected_components()[0] == 1
    assert first.graph == second.graph
    assert np.array_equal(first.targets, second.targets)
    assert first.targets.dtype == np.float64 and first.targets.shape == (1280,)
    # An interesting signal: spans nearly [-1, 1] and is not just a sphere's normals.
    assert first.targets.min() < -0.9 and first.targets.max() > 0.9
    sphere = mesh_from_trimesh(trimesh.creation.icosphere(subdivisions=3), "sphere")
    assert np.abs(first.targets - sphere.targets).max() > 0.3


def test_targets_are_unit_normal_z() -> None:
    dataset = default_mesh()
    normals = dataset.mesh.face_normals
    np.testing.assert_allclose(np.linalg.norm(normals, axis=1), 1.0, atol=1e-12)
    assert np.array_equal(dataset.targets, normals[:, 2])
    with pytest.raises(ValueError):
        dataset.targets[0] = 0.0  # read-only


def test_mesh_from_trimesh_validates() -> None:
    with pytest.raises(TypeError, match="trimesh.Trimesh"):
        mesh_from_trimesh(np.zeros((3, 3)), "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name"):
        mesh_from_trimesh(trimesh.creation.box(), 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no faces"):
        mesh_from_trimesh(trimesh.Trimesh(vertices=np.zeros((0, 3)), faces=np.zeros((0, 3), int)), "e")


def test_faces_sharing_several_edges_have_weight_one() -> None:
    mesh = trimesh.Trimesh(vertices=[[0, 0, 0], [1, 0, 0], [0, 1, 0]],
                           faces=[[0, 1, 2], [0, 2, 1]], process=False)
    graph = mesh_from_trimesh(mesh, "double").graph
    assert graph.num_edges == 1 and np.all(graph.weights == 1.0)


def test_isolated_faces_are_nodes() -> None:
    # Two triangles sharing only a vertex: two nodes, no edge.
    mesh = trimesh.Trimesh(vertices=[[0, 0, 0], [1, 0, 0], [0, 1, 0], [-1, 0, 0], [0, -1, 0]],
                           faces=[[0, 1, 2], [0, 3, 4]], process=False)
    dataset = mesh_from_trimesh(mesh, "pair")
    assert dataset.num_nodes == 2 and len(dataset.graph.isolated_nodes) == 2


@pytest.mark.parametrize("num_nodes", [20, 894, 1000, 1280, 43368])
def test_split_sizes_and_disjointness(num_nodes: int) -> None:
    train, test = split_test_nodes(num_nodes, seed=3)
    assert len(test) == int(np.floor(0.05 * num_nodes)) == num_nodes // 20
    assert len(train) == num_nodes - len(test)
    assert train.dtype == test.dtype == np.int64
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(num_nodes))


def test_split_deterministic() -> None:
    a, b, c = (split_test_nodes(1280, s) for s in (0, 0, 1))
    assert np.array_equal(a[1], b[1]) and np.array_equal(a[0], b[0])
    assert not np.array_equal(a[1], c[1])
    generator_split = split_test_nodes(1280, np.random.default_rng(0))
    assert len(generator_split[1]) == 64


def test_split_errors() -> None:
    with pytest.raises(ValueError, match="num_nodes"):
        split_test_nodes(19, seed=0)
    with pytest.raises(TypeError, match="num_nodes"):
        split_test_nodes(100.0, seed=0)  # type: ignore[arg-type]


def test_unknown_name_and_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown mesh 'teapots'.*teapot"):
        load_mesh("teapots", tmp_path)
    with pytest.raises(FileNotFoundError, match="nothing.stl"):
        load_mesh(tmp_path / "nothing.stl")
    with pytest.raises(TypeError, match="path_or_name"):
        load_mesh(3)  # type: ignore[arg-type]


def test_named_mesh_needs_a_data_dir(no_env_data: None) -> None:
    with pytest.raises(FileNotFoundError, match="GP_COUPLE_DATA"):
        load_mesh("teapot")


def test_missing_mesh_file_named(tmp_path: Path) -> None:
    (tmp_path / "meshes").mkdir()
    with pytest.raises(FileNotFoundError, match=r"meshes/teapot\.stl"):
        load_mesh("teapot", tmp_path)


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.ply"
    path.write_text("not a mesh\n")
    with pytest.raises(ValueError, match="broken.ply"):
        load_mesh(path)


# ------------------------------------------------------------------ real data
@pytest.mark.parametrize("name", list(README_MESHES))
def test_readme_counts(data_dir: Path, name: str) -> None:
    faces, pairs, components, largest = README_MESHES[name]
    dataset = load_mesh(name, data_dir)
    assert dataset.name == name
    assert dataset.num_nodes == faces == MESHES[name][1]
    assert len(dataset.mesh.face_adjacency) == pairs
    assert dataset.graph.num_edges == pairs - DUPLICATED_PAIRS.get(name, 0)
    assert np.all(dataset.graph.weights == 1.0)
    count, labels = dataset.graph.connected_components()
    assert count == components and np.bincount(labels).max() == largest
    assert dataset.targets.shape == (faces,) and dataset.targets.dtype == np.float64
    assert np.all(np.abs(dataset.targets) <= 1.0)


@pytest.mark.parametrize("name", ["teapot", "fuze"])
def test_graph_matches_shared_face_adjacency(data_dir: Path, name: str) -> None:
    pairs = np.loadtxt(data_dir / "meshes" / "face_adjacency" / f"{name}_face_adjacency.csv",
                       delimiter=",", skiprows=1, dtype=np.int64)
    dataset = load_mesh(name, data_dir)
    assert dataset.graph == Graph.from_edges(pairs, num_nodes=dataset.num_nodes)


def test_fuze_keeps_its_isolated_face(data_dir: Path) -> None:
    dataset = load_mesh("fuze", data_dir)
    assert dataset.num_nodes == 1000 and len(dataset.graph.isolated_nodes) == 1


def test_load_by_path_and_env_fallback(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    by_path = load_mesh(data_dir / "meshes" / "teapot.stl")
    assert by_path.name == "teapot"
    monkeypatch.setenv("GP_COUPLE_DATA", str(data_dir))
    by_name = load_mesh("teapot")
    assert by_name.graph == by_path.graph and np.array_equal(by_name.targets, by_path.targets)


def test_checksum_mismatch(corrupted_copy) -> None:
    copy_dir = corrupted_copy("meshes/sphere.ply")
    with pytest.raises(ValueError, match=r"checksum mismatch for meshes/sphere\.ply"):
        load_mesh("sphere", copy_dir)
