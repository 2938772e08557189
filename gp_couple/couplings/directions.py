r"""Direction couplings: how the walkers of one start node choose their next nodes jointly.

Walk-length couplings (:mod:`gp_couple.couplings.walk_lengths`) correlate *how far* the
:math:`m` walkers of a start node go; a direction coupling correlates *where* they go.
Estimates stay unbiased as long as each walker, on its own, follows the neighbour
proposal (:mod:`gp_couple.couplings.proposals`): features are sums over walkers, so only
each walker's marginal law enters their expectation.

* :class:`IndependentDirections` (default): every walker draws its moves from its own
  random stream.
* :class:`RepellingDirections`: repelling random walks (Reid, Berger, Choromanski and
  Weller, "Repelling Random Walks", ICLR 2024). At every step, the :math:`k` active
  walkers of one start node that stand on the same node :math:`u` share one uniform
  :math:`U`, and walker :math:`j` of that group (in walker order) moves by the
  proposal's inverse CDF at the stratified point

  .. math::

      u_j = (U + j/k) \bmod 1, \qquad j = 0, \dots, k - 1 .

  Each :math:`u_j` is uniform, so each walker's move follows the proposal exactly; the
  points are spread evenly over :math:`[0, 1)`, so the group spreads over the
  neighbourhood. With a uniform proposal and :math:`k \le \deg(u)` the walkers take
  distinct neighbours (sampling without replacement; the chosen set is evenly spaced
  in the neighbour order, starting at a uniformly random position); with more walkers
  than neighbours each neighbour receives :math:`\lfloor k/\deg(u)\rfloor` or
  :math:`\lceil k/\deg(u)\rceil` of them. With the weighted proposal every neighbour
  receives :math:`k\,P(v \mid u)` walkers rounded up or down.

The walkers of a start node then advance in lock-step; the result still depends only on
the seed and the start node, not on the thread count. Both schemes compose with any
length coupling and any proposal.

The compiled sampler implements these two schemes; a registered subclass (e.g. with
another name or parameters) chooses one of them through :attr:`DirectionCoupling.repelling`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..registry import Registered, Registry
from ._named import ValueEquality

__all__ = ["DIRECTION_COUPLINGS", "DirectionCoupling", "IndependentDirections", "RepellingDirections",
           "DEFAULT_DIRECTIONS", "get_direction_coupling", "direction_coupling_from_dict"]

#: Registry of direction couplings (names used by the command line and saved kernels).
DIRECTION_COUPLINGS: Registry[DirectionCoupling] = Registry("direction coupling")


class DirectionCoupling(ValueEquality, Registered, registry=DIRECTION_COUPLINGS):
    """Base class: how the walkers of one start node choose their moves jointly."""

    #: Whether the compiled sampler moves walkers that share a node with stratified
    #: uniforms (repelling) rather than independent ones.
    repelling: ClassVar[bool] = False


class IndependentDirections(DirectionCoupling):
    """Every walker chooses its moves independently (the paper's walks)."""

    name = "independent"


class RepellingDirections(DirectionCoupling):
    """Repelling random walks: walkers on the same node spread over its neighbours (module docstring)."""

    name = "repelling"
    repelling = True


#: The direction coupling used when none is given.
DEFAULT_DIRECTIONS: DirectionCoupling = IndependentDirections()


def get_direction_coupling(directions: DirectionCoupling | str | None) -> DirectionCoupling:
    """Resolve ``"independent"`` / ``"repelling"`` (or a registered name), an instance or ``None`` (default).

    :raises ValueError: For an unknown name.
    :raises TypeError: For anything else.
    """
    return DIRECTION_COUPLINGS.resolve(directions, DirectionCoupling, "directions", default=DEFAULT_DIRECTIONS)


def direction_coupling_from_dict(data: dict[str, Any]) -> DirectionCoupling:
    """Inverse of :meth:`DirectionCoupling.to_dict` for every registered direction coupling."""
    return DIRECTION_COUPLINGS.from_dict(data)
