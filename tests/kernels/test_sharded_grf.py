"""ShardedGRFKernel in one process: the same Gram matrix and hyperparameter gradients as GRFKernel."""

from __future__ import annotations

import numpy as np
import torch

from gp_couple import Diffusion, GRFKernel
from gp_couple.graphs import grid_graph
from gp_couple.kernels.sharded_grf import ShardedGRFKernel


def test_one_process_sharded_gram_and_its_gradients_equal_the_grf_kernels() -> None:
    graph = grid_graph(9, 9)
    train = np.arange(0, 81, 3)
    config = {"num_walkers": 16, "p_halt": 0.2, "seed": 5}
    sharded = ShardedGRFKernel(graph, train, kernel_family=Diffusion(1.3), **config).double()
    plain = GRFKernel(graph, kernel_family=Diffusion(1.3), nodes=train, schedule=None, **config).double()
    inputs = torch.as_tensor(train, dtype=torch.float64).unsqueeze(-1)
    generator = torch.Generator().manual_seed(0)
    left = torch.randn(train.size, 3, dtype=torch.float64, generator=generator)
    right = torch.randn(train.size, 3, dtype=torch.float64, generator=generator)
    gradients = []
    for kernel in (sharded, plain):
        gram = kernel(inputs, inputs).evaluate_kernel()
        torch.testing.assert_close(gram @ right, plain(inputs, inputs).to_dense() @ right, rtol=1e-12, atol=1e-12)
        # d(left^T K right)/d(gamma) through the operator's _bilinear_derivative.
        kernel.zero_grad()
        (left * (gram @ right)).sum().backward()
        gradients.append(kernel.kernel_family.raw_gamma.grad.clone())
    torch.testing.assert_close(gradients[0], gradients[1], rtol=1e-10, atol=1e-12)
