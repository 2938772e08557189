r"""Triangle meshes as graphs whose nodes are faces, with the normal-z regression target.

The paper's mesh experiments (Section 4.2 "Experiments with σ-coupled GRFs"
[sec:graph_gp_experiments], Appendix F.2 "Scalable GPs on graphs", paragraph "Training GRF-GPs:
technical details" [app:grf_gp_details]) take the faces of a mesh as nodes, join two faces when they
share an edge, and regress the
:math:`z`-component of each face's unit normal; 5 % of the nodes are held out as the
test set (:func:`split_test_nodes`).

Meshes are read with trimesh's default processing (duplicate vertices merged), which is
what ``trimesh.load(path, force="mesh")`` returns, so face order and face counts match
the table in ``datasets/meshes.md`` (teapot 894 faces, fuze 1000, sphere 1280, ...).
Every face is a node, including faces that share no edge with another face (isolated
nodes; fuze has one).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._checks import check_int
from .._random import SeedLike
from ..graphs import Graph
from ._paths import PathLike, data_file, existing_path, freeze, random_split

if TYPE_CHECKING:  # pragma: no cover
    import trimesh

__all__ = ["MESHES", "MeshDataset", "default_mesh", "load_mesh", "mesh_from_trimesh",
           "split_test_nodes"]

#: Named meshes of ``<data_dir>/meshes``: name -> (file name, number of faces).
MESHES: dict[str, tuple[str, int]] = {
    "teapot": ("teapot.stl", 894),
    "fuze": ("fuze.obj", 1000),
    "sphere": ("sphere.ply", 1280),
    "idler_riser": ("idler_riser.STL", 1572),
    "featuretype": ("featuretype.STL", 3476),
    "busted": ("busted.STL", 3878),
    "fandisk": ("fandisk.obj", 5750),
    "torus": ("torus.STL", 8700),
    "bunny": ("bunny.ply", 16301),
    "cycloidal": ("cycloidal.ply", 43368),
}

#: Fraction of nodes held out for testing in the paper's mesh experiments.
TEST_FRACTION_PERCENT = 5


@dataclass(frozen=True, eq=False)
class MeshDataset:
    """A mesh as a faces-as-nodes graph with the normal-z target of every face.

    :ivar graph: Unweighted graph with node ``i`` = face ``i``; faces sharing an edge
        are adjacent (weight 1, also for faces that share more than one edge).
    :ivar targets: ``(num_faces,)`` float64, read-only: the :math:`z`-component of each
        face's unit normal (0 for degenerate faces, whose normal trimesh sets to zero).
    :ivar mesh: The :class:`trimesh.Trimesh` the graph was built from.
    :ivar name: Mesh name (registry name, file stem or the name given).
    """

    graph: Graph
    targets: np.ndarray
    mesh: trimesh.Trimesh
    name: str

    @property
    def num_nodes(self) -> int:
        """Number of nodes (= number of faces)."""
        return self.graph.num_nodes


def mesh_from_trimesh(mesh: trimesh.Trimesh, name: str) -> MeshDataset:
    """Build a :class:`MeshDataset` from a triangle mesh.

    :param mesh: A :class:`trimesh.Trimesh` with at least one face.
    :param name: Name stored in the dataset.
    :return: The faces-as-nodes graph and normal-z targets of ``mesh``.
    :raises TypeError: If ``mesh`` is not a :class:`trimesh.Trimesh` or ``name`` not a str.
    :raises ValueError: If the mesh has no faces.
    """
    import trimesh

    if not isinstance(mesh, trimesh.Trimesh):
        raise TypeError(f"mesh must be a trimesh.Trimesh, got {type(mesh).__name__}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if len(mesh.faces) == 0:
        raise ValueError(f"mesh {name!r} has no faces")
    graph = Graph.from_trimesh(mesh, nodes="faces")
    targets = np.array(mesh.face_normals[:, 2], dtype=np.float64)
    return MeshDataset(graph=graph, targets=freeze(targets), mesh=mesh, name=name)


def _read_mesh(path: Path) -> trimesh.Trimesh:
    """``trimesh.load(path, force="mesh")`` without texture images.

    Texture visuals are dropped before the scene is flattened: copying them needs
    Pillow (an optional trimesh dependency) and only the geometry is used here. This
    does not change vertices, faces or their order.
    """
    import trimesh

    try:
        scene = trimesh.load_scene(str(path))
    except Exception as error:  # trimesh raises many types for unreadable files
        raise ValueError(f"trimesh could not read {path}: {error}") from error
    for geometry in scene.geometry.values():
        if isinstance(getattr(geometry, "visual", None), trimesh.visual.TextureVisuals):
            geometry.visual = trimesh.visual.ColorVisuals(mesh=geometry)
    mesh = scene.to_mesh()
    if not isinstance(mesh, trimesh.Trimesh) or len(mesh.faces) == 0:
        raise ValueError(f"{path} holds no triangle faces")
    return mesh


def load_mesh(path_or_name: PathLike, data_dir: PathLike | None = None,
              verify: bool = True) -> MeshDataset:
    """Load a mesh by registry name or from any trimesh-readable file.

    A name (one of :data:`MESHES`: ``teapot``, ``fuze``, ``sphere``, ``idler_riser``,
    ``featuretype``, ``busted``, ``fandisk``, ``torus``, ``bunny``, ``cycloidal``) is read
    from ``<data_dir>/meshes/`` and its checksum verified; a path is read as is (no
    checksum).

    :param path_or_name: Registry name or path to a mesh file.
    :param data_dir: Data directory for named meshes (default ``$GP_COUPLE_DATA``).
    :param verify: Verify the SHA-256 digest of a named mesh (cached per process).
    :return: The faces-as-nodes graph and normal-z targets.
    :raises ValueError: For an unknown name, an unreadable file or a checksum mismatch.
    :raises FileNotFoundError: If the data directory or the file is missing.
    """
    if isinstance(path_or_name, str) and path_or_name in MESHES:
        file_name, expected_faces = MESHES[path_or_name]
        path = data_file(f"meshes/{file_name}", data_dir, verify)
        dataset = mesh_from_trimesh(_read_mesh(path), path_or_name)
        if dataset.num_nodes != expected_faces:
            import trimesh

            warnings.warn(
                f"mesh {path_or_name!r} loaded with {dataset.num_nodes} faces, expected "
                f"{expected_faces}: trimesh {trimesh.__version__} processes this file "
                "differently, so results may not match the paper's", RuntimeWarning,
                stacklevel=2)
        return dataset
    path = existing_path(path_or_name, "path_or_name", "mesh", MESHES, expected="a path to a mesh file",
                         missing="mesh file")
    if not path.is_file():
        raise ValueError(f"{path.absolute()} is not a file")
    return mesh_from_trimesh(_read_mesh(path), path.stem)


def default_mesh() -> MeshDataset:
    r"""A procedural bumpy sphere (1280 faces) that needs no data directory.

    An icosphere with 3 subdivisions whose vertices are moved radially by the smooth
    function :math:`r = 1 + 0.25 \sin(3\phi)\sin(2\vartheta)^2 + 0.15 z^3` of the
    longitude :math:`\phi`, colatitude :math:`\vartheta` and height :math:`z`, giving a
    normal-z signal with both large-scale and local structure. Fully deterministic.

    :return: The faces-as-nodes graph (1280 nodes, connected) and normal-z targets,
        named ``"bumpy_icosphere"``.
    """
    import trimesh

    sphere = trimesh.creation.icosphere(subdivisions=3)
    unit = np.asarray(sphere.vertices, dtype=np.float64)
    unit = unit / np.linalg.norm(unit, axis=1, keepdims=True)
    longitude = np.arctan2(unit[:, 1], unit[:, 0])
    colatitude = np.arccos(np.clip(unit[:, 2], -1.0, 1.0))
    radius = (1.0 + 0.25 * np.sin(3.0 * longitude) * np.sin(2.0 * colatitude) ** 2
              + 0.15 * unit[:, 2] ** 3)
    mesh = trimesh.Trimesh(vertices=unit * radius[:, None], faces=np.asarray(sphere.faces),
                           process=False)
    return mesh_from_trimesh(mesh, "bumpy_icosphere")


def split_test_nodes(num_nodes: int, seed: SeedLike) -> tuple[np.ndarray, np.ndarray]:
    r"""Random train/test split of a mesh's nodes with :math:`\lfloor 0.05 N \rfloor` test nodes.

    The paper holds out 5 % of the nodes, chosen uniformly at random, as the test set
    (Appendix F.2 "Scalable GPs on graphs", paragraph "Training GRF-GPs: technical details"
    [app:grf_gp_details]); all other nodes are training nodes.

    :param num_nodes: Number of nodes :math:`N` (at least 20, so the test set is non-empty).
    :param seed: Seed (int, numpy/torch generator or ``None``); the same int gives the
        same split.
    :return: ``(train_index, test_index)``: disjoint, sorted int64 arrays covering
        ``range(num_nodes)``, of sizes :math:`N - \lfloor N/20 \rfloor` and
        :math:`\lfloor N/20 \rfloor`.
    :raises TypeError: If ``num_nodes`` is not an int.
    :raises ValueError: If ``num_nodes < 20``.
    """
    num_nodes = check_int("num_nodes", num_nodes, 1)
    num_test = num_nodes * TEST_FRACTION_PERCENT // 100
    if num_test == 0:
        raise ValueError(f"num_nodes must be >= 20 so that the 5% test set is non-empty, "
                         f"got {num_nodes}")
    return random_split(num_nodes, num_nodes - num_test, num_test, seed)
