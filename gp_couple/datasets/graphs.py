"""Real-world graphs: named graphs of ``<data_dir>/graphs/`` and edge-list CSV files.

Named graphs (:func:`available_graphs`) are read from their ``*_edges.csv`` file, whose
checksum is verified, and are checked against their known node and edge counts (see
``datasets/graphs.md``). All named graphs are unweighted and simple. Node counts come
from the registry, so isolated nodes are kept (citeseer has 48).

Any other edge list can be loaded from a path: a CSV file with one header line and
either two integer node columns and an optional third weight column, or named
columns ``source``/``target`` (or ``u``/``v``) with an optional ``weight`` column (other
columns are ignored). A directory is searched for its single ``*_edges.csv`` (or
``edges.csv``) file, and a single ``*_nodes.csv`` (or ``nodes.csv``) beside it, if
present, gives the number of nodes.
"""

from __future__ import annotations

import csv
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..graphs import Graph
from ._paths import PathLike, data_file, looks_like_name

__all__ = ["GRAPHS", "GraphSpec", "available_graphs", "load_graph"]


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

_NODE_COLUMN_NAMES = (("source", "target"), ("u", "v"))


def available_graphs() -> tuple[str, ...]:
    """Names accepted by :func:`load_graph` (no I/O: the data directory is not inspected).

    :return: The registry names, in the order of ``datasets/graphs.md``.
    """
    return tuple(GRAPHS)


def _load_columns(path: Path, columns: list[int]) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            # An empty table is reported below with the file's name.
            warnings.filterwarnings("ignore", message="loadtxt: input contained no data")
            table = np.loadtxt(path, delimiter=",", skiprows=1, usecols=columns, ndmin=2,
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


def _edge_csv_columns(path: Path) -> tuple[list[int], int | None]:
    """Node columns and optional weight column of a user edge-list CSV, from its header."""
    with open(path, newline="") as handle:
        header = next(csv.reader(handle), None)
    if not header:
        raise ValueError(f"{path} is empty: expected a header line and one edge per row")
    names = [name.strip().lower() for name in header]
    for first, second in _NODE_COLUMN_NAMES:
        if first in names and second in names:
            weight = names.index("weight") if "weight" in names else None
            return [names.index(first), names.index(second)], weight
    if len(names) == 2:
        return [0, 1], None
    if len(names) == 3:
        return [0, 1], 2
    raise ValueError(
        f"{path} has {len(names)} columns {header}: expected two node columns and an optional "
        "weight column, or columns named source,target (or u,v) and optionally weight")


def _count_records(path: Path) -> int:
    with open(path, newline="") as handle:
        return max(sum(1 for _ in csv.reader(handle)) - 1, 0)


def _matching_files(directory: Path, patterns: tuple[str, ...], exclude: str | None = None) -> list[Path]:
    found = {p for pattern in patterns for p in directory.glob(pattern)
             if exclude is None or not p.name.endswith(exclude)}
    return sorted(found)


def _load_edge_csv(path: Path, num_nodes: int | None) -> Graph:
    node_columns, weight_column = _edge_csv_columns(path)
    columns = node_columns + ([weight_column] if weight_column is not None else [])
    table = _load_columns(path, columns)
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
        if not isinstance(name_or_path, (str, os.PathLike)):
            raise TypeError(f"name_or_path must be a graph name or a path, got "
                            f"{type(name_or_path).__name__}")
        path = Path(name_or_path).expanduser()
        if not path.exists():
            if looks_like_name(name_or_path):
                raise ValueError(f"unknown graph {name_or_path!r}: expected one of "
                                 f"{', '.join(GRAPHS)} or a path to an edge-list CSV")
            raise FileNotFoundError(f"edge list {path.absolute()} does not exist")
        graph = _load_path(path)
    if largest_component:
        graph, _ = graph.largest_component()
    return graph
