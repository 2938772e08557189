"""The torch device a run trains on: ``cpu``, ``cuda`` or ``cuda:N``, checked with a clear error.

Models move to a device with ``.to(device)`` as usual in gpytorch; the graph kernels
then keep their features, lookups and caches there (walks are sampled on the CPU and
moved once). :func:`resolve_device` is the check every public entry point that takes a
device (the experiments' protocols, the ``--device`` option) goes through.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["DEVICE_CHOICES", "physical_memory", "resolve_device"]

#: The device strings accepted (``N`` is a CUDA device index).
DEVICE_CHOICES = ("cpu", "cuda", "cuda:N")


def physical_memory() -> int | None:
    """The host's physical memory in bytes; ``None`` where the platform does not say.

    The budget that memory-bounded choices (walker counts, variance methods) take a share of.
    """
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return None


def resolve_device(device: Any, name: str = "device") -> torch.device:
    """Check a device request and return it as a :class:`torch.device`.

    :param device: ``None`` (the CPU), a string ``"cpu"``, ``"cuda"`` or ``"cuda:N"``, or a
        :class:`torch.device` of those types.
    :param name: Argument name used in error messages.
    :return: The device.
    :raises TypeError: If ``device`` is neither a string nor a :class:`torch.device`.
    :raises ValueError: If it names another device type, or CUDA (or that CUDA device)
        is not available on this machine.
    """
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError:
            raise ValueError(f"{name} must be one of {', '.join(DEVICE_CHOICES)}, got {device!r}") from None
    elif not isinstance(device, torch.device):
        raise TypeError(f"{name} must be a string or torch.device, got {type(device).__name__}")
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"{name} must be one of {', '.join(DEVICE_CHOICES)}, got {str(device)!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"{name} {str(device)!r} was requested but CUDA is not available here (torch "
                         f"{torch.__version__}, CUDA build {torch.version.cuda or 'none'}); use {name} 'cpu'")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ValueError(f"{name} {str(device)!r} was requested but this machine has {count} CUDA "
                         f"device(s) (cuda:0 to cuda:{count - 1})")
    return device
