"""``resolve_graph``: graph specs as the command line and the benchmarks name them (public in datasets)."""

from __future__ import annotations

import pytest

from gp_couple.datasets import resolve_graph


def test_procedural_specs() -> None:
    assert resolve_graph("grid:3x4").num_nodes == 12
    assert resolve_graph("icosphere:1").num_nodes == 80  # faces of a once-subdivided icosahedron
    assert resolve_graph("erdos-renyi:30:0.2:1").num_nodes == 30


@pytest.mark.parametrize("spec, message", [
    ("", "non-empty"), ("grid:3", "malformed graph spec 'grid:3'"), ("erdos-renyi:10:2.0", "malformed"),
    ("icosphere:-1", r"malformed graph spec 'icosphere:-1' \(subdivisions must be >= 0, got -1\)"),
    ("icosphere:2.5", "malformed graph spec 'icosphere:2.5'"),
    ("grid:3x-2", r"malformed graph spec 'grid:3x-2' \(cols must be >= 1, got -2\)"),
    ("grid:3x2.5", "malformed graph spec 'grid:3x2.5'"),
    ("erdos-renyi:-4:0.5", r"\(num_nodes must be >= 1, got -4\)"),
    ("erdos-renyi:10:0.5:1:2", r"\(4 parts after 'erdos-renyi:', expected 2 or 3\)"),
])
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_graph(spec)


def test_named_dataset(data_dir) -> None:  # type: ignore[no-untyped-def]
    assert resolve_graph("karate", data_dir).num_nodes == 34


@pytest.mark.parametrize("spec, message", [
    ("icosphere:14", r"graph spec 'icosphere:14' is too large: icosphere_graph\(14\) \(5368709120 faces\) "
                     r"needs about 5 TiB of memory, more than the 16 GiB available"),
    ("grid:100000x100000", r"graph spec 'grid:100000x100000' is too large: .* needs about 4.37 TiB"),
    ("erdos-renyi:1000000:0.5", "graph spec 'erdos-renyi:1000000:0.5' is too large"),
])
def test_specs_that_cannot_fit_are_refused_before_allocating(memory_16_gib: None, spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_graph(spec)
