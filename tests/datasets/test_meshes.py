"""Mesh loaders: faces-as-nodes graphs, normal-z targets and the 5 % test split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trimesh

from gp_couple.datasets import MESHES, default_mesh, load_mesh, mesh_from_trimesh, split_test_nodes
from gp_couple.graphs import Graph

# datasets/meshes.md: faces, graph edges, components, largest component. bunny's 87
# duplicated faces are merged (16301 in the file); bunny (150) and cycloidal (242) have
# non-manifold edges, which join all their faces, so their graphs have more edges than
# trimesh's face_adjacency (24090 and 64568 pairs).
README_MESHES = {
    "teapot": (894, 1309, 4, 398),
    "fuze": (1000, 1342, 8, 309),
    "sphere": (1280, 1920, 1, 1280),
    "idler_riser": (1572, 2358, 1, 1572),
    "featuretype": (3476, 5214, 1, 3476),
    "busted": (3878, 5817, 1, 3878),
    "fandisk": (5750, 8625, 1, 5750),
    "torus": (8700, 13050, 1, 8700),
    "bunny": (16214, 24417, 1, 16214),
    "cycloidal": (43368, 66020, 112, 5994),
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


def test_duplicate_faces_are_merged_with_a_warning() -> None:
    # Face 12 repeats face 0 reversed: its edges would otherwise be shared by three faces.
    box = trimesh.creation.box()
    faces = np.vstack([box.faces, box.faces[:1, ::-1], box.faces[5:6]])
    mesh = trimesh.Trimesh(box.vertices, faces, process=False)
    with pytest.warns(UserWarning, match=r"mesh 'doubled': 2 faces repeat .* face 12 those of face 0"):
        dataset = mesh_from_trimesh(mesh, "doubled")
    assert dataset.num_nodes == 12 and dataset.graph.connected_components()[0] == 1
    assert np.all(dataset.graph.degrees == 3) and np.all(dataset.graph.weights == 1.0)
    np.testing.assert_array_equal(dataset.mesh.faces, box.faces)
    np.testing.assert_array_equal(dataset.targets, box.face_normals[:, 2])
    assert len(mesh.faces) == 14  # the input is not changed


def test_non_manifold_edge_joins_all_its_faces() -> None:
    # Three fins on the edge (0, 1) and a fourth face on the edge (1, 2) of the first.
    vertices = [[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [1, 1, 0]]
    mesh = trimesh.Trimesh(vertices, [[0, 1, 2], [1, 0, 3], [0, 1, 4], [1, 5, 2]], process=False)
    graph = mesh_from_trimesh(mesh, "fins").graph
    assert graph.num_nodes == 4 and len(graph.isolated_nodes) == 0
    np.testing.assert_array_equal(graph.adjacency.toarray(),
                                  [[0, 1, 1, 1], [1, 0, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])


@pytest.mark.parametrize("faces, message", [
    ([[0, 1, 2], [0, 0, 3]], r"mesh 'bad': face 1 has vertices \[0, 0, 3\], repeating a vertex"),
    ([[0, 1, 2], [0, 1, 4]], r"mesh 'bad': face 1 has zero area"),  # vertices 0, 1, 4 collinear
])
def test_degenerate_faces_are_refused(faces: list, message: str) -> None:
    vertices = [[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, -1, 0], [2, 0, 0]]
    mesh = trimesh.Trimesh(vertices, faces, process=False)
    with pytest.raises(ValueError, match=message):
        mesh_from_trimesh(mesh, "bad")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_vertices_are_refused(bad: float, tmp_path: Path) -> None:
    box = trimesh.creation.box()
    vertices = np.array(box.vertices)
    vertices[5, 1] = bad
    mesh = trimesh.Trimesh(vertices, box.faces, process=False)
    with pytest.raises(ValueError, match=r"mesh 'box': vertex 5 has a NaN or infinite coordinate"):
        mesh_from_trimesh(mesh, "box")
    with pytest.raises(ValueError, match="vertex 5"):
        Graph.from_trimesh(mesh)
    # Read from a file, trimesh would drop the faces of vertex 5 and renumber the rest.
    path = tmp_path / "box.obj"
    lines = [f"v {x!r} {y!r} {z!r}" for x, y, z in vertices.tolist()]
    lines += [f"f {a + 1} {b + 1} {c + 1}" for a, b, c in box.faces.tolist()]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"mesh file {path}: vertex 5 has a NaN or infinite"):
        load_mesh(path)


def test_truncated_stl_names_the_file(tmp_path: Path) -> None:
    box = tmp_path / "box.stl"
    trimesh.creation.box().export(box)
    assert load_mesh(box).num_nodes == 12
    content = box.read_bytes()
    for size in (len(content) // 2, len(content) - 1, 40):
        truncated = tmp_path / f"cut{size}.stl"
        truncated.write_bytes(content[:size])
        with pytest.raises(ValueError, match=rf"{truncated} is not a valid STL file") as info:
            load_mesh(truncated)
        assert "module" not in str(info.value) and "package" not in str(info.value)


def test_truncated_ascii_ply_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "box.ply"
    path.write_bytes(trimesh.exchange.ply.export_ply(trimesh.creation.box(), encoding="ascii"))
    assert load_mesh(path).num_nodes == 12
    content = path.read_bytes()
    path.write_bytes(content[:len(content) - 20])  # trimesh would read the first 11 faces
    with pytest.raises(ValueError, match=rf"{path} is truncated or corrupt: its header declares 8 vertices and "
                                         "12 faces"):
        load_mesh(path)


@pytest.mark.parametrize("suffix, export", [
    ("obj", lambda box: trimesh.exchange.obj.export_obj(box, include_normals=False, header=None)),
    ("ply", lambda box: trimesh.exchange.ply.export_ply(box, encoding="ascii").decode()),
    ("stl", trimesh.exchange.stl.export_stl_ascii),
    ("off", trimesh.exchange.off.export_off),
])
def test_text_mesh_encodings(tmp_path: Path, suffix: str, export) -> None:  # type: ignore[no-untyped-def]
    box = trimesh.creation.box()
    plain, marked = tmp_path / f"plain.{suffix}", tmp_path / f"marked.{suffix}"
    plain.write_text(export(box), encoding="utf-8")
    marked.write_text(export(box), encoding="utf-8-sig")  # an OBJ would lose its first vertex
    reference = load_mesh(plain)
    dataset = load_mesh(marked)
    assert dataset.graph == reference.graph and np.array_equal(dataset.mesh.vertices, reference.mesh.vertices)
    marked.write_text(export(box), encoding="utf-16")
    with pytest.raises(ValueError, match=rf"{marked} is UTF-16-LE text"):
        load_mesh(marked)


def test_ascii_stl_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "box.stl"
    path.write_text(trimesh.exchange.stl.export_stl_ascii(trimesh.creation.box()))
    assert load_mesh(path).num_nodes == 12


def test_unreadable_binary_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "noise.ply"
    path.write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 9\n" + bytes(range(256)) * 3)
    with pytest.raises(ValueError, match="noise.ply"):
        load_mesh(path)


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
@pytest.mark.filterwarnings("ignore:.*faces repeat the vertices:UserWarning")  # bunny: tested below
@pytest.mark.parametrize("name", list(README_MESHES))
def test_readme_counts(data_dir: Path, name: str) -> None:
    faces, pairs, components, largest = README_MESHES[name]
    dataset = load_mesh(name, data_dir)
    assert dataset.name == name
    assert dataset.num_nodes == faces == MESHES[name][1] == len(dataset.mesh.faces)
    assert dataset.graph.num_edges == pairs
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


def test_bunny_duplicate_faces_are_merged_with_a_warning(data_dir: Path) -> None:
    with pytest.warns(UserWarning, match=r"bunny\.ply: 87 faces repeat the vertices of an earlier face"):
        dataset = load_mesh("bunny", data_dir)
    assert dataset.num_nodes == 16214 and len(dataset.graph.isolated_nodes) == 0
