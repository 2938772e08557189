"""Couplings of random-feature samples: walk lengths (graphs) and frequencies (Euclidean)."""

from . import frequencies
from .directions import (
    DIRECTION_COUPLINGS,
    DirectionCoupling,
    IndependentDirections,
    RepellingDirections,
    direction_coupling_from_dict,
    get_direction_coupling,
)
from .frequencies import *  # noqa: F403 - every name of frequencies.__all__, re-exported below
from .proposals import (
    NEIGHBOUR_PROPOSALS,
    NeighbourProposal,
    UniformProposal,
    WeightedProposal,
    get_proposal,
    proposal_from_dict,
)
from .walk_lengths import (
    WALK_LENGTH_COUPLINGS,
    AntitheticWalkLengthCoupling,
    IIDWalkLengthCoupling,
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
    "WALK_LENGTH_COUPLINGS",
    "IIDWalkLengthCoupling",
    "AntitheticWalkLengthCoupling",
    "SigmaCoupling",
    "geometric_quantile",
    "get_walk_length_coupling",
    "coupling_from_dict",
    "NEIGHBOUR_PROPOSALS",
    "NeighbourProposal",
    "UniformProposal",
    "WeightedProposal",
    "get_proposal",
    "proposal_from_dict",
    "DIRECTION_COUPLINGS",
    "DirectionCoupling",
    "IndependentDirections",
    "RepellingDirections",
    "direction_coupling_from_dict",
    "get_direction_coupling",
    *frequencies.__all__,
]
