"""Tests for exact graph-kernel references."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla
import torch

from gp_couple import exact
from gp_couple.exact import exact_kernel_columns, exact_kernel_matrix
from gp_couple.graphs import grid_graph
from gp_couple.kernel_families import (
    Diffusion,
    InverseCosine,
    PowerSeries,
    PStepRandomWalk,
    RegularisedLaplacian,
)
from tests.test_graphs import two_components_and_isolated

SERIES = [Diffusion(0.9), RegularisedLaplacian(1.0, 2), PStepRandomWalk(2.5, 3), InverseCosine(),
          PowerSeries([1.0, 0.4, 0.1])]


def test_dense_references_match_matrix_functions() -> None:
    graph = two_components_and_isolated()
    w = graph.normalized_adjacency().toarray()
    laplacian = np.eye(7) - w
    diffusion = Diffusion().double()
    diffusion.gamma = 0.9
    np.testing.assert_allclose(exact_kernel_matrix(diffusion, graph).detach().numpy(),
                               sla.expm(-0.81 * laplacian), atol=1e-12)
    regularised = RegularisedLaplacian(degree=2).double()
    regularised.sigma = 1.0
    np.testing.assert_allclose(exact_kernel_matrix(regularised, graph).detach().numpy(),
                               np.linalg.matrix_power(np.linalg.inv(np.eye(7) + laplacian), 2), atol=1e-12)
    np.testing.assert_allclose(exact_kernel_matrix(InverseCosine().double(), graph).detach().numpy(),
                               sla.cosm(np.pi / 4 * laplacian), atol=1e-12)


@pytest.mark.parametrize("family", SERIES, ids=lambda s: type(s).__name__)
def test_columns_match_dense(family) -> None:
    graph = grid_graph(6, 5)
    dense = exact_kernel_matrix(family, graph).detach().numpy()
    columns = np.array([0, 7, 29])
    np.testing.assert_allclose(exact_kernel_columns(family, graph, columns), dense[:, columns],
                               atol=1e-6, rtol=1e-6)


def test_structure_of_disconnected_graphs() -> None:
    graph = two_components_and_isolated()
    kernel = exact_kernel_matrix(Diffusion(1.0).double(), graph).detach().numpy()
    assert np.all(kernel[:3, 3:] == pytest.approx(0.0, abs=1e-14))
    assert kernel[6, 6] == pytest.approx(np.exp(-1.0))
    assert np.linalg.eigvalsh(kernel).min() > 0


def test_dense_reference_is_differentiable_and_batched() -> None:
    graph = grid_graph(3, 3)
    family = Diffusion(batch_shape=torch.Size([2])).double()
    kernel = exact_kernel_matrix(family, graph)
    assert kernel.shape == (2, 9, 9)
    kernel.sum().backward()
    assert family.raw_gamma.grad is not None and torch.all(family.raw_gamma.grad != 0)


def test_errors(monkeypatch) -> None:
    graph = grid_graph(3, 3)
    with pytest.raises(TypeError, match="Graph"):
        exact_kernel_matrix(Diffusion(), np.eye(3))
    with pytest.raises(TypeError, match="KernelFamily"):
        exact_kernel_matrix("diffusion", graph)
    with pytest.raises(ValueError, match=r"\[0, 9\)"):
        exact_kernel_columns(Diffusion(), graph, np.array([9]))
    with pytest.raises(TypeError, match="integer"):
        exact_kernel_columns(Diffusion(), graph, np.array([0.5]))
    with pytest.raises(ValueError, match="unbatched"):
        exact_kernel_columns(Diffusion(batch_shape=torch.Size([2])), graph, np.array([0]))
    with pytest.raises(ValueError, match="integer degree"):
        exact_kernel_columns(RegularisedLaplacian(1.0, 1.5), graph, np.array([0]))
    monkeypatch.setattr(exact, "DENSE_LIMIT", 4)
    with pytest.raises(ValueError, match="force=True"):
        exact_kernel_matrix(Diffusion(), graph)
    assert exact_kernel_matrix(Diffusion(), graph, force=True).shape == (9, 9)
