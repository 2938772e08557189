"""Real-world graphs: named graphs of ``<data_dir>/graphs/`` and edge-list CSV files.

Named graphs (:func:`available_graphs`) are read from their ``*_edges.csv`` file, whose
checksum is verified, and are checked against their known node and edge counts (see
``datasets/graphs.md``). All named graphs are unweighted and simple. Node counts come
from the registry, so isolated nodes are kept (citeseer has 48).

Any other edge list can be loaded from a path: a CSV file with either two integer node
columns and an optional third weight column, or named columns ``source``/``target`` (or
``u``/``v``) with an optional ``weight`` column (other columns are ignored). The first
row is a header line if and only if one of its fields is not a number, so a headerless
file (``0,1\n1,2\n2,3``) keeps its first edge. A directory is searched for its single
``*_edges.csv`` (or ``edges.csv``) file, and a single ``*_nodes.csv`` (or ``nodes.csv``)
beside it, if present, gives the number of nodes (its rows, less a header row detected
the same way).
"""

from __future__ import annotations

import csv
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..graphs import Graph
from ._paths import PathLike, data_file, existing_path

__all__ = ["GRAPHS", "NODE_LABELS", "GraphSpec", "LabelSpec", "available_graphs", "load_graph",
           "load_node_labels"]


@dataclass(frozen=True)
class GraphSpec:
    """Where a named graph lives and what it must contain.

    :ivar file: Edge file, relative to the data directory.
    :ivar num_nodes: Number of nodes (including isolated nodes).
    :ivar num_edges: Number of undirected edges (= rows of the edge file).
    :ivar node_columns: Column indices of the two endpoints in the edge file.
    """

    file: str
    num_nodes: int
    num_edges: int
    node_columns: tuple[int, int] = (0, 1)


#: Named graphs, in the order of ``datasets/graphs.md``.
GRAPHS: dict[str, GraphSpec] = {
    "karate": GraphSpec("graphs/karate/karate_edges.csv", 34, 78),
    "dolphins": GraphSpec("graphs/dolphins/dolphins_edges.csv", 62, 159),
    "football": GraphSpec("graphs/football/football_edges.csv", 115, 613),
    "polbooks": GraphSpec("graphs/polbooks/polbooks_edges.csv", 105, 441),
    "netscience": GraphSpec("graphs/netscience/netscience_edges.csv", 1589, 2742),
    "internet_as_2006": GraphSpec("graphs/internet_as_2006/as-22july06_edges.csv", 22963, 48436),
    "eurosis": GraphSpec("graphs/eurosis/eurosis_edges.csv", 1285, 6462),
    "cora": GraphSpec("graphs/cora/cora_edges.csv", 2708, 5278),
    "citeseer": GraphSpec("graphs/citeseer/citeseer_edges.csv", 3327, 4552),
    "pubmed": GraphSpec("graphs/pubmed/pubmed_edges.csv", 19717, 44324),
    "ego_facebook": GraphSpec("graphs/ego_facebook/facebook_combined_edges.csv", 4039, 88234),
    "email_enron": GraphSpec("graphs/email_enron/email-Enron_edges.csv", 36692, 183831),
    "facebook_page_page": GraphSpec("graphs/facebook_page_page/facebook_edges.csv", 22470, 170823),
    "github_musae": GraphSpec("graphs/github_musae/github_edges.csv", 37700, 289003),
    # cal_edges.csv: edge_id, source, target, l2_distance_deg; the graph is unweighted.
    "california_roads": GraphSpec("graphs/california_roads/cal_edges.csv", 21048, 21693, (1, 2)),
}

@dataclass(frozen=True)
class LabelSpec:
    """Where a named graph's node classes live.

    :ivar file: Node file, relative to the data directory (one row per node, in node order).
    :ivar column: Header name of the class column.
    :ivar unlabelled: The value marking nodes without a class, if any.
    """

    file: str
    column: str
    unlabelled: str | None = None


#: Named graphs with node classes (``datasets/README.md``): karate's club, football's
#: conference, polbooks' political leaning and the citation graphs' subject.
NODE_LABELS: dict[str, LabelSpec] = {
    "karate": LabelSpec("graphs/karate/karate_nodes.csv", "club"),
    "football": LabelSpec("graphs/football/football_nodes.csv", "value"),
    "polbooks": LabelSpec("graphs/polbooks/polbooks_nodes.csv", "value"),
    "cora": LabelSpec("graphs/cora/cora_nodes.csv", "label"),
    "citeseer": LabelSpec("graphs/citeseer/citeseer_nodes.csv", "label", unlabelled="-1"),
    "pubmed": LabelSpec("graphs/pubmed/pubmed_nodes.csv", "label"),
}

_NODE_COLUMN_NAMES = (("source", "target"), ("u", "v"))
#: A field that reads as a number (decimal or scientific notation). Words that float()
#: also accepts ("nan", "inf", "infinity") are header names here, not data.
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def available_graphs() -> tuple[str, ...]:
    """Names accepted by :func:`load_graph` (no I/O: the data directory is not inspected).

    :return: The registry names, in the order of ``datasets/graphs.md``.
    """
    return tuple(GRAPHS)


def _load_columns(path: Path, columns: list[int], skip_rows: int = 1) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            # An empty table is reported below with the file's name.
            warnings.filterwarnings("ignore", message="loadtxt: input contained no data")
            table = np.loadtxt(path, delimiter=",", skiprows=skip_rows, usecols=columns, ndmin=2,
                               dtype=np.float64, quotechar='"')
    except ValueError as error:
        raise ValueError(f"{path}: cannot read columns {columns} as numbers ({error})") from error
    if table.shape[0] == 0:
        raise ValueError(f"{path} lists no edges")
    return table


def _node_indices(values: np.ndarray, path: Path) -> np.ndarray:
    if not np.all(np.isfinite(values)) or np.any(values != np.round(values)) or np.any(values < 0):
        raise ValueError(f"{path}: node columns must hold non-negative integers")
    return values.astype(np.int64)


def _first_row(path: Path) -> list[str] | None:
    with open(path, newline="") as handle:
        return next(csv.reader(handle), None)


def _is_header(row: list[str]) -> bool:
    """A first row is a header when any of its fields is not a number."""
    return any(_NUMBER.fullmatch(field.strip()) is None for field in row)


def _edge_csv_columns(path: Path) -> tuple[list[int], int | None, int]:
    """Node columns, optional weight column and header rows (0 or 1) of a user edge-list CSV."""
    first = _first_row(path)
    if not first:
        raise ValueError(f"{path} is empty: expected an optional header line and one edge per row")
    header_rows = int(_is_header(first))
    names = [name.strip().lower() for name in first] if header_rows else []
    for source, target in _NODE_COLUMN_NAMES:
        if source in names and target in names:
            weight = names.index("weight") if "weight" in names else None
            return [names.index(source), names.index(target)], weight, header_rows
    if len(first) == 2:
        return [0, 1], None, header_rows
    if len(first) == 3:
        return [0, 1], 2, header_rows
    raise ValueError(
        f"{path} has {len(first)} columns {first}: expected two node columns and an optional "
        "weight column, or columns named source,target (or u,v) and optionally weight")


def _count_records(path: Path) -> int:
    first = _first_row(path)
    if not first:
        return 0
    with open(path, newline="") as handle:
        return sum(1 for _ in csv.reader(handle)) - int(_is_header(first))


def _matching_files(directory: Path, patterns: tuple[str, ...], exclude: str | None = None) -> list[Path]:
    found = {p for pattern in patterns for p in directory.glob(pattern)
             if exclude is None or not p.name.endswith(exclude)}
    return sorted(found)


def _load_edge_csv(path: Path, num_nodes: int | None) -> Graph:
    node_columns, weight_column, header_rows = _edge_csv_columns(path)
    columns = node_columns + ([weight_column] if weight_column is not None else [])
    table = _load_columns(path, columns, header_rows)
    edges = _node_indices(table[:, :2], path)
    weights = None
    if weight_column is not None:
        weights = table[:, 2]
        if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
            raise ValueError(f"{path}: weights must be positive and finite")
    if num_nodes is not None and edges.max() >= num_nodes:
        raise ValueError(f"{path} references node {edges.max()} but the node file lists "
                         f"only {num_nodes} nodes")
    return Graph.from_edges(edges, weights=weights, num_nodes=num_nodes, self_loops="drop")


def _load_path(path: Path) -> Graph:
    if path.is_file():
        return _load_edge_csv(path, None)
    edge_files = _matching_files(path, ("*_edges.csv", "edges.csv"), exclude="_directed_edges.csv")
    if len(edge_files) != 1:
        raise (FileNotFoundError if not edge_files else ValueError)(
            f"directory {path} must contain exactly one '*_edges.csv' or 'edges.csv' file, "
            f"found {[p.name for p in edge_files]}")
    node_files = _matching_files(path, ("*_nodes.csv", "nodes.csv"))
    num_nodes = _count_records(node_files[0]) if len(node_files) == 1 else None
    return _load_edge_csv(edge_files[0], num_nodes)


def _load_named(name: str, data_dir: PathLike | None, verify: bool) -> Graph:
    spec = GRAPHS[name]
    path = data_file(spec.file, data_dir, verify)
    table = _load_columns(path, list(spec.node_columns))
    if table.shape[0] != spec.num_edges:
        raise ValueError(f"{spec.file} has {table.shape[0]} edges, expected {spec.num_edges}")
    edges = _node_indices(table, path)
    if edges.max() >= spec.num_nodes:
        raise ValueError(f"{spec.file} references node {edges.max()}, but {name} has "
                         f"{spec.num_nodes} nodes")
    graph = Graph.from_edges(edges, num_nodes=spec.num_nodes)
    if graph.num_edges != spec.num_edges:
        raise ValueError(f"{spec.file} lists {spec.num_edges} rows but they join "
                         f"{graph.num_edges} distinct node pairs (duplicates?)")
    return graph


def load_graph(name_or_path: PathLike, data_dir: PathLike | None = None, verify: bool = True,
               largest_component: bool = False) -> Graph:
    """Load a named graph from ``<data_dir>/graphs/`` or an edge list from a path.

    :param name_or_path: A name from :func:`available_graphs` (``karate``, ``dolphins``,
        ``football``, ``polbooks``, ``netscience``, ``internet_as_2006``, ``eurosis``,
        ``cora``, ``citeseer``, ``pubmed``, ``ego_facebook``, ``email_enron``,
        ``facebook_page_page``, ``github_musae``, ``california_roads``), or a path to an
        edge-list CSV file or to a directory holding one (see the module docstring).
        Self-loops in a user file are dropped; repeated edges have their weights summed.
    :param data_dir: Data directory for named graphs (default ``$GP_COUPLE_DATA``).
    :param verify: Verify the SHA-256 digest of a named graph's file (cached per process).
    :param largest_component: Return only the largest connected component, relabelled
        ``0..n-1`` in increasing order of the original node index (e.g. eurosis: 1272 of
        1285 nodes, the size used in the graph-random-feature papers).
    :return: The graph (unweighted unless a user file has a weight column).
    :raises ValueError: For an unknown name, malformed file or checksum mismatch.
    :raises FileNotFoundError: If the data directory or a file is missing.
    """
    if isinstance(name_or_path, str) and name_or_path in GRAPHS:
        graph = _load_named(name_or_path, data_dir, verify)
    else:
        path = existing_path(name_or_path, "name_or_path", "graph", GRAPHS, expected="a path to an edge-list CSV",
                             missing="edge list")
        graph = _load_path(path)
    if largest_component:
        graph, _ = graph.largest_component()
    return graph


def load_node_labels(name: str, data_dir: PathLike | None = None,
                     verify: bool = True) -> tuple[np.ndarray, tuple[str, ...]]:
    """Node classes of a named graph (see :data:`NODE_LABELS`), in the node order of :func:`load_graph`.

    :param name: A key of :data:`NODE_LABELS` (``karate``, ``football``, ``polbooks``,
        ``cora``, ``citeseer``, ``pubmed``).
    :param data_dir: Data directory (default ``$GP_COUPLE_DATA``).
    :param verify: Verify the node file's SHA-256 digest.
    :return: ``(codes, classes)``: int64 class codes of shape ``(num_nodes,)`` indexing
        ``classes`` (the distinct values, sorted; numerically for numeric labels), and
        ``-1`` for unlabelled nodes (citeseer has 15).
    :raises ValueError: For a graph without labels, or a node file whose rows do not
        match the graph's nodes.
    :raises FileNotFoundError: If the data directory or the file is missing.
    """
    if name not in NODE_LABELS:
        raise ValueError(f"no node labels for {name!r}: labelled graphs are {', '.join(NODE_LABELS)}")
    spec = NODE_LABELS[name]
    path = data_file(spec.file, data_dir, verify)
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    header = [field.strip() for field in rows[0]]
    if spec.column not in header or "node" not in header:
        raise ValueError(f"{spec.file} has no 'node' and {spec.column!r} columns (header {header})")
    node_column, label_column = header.index("node"), header.index(spec.column)
    nodes = np.array([int(row[node_column]) for row in rows[1:]], dtype=np.int64)
    values = [row[label_column].strip() for row in rows[1:]]
    expected = GRAPHS[name].num_nodes
    if not np.array_equal(nodes, np.arange(expected)):
        raise ValueError(f"{spec.file} must list nodes 0..{expected - 1} in order")
    labelled = sorted({v for v in values if v != spec.unlabelled},
                      key=lambda v: (0, float(v), "") if _NUMBER.fullmatch(v) else (1, 0.0, v))
    lookup = {value: code for code, value in enumerate(labelled)}
    codes = np.array([lookup.get(value, -1) for value in values], dtype=np.int64)
    return codes, tuple(labelled)
