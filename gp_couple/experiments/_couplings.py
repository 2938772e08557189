"""Walk-length couplings compared by the graph experiments."""

from __future__ import annotations

from typing import Callable, Sequence

from ..couplings.walk_lengths import (
    AntitheticTermination,
    IIDLengths,
    SigmaCoupling,
    WalkLengthCoupling,
)

#: The three couplings of the paper's graph experiments.
COUPLINGS = ("iid", "antithetic", "sigma")


def walk_length_couplings(names: Sequence[str], fit_sigma: Callable[[], SigmaCoupling]
                          ) -> dict[str, WalkLengthCoupling]:
    """Instances for ``names``; the σ-coupling is fitted by ``fit_sigma`` only if asked for."""
    couplings: dict[str, WalkLengthCoupling] = {}
    for name in names:
        if name == "iid":
            couplings[name] = IIDLengths()
        elif name == "antithetic":
            couplings[name] = AntitheticTermination()
        elif name == "sigma":
            couplings[name] = fit_sigma()
        else:
            raise ValueError(f"unknown coupling {name!r}; choose from {COUPLINGS}")
    return couplings
