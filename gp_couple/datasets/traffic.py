r"""The San Jose highway traffic-speed graph (Borovitskiy et al., 2021).

1016 road-network nodes, 325 of which are PeMS speed sensors with one observation each
(the paper's traffic regression task, Appendix F.3 "Probabilistic traffic interpolation"
[sec:traffic_expt]). The weighted adjacency is

.. math::

    A_{uv} = A_{vu} = \sum_{e \text{ joins } u, v} w_e, \qquad
    w_e = \frac{\text{mean edge length}}{\text{length of } e},

summed over the 1173 road segments (nodes 123 and 606 are joined by two parallel
segments, so the graph has 1172 distinct edges), exactly as ``networkx.to_numpy_array``
builds it from the original multigraph.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

from .._checks import check_int
from .._random import SeedLike
from ..graphs import Graph
from ._paths import PathLike, data_file, freeze, random_split

__all__ = ["TRAFFIC_FILE", "TrafficDataset", "load_traffic", "traffic_split"]

#: The file :func:`load_traffic` reads, relative to the data directory.
TRAFFIC_FILE = "traffic/pems_traffic.npz"

NUM_NODES = 1016
NUM_ROAD_SEGMENTS = 1173
NUM_EDGES = 1172
NUM_OBSERVED = 325

_REQUIRED_KEYS = ("num_nodes", "edge_index", "edge_weight", "node_lonlat", "obs_nodes",
                  "obs_speed_mph")


@dataclass(frozen=True, eq=False)
class TrafficDataset:
    """Traffic speeds observed at the sensor nodes of a weighted road graph.

    :ivar graph: Weighted road graph, 1016 nodes and 1172 edges (parallel segments summed).
    :ivar observed_nodes: ``(325,)`` int64, read-only: the graph node of each sensor.
    :ivar speeds: ``(325,)`` float64, read-only: speed in mph at ``observed_nodes``
        (unstandardised; the papers standardise it).
    :ivar node_lonlat: ``(1016, 2)`` float64, read-only: WGS84 longitude and latitude of
        each node (for plotting).
    :ivar name: ``"pems_traffic"``.
    """

    graph: Graph
    observed_nodes: np.ndarray
    speeds: np.ndarray
    node_lonlat: np.ndarray
    name: str


def _invalid(problem: str) -> ValueError:
    return ValueError(f"{TRAFFIC_FILE} is invalid: {problem}")


def _check_shape(arrays: dict[str, np.ndarray], key: str, shape: tuple[int, ...]) -> np.ndarray:
    array = arrays[key]
    if array.shape != shape:
        raise _invalid(f"{key} has shape {array.shape}, expected {shape}")
    if not (np.issubdtype(array.dtype, np.number)):
        raise _invalid(f"{key} has non-numeric dtype {array.dtype}")
    if not np.all(np.isfinite(array)):
        raise _invalid(f"{key} contains NaN or infinite values")
    return array


def _integer(array: np.ndarray, key: str) -> np.ndarray:
    if not np.issubdtype(array.dtype, np.integer):
        raise _invalid(f"{key} must hold integers, got dtype {array.dtype}")
    return array.astype(np.int64)


def _validated_dataset(arrays: dict[str, np.ndarray]) -> TrafficDataset:
    missing = [key for key in _REQUIRED_KEYS if key not in arrays]
    if missing:
        raise _invalid(f"missing arrays {missing} (has {sorted(arrays)})")
    num_nodes = int(_integer(_check_shape(arrays, "num_nodes", ()), "num_nodes"))
    if num_nodes != NUM_NODES:
        raise _invalid(f"num_nodes = {num_nodes}, expected {NUM_NODES}")
    edges = _integer(_check_shape(arrays, "edge_index", (NUM_ROAD_SEGMENTS, 2)), "edge_index")
    if edges.min() < 0 or edges.max() >= num_nodes:
        raise _invalid(f"edge_index has node indices outside [0, {num_nodes})")
    if np.any(edges[:, 0] == edges[:, 1]):
        raise _invalid("edge_index contains self-loops")
    weights = _check_shape(arrays, "edge_weight", (NUM_ROAD_SEGMENTS,)).astype(np.float64)
    if np.any(weights <= 0):
        raise _invalid(f"edge_weight must be positive (min {weights.min():.3g})")
    lonlat = _check_shape(arrays, "node_lonlat", (num_nodes, 2)).astype(np.float64)
    observed = _integer(_check_shape(arrays, "obs_nodes", (NUM_OBSERVED,)), "obs_nodes")
    if observed.min() < 0 or observed.max() >= num_nodes:
        raise _invalid(f"obs_nodes has node indices outside [0, {num_nodes})")
    if len(np.unique(observed)) != len(observed):
        raise _invalid("obs_nodes contains repeated nodes")
    speeds = _check_shape(arrays, "obs_speed_mph", (NUM_OBSERVED,)).astype(np.float64)
    graph = Graph.from_edges(edges, weights=weights, num_nodes=num_nodes)
    if graph.num_edges != NUM_EDGES:
        raise _invalid(f"the road segments join {graph.num_edges} distinct node pairs, "
                       f"expected {NUM_EDGES}")
    return TrafficDataset(graph=graph, observed_nodes=freeze(observed), speeds=freeze(speeds),
                          node_lonlat=freeze(lonlat), name="pems_traffic")


def load_traffic(data_dir: PathLike | None = None, verify: bool = True) -> TrafficDataset:
    """Load the San Jose traffic-speed graph from ``<data_dir>/traffic/pems_traffic.npz``.

    The contents are validated (array names and shapes, 1016 nodes, 1173 road segments
    joining 1172 node pairs, positive finite weights, 325 distinct observed nodes) even
    when ``verify=False``.

    :param data_dir: Data directory (default ``$GP_COUPLE_DATA``).
    :param verify: Verify the file's SHA-256 digest (cached per process).
    :return: The weighted graph, observed nodes, speeds (mph) and node coordinates.
    :raises FileNotFoundError: If the data directory or the file is missing.
    :raises ValueError: On a checksum mismatch or invalid contents, including a file that
        is not a readable numpy archive (truncated, corrupt); the message names the file.
    """
    path = data_file(TRAFFIC_FILE, data_dir, verify)
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ValueError(f"it holds a single {type(archive).__name__}, not named arrays")
        with archive:
            arrays = {key: archive[key] for key in archive.files}
    # A damaged zip fails in zipfile (BadZipFile), zlib (a truncated member) or while
    # reading past its end (EOFError), none of them a ValueError.
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        raise _invalid(f"{path} cannot be read as a numpy archive ({type(error).__name__}: {error})") from error
    return _validated_dataset(arrays)


def traffic_split(num_observed: int = NUM_OBSERVED, num_train: int = 250, num_test: int = 75,
                  *, seed: SeedLike) -> tuple[np.ndarray, np.ndarray]:
    """Random train/test split of the observed nodes (the paper's 250/75 splits).

    Indices refer to positions in :attr:`TrafficDataset.observed_nodes` /
    :attr:`TrafficDataset.speeds`, not to graph nodes.

    :param num_observed: Number of observations (325 for the traffic dataset).
    :param num_train: Size of the training set.
    :param num_test: Size of the test set.
    :param seed: Seed (int, numpy/torch generator or ``None``), keyword-only; the same int
        gives the same split.
    :return: ``(train_positions, test_positions)``: disjoint sorted int64 arrays of positions.
    :raises TypeError: If a count is not an int.
    :raises ValueError: If a size is not positive or ``num_train + num_test > num_observed``.
    """
    num_observed = check_int("num_observed", num_observed, 2)
    num_train = check_int("num_train", num_train, 1)
    num_test = check_int("num_test", num_test, 1)
    if num_train + num_test > num_observed:
        raise ValueError(f"num_train + num_test = {num_train + num_test} exceeds "
                         f"num_observed = {num_observed}")
    return random_split(num_observed, num_train, num_test, seed)
