"""Couplings of random-feature samples: walk lengths (graphs) and frequencies (Euclidean)."""

from .walk_lengths import (
    AntitheticTermination,
    IIDLengths,
    PairedWalkLengthCoupling,
    SigmaCoupling,
    WalkLengthCoupling,
    coupling_from_dict,
    geometric_quantile,
    get_walk_length_coupling,
)

__all__ = [
    "WalkLengthCoupling",
    "PairedWalkLengthCoupling",
    "IIDLengths",
    "AntitheticTermination",
    "SigmaCoupling",
    "geometric_quantile",
    "get_walk_length_coupling",
    "coupling_from_dict",
]
