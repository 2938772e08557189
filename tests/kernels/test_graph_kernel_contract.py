"""gpytorch's kernel contract (``BaseKernelTestCase``) for the graph kernels.

Inputs are node indices ``(..., n, 1)``; the base tests' data are replaced by random node
indices of the same batch shapes (different nodes in every batch entry).
"""

from __future__ import annotations

import unittest

import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase

from gp_couple.graphs import grid_graph
from gp_couple.kernels import ExactGraphKernel, GRFKernel
from gp_couple.operators import GRFGramLinearOperator, SparseFeatureLinearOperator

GRAPH = grid_graph(8, 8)


class _GraphKernelContract(BaseKernelTestCase):
    seed = 0

    def create_kernel_no_ard(self, **kwargs):  # type: ignore[no-untyped-def]
        return GRFKernel(GRAPH, num_walkers=4, p_halt=0.5, seed=0, **kwargs)

    @staticmethod
    def _nodes(*shape: int) -> torch.Tensor:
        return torch.randint(0, GRAPH.num_nodes, (*shape, 1)).to(torch.get_default_dtype())

    def create_data_no_batch(self) -> torch.Tensor:
        return self._nodes(50)

    def create_data_single_batch(self) -> torch.Tensor:
        return self._nodes(2, 3)

    def create_data_double_batch(self) -> torch.Tensor:
        return self._nodes(3, 2, 50)

    # The base active_dims tests select 4 or 6 columns of 10-column data; a node kernel
    # takes exactly one column, so the same check selects one column of several.
    def _check_active_dims(self, active_dims: list[int]) -> None:
        x = torch.cat([self._nodes(20) for _ in range(4)], dim=-1)
        covar = self.create_kernel_no_ard(active_dims=active_dims)(x).to_dense()
        expected = self.create_kernel_no_ard()(x[:, active_dims]).to_dense()
        self.assertAllClose(covar, expected, rtol=1e-5, atol=1e-6)

    def test_active_dims_list(self) -> None:
        self._check_active_dims([2])

    def test_active_dims_range(self) -> None:
        self._check_active_dims(list(range(3, 4)))


class TestGRFKernelContract(_GraphKernelContract, unittest.TestCase):
    def test_different_nodes_per_batch_entry_stay_sparse(self) -> None:
        kernel = self.create_kernel_no_ard()
        covar = kernel(self.create_data_double_batch()).evaluate_kernel()
        self.assertIsInstance(covar, GRFGramLinearOperator)
        self.assertIsInstance(covar.left, SparseFeatureLinearOperator)
        self.assertEqual(covar.shape, torch.Size((3, 2, 50, 50)))

    def test_gradient_flows_through_batched_nodes(self) -> None:
        kernel = self.create_kernel_no_ard(batch_shape=torch.Size([2]))
        kernel.kernel_family.gamma = torch.tensor([[0.7], [1.3]])
        x = self.create_data_single_batch()
        kernel(x).to_dense().sum().backward()
        gradient = kernel.kernel_family.raw_gamma.grad
        self.assertEqual(gradient.shape, torch.Size((2, 1)))
        self.assertTrue(bool(torch.all(gradient != 0)))


class TestExactGraphKernelContract(_GraphKernelContract, unittest.TestCase):
    def create_kernel_no_ard(self, **kwargs):  # type: ignore[no-untyped-def]
        return ExactGraphKernel(GRAPH, **kwargs)
