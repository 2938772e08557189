"""The registration mechanism, and user couplings registered in their own module round-tripping.

The user couplings below live in a module written to a temporary directory and imported
from there, as a user's package would be; the kernels are then saved and loaded into
freshly built kernels, and the couplings go through JSON.
"""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import textwrap
import warnings
from collections.abc import Iterator
from types import ModuleType

import numpy as np
import pytest
import torch

from gp_couple.couplings import (
    FREQUENCY_COUPLINGS,
    WALK_LENGTH_COUPLINGS,
    AntitheticFrequencyCoupling,
    AntitheticWalkLengthCoupling,
    FrequencyCoupling,
    GaussianCopulaCoupling,
    IIDFrequencyCoupling,
    IIDWalkLengthCoupling,
    SigmaCoupling,
    WalkLengthCoupling,
    coupling_from_dict,
    frequency_coupling_from_dict,
    get_frequency_coupling,
    get_walk_length_coupling,
)
from gp_couple.graphs import grid_graph
from gp_couple.kernels import CoupledRFFKernel, GRFKernel
from gp_couple.registry import Registered, Registry

USER_MODULE = '''
from __future__ import annotations

import numpy as np

from gp_couple.couplings import OrthogonalNormCoupling, PairedWalkLengthCoupling, chi_isf, chi_ppf
from gp_couple.couplings import geometric_quantile


class UserQuantileMirror(PairedWalkLengthCoupling):
    """The worked example of couplings/walk_lengths.py, in a user's module."""

    name = "user-quantile-mirror"

    def sample_pairs(self, num_pairs, p_halt, rng):
        u1 = rng.random(num_pairs)
        return geometric_quantile(u1, p_halt), geometric_quantile(1.0 - u1, p_halt)


class UserMirroredNorms(OrthogonalNormCoupling):
    """Norms mirrored around the median for the first `mirrored` of each ensemble (a parameter)."""

    name = "user-mirrored-norms"

    def __init__(self, mirrored: int = 1) -> None:
        super().__init__()
        self.mirrored = int(mirrored)

    def params(self):
        return {"mirrored": self.mirrored}

    def sample_norms(self, shape, dim, rng):
        u = rng.random((*shape, 1))
        keep = min(self.mirrored, dim)
        return np.concatenate([np.repeat(chi_isf(u, dim), keep, -1),
                               np.repeat(chi_ppf(u, dim), dim - keep, -1)], -1)
'''


@pytest.fixture(scope="module")
def user_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    path = tmp_path_factory.mktemp("user_package") / "my_couplings.py"
    path.write_text(textwrap.dedent(USER_MODULE))
    spec = importlib.util.spec_from_file_location("my_couplings", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["my_couplings"] = module
    spec.loader.exec_module(module)
    yield module
    WALK_LENGTH_COUPLINGS.unregister("user-quantile-mirror")
    FREQUENCY_COUPLINGS.unregister("user-mirrored-norms")
    del sys.modules["my_couplings"]


def _saved(module: torch.nn.Module) -> dict:
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


# --------------------------------------------------------------------------- user couplings


def test_user_walk_length_coupling_reloads_into_a_fresh_grf_kernel(user_module: ModuleType) -> None:
    graph = grid_graph(4, 5)
    coupling = user_module.UserQuantileMirror()
    kernel = GRFKernel(graph, num_walkers=4, p_halt=0.4, coupling=coupling, seed=3)
    nodes = torch.arange(graph.num_nodes).unsqueeze(-1)
    expected = kernel(nodes).to_dense().detach()

    fresh = GRFKernel(graph, num_walkers=2, p_halt=0.5, coupling="iid", seed=99)
    fresh.load_state_dict(_saved(kernel))
    assert isinstance(fresh.coupling, user_module.UserQuantileMirror)
    assert (fresh.num_walkers, fresh.p_halt, fresh.seed) == (4, 0.4, 3)
    assert torch.equal(fresh(nodes).to_dense().detach(), expected)
    # Resampling with the reloaded coupling reproduces the original walks.
    assert torch.equal(fresh.resample(seed=3)(nodes).to_dense().detach(), expected)


def test_user_walk_length_coupling_by_name_and_json(user_module: ModuleType) -> None:
    by_name = get_walk_length_coupling("user-quantile-mirror")
    assert isinstance(by_name, user_module.UserQuantileMirror)
    text = json.dumps(by_name.to_dict())
    assert json.loads(text) == {"type": "user-quantile-mirror"}
    again = coupling_from_dict(json.loads(text))
    assert again == by_name
    np.testing.assert_array_equal(again.sample_lengths(10, 4, 0.3, seed=1),
                                  by_name.sample_lengths(10, 4, 0.3, seed=1))


def test_user_frequency_coupling_reloads_into_a_fresh_kernel(user_module: ModuleType) -> None:
    coupling = user_module.UserMirroredNorms(mirrored=2)
    kernel = CoupledRFFKernel(num_features=6, num_dims=3, coupling=coupling, seed=0).double()
    x = torch.as_tensor(np.random.default_rng(0).standard_normal((7, 3)))
    expected = kernel(x).to_dense().detach()
    state = _saved(kernel)
    assert state["_extra_state"]["coupling"] == {"type": "user-mirrored-norms", "mirrored": 2}

    # A fresh kernel built from the saved description (by name, through the registry).
    rebuilt = frequency_coupling_from_dict(state["_extra_state"]["coupling"])
    fresh = CoupledRFFKernel(num_features=2, num_dims=3, coupling=rebuilt, seed=7).double()
    fresh.load_state_dict(state)
    assert torch.equal(fresh(x).to_dense().detach(), expected)
    by_name = CoupledRFFKernel(num_features=2, num_dims=3, coupling="user-mirrored-norms").double()
    by_name.load_state_dict(state)
    assert torch.equal(by_name.frequencies, fresh.frequencies)


def test_user_frequency_coupling_json_keeps_its_parameters(user_module: ModuleType) -> None:
    coupling = user_module.UserMirroredNorms(mirrored=2)
    again = FrequencyCoupling.from_dict(json.loads(json.dumps(coupling.to_dict())))
    assert isinstance(again, user_module.UserMirroredNorms) and again.mirrored == 2
    torch.testing.assert_close(again.sample(6, 3, seed=4), coupling.sample(6, 3, seed=4),
                               rtol=0, atol=0)
    assert "user-mirrored-norms" in FREQUENCY_COUPLINGS.names()


# --------------------------------------------------------------------------- built-in descriptions


@pytest.mark.parametrize("name", ["iid", "halton", "sobol", "orthogonal", "pnc", "pm", "copula",
                                  "antithetic", "orthogonal+antithetic", "copula+antithetic"])
def test_builtin_frequency_couplings_round_trip_through_json(name: str) -> None:
    coupling = get_frequency_coupling(name, dim=3)
    if isinstance(coupling, (GaussianCopulaCoupling, AntitheticFrequencyCoupling)):
        for parameter in coupling.parameters():
            with torch.no_grad():
                parameter.normal_(generator=torch.Generator().manual_seed(0))
    again = frequency_coupling_from_dict(json.loads(json.dumps(coupling.to_dict())))
    assert type(again) is type(coupling) and again.name == coupling.name
    torch.testing.assert_close(again.sample(6, 3, seed=2, dtype=torch.float64),
                               coupling.sample(6, 3, seed=2, dtype=torch.float64), rtol=0, atol=1e-12)


def test_builtin_walk_length_couplings_round_trip_through_json() -> None:
    sigma = SigmaCoupling(np.random.default_rng(0).permutation(8), p_halt=0.3, metadata={"fit": "test"})
    for coupling in (IIDWalkLengthCoupling(), AntitheticWalkLengthCoupling(), sigma):
        again = WalkLengthCoupling.from_dict(json.loads(json.dumps(coupling.to_dict())))
        assert again == coupling and type(again) is type(coupling)
    assert WALK_LENGTH_COUPLINGS.names()[:3] == ("iid", "antithetic", "sigma")


def test_frequency_state_keeps_the_old_name_format() -> None:
    kernel = CoupledRFFKernel(num_features=4, num_dims=2, coupling="orthogonal", seed=0)
    state = kernel.state_dict()
    state["_extra_state"] = {**state["_extra_state"], "coupling": "orthogonal"}
    fresh = CoupledRFFKernel(num_features=4, num_dims=2, coupling="orthogonal", seed=1)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.frequencies, kernel.frequencies)


# --------------------------------------------------------------------------- the mechanism


class _Thing(Registered):
    def __init__(self, size: int = 1) -> None:
        self.size = size

    def params(self) -> dict:
        return {"size": self.size}


def _family() -> tuple[Registry, type]:
    registry: Registry = Registry("thing")

    class Base(_Thing, registry=registry):
        pass

    return registry, Base


def test_subclasses_with_a_name_register_themselves() -> None:
    registry, base = _family()
    big = type("Big", (base,), {"name": "big"})
    type("Unnamed", (base,), {})
    type("Private", (base,), {"name": "private"}, register=False)
    assert registry.names() == ("big",)
    assert registry.get("big") is big and registry.name_of(big(3)) == "big"
    assert big(3).to_dict() == {"type": "big", "size": 3}
    rebuilt = base.from_dict({"type": "big", "size": 5})
    assert type(rebuilt) is big and rebuilt.size == 5
    assert registry.from_dict({"type": "big"}).size == 1
    assert registry.create("big", size=2).size == 2 and "big" in registry and len(registry) == 1


def test_duplicate_names_are_refused_but_redefinitions_replace() -> None:
    registry, base = _family()
    first = type("Big", (base,), {"name": "big", "__module__": "mod_a"})
    with pytest.raises(ValueError, match=r"'big' is already registered by mod_a\.Big"):
        type("Other", (base,), {"name": "big", "__module__": "mod_b"})
    assert registry.get("big") is first
    second = type("Big", (base,), {"name": "big", "__module__": "mod_a"})
    assert registry.get("big") is second and not registry.is_registered(first)


def test_registry_errors_name_the_problem() -> None:
    registry, base = _family()
    type("Big", (base,), {"name": "big"})
    with pytest.raises(ValueError, match=r"unknown thing 'small'; choose from \['big'\]"):
        registry.get("small")
    with pytest.raises(ValueError, match=r"unknown thing type 'small'; registered: \['big'\]"):
        registry.from_dict({"type": "small"})
    with pytest.raises(ValueError, match="needs a 'type' key"):
        registry.from_dict({"size": 1})
    with pytest.raises(TypeError, match="must be a dict"):
        registry.from_dict("big")
    with pytest.raises(ValueError, match="not a registered thing"):
        type("Child", (registry.get("big"),), {})(1).to_dict()
    with pytest.raises(TypeError, match="str name"):
        registry.register(type("Nameless", (), {}))
    with pytest.raises(ValueError, match="non-empty"):
        registry.register(type("Blank", (), {}), name=" ")
    with pytest.raises(TypeError, match="only classes"):
        registry.register(3)

    @registry.register(name="decorated")
    class Decorated:
        def __init__(self, size: int = 0) -> None:
            self.size = size

    assert registry.from_dict({"type": "decorated", "size": 4}).size == 4


def test_builtin_names_cannot_be_taken_by_user_classes() -> None:
    with pytest.raises(ValueError, match="'pnc' is already registered"):
        type("MyPNC", (IIDFrequencyCoupling,), {"name": "pnc"})
    assert FREQUENCY_COUPLINGS.get("pnc").__name__ == "PairwiseNormCoupling"


def test_importing_the_package_warns_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from gp_couple.couplings import PairwiseNormCoupling  # noqa: F401


def test_resample_returns_the_kernel_in_both_families() -> None:
    rff = CoupledRFFKernel(num_features=3, num_dims=2, seed=0)
    assert rff.resample(seed=1) is rff
    grf = GRFKernel(grid_graph(2, 3), num_walkers=2, seed=0)
    assert grf.resample(seed=1) is grf


def test_descriptions_are_checked_before_anything_is_built() -> None:
    registry, base = _family()
    type("Big", (base,), {"name": "big"})

    @registry.register(name="loose")
    class Loose:
        def __init__(self, **options: int) -> None:
            self.options = options

    for rebuild in (registry.from_dict, base.from_dict):
        with pytest.raises(TypeError, match="thing description's 'type' must be a string, got integer 3"):
            rebuild({"type": 3})
        with pytest.raises(TypeError, match="'type' must be a string, got list"):
            rebuild({"type": ["big"]})
        with pytest.raises(ValueError, match=r"thing 'big' description has unknown field\(s\) \['colour'\]; "
                                             r"expected \['size', 'type'\]"):
            rebuild({"type": "big", "colour": "red"})
    deep: dict = {"type": "big"}
    inner = deep
    for _ in range(100_000):
        inner["size"] = {}
        inner = inner["size"]
    with pytest.raises(ValueError, match="thing description is nested more than 64 levels deep"):
        registry.from_dict(deep)
    assert registry.from_dict({"type": "loose", "anything": 1}).options == {"anything": 1}  # **kwargs


def test_check_json_value_names_where() -> None:
    from gp_couple.registry import check_json_value

    check_json_value({"a": [1, 2.5, "x", None, True]}, "metadata")
    with pytest.raises(TypeError, match=r"metadata must be JSON-serialisable: metadata\['a'\]\[1\] is a set"):
        check_json_value({"a": [1, {2}]}, "metadata")
    with pytest.raises(TypeError, match="has a key of type int"):
        check_json_value({1: 2}, "metadata")
    with pytest.raises(ValueError, match="nested more than 3 levels"):
        check_json_value([[[[1]]]], "metadata", max_depth=3)
