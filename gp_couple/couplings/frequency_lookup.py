"""Resolving frequency couplings from names and JSON descriptions.

Every coupling registered in :data:`~gp_couple.couplings.frequency_interface.FREQUENCY_COUPLINGS`
(built in or a user's) is found by name; ``<name>+antithetic`` wraps it in the
antithetic coupling.
"""

from __future__ import annotations

import inspect
from typing import Any

from .frequency_interface import FREQUENCY_COUPLINGS, FrequencyCoupling

__all__ = ["get_frequency_coupling", "frequency_coupling_from_dict"]

#: Appended to a coupling's name, wraps it in the antithetic coupling.
ANTITHETIC_SUFFIX = "+antithetic"


def get_frequency_coupling(coupling: str | FrequencyCoupling, *,
                           dim: int | None = None) -> FrequencyCoupling:
    """Resolve a registered coupling name (or an instance) to a coupling instance.

    Names: those of :data:`FREQUENCY_COUPLINGS` (built in: ``iid``, ``halton``,
    ``sobol``, ``orthogonal``, ``pnc``, ``pm``, ``copula`` (needs ``dim``),
    ``antithetic`` (= ``pnc+antithetic``)), case-insensitively for the built-in ones,
    and ``<name>+antithetic``.

    :param coupling: Name or instance (returned as is).
    :param dim: Input dimension, passed to couplings whose constructor takes ``dim``
        (``copula``).
    :raises ValueError: For an unknown name (listing the known ones) or a missing ``dim``.
    :raises TypeError: If ``coupling`` is neither a str nor a coupling.
    """
    if not isinstance(coupling, str):
        return FREQUENCY_COUPLINGS.resolve(coupling, FrequencyCoupling, "coupling")
    spec = coupling.strip()
    if spec not in FREQUENCY_COUPLINGS:
        spec = spec.lower()
    if spec.endswith(ANTITHETIC_SUFFIX) and spec not in FREQUENCY_COUPLINGS:
        # Found by its registered name: the antithetic coupling resolves its own base
        # through this function, so its module comes after this one.
        antithetic = FREQUENCY_COUPLINGS.get("antithetic")
        return antithetic(get_frequency_coupling(spec[: -len(ANTITHETIC_SUFFIX)], dim=dim))
    if spec not in FREQUENCY_COUPLINGS:
        raise FREQUENCY_COUPLINGS.unknown_name_error(
            coupling, f" (optionally with {ANTITHETIC_SUFFIX!r}) or pass a FrequencyCoupling")
    arguments: dict[str, Any] = {}
    if "dim" in inspect.signature(FREQUENCY_COUPLINGS.get(spec)).parameters:
        if dim is None:
            raise ValueError(f"the {spec} coupling needs dim (the input dimension)")
        arguments["dim"] = dim
    return FREQUENCY_COUPLINGS.resolve(spec, FrequencyCoupling, "coupling", **arguments)


def frequency_coupling_from_dict(data: dict[str, Any]) -> FrequencyCoupling:
    """Inverse of :meth:`FrequencyCoupling.to_dict` for every registered coupling."""
    return FREQUENCY_COUPLINGS.from_dict(data)
