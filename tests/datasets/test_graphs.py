"""Named real-world graphs and edge-list CSV files."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from gp_couple.datasets import GRAPHS, available_graphs, load_graph
from gp_couple.graphs import Graph

# datasets/graphs.md: nodes, edges, components, largest component.
README_GRAPHS = {
    "karate": (34, 78, 1, 34),
    "dolphins": (62, 159, 1, 62),
    "football": (115, 613, 1, 115),
    "polbooks": (105, 441, 1, 105),
    "netscience": (1589, 2742, 396, 379),
    "internet_as_2006": (22963, 48436, 1, 22963),
    "eurosis": (1285, 6462, 6, 1272),
    "cora": (2708, 5278, 78, 2485),
    "citeseer": (3327, 4552, 438, 2120),
    "pubmed": (19717, 44324, 1, 19717),
    "ego_facebook": (4039, 88234, 1, 4039),
    "email_enron": (36692, 183831, 1065, 33696),
    "facebook_page_page": (22470, 170823, 1, 22470),
    "github_musae": (37700, 289003, 1, 37700),
    "california_roads": (21048, 21693, 1, 21048),
}


def test_available_graphs() -> None:
    assert available_graphs() == tuple(README_GRAPHS) == tuple(GRAPHS)


# ------------------------------------------------------------------ real data
@pytest.mark.parametrize("name", list(README_GRAPHS))
def test_readme_counts(data_dir: Path, name: str) -> None:
    nodes, edges, components, largest = README_GRAPHS[name]
    graph = load_graph(name, data_dir)
    assert graph.num_nodes == nodes and graph.num_edges == edges
    assert np.all(graph.weights == 1.0)
    count, labels = graph.connected_components()
    assert count == components and np.bincount(labels).max() == largest
    if components > 1:
        assert load_graph(name, data_dir, largest_component=True).num_nodes == largest


def test_eurosis_largest_component(data_dir: Path) -> None:
    component = load_graph("eurosis", data_dir, largest_component=True)
    assert component.num_nodes == 1272 and component.connected_components()[0] == 1


def test_citeseer_keeps_isolated_nodes(data_dir: Path) -> None:
    assert len(load_graph("citeseer", data_dir).isolated_nodes) == 48


def test_karate_matches_networkx(data_dir: Path) -> None:
    assert load_graph("karate", data_dir) == Graph.from_networkx(nx.karate_club_graph(), weight=None)


def test_directory_and_file_paths(data_dir: Path) -> None:
    by_dir = load_graph(data_dir / "graphs" / "citeseer")  # node count from citeseer_nodes.csv
    assert by_dir == load_graph("citeseer", data_dir)
    roads = load_graph(str(data_dir / "graphs" / "california_roads" / "cal_edges.csv"))
    assert roads == load_graph("california_roads", data_dir)
    traffic = load_graph(data_dir / "traffic")  # u, v, ..., weight columns, parallel edges summed
    assert traffic.num_nodes == 1016 and traffic.num_edges == 1172


def test_env_var_fallback(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GP_COUPLE_DATA", str(data_dir))
    assert load_graph("karate").num_nodes == 34


def test_checksum_mismatch(corrupted_copy) -> None:
    copy_dir = corrupted_copy("graphs/eurosis/eurosis_edges.csv")
    with pytest.raises(ValueError, match=r"checksum mismatch for graphs/eurosis/eurosis_edges\.csv"):
        load_graph("eurosis", copy_dir)


def test_wrong_contents_without_verification(data_dir: Path, tmp_path: Path) -> None:
    relative = Path("graphs/karate/karate_edges.csv")
    (tmp_path / relative).parent.mkdir(parents=True)
    (tmp_path / relative).write_text((data_dir / relative).read_text() + "0,33\n")
    with pytest.raises(ValueError, match="has 79 edges, expected 78"):
        load_graph("karate", tmp_path, verify=False)


# ------------------------------------------------------------------ no data needed
def _csv(tmp_path: Path, text: str, name: str = "g_edges.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_two_column_csv(tmp_path: Path) -> None:
    graph = load_graph(_csv(tmp_path, "a,b\n0,1\n1,2\n2,2\n"))  # self-loop dropped
    assert graph.num_nodes == 3 and graph.num_edges == 2


def test_weighted_csv(tmp_path: Path) -> None:
    graph = load_graph(_csv(tmp_path, "i,j,w\n0,1,0.5\n1,0,0.25\n1,2,2\n"))
    adjacency = graph.adjacency.toarray()
    assert adjacency[0, 1] == 0.75 and adjacency[2, 1] == 2.0


def test_named_columns_and_quotes(tmp_path: Path) -> None:
    text = 'id,source,name,target,weight\n0,0,"a, b",2,3.0\n1,2,c,1,1.0\n'
    graph = load_graph(_csv(tmp_path, text))
    assert graph.num_nodes == 3 and graph.adjacency[0, 2] == 3.0


def test_directory_with_node_file(tmp_path: Path) -> None:
    _csv(tmp_path, "source,target\n0,1\n", "toy_edges.csv")
    _csv(tmp_path, "source,target\n1,0\n0,1\n", "toy_directed_edges.csv")  # ignored
    _csv(tmp_path, 'node,label\n0,"x, y"\n1,b\n2,c\n3,d\n', "toy_nodes.csv")
    graph = load_graph(tmp_path)
    assert graph.num_nodes == 4 and len(graph.isolated_nodes) == 2
    _csv(tmp_path, 'node\n0\n', "toy_nodes.csv")
    with pytest.raises(ValueError, match="lists only 1 nodes"):
        load_graph(tmp_path)


@pytest.mark.parametrize("text, message", [
    ("a,b\n0,1.5\n", "non-negative integers"),
    ("a,b\n0,-1\n", "non-negative integers"),
    ("a,b,w\n0,1,-2\n", "weights must be positive"),
    ("a,b,c,d\n0,1,2,3\n", "has 4 columns"),
    ("a,b\n", "lists no edges"),
    ("", "is empty"),
    ("a,b\n0,x\n", "cannot read columns"),
])
def test_malformed_csv(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_graph(_csv(tmp_path, text))


def test_errors(tmp_path: Path, no_env_data: None) -> None:
    with pytest.raises(ValueError, match=r"unknown graph 'karat'.*karate"):
        load_graph("karat")
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        load_graph(tmp_path / "missing.csv")
    with pytest.raises(FileNotFoundError, match=r"data_dir.*GP_COUPLE_DATA"):
        load_graph("karate")
    with pytest.raises(FileNotFoundError, match=r"graphs/karate/karate_edges\.csv"):
        load_graph("karate", tmp_path)
    with pytest.raises(FileNotFoundError, match="exactly one"):
        load_graph(tmp_path)
    with pytest.raises(TypeError, match="name_or_path"):
        load_graph(7)  # type: ignore[arg-type]


# ------------------------------------------------------------------ header detection
@pytest.mark.parametrize("text, edges, weight", [
    ("0,1\n1,2\n2,3", 3, None),               # headerless: the first row is an edge
    ("0,1,2.5\n1,2,1e0\n", 2, 2.5),           # headerless with weights (scientific notation too)
    ("source,target\n0,1\n1,2\n2,3\n", 3, None),
    ("nan,inf\n0,1\n1,2\n", 2, None),         # words float() accepts are still header names
])
def test_header_is_detected_from_the_first_row(tmp_path: Path, text: str, edges: int, weight) -> None:
    graph = load_graph(_csv(tmp_path, text))
    assert graph.num_edges == edges and len(graph.isolated_nodes) == 0
    if weight is not None:
        assert graph.adjacency[0, 1] == weight


def test_headerless_node_file_counts_every_row(tmp_path: Path) -> None:
    _csv(tmp_path, "0,1\n", "toy_edges.csv")
    _csv(tmp_path, "0\n1\n2\n", "toy_nodes.csv")
    assert load_graph(tmp_path).num_nodes == 3


def test_node_labels(data_dir: Path) -> None:
    from gp_couple.datasets import NODE_LABELS, load_node_labels

    codes, classes = load_node_labels("karate", data_dir)
    assert classes == ("Mr. Hi", "Officer") and np.bincount(codes).tolist() == [17, 17]
    codes, classes = load_node_labels("cora", data_dir)
    assert classes == tuple(str(k) for k in range(7)) and codes.shape == (2708,) and codes.min() == 0
    codes, _ = load_node_labels("citeseer", data_dir)
    assert int(np.sum(codes == -1)) == 15  # placeholder nodes, README
    assert set(NODE_LABELS) <= set(GRAPHS)
    with pytest.raises(ValueError, match="no node labels for 'eurosis'"):
        load_node_labels("eurosis", data_dir)


# ------------------------------------------------------------------ encodings
@pytest.mark.parametrize("text, edges, weight", [
    ("0,1\n1,2\n2,3\n", 3, None),       # headerless: the mark must not make row 1 a header
    ("0,1,2.5\n1,2,1\n", 2, 2.5),       # headerless with weights: the weight column is kept
    ("source,target,weight\n0,1,2.5\n1,2,1\n", 2, 2.5),  # the first column name is found
])
def test_utf8_byte_order_mark_is_ignored(tmp_path: Path, text: str, edges: int, weight) -> None:
    path = tmp_path / "bom_edges.csv"
    path.write_bytes(text.encode("utf-8-sig"))
    graph = load_graph(path)
    assert graph == load_graph(_csv(tmp_path, text))
    assert graph.num_edges == edges and graph.adjacency[0, 1] == (weight or 1.0)


@pytest.mark.parametrize("content, message", [
    ("0,1\n1,2\n".encode("utf-16"), "is UTF-16-LE text"),
    ("0,1\n1,2\n".encode("utf-16-be"), "line 1 contains a NUL byte"),  # no byte-order mark
    ("0,1\n1,2\n".encode("utf-32"), "is UTF-32-LE text"),
    ("a,b\n0,1\n1,2 # é\n".encode("latin-1"), r"is not UTF-8 text: line 3 has the byte 0xe9"),
    (bytes(range(256)), "not UTF-8 text"),
    (b"0,1\n\x00\x01\x02\n", "line 2 contains a NUL byte"),
])
def test_undecodable_files_are_named(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad_edges.csv"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"{path} .*{message}"):
        load_graph(path)
    (tmp_path / "toy_edges.csv").write_text("0,1\n")
    (tmp_path / "toy_nodes.csv").write_bytes(content)  # the node file of a directory too
    (tmp_path / "bad_edges.csv").unlink()
    with pytest.raises(ValueError, match=rf"toy_nodes.csv .*{message}"):
        load_graph(tmp_path)


def test_node_file_with_byte_order_mark_and_blank_lines(tmp_path: Path) -> None:
    _csv(tmp_path, "0,1\n", "toy_edges.csv")
    (tmp_path / "toy_nodes.csv").write_bytes("node,label\n0,a\n\n1,b\n2,c\n\n".encode("utf-8-sig"))
    assert load_graph(tmp_path).num_nodes == 3


# ------------------------------------------------------------------ invalid first rows are data
@pytest.mark.parametrize("text, message", [
    ("0,1,inf\n1,2,1\n", r"line 1: weights must be positive and finite, got 'inf'"),
    ("0,1,nan\n1,2,1\n", r"line 1: weights must be positive and finite, got 'nan'"),
    ("0,1,0\n1,2,1\n", r"line 1: weights must be positive and finite, got '0'"),
    ("0,1,-1e3\n", r"line 1: weights must be positive and finite"),
    ("nan,1\n1,2\n", r"line 1: node ids must be non-negative integers, got 'nan'"),
    ("0,inf\n1,2\n", r"line 1: node ids must be non-negative integers, got 'inf'"),
    ("-1,2\n1,2\n", r"line 1: node ids must be non-negative integers, got '-1'"),
    ("0,x\n1,2\n", r"line 1: cannot read columns as numbers: 'x'"),
    ("source,target\n\n0,1\n\n1,2.5\n", r"line 5: node ids must be non-negative integers, got '2.5'"),
    ("source,target,weight\n0,1,1\n1,2,infinity\n", r"line 3: weights must be positive and finite"),
    ("0,1\n1\n", r"line 2: 1 fields, expected at least 2"),
    ("0,1,1\n1,2\n", r"line 2: 2 fields, expected at least 3"),
    ("0,99999999999999999999\n", r"line 1: node ids must be non-negative integers below 2\*\*63"),
])
def test_invalid_rows_are_errors_with_their_line(tmp_path: Path, text: str, message: str) -> None:
    path = _csv(tmp_path, text)
    with pytest.raises(ValueError, match=rf"{path}, {message}"):
        load_graph(path)


def test_only_a_row_without_numbers_is_a_header(tmp_path: Path) -> None:
    assert load_graph(_csv(tmp_path, "from,to\n0,1\n")).num_edges == 1
    assert load_graph(_csv(tmp_path, "nan,inf\n0,1\n1,2\n")).num_edges == 2
    # Ids written as floats or with spaces are still read exactly.
    graph = load_graph(_csv(tmp_path, "0.0, 1\n1 ,2e0\n"))
    assert graph.num_edges == 2 and graph.num_nodes == 3


def test_large_ids_are_read_exactly(tmp_path: Path) -> None:
    big = 2 ** 62 + 1  # not a float64
    graph, ids = load_graph(_csv(tmp_path, f"{big},{big + 2}\n{big + 2},{big + 4}\n"), relabel=True)
    assert ids.tolist() == [big, big + 2, big + 4] and graph.num_edges == 2


# ------------------------------------------------------------------ node ids, relabelling and sizes
def test_sparse_ids_warn_and_relabel_keeps_the_original_ids(tmp_path: Path) -> None:
    path = _csv(tmp_path, "source,target,weight\n0,200000,2\n200000,31,1\n")
    with pytest.warns(UserWarning, match=r"200001 nodes.*only 3 distinct node ids.*relabel=True"):
        graph = load_graph(path)
    assert graph.num_nodes == 200_001
    relabelled, ids = load_graph(path, relabel=True)
    assert ids.tolist() == [0, 31, 200_000] and ids.dtype == np.int64
    np.testing.assert_array_equal(relabelled.adjacency.toarray(), [[0, 0, 2], [0, 0, 1], [2, 1, 0]])
    component, component_ids = load_graph(_csv(tmp_path, "5,9\n9,7\n100,200\n"), relabel=True,
                                          largest_component=True)
    assert component.num_nodes == 3 and component_ids.tolist() == [5, 7, 9]


def test_relabel_keeps_the_numbering_of_named_graphs_and_node_files(tmp_path: Path, data_dir: Path) -> None:
    graph, ids = load_graph("karate", data_dir, relabel=True)
    assert graph == load_graph("karate", data_dir) and ids.tolist() == list(range(34))
    _csv(tmp_path, "0,3\n", "toy_edges.csv")
    _csv(tmp_path, "node\n0\n1\n2\n3\n4\n", "toy_nodes.csv")
    graph, ids = load_graph(tmp_path, relabel=True)
    assert graph.num_nodes == 5 and ids.tolist() == list(range(5))


def test_huge_ids_are_refused_with_a_memory_estimate(tmp_path: Path, memory_16_gib: None) -> None:
    path = _csv(tmp_path, "0,1000000000000\n")
    with pytest.raises(ValueError, match=r"1000000000001 nodes .* needs about 29.1 TiB of memory, more than the "
                                         r"16 GiB available.*relabel"):
        load_graph(path)
    graph, ids = load_graph(path, relabel=True)
    assert graph.num_nodes == 2 and ids.tolist() == [0, 10 ** 12]


# ------------------------------------------------------------------ node labels
def _label_dir(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "graphs" / "karate" / "karate_nodes.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return tmp_path


def test_node_labels_file_with_byte_order_mark(tmp_path: Path) -> None:
    from gp_couple.datasets import load_node_labels

    rows = "".join(f"{node},{'Mr. Hi' if node < 17 else 'Officer'}\n" for node in range(34))
    directory = _label_dir(tmp_path, f"node,club\n{rows}".encode("utf-8-sig"))
    codes, classes = load_node_labels("karate", directory, verify=False)
    assert classes == ("Mr. Hi", "Officer") and np.bincount(codes).tolist() == [17, 17]


@pytest.mark.parametrize("content, message", [
    (b"", r"karate_nodes.csv is empty: expected a header with 'node' and 'club' columns"),
    (b"\n\n", "is empty"),
    (b"node,club\n0,a\n1.5,b\n", r"karate_nodes.csv, line 3: node ids must be non-negative integers, got '1.5'"),
    (b"node,club\n0,a\nx,b\n", r"line 3: cannot read columns as numbers: 'x'"),
    (b"node,club\n0,a\n1\n", r"line 3: 1 fields, expected at least 2"),
    (b"node,club\n0,a\n", r"must list nodes 0..33 in order"),
    ("node,club\n0,a\n".encode("utf-16"), "is UTF-16-LE text"),
])
def test_malformed_node_label_files(tmp_path: Path, content: bytes, message: str) -> None:
    from gp_couple.datasets import load_node_labels

    with pytest.raises(ValueError, match=message):
        load_node_labels("karate", _label_dir(tmp_path, content), verify=False)
