"""Loaders for the real datasets of the paper's experiments.

No data is bundled: every loader reads a data directory passed as ``data_dir`` or named
by the environment variable ``GP_COUPLE_DATA``, verifies each file's SHA-256 digest
(``verify=True``, cached per process) and raises :class:`FileNotFoundError` naming what
is missing and where it was looked for. Dataset cards: ``datasets/`` at the repository
root.

* :func:`load_mesh` / :func:`default_mesh`: meshes as faces-as-nodes graphs with the
  normal-z target; :func:`split_test_nodes` for the 5 % test split.
* :func:`load_traffic` / :func:`traffic_split`: the San Jose traffic-speed graph.
* :func:`load_graph`: named real-world graphs and edge-list CSV files;
  :func:`load_node_labels`: node classes of the labelled ones (:data:`NODE_LABELS`).
* :func:`load_uci`: UCI regression datasets as ``(X, y)``; :func:`load_regression`: the
  same, or a CSV file of your own (the commands' ``--dataset``).
* :func:`resolve_graph`: a graph from a spec string (dataset name, edge-list path or
  ``grid:RxC`` / ``icosphere:K`` / ``erdos-renyi:N:P[:SEED]``), as the command line takes it.
"""

from __future__ import annotations

from ._paths import CHECKSUMS, ENV_VAR, clear_verification_cache, resolve_data_dir, verify_file
from .graph_specs import resolve_graph
from .graphs import GRAPHS, NODE_LABELS, available_graphs, load_graph, load_node_labels
from .meshes import MESHES, MeshDataset, default_mesh, load_mesh, mesh_from_trimesh, split_test_nodes
from .traffic import TrafficDataset, load_traffic, traffic_split
from .uci import UCI_DATASETS, load_regression, load_uci

__all__ = [
    "CHECKSUMS",
    "ENV_VAR",
    "GRAPHS",
    "MESHES",
    "NODE_LABELS",
    "UCI_DATASETS",
    "MeshDataset",
    "TrafficDataset",
    "available_graphs",
    "clear_verification_cache",
    "default_mesh",
    "load_graph",
    "load_mesh",
    "load_node_labels",
    "load_traffic",
    "load_regression",
    "load_uci",
    "mesh_from_trimesh",
    "resolve_data_dir",
    "resolve_graph",
    "split_test_nodes",
    "traffic_split",
    "verify_file",
]
