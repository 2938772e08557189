r"""Node indices: the one rule every entry point applies, with one set of messages.

Every argument that holds graph nodes (a GP's training and test nodes, inducing nodes,
the nodes a GRF kernel samples walks from, the walk sampler's start nodes, the
evaluators' indices, the figures' nodes) goes through :func:`node_index_tensor` or
:func:`node_index_array`, once, where the user hands it over; inner code trusts the
int64 result. The rule:

* integers only: Python ints, NumPy integer arrays, torch integer tensors, or sequences
  of them. ``bool`` is refused (``TypeError``): ``[True, False]`` is a mask, not nodes.
* 1-D, every index in ``[0, num_nodes)`` (``ValueError`` naming the argument and the
  first offending index), optionally distinct and, unless ``allow_empty``, not empty.

**Floats.** gpytorch forces floating inputs on a GP: its means and likelihoods take
the input's dtype, its kernels (an RBF as much as a graph kernel) are called with the
same column, and :class:`gpytorch.models.ExactGP` and
:class:`gpytorch.variational.VariationalStrategy` store the inputs (``train_inputs``,
``inducing_points``) as the ``(n, 1)`` float column they are given. This is the one
reason node indices travel int → float → int: a model validates its nodes as integers,
converts them to that column once for gpytorch (float64 above :math:`2^{24}` nodes, so
they stay exact), and tells its graph kernels the integers it came from
(:meth:`~gp_couple.kernels.graph_node.GraphNodeKernel.prepare_inputs`), so the kernels
never read the floats back on the hot path; the evaluators likewise call a kernel on a
float64 column. Hence ``gpytorch_inputs=True``, and nowhere else, accepts what gpytorch
hands back: floating-point indices whose values are exact integers, and the ``(n, 1)``
column form. It is passed by the graph kernels' ``forward`` (gpytorch calls them with the
float column) and by the GP models' node arguments (which accept ``model.train_inputs[0]``
and ``inducing_points``). Every other argument refuses floats with ``TypeError``.

Checking values reads a few numbers back together (one host synchronisation for a
tensor on an accelerator, two with ``unique``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["check_node_values", "node_index_array", "node_index_tensor"]


def _dtype_error(name: str, dtype: Any, gpytorch_inputs: bool) -> TypeError:
    allowed = "integers or integer-valued floats" if gpytorch_inputs else "integers"
    return TypeError(f"{name} must hold node indices as {allowed}, got dtype {dtype}")


def _range_error(name: str, value: int, num_nodes: int | None) -> ValueError:
    bound = "inf" if num_nodes is None else num_nodes
    return ValueError(f"{name} contains node index {value} outside [0, {bound})")


def check_node_values(index: Tensor, name: str, num_nodes: int | None = None, *,
                      gpytorch_inputs: bool = False) -> Tensor:
    """Check the dtype and values of node indices of any shape, on any device; return them as int64.

    :param index: Tensor of node indices.
    :param name: Argument name used in error messages.
    :param num_nodes: If given, every index must lie in ``[0, num_nodes)``; otherwise it
        must be non-negative.
    :param gpytorch_inputs: Accept floating-point indices with exact integer values (see
        the module docstring for where).
    :return: ``index`` as int64, on its device.
    :raises TypeError: If the dtype is not an integer one (``bool`` included), or is
        floating without ``gpytorch_inputs``.
    :raises ValueError: If an index is NaN or infinite, not an integer, not exactly
        representable in its floating dtype, or outside ``[0, num_nodes)``.
    """
    floating = index.dtype.is_floating_point
    if index.dtype == torch.bool or index.dtype.is_complex or (floating and not gpytorch_inputs):
        raise _dtype_error(name, index.dtype, gpytorch_inputs)
    if index.numel() == 0:
        return index.to(torch.int64)
    if floating:
        finite = torch.isfinite(index)
        safe = torch.where(finite, index, torch.zeros((), dtype=index.dtype, device=index.device))
        fractional = safe != torch.round(safe)
        nonfinite, has_fraction, low, high = torch.stack(
            [(~finite).any().to(torch.float64), fractional.any().to(torch.float64),
             safe.min().to(torch.float64), safe.max().to(torch.float64)]).tolist()
        if nonfinite:
            raise ValueError(f"{name} contains NaN or infinite node indices")
        if has_fraction:
            raise ValueError(f"{name} contains non-integer node index {safe[fractional][0].item()}")
        # Floats represent integers exactly only up to 2 / eps (2**24 for float32).
        exact = round(2.0 / torch.finfo(index.dtype).eps)
        if max(-low, high) > exact:
            raise ValueError(f"{name} has dtype {index.dtype}, which cannot represent node indices above "
                             f"2**{exact.bit_length() - 1} exactly; pass int64 or float64 indices")
        low, high = int(low), int(high)
    else:
        low, high = torch.stack([index.min(), index.max()]).to(torch.int64).tolist()
    if low < 0:
        raise _range_error(name, low, num_nodes)
    if num_nodes is not None and high >= num_nodes:
        raise _range_error(name, high, num_nodes)
    return index.to(torch.int64)


def _as_tensor(nodes: Any, name: str, gpytorch_inputs: bool) -> Tensor:
    """``nodes`` as a tensor of its own dtype (NumPy integers widened to int64), without checking values."""
    if isinstance(nodes, Tensor):
        return nodes.detach()
    try:
        array = np.asarray(nodes)
    except (TypeError, ValueError) as error:  # e.g. ragged nested sequences
        raise TypeError(f"{name} must be a 1-D sequence of node indices, got {type(nodes).__name__}") from error
    if array.size == 0 and array.dtype == np.float64:
        # np.asarray([]) is float64: an empty sequence holds no floats.
        array = array.astype(np.int64)
    if np.issubdtype(array.dtype, np.integer) and array.dtype != np.bool_:
        return torch.from_numpy(array.astype(np.int64))  # a copy: the result never aliases the caller's array
    if np.issubdtype(array.dtype, np.floating) and gpytorch_inputs:
        return torch.from_numpy(array.astype(np.float64 if array.dtype.itemsize > 8 else array.dtype))
    raise _dtype_error(name, array.dtype, gpytorch_inputs)


def node_index_tensor(nodes: Any, name: str, num_nodes: int | None = None, *, unique: bool = False,
                      allow_empty: bool = False, gpytorch_inputs: bool = False,
                      device: torch.device | str | None = None) -> Tensor:
    """Validate node indices (the rule of the module docstring) and return them as an int64 tensor ``(n,)``.

    :param nodes: Tensor, array or sequence of node indices.
    :param name: Argument name used in error messages.
    :param num_nodes: If given, every index must lie in ``[0, num_nodes)``; otherwise it
        must be non-negative.
    :param unique: Refuse repeated indices.
    :param allow_empty: Accept an empty set of indices.
    :param gpytorch_inputs: Accept what gpytorch hands back as GP inputs: floating-point
        indices with exact integer values, and the column form ``(n, 1)``.
    :param device: Device of the result (default: the tensor's own, or the CPU).
    :return: int64 tensor ``(n,)``.
    :raises TypeError: If ``nodes`` is not array-like or does not hold integers
        (``bool`` included; floats unless ``gpytorch_inputs``).
    :raises ValueError: If the shape is wrong, the set is empty (unless
        ``allow_empty``), an index is outside ``[0, num_nodes)`` (or not an exact
        integer), or, with ``unique``, an index repeats.
    """
    tensor = _as_tensor(nodes, name, gpytorch_inputs)
    if gpytorch_inputs and tensor.ndim == 2 and tensor.shape[1] == 1:
        tensor = tensor[:, 0]
    if tensor.ndim != 1:
        form = " (or a column of shape (n, 1))" if gpytorch_inputs else ""
        raise ValueError(f"{name} must be a 1-D sequence of node indices{form}, got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0 and not allow_empty:
        raise ValueError(f"{name} is empty; pass at least one node index")
    index = check_node_values(tensor, name, num_nodes, gpytorch_inputs=gpytorch_inputs)
    if unique and index.numel() > 1:
        ordered = torch.sort(index).values
        repeated = ordered[1:] == ordered[:-1]
        if bool(repeated.any()):
            raise ValueError(f"{name} contains duplicate node index {int(ordered[1:][repeated][0])}")
    return index if device is None else index.to(device)


def node_index_array(nodes: Any, name: str, num_nodes: int | None = None, *, unique: bool = False,
                     allow_empty: bool = False, gpytorch_inputs: bool = False) -> np.ndarray:
    """:func:`node_index_tensor` as an int64 NumPy array on the CPU (the same rule and messages).

    :param nodes: Tensor, array or sequence of node indices.
    :param name: Argument name used in error messages.
    :param num_nodes: If given, every index must lie in ``[0, num_nodes)``.
    :param unique: Refuse repeated indices.
    :param allow_empty: Accept an empty set of indices.
    :param gpytorch_inputs: Accept integer-valued floats and the ``(n, 1)`` column.
    :return: int64 array ``(n,)``.
    :raises TypeError: See :func:`node_index_tensor`.
    :raises ValueError: See :func:`node_index_tensor`.
    """
    return node_index_tensor(nodes, name, num_nodes, unique=unique, allow_empty=allow_empty,
                             gpytorch_inputs=gpytorch_inputs).cpu().numpy()
