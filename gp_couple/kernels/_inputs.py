"""Results computed from a kernel's input tensors, remembered without reading the inputs.

Kernels validate their inputs (node indices in range, features finite) and derive
index structures from them. A training loop passes the same input tensor every
iteration, so :class:`InputCache` remembers those results per tensor: looking one
up compares the tensor's memory address, shape, strides and version counter, never
its values, so it costs no host synchronisation on an accelerator.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor

__all__ = ["InputCache", "same_inputs", "same_memory"]

#: Input tensors whose results a kernel remembers (train, train+test, test blocks, ...).
INPUT_CACHE_SIZE = 8


def same_memory(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors view the same memory the same way, so hold equal values (no sync)."""
    return (a.device == b.device and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride() and a.data_ptr() == b.data_ptr())


def same_inputs(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` certainly hold equal values, without a device synchronisation.

    The same tensor, or views of the same memory, are equal; other tensors are compared
    by value only on the CPU, where reading them costs no synchronisation. On an
    accelerator equal values in different memory count as different: callers then
    take their general (not symmetric) path, which gives the same result.
    """
    if a is b or same_memory(a, b):
        return True
    return (a.device.type == "cpu" and b.device.type == "cpu" and a.shape == b.shape
            and bool(torch.equal(a, b)))


class InputCache:
    """Small LRU of results computed from input tensors, keyed by the tensor's memory.

    An entry holds a weak reference to the tensor's base (the tensor itself unless it is a
    view): while the base is alive its memory cannot hold another tensor, and once it is
    gone the entry misses. So a new view of the same memory (gpytorch slices its inputs
    when it evaluates a kernel block by block) finds what the first view computed. The
    entry also records the tensor's version counter (shared by all views of the memory),
    so an in-place change misses too. Inference-mode tensors have no version counter
    and are never remembered.

    :param size: Number of entries kept (least recently used ones are dropped).
    """

    def __init__(self, size: int = INPUT_CACHE_SIZE) -> None:
        self._entries: OrderedDict = OrderedDict()
        self._size = size

    @staticmethod
    def _key(x: Tensor, extra: Any) -> tuple[Any, ...]:
        return (x.device, x.dtype, x.data_ptr(), tuple(x.shape), x.stride(), extra)

    def get(self, x: Tensor, extra: Any = None) -> Any:
        """The value remembered for ``x`` (and ``extra``), or ``None``."""
        if x.is_inference():
            return None
        key = self._key(x, extra)
        entry = self._entries.get(key)
        if entry is None or entry[0]() is None or entry[1] != x._version:
            return None
        self._entries.move_to_end(key)
        return entry[2]

    def put(self, x: Tensor, value: Any, extra: Any = None) -> Any:
        """Remember ``value`` for ``x`` (and ``extra``); return ``value``."""
        if not x.is_inference():
            # Entries of freed tensors can never hit again: drop them, and what they hold.
            for key in [key for key, entry in self._entries.items() if entry[0]() is None]:
                del self._entries[key]
            owner = x if x._base is None else x._base
            self._entries[self._key(x, extra)] = (weakref.ref(owner), x._version, value)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __reduce__(self) -> tuple[Any, ...]:
        # Copies and pickles start empty: the entries refer to live tensors.
        return (type(self), (self._size,))
