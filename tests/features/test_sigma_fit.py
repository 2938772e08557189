"""Tests for fitting sigma-couplings from simulated walks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gp_couple.couplings import SigmaCoupling
from gp_couple.features.sigma_fit import fit_pagerank_sigma_coupling, fit_sigma_coupling
from gp_couple.graphs import grid_graph
from gp_couple.kernel_families import Diffusion, RegularisedLaplacian


def test_fit_finds_the_assignment_minimum() -> None:
    graph = grid_graph(4, 4)
    fitted = fit_sigma_coupling(RegularisedLaplacian(1.0, 2), 0.4, 6, graph=graph, samples_per_bin=20, seed=3)
    assert sorted(fitted.permutation.tolist()) == list(range(6))
    # The assignment optimum is no worse than pairing every bin with itself.
    assert fitted.metadata["cost"] <= fitted.metadata["identity_cost"]
    again = fit_sigma_coupling(RegularisedLaplacian(1.0, 2), 0.4, 6, graph=graph, samples_per_bin=20, seed=3)
    np.testing.assert_array_equal(fitted.permutation, again.permutation)


def test_fitted_coupling_is_antitone_for_the_regularised_laplacian() -> None:
    # Short walks pair with long ones (the insets of the paper's Figure 3, fig:permuton_grf).
    fitted = fit_sigma_coupling(RegularisedLaplacian(1.0, 2), 0.5, 20, samples_per_bin=30, seed=0)
    correlation = np.corrcoef(np.arange(20), fitted.permutation)[0, 1]
    assert correlation < -0.5
    assert fitted.p_halt == 0.5 and fitted.metadata["objective"] == "grf"


def test_pagerank_fit_and_metadata() -> None:
    fitted = fit_pagerank_sigma_coupling(0.5, 6, samples_per_bin=200, seed=0)
    assert isinstance(fitted, SigmaCoupling) and fitted.order == 6
    assert fitted.metadata["cost"] <= fitted.metadata["identity_cost"]
    assert fitted.metadata["objective"] == "pagerank"


def test_errors() -> None:
    with pytest.raises(ValueError, match="order"):
        fit_sigma_coupling(Diffusion(), 0.4, 1)
    with pytest.raises(TypeError, match="samples_per_bin"):
        fit_sigma_coupling(Diffusion(), 0.4, 4, samples_per_bin=2.5)
    with pytest.raises(TypeError, match="KernelFamily"):
        fit_sigma_coupling("diffusion", 0.4)
    with pytest.raises(ValueError, match="unbatched"):
        fit_sigma_coupling(Diffusion(batch_shape=torch.Size([2])), 0.4)
    with pytest.raises(TypeError, match="Graph"):
        fit_pagerank_sigma_coupling(0.4, 4, graph=np.eye(3))


def test_sigma_path_is_bit_identical_under_different_thread_counts():
    """The sigma fit and the walks drawn with it depend on the seed only, not on the thread pools."""
    from gp_couple import GRFKernel
    from gp_couple.settings import threads

    graph = grid_graph(8, 8)
    runs = []
    for count in (1, 2, 1):
        with threads(count):
            sigma = fit_sigma_coupling(Diffusion(1.7), 0.2, 20, samples_per_bin=20, seed=3)
            kernel = GRFKernel(graph, num_walkers=8, p_halt=0.2, coupling=sigma, kernel_family=Diffusion(1.7),
                               seed=4)
        runs.append((sigma.to_dict(), {name: buffer.clone() for name, buffer in kernel.named_buffers()}))
    for description, buffers in runs[1:]:
        assert description == runs[0][0]
        assert all(torch.equal(buffer, runs[0][1][name]) for name, buffer in buffers.items())
