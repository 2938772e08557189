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
Every distinct face is a node, including faces that share no edge with another face
(isolated nodes; fuze has one).

What the loaders do with imperfect meshes (:meth:`gp_couple.graphs.Graph.from_trimesh`
defines the face graph):

* **Non-manifold edges** (shared by three or more faces) join all those faces pairwise.
* **Exact duplicate faces** (the same three vertices, either orientation; bunny has 87)
  are merged into their first occurrence with a warning: the dataset's mesh, graph and
  targets hold the distinct faces, in file order.
* **Degenerate faces** are refused with a ``ValueError`` naming the face: a face that
  repeats a vertex index, and a face of zero area, whose normal (the target) is undefined.
* **Vertices with a NaN or infinite coordinate** are refused with a ``ValueError`` naming
  the vertex and the file (trimesh would silently drop their faces and renumber the rest).
* **Unreadable files** (truncated, wrong format) raise a ``ValueError`` naming the file.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._checks import check_int
from .._random import SeedLike
from ..graphs import Graph, check_mesh, distinct_faces
from ._paths import PathLike, data_file, existing_path, freeze, random_split, without_byte_order_mark

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
    "bunny": ("bunny.ply", 16214),  # 16301 in the file, less 87 duplicated faces
    "cycloidal": ("cycloidal.ply", 43368),
}

#: Fraction of nodes held out for testing in the paper's mesh experiments.
TEST_FRACTION_PERCENT = 5


@dataclass(frozen=True, eq=False)
class MeshDataset:
    """A mesh as a faces-as-nodes graph with the normal-z target of every face.

    :ivar graph: Unweighted graph with node ``i`` = face ``i`` of :attr:`mesh`; faces
        sharing an edge are adjacent (weight 1; at a non-manifold edge all its faces).
    :ivar targets: ``(num_faces,)`` float64, read-only: the :math:`z`-component of each
        face's unit normal.
    :ivar mesh: The :class:`trimesh.Trimesh` the graph was built from (exact duplicate
        faces of the input merged).
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

    Exact duplicate faces (the same three vertices, either orientation) are merged into
    their first occurrence with a warning; the dataset's mesh is then a copy without
    them (``mesh`` itself is not changed).

    :param mesh: A :class:`trimesh.Trimesh` with at least one face.
    :param name: Name stored in the dataset.
    :return: The faces-as-nodes graph and normal-z targets of ``mesh``.
    :raises TypeError: If ``mesh`` is not a :class:`trimesh.Trimesh` or ``name`` not a str.
    :raises ValueError: If the mesh has no faces, a vertex with a NaN or infinite
        coordinate, or a degenerate face (a repeated vertex index, or zero area so that
        its normal is undefined); the vertex or face is named.
    """
    import trimesh

    if not isinstance(mesh, trimesh.Trimesh):
        raise TypeError(f"mesh must be a trimesh.Trimesh, got {type(mesh).__name__}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    return _dataset(mesh, name, f"mesh {name!r}")


def _dataset(mesh: trimesh.Trimesh, name: str, source: str) -> MeshDataset:
    """The dataset of a mesh; ``source`` (the mesh's name or file) starts every message."""
    if len(mesh.faces) == 0:
        raise ValueError(f"{source} has no faces")
    keep = distinct_faces(mesh, source)
    if len(keep) < len(mesh.faces):
        mesh = mesh.copy()
        mesh.update_faces(keep)
    normals = np.asarray(mesh.face_normals, dtype=np.float64)
    # trimesh gives a face whose cross product vanishes (zero area) a zero normal.
    flat = np.flatnonzero(~np.any(normals != 0, axis=1))
    if flat.size:
        face = int(keep[flat[0]])
        raise ValueError(f"{source}: face {face} has zero area (vertices {np.asarray(mesh.faces)[flat[0]].tolist()} "
                         f"are collinear or coincide; {flat.size} such faces), so its normal, the target, is "
                         "undefined; remove them, e.g. with mesh.update_faces(mesh.nondegenerate_faces())")
    graph = Graph.from_trimesh(mesh, nodes="faces")
    return MeshDataset(graph=graph, targets=freeze(normals[:, 2].copy()), mesh=mesh, name=name)


#: Binary STL: an 80-byte header, a uint32 triangle count, then 50 bytes per triangle.
_STL_HEADER_BYTES = 84
_STL_TRIANGLE_BYTES = 50
#: Bytes looked at to tell an ASCII file from a binary one, and to find a PLY header's end.
_HEAD_BYTES = 1 << 16


def _binary_stl_size(data: bytes) -> int | None:
    """The size a binary STL with this header has (``None``: shorter than a header)."""
    if len(data) < _STL_HEADER_BYTES:
        return None
    return _STL_HEADER_BYTES + _STL_TRIANGLE_BYTES * int.from_bytes(data[80:84], "little")


def _check_ascii_stl(path: Path, data: bytes) -> None:
    """Refuse an STL that is neither a complete binary STL nor ASCII text, before trimesh guesses its encoding.

    A binary STL may begin with ``solid`` like an ASCII one; its float data (NUL and
    non-ASCII bytes) tells them apart.
    """
    head = data[:_HEAD_BYTES]
    if head.lstrip().startswith(b"solid") and head.isascii() and b"\x00" not in head:
        return
    expected = _binary_stl_size(data)
    if expected is None:
        raise ValueError(f"{path} is not a valid STL file: {len(data)} bytes, shorter than a binary "
                         f"STL header ({_STL_HEADER_BYTES} bytes)")
    raise ValueError(f"{path} is not a valid STL file: its binary header announces "
                     f"{(expected - _STL_HEADER_BYTES) // _STL_TRIANGLE_BYTES} triangles ({expected} bytes) "
                     f"but the file has {len(data)} bytes (truncated or corrupt)")


def _mesh_bytes(path: Path) -> bytes | None:
    """A text mesh file's bytes without its UTF-8 byte-order mark, or ``None`` to read the file as it is.

    trimesh would read the mark as part of the first line (an OBJ file then loses its
    first vertex); UTF-16 and UTF-32 text is refused with the file's name.
    """
    data = path.read_bytes()
    if path.suffix.lower() == ".stl" and _binary_stl_size(data) == len(data):
        return None
    text = without_byte_order_mark(path, data)
    if path.suffix.lower() == ".stl":
        _check_ascii_stl(path, text)
    return text if len(text) < len(data) else None


def _check_ply_counts(path: Path, meshes: list[trimesh.Trimesh]) -> None:
    """Refuse a PLY file with fewer vertices or faces than its header declares.

    trimesh reads a truncated ASCII PLY without complaint, keeping what is there.
    """
    declared: dict[str, int] = {}
    with open(path, "rb") as handle:
        head = handle.read(_HEAD_BYTES)
    for line in head.split(b"end_header", 1)[0].decode("ascii", "replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "element" and parts[2].isdigit():
            declared[parts[1]] = int(parts[2])
    read = {"vertex": sum(len(mesh.vertices) for mesh in meshes),
            "face": sum(len(np.asarray(mesh.faces).reshape(-1, 3)) for mesh in meshes)}
    # A polygon is read as several triangles, so only fewer faces than declared is wrong.
    if any(read[element] < declared.get(element, 0) for element in read):
        raise ValueError(f"{path} is truncated or corrupt: its header declares {declared.get('vertex', 0)} "
                         f"vertices and {declared.get('face', 0)} faces, but {read['vertex']} vertices and "
                         f"{read['face']} triangles could be read")


def _read_mesh(path: Path) -> trimesh.Trimesh:
    """``trimesh.load(path, force="mesh")`` without texture images, refusing non-finite vertices.

    The file is read unprocessed, its vertices checked (trimesh's processing would drop
    the faces of NaN or infinite vertices and renumber the rest), then processed as
    ``trimesh.load`` does. Texture visuals are dropped before the scene is flattened:
    copying them needs Pillow (an optional trimesh dependency) and only the geometry is
    used here. This does not change vertices, faces or their order.
    """
    import trimesh

    text = _mesh_bytes(path)
    try:
        if text is None:
            scene = trimesh.load_scene(str(path), process=False)
        else:
            scene = trimesh.load_scene(io.BytesIO(text), file_type=path.suffix.lower().lstrip("."), process=False,
                                       resolver=trimesh.resolvers.FilePathResolver(str(path)))
    except ImportError as error:
        # trimesh falls back on optional packages (e.g. charset_normalizer to guess a
        # text encoding) when a file is not what its format promises.
        raise ValueError(f"trimesh could not read {path}: the file is truncated, corrupt or not a "
                         f"{path.suffix.lstrip('.')} mesh (reading it further needs the optional package "
                         f"{error.name!r})") from error
    except Exception as error:  # trimesh raises many types for unreadable files
        raise ValueError(f"trimesh could not read {path}: {error}") from error
    meshes = {key: geometry for key, geometry in scene.geometry.items() if isinstance(geometry, trimesh.Trimesh)}
    if path.suffix.lower() == ".ply":
        _check_ply_counts(path, list(meshes.values()))
    for key, geometry in meshes.items():
        check_mesh(geometry, f"mesh file {path}" + (f" (geometry {key!r})" if len(scene.geometry) > 1 else ""))
        geometry.process()
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
    :return: The faces-as-nodes graph and normal-z targets (exact duplicate faces merged,
        with a warning; see the module docstring).
    :raises ValueError: For an unknown name, an unreadable file (truncated, corrupt, not
        a mesh), a vertex with a NaN or infinite coordinate, a degenerate face, or a
        checksum mismatch; the file (and vertex or face) is named.
    :raises FileNotFoundError: If the data directory or the file is missing.
    """
    if isinstance(path_or_name, str) and path_or_name in MESHES:
        file_name, expected_faces = MESHES[path_or_name]
        path = data_file(f"meshes/{file_name}", data_dir, verify)
        dataset = _dataset(_read_mesh(path), path_or_name, f"mesh file {path}")
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
    return _dataset(_read_mesh(path), path.stem, f"mesh file {path}")


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
    :return: ``(train_nodes, test_nodes)``: disjoint, sorted int64 arrays covering
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
