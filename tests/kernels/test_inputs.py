"""What the kernels remember per input tensor: hits for the same memory, misses for anything else."""

from __future__ import annotations

import gc

import torch

from gp_couple.kernels._inputs import InputCache


def test_a_new_view_of_the_same_memory_finds_what_the_first_view_computed() -> None:
    cache = InputCache()
    base = torch.arange(12.0).reshape(6, 2)
    first = base[:, :]  # gpytorch slices its inputs like this when it evaluates a kernel block by block
    cache.put(first, "derived")
    del first
    gc.collect()
    assert cache.get(base[:, :]) == "derived"
    assert cache.get(base) == "derived"  # the same memory, shape and strides
    assert cache.get(base[:3]) is None  # other memory or shape
    assert cache.get(base.clone()) is None


def test_entries_miss_once_the_memory_changes_and_are_dropped_once_it_is_freed() -> None:
    cache = InputCache()
    base = torch.arange(6.0).unsqueeze(-1)
    cache.put(base[:, :], "derived")
    base[0] = 7.0  # in place, through any view: the version counter moves
    assert cache.get(base[:, :]) is None
    del base
    gc.collect()
    kept = torch.zeros(2, 1)
    cache.put(kept, "kept")  # entries whose memory was freed can never hit again: dropped
    assert len(cache._entries) == 1 and cache.get(kept) == "kept"


def test_the_cache_keeps_its_size_and_drops_the_oldest_entry() -> None:
    cache = InputCache(size=2)
    tensors = [torch.full((3, 1), float(i)) for i in range(3)]
    for i, tensor in enumerate(tensors):
        cache.put(tensor, i)
    assert cache.get(tensors[0]) is None
    assert cache.get(tensors[1]) == 1 and cache.get(tensors[2]) == 2
