"""Loading a kernel's state dict all at once or not at all.

torch copies what it can of a state dict and reports the rest at the end, and calls
``set_extra_state`` only after the tensors were copied, so a bad entry would leave a
kernel half loaded (new walks or frequencies with an old configuration). The kernels
therefore check everything in ``_load_from_state_dict`` before calling torch's: their
saved configuration (``_extra_state``) and, with :func:`check_state_tensors`, every
tensor of theirs and of their submodules.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch import Tensor

__all__ = ["check_state_tensors"]


def check_state_tensors(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str,
                        reshaped: Collection[str] = ()) -> None:
    """Refuse, before anything is copied, state-dict entries that could not be copied into ``module``.

    :param module: The module being loaded (its submodules are checked too).
    :param state_dict: The state dict.
    :param prefix: The module's prefix in it.
    :param reshaped: Names of ``module``'s own buffers that take the saved shape on load.
    :raises TypeError: If an entry of the module is not a tensor.
    :raises ValueError: If an entry's shape differs from the module's (except where a
        module loads shapes loosely, gpytorch's ``load_strict_shapes(False)``).
    """
    for path, owner in module.named_modules():
        strict_shapes = getattr(owner, "_load_strict_shapes", True)
        persistent = {**owner._parameters, **{name: buffer for name, buffer in owner._buffers.items()
                                              if name not in owner._non_persistent_buffers_set}}
        for name, current in persistent.items():
            key = f"{prefix}{path + '.' if path else ''}{name}"
            if current is None or key not in state_dict:
                continue
            saved = state_dict[key]
            if not isinstance(saved, Tensor):
                raise TypeError(f"{key}: expected a tensor in the state dict, got {type(saved).__name__}")
            if strict_shapes and not (owner is module and name in reshaped) and saved.shape != current.shape:
                raise ValueError(f"{key} has shape {tuple(saved.shape)} in the state dict but "
                                 f"{tuple(current.shape)} in this kernel")
