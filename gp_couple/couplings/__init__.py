"""Couplings of random-feature samples: walk lengths (graphs) and frequencies (Euclidean)."""

from .._deprecation import deprecated_aliases
from . import frequencies, walk_lengths
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
from .proposals import (
    NEIGHBOUR_PROPOSALS,
    NeighbourProposal,
    UniformProposal,
    WeightedProposal,
    get_proposal,
    proposal_from_dict,
)
from .directions import (
    DIRECTION_COUPLINGS,
    DirectionCoupling,
    IndependentDirections,
    RepellingDirections,
    direction_coupling_from_dict,
    get_direction_coupling,
)

from .frequencies import (
    FREQUENCY_COUPLING_NAMES,
    FREQUENCY_COUPLINGS,
    AntitheticFrequencyCoupling,
    FrequencyCoupling,
    GaussianCopulaCoupling,
    HaltonCoupling,
    IIDFrequencyCoupling,
    OrthogonalCoupling,
    OrthogonalNormCoupling,
    PairwiseNormCoupling,
    PositiveMonotoneCoupling,
    SobolCoupling,
    chi_isf,
    chi_ppf,
    chi_quantile,
    frequency_coupling_from_dict,
    get_frequency_coupling,
    normal_to_chi,
    random_orthogonal_matrices,
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

# Old names of the two families' i.i.d. and antithetic couplings, with a warning.
__getattr__ = deprecated_aliases(__name__, {**walk_lengths.__getattr__.aliases,
                                            **frequencies.__getattr__.aliases})
