r"""Sparse-spectrum GPs (coupled random-feature kernels) with their data sharded across processes.

A GP whose kernel is :math:`s\,\phi(\mathbf x)^\top\phi(\mathbf x')` with :math:`F` feature
columns (:class:`~gp_couple.kernels.random_features.CoupledRFFKernel`,
:class:`~gp_couple.kernels.random_features.CoupledRLFKernel`; paper, Section 3 "Random
Fourier and Laplace features" [sec:rffs]) needs the data only through

.. math::

    \mathbf G = \Phi^\top\Phi, \qquad \mathbf b = \Phi^\top\mathbf y, \qquad
    \mathbf y^\top\mathbf y, \qquad N,

sums over the data points. With :math:`\mathbf M = \mathbf G + (\sigma_n^2/s)\mathbf I`,
the Woodbury identity and the matrix determinant lemma give the exact marginal likelihood
from :math:`F \times F` quantities,

.. math::

    \mathbf y^\top \mathbf A^{-1}\mathbf y = \sigma_n^{-2}\big(\mathbf y^\top\mathbf y -
    \mathbf b^\top\mathbf M^{-1}\mathbf b\big), \qquad
    \log\det\mathbf A = (N - F)\log\sigma_n^2 + F\log s + \log\det\mathbf M,

with :math:`\mathbf A = s\,\Phi\Phi^\top + \sigma_n^2\mathbf I`, and the posterior
:math:`\mu_* = \phi_*^\top\mathbf M^{-1}\mathbf b`, :math:`\sigma^2_* =
\sigma_n^2\,\phi_*^\top\mathbf M^{-1}\phi_*`. So each process holds its shard of the data,
the sums are all-reduced (:math:`F^2 + F + 2` numbers per evaluation), and the
lengthscale gradients, which each process computes from its own points, are summed; the
result is the single-process one up to the order of the sums. Predictions are made
where the test points are, from the same reduced sums.
"""

from __future__ import annotations

import math
from typing import Any

import gpytorch
import torch
from torch import Tensor

from ._checks import check_int
from ._random import SeedLike
from .distributed import Collective
from .kernels.random_features import CoupledRandomFeatureKernel
from .optimize import Convergence, TrainingHistory, minimize

__all__ = ["ShardedSparseSpectrumGP", "shard_rows"]


#: Data points whose features are formed at once (bounds the memory: ``chunk x F`` numbers).
DEFAULT_CHUNK_SIZE = 65_536


class _DataSums(torch.autograd.Function):
    r""":math:`\Phi^\top\Phi` (flattened) and :math:`\Phi^\top\mathbf y` summed over the data, chunk by chunk.

    The forward pass never holds more than one chunk of features, and neither does the
    backward pass: it forms each chunk's features again, with gradients, and
    differentiates the chunk's contribution against the incoming gradient. The forward
    result is this process's part (the caller sums it over the processes); the backward
    pass returns the kernel's gradient summed over the processes, which all receive the
    same incoming gradient.
    """

    @staticmethod
    def forward(ctx: Any, model: ShardedSparseSpectrumGP, chunk_size: int, *parameters: Tensor) -> Tensor:
        ctx.model, ctx.chunk_size = model, chunk_size
        ctx.save_for_backward(*parameters)
        total = None
        for inputs, targets in model._chunks(chunk_size):
            part = _chunk_sums(model.kernel.features(inputs), targets)
            total = part if total is None else total + part
        return total

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        parameters = ctx.saved_tensors
        grads = [torch.zeros_like(parameter) for parameter in parameters]
        with torch.enable_grad():
            for inputs, targets in ctx.model._chunks(ctx.chunk_size):
                part = _chunk_sums(ctx.model.kernel.features(inputs), targets)
                for total, value in zip(grads, torch.autograd.grad((part * grad).sum(), ctx.model._kernel_leaves(),
                                                                   allow_unused=True)):
                    if value is not None:
                        total += value
        # Every process got the same incoming gradient and differentiated its own data:
        # the kernel's gradient is the sum over the processes.
        summed = ctx.model.collective.all_reduce(torch.cat([g.reshape(-1) for g in grads])) if grads else None
        if summed is not None:
            grads = list(torch.split(summed, [g.numel() for g in grads]))
            grads = [g.reshape(parameter.shape) for g, parameter in zip(grads, parameters)]
        return (None, None, *grads)


def _chunk_sums(features: Tensor, targets: Tensor) -> Tensor:
    targets = targets.to(features.dtype)
    return torch.cat([(features.mT @ features).reshape(-1), features.mT @ targets])


class ShardedSparseSpectrumGP(torch.nn.Module):
    r"""Exact GP regression with a coupled random-feature kernel, each process holding a shard of the data.

    :param kernel: The random-feature kernel (the same frequencies on every process: build
        it with the same ``seed``).
    :param train_inputs: This process's training inputs ``(n_r, D)`` (its shard).
    :param train_targets: This process's targets ``(n_r,)``.
    :param collective: The processes (default: the default process group, or this process alone).
    :param chunk_size: Data points whose features are formed at once.
    :raises TypeError: If ``kernel`` is not a coupled random-feature kernel.
    :raises ValueError: If the shapes disagree, a target is not finite, or the frequencies
        differ between processes.
    """

    def __init__(self, kernel: CoupledRandomFeatureKernel, train_inputs: Tensor, train_targets: Tensor, *,
                 collective: Collective | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:
        super().__init__()
        self.chunk_size = check_int("chunk_size", chunk_size, 1)
        if not isinstance(kernel, CoupledRandomFeatureKernel):
            raise TypeError(f"kernel must be a CoupledRFFKernel or CoupledRLFKernel, got {type(kernel).__name__}")
        if not isinstance(train_inputs, Tensor) or not isinstance(train_targets, Tensor):
            raise TypeError("train_inputs and train_targets must be tensors")
        if train_targets.ndim != 1 or train_inputs.ndim != 2 or train_inputs.shape[0] != train_targets.shape[0]:
            raise ValueError(f"train_inputs must be (n, D) and train_targets (n,), got {tuple(train_inputs.shape)} "
                             f"and {tuple(train_targets.shape)}")
        if not bool(torch.isfinite(train_targets).all()):
            raise ValueError("train_targets contains NaN or infinite values")
        self.collective = Collective() if collective is None else collective
        self.collective.check_same("kernel frequencies", kernel.frequencies.detach().cpu())
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel)
        self.likelihood = gpytorch.likelihoods.GaussianLikelihood()
        self.register_buffer("train_inputs", train_inputs)
        self.register_buffer("train_targets", train_targets)

    @property
    def kernel(self) -> CoupledRandomFeatureKernel:
        """The random-feature kernel."""
        return self.covar_module.base_kernel

    def _kernel_leaves(self) -> list[Tensor]:
        return list(self.kernel.parameters())

    def _chunks(self, chunk_size: int) -> Any:
        for start in range(0, self.train_targets.numel(), chunk_size):
            yield self.train_inputs[start:start + chunk_size], self.train_targets[start:start + chunk_size]

    def _statistics(self) -> tuple[Tensor, Tensor, Tensor, float]:
        r""":math:`\mathbf G, \mathbf b, \mathbf y^\top\mathbf y, N`, summed over the processes."""
        local = _DataSums.apply(self, self.chunk_size, *self._kernel_leaves())
        targets = self.train_targets.to(local.dtype)
        count = local.new_tensor([targets.numel()])
        # The other processes' sums are constants here; _DataSums sums the kernel's gradient.
        others = self.collective.all_reduce(torch.cat([local.detach(), (targets @ targets).reshape(1), count]))
        size = self.kernel.num_feature_columns
        sums = local + (others[:-2] - local.detach())
        return sums[:size * size].reshape(size, size), sums[size * size:], others[-2], float(others[-1])

    def _weights_system(self) -> tuple[Tensor, Tensor, Tensor, Tensor, float]:
        gram, projected, squares, count = self._statistics()
        scale, noise = self.covar_module.outputscale, self.likelihood.noise.reshape(())
        system = gram + (noise / scale) * torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
        return torch.linalg.cholesky(system), projected, squares, noise, count

    def loss(self) -> Tensor:
        """The negative exact marginal log-likelihood per data point (gpytorch's normalisation)."""
        factor, projected, squares, noise, count = self._weights_system()
        scale = self.covar_module.outputscale
        size = factor.shape[-1]
        solved = torch.linalg.solve_triangular(factor, projected.unsqueeze(-1), upper=False).squeeze(-1)
        quadratic = (squares - solved @ solved) / noise
        logdet = (count - size) * torch.log(noise) + size * torch.log(scale) \
            + 2 * torch.log(torch.diagonal(factor)).sum()
        return 0.5 * (quadratic + logdet + count * math.log(2 * math.pi)) / count

    def fit(self, *, iterations: int = 200, optimizer: str = "lbfgs", lr: float = 0.05,
            convergence: Convergence | None = None, seed: SeedLike = 0) -> TrainingHistory:
        """Train the lengthscales, output scale and noise (:func:`gp_couple.optimize.minimize`).

        Every process must call it; they end with the same parameters.

        :param iterations: Most iterations.
        :param optimizer: ``"lbfgs"`` (the objective is deterministic) or ``"adam"``.
        :param lr: Adam learning rate.
        :param convergence: Stopping rule (default :class:`gp_couple.optimize.Convergence`).
        :param seed: Seed of the loop (the objective itself draws nothing).
        :return: The training history.
        """
        iterations = check_int("iterations", iterations, 0)
        num_data = int(self.collective.all_reduce(self.train_targets.new_tensor([self.train_targets.numel()])).item())
        return minimize(self.loss, dict(self.named_parameters()), iterations=iterations,
                        lr=lr, optimizer=optimizer, convergence=Convergence() if convergence is None else convergence,
                        seed=seed, description="sparse-spectrum GP", num_data=num_data)

    def predict(self, inputs: Tensor, *, noise: bool = True) -> tuple[Tensor, Tensor]:
        """Posterior means and variances at ``inputs`` (this process's test points; no collectives
        beyond the one reduction of the training sums).

        :param inputs: Test inputs ``(t, D)``.
        :param noise: Variances of noisy observations (``True``) or of the latent function.
        :return: ``(mean, variance)``, each ``(t,)``.
        """
        with torch.no_grad():
            factor, projected, _, noise_variance, _ = self._weights_system()
            features = self.kernel.features(inputs)
            weights = torch.cholesky_solve(projected.unsqueeze(-1), factor).squeeze(-1)
            solved = torch.linalg.solve_triangular(factor, features.mT, upper=False)
            variance = noise_variance * solved.square().sum(0) + (noise_variance if noise else 0.0)
            return features @ weights, variance

    def extra_repr(self) -> str:
        return f"shard={self.train_targets.numel()} points, processes={self.collective.size}"


def shard_rows(collective: Collective, *tensors: Any) -> tuple[Any, ...]:
    """This process's contiguous block of rows of each of ``tensors`` (same first dimension)."""
    block = collective.shard(len(tensors[0]))
    return tuple(tensor[block] for tensor in tensors)
