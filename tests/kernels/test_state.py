"""Kernels load a state dict all at once or not at all: a bad entry leaves them exactly as they were."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import gpytorch
import pytest
import torch

from gp_couple.graphs import grid_graph
from gp_couple.kernel_families import Diffusion
from gp_couple.kernels import CoupledRFFKernel, ExactGraphKernel, GRFKernel

GRID = grid_graph(4, 5)
OTHER = grid_graph(2, 10)  # as many nodes, another graph


def _snapshot(kernel: torch.nn.Module) -> dict[str, Any]:
    """Everything loading may change: tensors and the saved configuration."""
    return copy.deepcopy({key: value.clone() if isinstance(value, torch.Tensor) else value
                          for key, value in kernel.state_dict().items()})


def _assert_unchanged(kernel: torch.nn.Module, before: dict[str, Any]) -> None:
    after = kernel.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert after[key].shape == value.shape and torch.equal(after[key], value), key
        else:
            assert after[key] == value, key


def _saved_grf() -> dict[str, Any]:
    kernel = GRFKernel(GRID, num_walkers=6, p_halt=0.3, seed=7, coupling="antithetic",
                       kernel_family=Diffusion(1.7))
    return _snapshot(kernel)  # walks of another seed and count than the fresh kernels below


def _with_extra(**changes: Any) -> Callable[[dict[str, Any]], None]:
    return lambda state: state["_extra_state"].update(changes)


@pytest.mark.parametrize("corrupt, error, message", [
    (_with_extra(p_halt=0.0), ValueError, "p_halt"),
    (_with_extra(num_walkers=-1), ValueError, "num_walkers"),
    (_with_extra(num_walkers="six"), TypeError, "num_walkers"),
    (_with_extra(coupling={"type": "no-such-coupling"}), ValueError, "unknown walk-length coupling type"),
    (_with_extra(coupling={"type": 3}), TypeError, "'type' must be a string"),
    (_with_extra(proposal={"type": "uniform", "bias": 2}), ValueError, r"unknown field\(s\) \['bias'\]"),
    (_with_extra(seed=-1), ValueError, "seed must be non-negative"),
    (_with_extra(seed=1.5), TypeError, "seed must be an int"),
    (_with_extra(max_length=-3), ValueError, "max_length"),
    (lambda state: state["_extra_state"].pop("seed"), ValueError, r"lacks \['seed'\]"),
    (lambda state: state["_extra_state"].update(graph_fingerprint=OTHER.fingerprint()), ValueError,
     "different graph"),
    (lambda state: state.update({"kernel_family.raw_gamma": torch.zeros(3, 1)}), ValueError,
     r"kernel_family.raw_gamma has shape \(3, 1\)"),
    (lambda state: state.update({"kernel_family.raw_gamma": [0.5]}), TypeError, "expected a tensor"),
])
def test_a_bad_grf_state_changes_nothing(corrupt, error, message: str) -> None:  # type: ignore[no-untyped-def]
    state = _saved_grf()
    corrupt(state)
    kernel = GRFKernel(GRID, num_walkers=2, p_halt=0.5, seed=0, coupling="iid")
    before = _snapshot(kernel)
    for strict in (True, False):
        with pytest.raises(error, match=message):
            kernel.load_state_dict(state, strict=strict)
        _assert_unchanged(kernel, before)
    assert (kernel.num_walkers, kernel.p_halt, kernel.seed, kernel.coupling.name) == (2, 0.5, 0, "iid")


def test_a_good_grf_state_loads_whole() -> None:
    state = _saved_grf()
    kernel = GRFKernel(GRID, num_walkers=2, p_halt=0.5, seed=0, coupling="iid")
    kernel.load_state_dict(state)
    _assert_unchanged(kernel, state)
    assert (kernel.num_walkers, kernel.p_halt, kernel.seed, kernel.coupling.name) == (6, 0.3, 7, "antithetic")


def test_a_grf_state_without_extra_state_is_refused_even_when_not_strict() -> None:
    state = _saved_grf()
    del state["_extra_state"]
    kernel = GRFKernel(OTHER, num_walkers=2, p_halt=0.5, seed=0, coupling="iid")  # another graph, same size
    before = _snapshot(kernel)
    for strict in (True, False):
        with pytest.raises(ValueError, match="_extra_state is missing .* features_columns.* cannot be checked"):
            kernel.load_state_dict(state, strict=strict)
        _assert_unchanged(kernel, before)
    # Inside a model the message names the kernel's prefix.
    model = gpytorch.kernels.ScaleKernel(GRFKernel(GRID, num_walkers=2, seed=0))
    saved = model.state_dict()
    del saved["base_kernel._extra_state"]
    with pytest.raises(ValueError, match="base_kernel._extra_state is missing"):
        model.load_state_dict(saved, strict=False)


def test_hyperparameters_alone_need_no_graph_identity() -> None:
    # Nothing sampled on a graph is loaded, so nothing needs checking: the transfer of
    # hyperparameters between graph kernels keeps working without the extra state.
    state = {key: value for key, value in ExactGraphKernel(GRID, Diffusion(2.5)).state_dict().items()
             if key != "_extra_state"}
    kernel = GRFKernel(OTHER, num_walkers=2, seed=0)
    kernel.load_state_dict(state, strict=False)
    assert float(kernel.kernel_family.gamma.detach()) == pytest.approx(2.5)


def _saved_rff() -> dict[str, Any]:
    kernel = CoupledRFFKernel(num_features=5, num_dims=3, coupling="iid", seed=0)
    kernel.resample(seed=4, num_features=9)
    return _snapshot(kernel)


@pytest.mark.parametrize("corrupt, error, message", [
    (_with_extra(num_features=-1), ValueError, "num_features"),
    (_with_extra(num_features=12), ValueError, "the noise holds 9 frequencies but num_features=12"),
    (_with_extra(coupling={"type": "no-such-coupling"}), ValueError, "unknown frequency coupling type"),
    (lambda state: state.update(noise_frequencies=state["noise_frequencies"][:, :2]), ValueError,
     r"shape \(9, 2\); expected \(M >= 9, 3\)"),
    (lambda state: state.update(noise_frequencies=state["noise_frequencies"] * float("nan")), ValueError,
     "NaN or infinite"),
    (lambda state: state.update(raw_lengthscale=torch.zeros(1, 3)), ValueError,
     r"raw_lengthscale has shape \(1, 3\)"),
])
def test_a_bad_random_feature_state_changes_nothing(corrupt, error, message: str) -> None:  # type: ignore[no-untyped-def]
    state = _saved_rff()
    corrupt(state)
    kernel = CoupledRFFKernel(num_features=2, num_dims=3, coupling="iid", seed=1)
    before, frequencies = _snapshot(kernel), kernel.frequencies.clone()
    with pytest.raises(error, match=message):
        kernel.load_state_dict(state)
    _assert_unchanged(kernel, before)
    assert kernel.num_features == 2 and torch.equal(kernel.frequencies, frequencies)


def test_a_random_feature_state_without_extra_state_must_fit_the_kernel() -> None:
    state = _saved_rff()
    del state["_extra_state"]
    kernel = CoupledRFFKernel(num_features=12, num_dims=3, coupling="iid", seed=1)
    before = _snapshot(kernel)
    with pytest.raises(ValueError, match="the noise holds 9 frequencies but num_features=12"):
        kernel.load_state_dict(state, strict=False)
    _assert_unchanged(kernel, before)
    fitting = CoupledRFFKernel(num_features=9, num_dims=3, coupling="iid", seed=1)
    fitting.load_state_dict(state, strict=False)
    assert torch.equal(fitting.noise_frequencies, state["noise_frequencies"])


def test_saved_states_of_the_current_format_load_into_fresh_kernels() -> None:
    """The files in tests/fixtures (written by make_fixtures.py) give their writer's kernel matrices."""
    from tests.fixtures import make_fixtures as fixtures

    cases = [(fixtures.GRF_STATE, fixtures.GRF_MATRIX, lambda: fixtures.grf_kernel(seed=1), fixtures.GRF_INPUTS),
             (fixtures.RFF_STATE, fixtures.RFF_MATRIX, lambda: fixtures.rff_kernel(seed=1), fixtures.RFF_INPUTS)]
    for path, matrix, fresh, inputs in cases:
        expected, loaded = torch.load(matrix, weights_only=True), fresh().double()
        assert not torch.allclose(fixtures.kernel_matrix(loaded, inputs), expected)
        loaded.load_state_dict(torch.load(path, weights_only=True))
        torch.testing.assert_close(fixtures.kernel_matrix(loaded, inputs), expected, rtol=1e-12, atol=1e-12)
