"""Graph specifications, as command lines and benchmarks name graphs.

A spec is a dataset name or edge-list path (read through :func:`gp_couple.datasets.load_graph`),
or a procedural graph that needs no data: ``grid:ROWSxCOLS``, ``icosphere:SUBDIVISIONS``
or ``erdos-renyi:NODES:PROBABILITY[:SEED]``.
"""

from __future__ import annotations

from typing import Any

from .._checks import TooLargeError
from ..graphs import Graph, erdos_renyi_graph, grid_graph, icosphere_graph

__all__ = ["PROCEDURAL_HELP", "resolve_graph"]

PROCEDURAL_HELP = ("a dataset name (karate, dolphins, football, polbooks, eurosis, cora, ...), "
                   "a path to an edge-list CSV, or grid:RxC, icosphere:K, erdos-renyi:N:P[:SEED]")


def resolve_graph(spec: str, data_dir: Any = None, *, largest_component: bool = False) -> Graph:
    """Build the graph named by ``spec`` (see the module docstring).

    :param spec: A dataset name, an edge-list path, or ``grid:RxC``, ``icosphere:K``,
        ``erdos-renyi:N:P[:SEED]``.
    :param data_dir: Data directory for named datasets (default ``$GP_COUPLE_DATA``).
    :param largest_component: Keep only the largest connected component.
    :return: The graph.
    :raises ValueError: For an empty or malformed spec (naming the wrong part, e.g.
        ``icosphere:-1``), or a procedural graph too large for the available memory
        (``icosphere:14``, ``grid:100000x100000``: refused with the estimate before
        anything is allocated).
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"graph spec must be a non-empty string, got {spec!r}")
    kind, _, rest = spec.partition(":")
    try:
        if kind == "grid" and rest:
            rows, cols = (int(v) for v in rest.lower().split("x"))
            graph = grid_graph(rows, cols)
        elif kind == "icosphere" and rest:
            graph = icosphere_graph(int(rest))
        elif kind == "erdos-renyi" and rest:
            parts = rest.split(":")
            if len(parts) > 3:
                raise ValueError(f"{len(parts)} parts after 'erdos-renyi:', expected 2 or 3")
            graph = erdos_renyi_graph(int(parts[0]), float(parts[1]),
                                      int(parts[2]) if len(parts) > 2 else 0)
        else:
            from .graphs import load_graph

            return load_graph(spec, data_dir, largest_component=largest_component)
    except TooLargeError as error:
        # Checked by the builders before they allocate anything.
        raise TooLargeError(f"graph spec {spec!r} is too large: {error}") from error
    except (IndexError, TypeError, ValueError) as error:
        if kind in ("grid", "icosphere", "erdos-renyi"):
            # The builder's message (e.g. "edge_probability must lie in [0, 1], got 2.0")
            # says which part of the spec is wrong.
            reason = f" ({error})" if not isinstance(error, IndexError) else ""
            raise ValueError(f"malformed graph spec {spec!r}{reason}: expected {PROCEDURAL_HELP}") from error
        raise
    return graph.largest_component()[0] if largest_component else graph
