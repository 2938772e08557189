"""The recommended-settings context manager restores gpytorch's settings."""

from __future__ import annotations

import gpytorch
import pytest

from gp_couple.settings import GRFGPSettings, grf_gp_settings

SETTINGS = {
    "max_cholesky_size": gpytorch.settings.max_cholesky_size,
    "cg_tolerance": gpytorch.settings.cg_tolerance,
    "eval_cg_tolerance": gpytorch.settings.eval_cg_tolerance,
    "max_cg_iterations": gpytorch.settings.max_cg_iterations,
    "max_preconditioner_size": gpytorch.settings.max_preconditioner_size,
    "min_preconditioning_size": gpytorch.settings.min_preconditioning_size,
    "num_trace_samples": gpytorch.settings.num_trace_samples,
    "max_lanczos_quadrature_iterations": gpytorch.settings.max_lanczos_quadrature_iterations,
    "max_root_decomposition_size": gpytorch.settings.max_root_decomposition_size,
}


def current() -> dict:
    return {name: setting.value() for name, setting in SETTINGS.items()}


def test_settings_apply_inside_and_restore_on_exit():
    before = current()
    with grf_gp_settings(max_cholesky_size=0) as applied:
        inside = current()
    assert current() == before
    assert inside == applied.as_dict()
    assert inside["max_cholesky_size"] == 0
    defaults = GRFGPSettings().as_dict()
    assert {k: v for k, v in inside.items() if k != "max_cholesky_size"} == \
        {k: v for k, v in defaults.items() if k != "max_cholesky_size"}


def test_settings_restore_after_an_exception_and_nest():
    before = current()
    with pytest.raises(RuntimeError):
        with grf_gp_settings(cg_tolerance=0.5):
            with grf_gp_settings(num_trace_samples=3):
                assert gpytorch.settings.cg_tolerance.value() == GRFGPSettings().cg_tolerance
                assert gpytorch.settings.num_trace_samples.value() == 3
            assert gpytorch.settings.num_trace_samples.value() == GRFGPSettings().num_trace_samples
            raise RuntimeError("boom")
    assert current() == before


@pytest.mark.parametrize("overrides, error", [
    ({"max_cholesky_sise": 3}, TypeError),
    ({"max_cholesky_size": -1}, ValueError),
    ({"max_cholesky_size": 1.5}, TypeError),
    ({"cg_tolerance": 0.0}, ValueError),
    ({"cg_tolerance": "tight"}, TypeError),
    ({"num_trace_samples": 0}, ValueError),
])
def test_bad_settings_are_rejected(overrides, error):
    with pytest.raises(error):
        with grf_gp_settings(**overrides):
            pass
