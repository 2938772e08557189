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
