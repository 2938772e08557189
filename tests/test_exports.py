"""The public names of the package's top level: one lazy table, every public coupling in it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import gp_couple
from gp_couple import couplings
from gp_couple.couplings import DIRECTION_COUPLINGS, FREQUENCY_COUPLINGS, NEIGHBOUR_PROPOSALS, WALK_LENGTH_COUPLINGS


@pytest.mark.parametrize("name", sorted(gp_couple.__all__))
def test_every_listed_name_imports_from_the_top_level(name: str) -> None:
    assert getattr(gp_couple, name) is not None


@pytest.mark.parametrize("registry", [WALK_LENGTH_COUPLINGS, NEIGHBOUR_PROPOSALS, DIRECTION_COUPLINGS,
                                      FREQUENCY_COUPLINGS], ids=lambda registry: repr(registry))
def test_every_builtin_coupling_of_every_family_is_exported_like_the_others(registry) -> None:
    builtins = [registry.get(name) for name in registry.names()
                if registry.get(name).__module__.startswith("gp_couple.")]
    assert builtins
    for cls in builtins:
        assert cls.__name__ in gp_couple.__all__, f"{cls.__name__} is not exported from gp_couple"
        assert getattr(gp_couple, cls.__name__) is getattr(couplings, cls.__name__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'gp_couple' has no attribute 'NoSuchName'"):
        gp_couple.NoSuchName  # noqa: B018 - the attribute access is the test


def test_each_family_exports_its_base_class_and_its_lookup() -> None:
    for name in ("WalkLengthCoupling", "get_walk_length_coupling", "NeighbourProposal", "get_proposal",
                 "DirectionCoupling", "get_direction_coupling", "FrequencyCoupling", "get_frequency_coupling"):
        assert getattr(gp_couple, name) is getattr(couplings, name)


def test_importing_the_package_stays_light() -> None:
    code = ("import sys, gp_couple\nfrom gp_couple import __version__\n"
            "print(sorted(m for m in ('torch', 'gpytorch', 'numba') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
