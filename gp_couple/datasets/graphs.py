"""Real-world graphs: named graphs of ``<data_dir>/graphs/`` and edge-list CSV files.

Named graphs (:func:`available_graphs`) are read from their ``*_edges.csv`` file, whose
checksum is verified, and are checked against their known node and edge counts (see
``datasets/graphs.md``). All named graphs are unweighted and simple. Node counts come
from the registry, so isolated nodes are kept (citeseer has 48).

Any other edge list can be loaded from a path: a CSV file with either two integer node
columns and an optional third weight column, or named columns ``source``/``target`` (or
``u``/``v``) with an optional ``weight`` column (other columns are ignored). The first
row is a header line if and only if none of its fields is a number, so a headerless
file (``0,1\n1,2\n2,3``) keeps its first edge, and a first row of invalid data
(``0,1,inf``, ``nan,1``) is an error naming its line, like any other row. A directory is
searched for its single ``*_edges.csv`` (or ``edges.csv``) file, and a single
``*_nodes.csv`` (or ``nodes.csv``) beside it, if present, gives the number of nodes (its
non-blank rows, less a header row detected the same way).

Every file is read as UTF-8 text (:func:`gp_couple.datasets._paths.read_text`): a
byte-order mark is dropped, and a UTF-16 or binary file is refused with its name. Blank
lines are skipped; errors name the file and the line.
"""

from __future__ import annotations

import csv
import io
import math
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np

from ..graphs import Graph
from ._paths import PathLike, data_file, existing_path, read_text

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


class _FieldError(ValueError):
    """A field that is not what its column must hold (the message says what and shows it)."""


def _csv_rows(path: Path, text: str) -> Iterator[tuple[int, list[str]]]:
    """The non-blank rows of the text of a CSV file, each with the line it starts on."""
    reader = csv.reader(io.StringIO(text, newline=""))
    line = 1
    try:
        for row in reader:
            if any(field.strip() for field in row):
                yield line, row
            line = reader.line_num + 1
    except csv.Error as error:
        raise ValueError(f"{path}, line {line}: not a valid CSV row ({error})") from None


def _read_rows(path: Path) -> list[tuple[int, list[str]]]:
    """The non-blank rows of a UTF-8 CSV file (:func:`read_text`), each with the line it starts on."""
    return list(_csv_rows(path, read_text(path)))


def _numpy_columns(text: str, skip_lines: int, columns: list[int], dtype: type) -> np.ndarray | None:
    """``columns`` of the lines after the first ``skip_lines``, read by numpy's C parser; ``None`` where it fails."""
    try:
        with warnings.catch_warnings():
            # An empty table is reported by the caller, with the file's name.
            warnings.filterwarnings("ignore", message="loadtxt: input contained no data")
            return np.loadtxt(io.StringIO(text), delimiter=",", skiprows=skip_lines, usecols=columns, dtype=dtype,
                              quotechar='"', comments=None, ndmin=2)
    except ValueError:
        return None


def _number(field: str) -> float:
    try:
        return float(field)
    except ValueError:
        raise _FieldError(f"cannot read columns as numbers: {field.strip()!r} is not a number") from None


def _node_id(field: str) -> int:
    """A node id: an integer (``3`` or ``3.0``) in ``[0, 2**63)``, read exactly (no float rounding)."""
    try:
        value = int(field)
    except ValueError:
        number = _number(field)
        if not number.is_integer():  # NaN, infinities and fractions
            raise _FieldError(f"node ids must be non-negative integers, got {field.strip()!r}") from None
        value = int(number)
    if not 0 <= value < 2 ** 63:
        limit = " below 2**63" if value > 0 else ""
        raise _FieldError(f"node ids must be non-negative integers{limit}, got {field.strip()!r}")
    return value


def _weight(field: str) -> float:
    value = _number(field)
    if not (math.isfinite(value) and value > 0):
        raise _FieldError(f"weights must be positive and finite, got {field.strip()!r}")
    return value


def _parse_columns(path: Path, records: list[tuple[int, list[str]]], columns: list[int],
                   parse: Callable[[str], Any]) -> list[list[Any]]:
    """Fields ``columns`` of every record through ``parse``; an error names the file and the line."""
    width = max(columns) + 1
    values = []
    for line, row in records:
        if len(row) < width:
            raise ValueError(f"{path}, line {line}: {len(row)} fields, expected at least {width}")
        try:
            values.append([parse(row[column]) for column in columns])
        except _FieldError as error:
            raise ValueError(f"{path}, line {line}: {error}") from None
    return values


def _edges(path: Path, records: list[tuple[int, list[str]]], columns: list[int]) -> np.ndarray:
    return np.array(_parse_columns(path, records, columns, _node_id), dtype=np.int64).reshape(-1, 2)


def _read_edges(path: Path, text: str, header_line: int, node_columns: list[int],
                weight_column: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Edges (int64, exact) and weights (float64) of the rows after line ``header_line`` (0: no header).

    numpy's parser reads a valid file; the csv module reads it again, row by row, when
    numpy fails or a value is invalid, to name the line and the field.
    """
    edges = _numpy_columns(text, header_line, node_columns, np.int64)
    weights = None if weight_column is None else _numpy_columns(text, header_line, [weight_column], np.float64)
    if edges is not None and np.all(edges >= 0) and (weight_column is None or (
            weights is not None and len(weights) == len(edges) and np.all(np.isfinite(weights) & (weights > 0)))):
        return edges, None if weights is None else weights.ravel()
    records = [(line, row) for line, row in _csv_rows(path, text) if line > header_line]
    edges = _edges(path, records, node_columns)
    if weight_column is None:
        return edges, None
    return edges, np.array(_parse_columns(path, records, [weight_column], _weight), dtype=np.float64).ravel()


def _is_header(row: list[str]) -> bool:
    """A first row is a header when none of its fields is a number (``0,1,inf`` is data)."""
    return not any(_NUMBER.fullmatch(field.strip()) for field in row)


def _edge_csv_columns(path: Path, first: list[str]) -> tuple[list[int], int | None, int]:
    """Node columns, optional weight column and header rows (0 or 1) of a user edge-list CSV."""
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
    rows = _read_rows(path)
    return len(rows) - int(bool(rows) and _is_header(rows[0][1]))


def _matching_files(directory: Path, patterns: tuple[str, ...], exclude: str | None = None) -> list[Path]:
    found = {p for pattern in patterns for p in directory.glob(pattern)
             if exclude is None or not p.name.endswith(exclude)}
    return sorted(found)


def _load_edge_csv(path: Path, num_nodes: int | None, relabel: bool) -> tuple[Graph, np.ndarray | None]:
    """The graph of a user edge list and, where relabelled, the original id of each node."""
    text = read_text(path)
    first = next(_csv_rows(path, text), None)
    if first is None:
        raise ValueError(f"{path} is empty: expected an optional header line and one edge per row")
    node_columns, weight_column, header_rows = _edge_csv_columns(path, first[1])
    edges, weights = _read_edges(path, text, first[0] * header_rows, node_columns, weight_column)
    if len(edges) == 0:
        raise ValueError(f"{path} lists no edges")
    if num_nodes is not None and edges.max() >= num_nodes:
        raise ValueError(f"{path} references node {edges.max()} but the node file lists only {num_nodes} nodes")
    node_ids = None
    if relabel and num_nodes is None:
        node_ids, inverse = np.unique(edges, return_inverse=True)
        edges, num_nodes = inverse.reshape(edges.shape), len(node_ids)
    return Graph.from_edges(edges, weights=weights, num_nodes=num_nodes, self_loops="drop"), node_ids


def _load_path(path: Path, relabel: bool) -> tuple[Graph, np.ndarray | None]:
    if path.is_file():
        return _load_edge_csv(path, None, relabel)
    edge_files = _matching_files(path, ("*_edges.csv", "edges.csv"), exclude="_directed_edges.csv")
    if len(edge_files) != 1:
        raise (FileNotFoundError if not edge_files else ValueError)(
            f"directory {path} must contain exactly one '*_edges.csv' or 'edges.csv' file, "
            f"found {[p.name for p in edge_files]}")
    node_files = _matching_files(path, ("*_nodes.csv", "nodes.csv"))
    num_nodes = _count_records(node_files[0]) if len(node_files) == 1 else None
    return _load_edge_csv(edge_files[0], num_nodes, relabel)


def _load_named(name: str, data_dir: PathLike | None, verify: bool) -> Graph:
    spec = GRAPHS[name]
    path = data_file(spec.file, data_dir, verify)
    edges, _ = _read_edges(path, read_text(path), 1, list(spec.node_columns))
    if len(edges) != spec.num_edges:
        raise ValueError(f"{spec.file} has {len(edges)} edges, expected {spec.num_edges}")
    if edges.max() >= spec.num_nodes:
        raise ValueError(f"{spec.file} references node {edges.max()}, but {name} has "
                         f"{spec.num_nodes} nodes")
    graph = Graph.from_edges(edges, num_nodes=spec.num_nodes)
    if graph.num_edges != spec.num_edges:
        raise ValueError(f"{spec.file} lists {spec.num_edges} rows but they join "
                         f"{graph.num_edges} distinct node pairs (duplicates?)")
    return graph


@overload
def load_graph(name_or_path: PathLike, data_dir: PathLike | None = None, verify: bool = True,
               largest_component: bool = False, *, relabel: Literal[False] = False) -> Graph: ...


@overload
def load_graph(name_or_path: PathLike, data_dir: PathLike | None = None, verify: bool = True,
               largest_component: bool = False, *, relabel: Literal[True]) -> tuple[Graph, np.ndarray]: ...


def load_graph(name_or_path: PathLike, data_dir: PathLike | None = None, verify: bool = True,
               largest_component: bool = False, *, relabel: bool = False) -> Graph | tuple[Graph, np.ndarray]:
    """Load a named graph from ``<data_dir>/graphs/`` or an edge list from a path.

    A user edge list's node ids are node indices as they are, so ids ``0`` and
    ``10000000`` make ``10000001`` nodes (with a warning, :func:`gp_couple.graphs.Graph.from_edges`),
    and a graph too large for the available memory is refused before it is built. With
    ``relabel=True`` the distinct ids of a single edge-list file become nodes
    ``0..k-1`` in increasing order, and the original ids are returned with the graph (a
    named graph, or a directory whose node file gives the number of nodes, keeps its
    numbering: the ids are ``0..num_nodes-1``).

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
    :param relabel: Number a user edge list's distinct node ids ``0..k-1`` and return
        them too (keyword-only).
    :return: The graph (unweighted unless a user file has a weight column); with
        ``relabel=True``, ``(graph, node_ids)``: ``node_ids[i]`` (int64) is the original
        id of node ``i``.
    :raises ValueError: For an unknown name, a malformed file (naming the file and line:
        a file that is not UTF-8 text, a node id that is not a non-negative integer, a
        weight that is not positive and finite), a checksum mismatch, or a graph that
        cannot fit in memory.
    :raises FileNotFoundError: If the data directory or a file is missing.
    """
    node_ids: np.ndarray | None = None
    if isinstance(name_or_path, str) and name_or_path in GRAPHS:
        graph = _load_named(name_or_path, data_dir, verify)
    else:
        path = existing_path(name_or_path, "name_or_path", "graph", GRAPHS, expected="a path to an edge-list CSV",
                             missing="edge list")
        graph, node_ids = _load_path(path, relabel)
    if not relabel:
        return graph.largest_component()[0] if largest_component else graph
    if node_ids is None:
        node_ids = np.arange(graph.num_nodes, dtype=np.int64)
    if largest_component:
        graph, nodes = graph.largest_component()
        node_ids = node_ids[nodes]
    return graph, node_ids


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
    :raises ValueError: For a graph without labels, or a node file that is empty, not
        UTF-8 text, has a row without a valid node id (naming the line), or whose rows do
        not match the graph's nodes.
    :raises FileNotFoundError: If the data directory or the file is missing.
    """
    if name not in NODE_LABELS:
        raise ValueError(f"no node labels for {name!r}: labelled graphs are {', '.join(NODE_LABELS)}")
    spec = NODE_LABELS[name]
    path = data_file(spec.file, data_dir, verify)
    rows = _read_rows(path)
    if not rows:
        raise ValueError(f"{path} is empty: expected a header with 'node' and {spec.column!r} columns "
                         "and one row per node")
    header = [field.strip() for field in rows[0][1]]
    if spec.column not in header or "node" not in header:
        raise ValueError(f"{spec.file} has no 'node' and {spec.column!r} columns (header {header})")
    node_column, label_column = header.index("node"), header.index(spec.column)
    nodes = np.array(_parse_columns(path, rows[1:], [node_column], _node_id), dtype=np.int64).ravel()
    values = [value for value, in _parse_columns(path, rows[1:], [label_column], str.strip)]
    expected = GRAPHS[name].num_nodes
    if not np.array_equal(nodes, np.arange(expected)):
        raise ValueError(f"{spec.file} must list nodes 0..{expected - 1} in order")
    labelled = sorted({v for v in values if v != spec.unlabelled},
                      key=lambda v: (0, float(v), "") if _NUMBER.fullmatch(v) else (1, 0.0, v))
    lookup = {value: code for code, value in enumerate(labelled)}
    codes = np.array([lookup.get(value, -1) for value in values], dtype=np.int64)
    return codes, tuple(labelled)
