"""The recommended-settings context manager restores gpytorch's settings."""

from __future__ import annotations

import gpytorch
import pytest
import torch

from gp_couple.settings import GRFGPSettings, grf_gp_settings, preconditioner_pivot_reuse

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
    "preconditioner_pivot_tolerance": preconditioner_pivot_reuse,
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
    ({"max_cg_iterations": 50}, ValueError),  # below the log-determinant's quadrature steps
    ({"num_trace_samples": 0}, ValueError),
])
def test_bad_settings_are_rejected(overrides, error):
    with pytest.raises(error):
        with grf_gp_settings(**overrides):
            pass



def _high_snr_loss(**settings) -> tuple[float, float]:
    r"""Negative log-likelihood per point of an exact GP on a prior draw with signal-to-noise ratio 10^5,
    and the standard error of its stochastic estimate from 32 Gaussian probes (no preconditioner below
    2,000 points): :math:`\sqrt{2/32}\,\|\log \mathbf C\|_F / (2n)`."""
    import numpy as np

    from gp_couple import Diffusion, ExactGraphKernel, GraphGP
    from gp_couple.exact import exact_kernel_matrix
    from gp_couple.graphs import grid_graph

    graph = grid_graph(16, 16)
    generator = torch.Generator().manual_seed(0)
    prior = exact_kernel_matrix(Diffusion(5.0), graph)
    root = torch.linalg.cholesky(prior + 1e-9 * torch.eye(graph.num_nodes, dtype=torch.float64))
    outputscale, noise = 30.0, 3e-4
    targets = (outputscale ** 0.5 * root @ torch.randn(graph.num_nodes, generator=generator, dtype=torch.float64)
               + noise ** 0.5 * torch.randn(graph.num_nodes, generator=generator, dtype=torch.float64))
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    kernel = gpytorch.kernels.ScaleKernel(ExactGraphKernel(graph, Diffusion(5.0)))
    model = GraphGP(np.arange(graph.num_nodes), targets, likelihood, kernel).double()
    kernel.outputscale, likelihood.noise = outputscale, noise
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    torch.manual_seed(1)  # the same probe vectors for every call
    with torch.no_grad(), grf_gp_settings(**settings):
        loss = -float(mll(model(*model.train_inputs), model.train_targets))
    log_eigenvalues = torch.log(torch.linalg.eigvalsh(outputscale * prior).clamp_min(0) + noise).detach()
    standard_error = float((2 / 32) ** 0.5 * log_eigenvalues.norm() / (2 * graph.num_nodes))
    return loss, standard_error


def test_the_cg_objective_converges_its_log_determinant_quadrature_at_high_signal_to_noise():
    """The CG/Lanczos value L-BFGS reads equals the full quadrature on the same probes (256 nodes).

    On the same probe vectors, stochastic Lanczos quadrature with as many nodes as rows is
    exact for those probes, so the difference is the truncation error alone, deterministic.
    gpytorch's 20 nodes leave an error that reorders hyperparameters on real problems.
    """
    full, standard_error = _high_snr_loss(max_cholesky_size=0, max_lanczos_quadrature_iterations=256)
    assert abs(_high_snr_loss(max_cholesky_size=0)[0] - full) < 1e-4
    assert abs(_high_snr_loss(max_cholesky_size=0, max_lanczos_quadrature_iterations=20)[0] - full) > 1e-2
    # What remains against the Cholesky value is the probes' noise, within 3 standard errors.
    assert abs(_high_snr_loss()[0] - full) < 3 * standard_error


# ------------------------------------------------------------------ thread pools
def _pools() -> tuple:
    import numba
    import torch
    from threadpoolctl import threadpool_info

    return (torch.get_num_threads(), numba.get_num_threads(),
            tuple(sorted((info["internal_api"], info["num_threads"]) for info in threadpool_info())))


def test_threads_bounds_every_pool_and_restores_them():
    import numba
    import torch
    from threadpoolctl import threadpool_info

    from gp_couple.settings import threads

    before = _pools()
    with threads(1) as count:
        assert count == 1 and torch.get_num_threads() == 1 and numba.get_num_threads() == 1
        assert all(info["num_threads"] == 1 for info in threadpool_info())
        with threads(2):  # nesting restores the outer limit
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
    assert _pools() == before
    with pytest.raises(RuntimeError, match="boom"):
        with threads(1):
            raise RuntimeError("boom")
    assert _pools() == before
    with threads(None) as count:  # no change
        assert _pools() == before and count == before[0]


@pytest.mark.parametrize("value, error", [(0, ValueError), (-2, ValueError), (1.5, TypeError), (True, TypeError),
                                          ("2", TypeError)])
def test_threads_validates_its_argument(value, error):
    from gp_couple.settings import threads

    with pytest.raises(error, match="num_threads"):
        with threads(value):
            pass


def test_walks_do_not_depend_on_the_thread_count():
    from gp_couple.features import GraphRandomFeatures
    from gp_couple.graphs import grid_graph
    from gp_couple.settings import threads

    graph = grid_graph(6, 6)
    with threads(1):
        single = GraphRandomFeatures.sample(graph, 8, 0.3, seed=4).tensors()
    with threads(2):
        double = GraphRandomFeatures.sample(graph, 8, 0.3, seed=4).tensors()
    assert all(torch.equal(single[name], double[name]) for name in single)


def test_threads_beyond_the_cpus_are_capped_with_a_warning():
    from gp_couple.settings import available_cpus, threads

    before = torch.get_num_threads()
    with pytest.warns(RuntimeWarning, match=r"num_threads=100000 is more than the \d+ CPUs .* using"):
        with threads(100_000) as count:
            assert count == available_cpus() == torch.get_num_threads()
    assert torch.get_num_threads() == before


def _subnormal_survives() -> bool:
    return bool(torch.tensor(torch.finfo(torch.float32).tiny) / 2 != 0)


def test_flush_denormals_flushes_inside_restores_and_nests():
    from gp_couple.settings import flush_denormals

    assert _subnormal_survives()  # the process default: IEEE subnormals
    with flush_denormals() as flushing:
        assert _subnormal_survives() is not flushing
        with flush_denormals(False) as inner:
            assert inner is False and _subnormal_survives()
        assert _subnormal_survives() is not flushing
        with pytest.raises(RuntimeError), flush_denormals():
            raise RuntimeError("escapes")
        assert _subnormal_survives() is not flushing
    assert _subnormal_survives()
    with grf_gp_settings():
        assert _subnormal_survives() is not flushing
    assert _subnormal_survives()


def test_fit_gp_and_predict_flush_subnormals_and_leave_the_thread_as_they_found_it():
    from gp_couple import ExactGraphKernel, GraphGP, fit_gp, predict
    from gp_couple.graphs import grid_graph
    from gp_couple.kernel_families import Diffusion

    graph = grid_graph(4, 4)
    nodes = torch.arange(0, 16, 2)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(nodes, torch.sin(nodes.double()).float(), likelihood,
                    gpytorch.kernels.ScaleKernel(ExactGraphKernel(graph, Diffusion(1.0))))
    seen = []
    fit_gp(model, likelihood, iterations=2, callback=lambda step, loss: seen.append(_subnormal_survives()))
    assert seen and not any(seen) and _subnormal_survives()
    predict(model, likelihood, [1, 3])
    assert _subnormal_survives()


def test_kept_chebyshev_terms_bounds_the_kept_blocks_and_restores_on_exit():
    """Within the bound the training block's terms are kept; under a smaller bound (or 0) nothing
    is kept and the block is still exact; the value is restored on exit and checked on entry."""
    from gp_couple.exact import exact_kernel_matrix
    from gp_couple.graphs import grid_graph
    from gp_couple.kernel_families import Diffusion
    from gp_couple.operators import ChebyshevBasis, ChebyshevKernelLinearOperator, chebyshev_expansion
    from gp_couple.settings import kept_chebyshev_terms

    graph, nodes = grid_graph(5, 6), torch.tensor([0, 4, 9, 17, 22, 29])
    family = Diffusion(1.3).double()
    coefficients = chebyshev_expansion(family, 1e-12).coefficients.detach()
    exact = exact_kernel_matrix(family, graph).detach()[nodes][:, nodes]
    default = kept_chebyshev_terms.value()
    assert default == 1 << 26
    for bound, kept in [(default, True), (coefficients.numel() * 36 - 1, False), (0, False)]:
        basis = ChebyshevBasis(graph.normalized_adjacency())
        with kept_chebyshev_terms(bound):
            block = ChebyshevKernelLinearOperator(coefficients, basis=basis, row_nodes=nodes,
                                                  column_nodes=nodes).to_dense()
        torch.testing.assert_close(block, exact, rtol=0, atol=1e-11)
        assert (basis.kept_entries > 0) == kept
        assert kept_chebyshev_terms.value() == default
    for value, error in [(-1, ValueError), (2.5, TypeError), (True, TypeError)]:
        with pytest.raises(error, match="entries"):
            kept_chebyshev_terms(value)
