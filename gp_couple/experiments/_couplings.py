"""Walk-length couplings compared by the graph experiments, resolved through the registry."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..couplings.walk_lengths import (
    WALK_LENGTH_COUPLINGS,
    SigmaCoupling,
    WalkLengthCoupling,
    get_walk_length_coupling,
)

# The default selections, shown by the commands' options (graph_gp.py imports them from here).
from ._options import COUPLINGS, DIRECTIONS  # noqa: F401


def coupling_choices() -> tuple[str, ...]:
    """Names the graph experiments accept: every registered walk-length coupling."""
    return WALK_LENGTH_COUPLINGS.names()


def walk_length_couplings(names: Sequence[str], fit_sigma: Callable[[], SigmaCoupling]
                          ) -> dict[str, WalkLengthCoupling]:
    """Instances for ``names``; the σ-coupling is fitted by ``fit_sigma`` only if asked for.

    :raises ValueError: For a name that is not registered (listing the registered ones).
    """
    return {name: fit_sigma() if name == SigmaCoupling.name else get_walk_length_coupling(name)
            for name in names}


def with_direction_labels(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows whose ``coupling`` names the direction scheme too, for plots that draw one curve per coupling."""
    if len({row.get("directions") for row in rows}) <= 1:
        return rows
    return [{**row, "coupling": f"{row['coupling']} ({row['directions']})"} for row in rows]
