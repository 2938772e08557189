"""``resolve_graph``: graph specs as the command line and the benchmarks name them (public in datasets)."""

from __future__ import annotations

import pytest

from gp_couple.datasets import resolve_graph
from gp_couple.experiments._graphs import resolve_graph as experiments_resolve_graph


def test_procedural_specs() -> None:
    assert resolve_graph("grid:3x4").num_nodes == 12
    assert resolve_graph("icosphere:1").num_nodes == 80  # faces of a once-subdivided icosahedron
    assert resolve_graph("erdos-renyi:30:0.2:1").num_nodes == 30
    assert experiments_resolve_graph is resolve_graph


@pytest.mark.parametrize("spec, message", [("", "non-empty"), ("grid:3", "malformed graph spec 'grid:3'"),
                                           ("erdos-renyi:10:2.0", "malformed")])
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_graph(spec)


def test_named_dataset(data_dir) -> None:  # type: ignore[no-untyped-def]
    assert resolve_graph("karate", data_dir).num_nodes == 34
