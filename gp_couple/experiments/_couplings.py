"""Walk-length couplings compared by the graph experiments, resolved through the registry."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..couplings.walk_lengths import (
    WALK_LENGTH_COUPLINGS,
    SigmaCoupling,
    WalkLengthCoupling,
    get_walk_length_coupling,
)
from ._report import positive_int

#: The three couplings of the paper's graph experiments (the default selection; any
#: registered walk-length coupling may be chosen).
COUPLINGS = ("iid", "antithetic", SigmaCoupling.name)


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


#: Direction couplings compared by default: the paper's independent walkers and
#: repelling random walks.
DIRECTIONS = ("independent", "repelling")


def add_walk_arguments(parser: Any) -> None:
    """``--proposal`` and ``--directions``: the options of every command that samples walks."""
    from ..couplings.directions import DIRECTION_COUPLINGS
    from ..couplings.proposals import NEIGHBOUR_PROPOSALS

    parser.add_argument("--proposal", choices=NEIGHBOUR_PROPOSALS.names(), default="weighted",
                        help="neighbour proposal: weighted (choice in proportion to edge weight; the same "
                             "as uniform on unweighted graphs) or uniform (default %(default)s)")
    parser.add_argument("--directions", nargs="+", choices=DIRECTION_COUPLINGS.names(),
                        default=list(DIRECTIONS),
                        help="direction couplings compared with every length coupling (default %(default)s)")
    # The CLI runs the command inside gp_couple.settings.threads(args.threads): on a busy
    # machine, thread pools larger than the CPU share a run gets spin-wait for descheduled
    # peers (benchmarks/bench_contention.py), so users sharing a machine should bound them.
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="bound torch, numba and BLAS threads for this run, e.g. 1 on a busy "
                             "machine (default: leave the thread pools as they are)")


def with_direction_labels(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows whose ``coupling`` names the direction scheme too, for plots that draw one curve per coupling."""
    if len({row.get("directions") for row in rows}) <= 1:
        return rows
    return [{**row, "coupling": f"{row['coupling']} ({row['directions']})"} for row in rows]
