r"""Where the evaluators read a Gram matrix from: arrays, linear operators, kernels and trained models.

The evaluators compare Gram matrices and posteriors wherever they live, without asking
the caller to densify them:

* a dense array, tensor or scipy sparse matrix over all points;
* a :class:`~linear_operator.operators.LinearOperator` over all points (e.g. the
  :class:`~gp_couple.operators.GRFGramLinearOperator` a GRF kernel returns): only the
  requested blocks are made dense;
* a gpytorch :class:`~gpytorch.kernels.Kernel` on node indices (e.g.
  ``ScaleKernel(GRFKernel(graph))``): evaluated at the requested nodes, so a GRF kernel's
  own features (one feature build, the one the model trains and predicts with) give the
  estimate;
* a trained :class:`gpytorch.models.ExactGP` (e.g. :class:`gp_couple.models.GraphGP`):
  its covariance module.

Every block comes back as a float64 numpy array on the CPU; kernels are evaluated in
their own dtype and on their own device (call ``model.double()`` for float64 entries).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import gpytorch
import numpy as np
import scipy.sparse as sp
import torch
from linear_operator.operators import LinearOperator
from torch import Tensor

from ..kernels import GraphNodeKernel
from ..models import module_device
from ._arrays import as_float64, check_finite

__all__ = ["GramSource", "gram_source", "is_lazy_source", "row_chunks"]

#: Numbers in one dense block read from a lazy source (bounds the memory of row chunks).
BLOCK_ENTRIES = 1 << 22


def is_lazy_source(value: Any) -> bool:
    """Whether ``value`` is a linear operator, a kernel or a model (read block by block)."""
    return isinstance(value, (LinearOperator, gpytorch.kernels.Kernel, gpytorch.models.ExactGP))


class GramSource(ABC):
    """Dense float64 blocks ``K[rows][:, cols]`` of a Gram matrix, wherever it lives.

    Build with :func:`gram_source`.

    :ivar size: Number of points :math:`N` (``None`` for a kernel that does not know it).
    :ivar name: The argument it was given as, named when a block holds NaN or infinities.
    """

    name = "gram"

    def __init__(self, size: int | None) -> None:
        self.size = size

    @abstractmethod
    def block(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """The dense block at integer indices ``rows`` x ``cols`` (int64 arrays), float64."""

    def diagonal(self, nodes: np.ndarray) -> np.ndarray:
        """The diagonal entries :math:`K_{ii}` at ``nodes``, float64."""
        return np.diag(self.block(nodes, nodes)).copy()


class _DenseSource(GramSource):
    def __init__(self, matrix: np.ndarray) -> None:
        super().__init__(matrix.shape[0])
        self.matrix = matrix

    def block(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return self.matrix[np.ix_(rows, cols)]

    def diagonal(self, nodes: np.ndarray) -> np.ndarray:
        return self.matrix[nodes, nodes]


class _SparseSource(GramSource):
    def __init__(self, matrix: sp.spmatrix, name: str) -> None:
        super().__init__(matrix.shape[0])
        self.name = name
        self.matrix = sp.csr_matrix(matrix, dtype=np.float64)
        check_finite(self.matrix.data, name)

    def block(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return self.matrix[rows][:, cols].toarray()

    def diagonal(self, nodes: np.ndarray) -> np.ndarray:
        return np.asarray(self.matrix[nodes, nodes]).reshape(-1)


class _OperatorSource(GramSource):
    def __init__(self, operator: LinearOperator) -> None:
        super().__init__(operator.shape[-1])
        self.operator = operator

    def _index(self, index: np.ndarray) -> Tensor:
        return torch.as_tensor(index, dtype=torch.int64, device=self.operator.device)

    def block(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        # Two selections: linear_operator reads one call with two index tensors as pairs.
        selected = self.operator[self._index(rows), :][:, self._index(cols)]
        return as_float64(selected.to_dense(), self.name)

    def diagonal(self, nodes: np.ndarray) -> np.ndarray:
        index = self._index(nodes)
        return as_float64(self.operator[index, index], self.name)


class _KernelSource(GramSource):
    def __init__(self, kernel: gpytorch.kernels.Kernel, size: int | None) -> None:
        super().__init__(size)
        self.kernel = kernel
        self.device = module_device(kernel)

    def inputs(self, nodes: np.ndarray) -> Tensor:
        # float64 holds node indices exactly up to 2**53; graph kernels read them back as ints.
        return torch.as_tensor(nodes, dtype=torch.float64, device=self.device).unsqueeze(-1)

    def block(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        left = self.inputs(rows)
        # The same tensor on both sides lets a GRF kernel return its symmetric Phi Phi^T.
        right = left if rows is cols or np.array_equal(rows, cols) else self.inputs(cols)
        with torch.no_grad():
            value = self.kernel(left, right).to_dense()
        if value.shape != (rows.size, cols.size):
            raise ValueError(f"the kernel returned a block of shape {tuple(value.shape)} for "
                             f"{rows.size} x {cols.size} nodes; a batched kernel needs one batch entry")
        return as_float64(value, self.name)

    def diagonal(self, nodes: np.ndarray) -> np.ndarray:
        inputs = self.inputs(nodes)
        with torch.no_grad():
            value = self.kernel(inputs, inputs, diag=True)
        return as_float64(value, self.name).reshape(-1)


def _graph_size(module: torch.nn.Module) -> int | None:
    sizes = {sub.num_nodes for sub in module.modules() if isinstance(sub, GraphNodeKernel)}
    return sizes.pop() if len(sizes) == 1 else None


def gram_source(value: Any, name: str = "gram") -> GramSource:
    """Wrap a Gram matrix, linear operator, kernel or trained ExactGP for block reads.

    :param value: A square array / tensor / scipy sparse matrix over all points, a square
        :class:`~linear_operator.operators.LinearOperator` (no batch), a gpytorch kernel
        on node indices, or a :class:`gpytorch.models.ExactGP` (its ``covar_module``).
    :param name: Argument name used in error messages.
    :raises TypeError: For other types or non-numeric arrays.
    :raises ValueError: If an array or operator is not square (or is batched), or an
        array holds NaN or infinite values (lazy sources: the blocks read from them).
    """
    if isinstance(value, GramSource):
        return value
    if isinstance(value, gpytorch.models.ExactGP):
        value = value.covar_module
    if isinstance(value, gpytorch.kernels.Kernel):
        source: GramSource = _KernelSource(value, _graph_size(value))
        source.name = name
        return source
    if isinstance(value, LinearOperator):
        if value.ndim != 2 or value.shape[0] != value.shape[1]:
            raise ValueError(f"{name} must be a square matrix, got shape {tuple(value.shape)}")
        source = _OperatorSource(value)
        source.name = name
        return source
    if sp.issparse(value):
        if value.shape[0] != value.shape[1]:
            raise ValueError(f"{name} must be square, got shape {value.shape}")
        return _SparseSource(value, name)
    matrix = as_float64(value, name)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"{name} must be square, got shape {matrix.shape}")
    return _DenseSource(matrix)


def row_chunks(num_rows: int, num_columns: int) -> list[tuple[int, int]]:
    """Consecutive row ranges whose dense blocks hold at most about :data:`BLOCK_ENTRIES` numbers."""
    step = max(1, BLOCK_ENTRIES // max(num_columns, 1))
    return [(start, min(start + step, num_rows)) for start in range(0, num_rows, step)]
