r"""The interface of frequency couplings and the registry they join (paper, Section 3 "Random
Fourier features and random Laplace features" [sec:rffs_and_rlfs]).

A :class:`FrequencyCoupling` is a joint law of the frequencies of random Fourier or
Laplace features whose marginals stay standard Gaussian; see
:mod:`gp_couple.couplings.frequencies` for the guide and
:mod:`gp_couple.couplings.frequency_builtins` for the built-in couplings.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from .._checks import check_batch_shape, check_positive_int
from .._random import SeedLike, as_numpy_generator
from ..registry import Registered, Registry

__all__ = ["FREQUENCY_COUPLINGS", "FrequencyCoupling"]

#: Named noise arrays of one draw, as tensors (what kernels keep in buffers).
Noise = dict[str, Tensor]

#: Registry of frequency couplings: every subclass with a ``name`` joins it.
FREQUENCY_COUPLINGS: Registry[FrequencyCoupling] = Registry("frequency coupling")


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return tuple(torch.broadcast_shapes(shape, target)) == target
    except RuntimeError:
        return False


class FrequencyCoupling(torch.nn.Module, Registered, ABC, registry=FREQUENCY_COUPLINGS):
    r"""Interface: a joint law of ``num_features`` frequencies in :math:`\mathbb R^d`.

    Subclasses must keep every frequency marginally :math:`\mathcal N(0, \mathbf I_d)`
    (see the module docstring) and may couple the frequencies of one draw in any way.
    Different draws (batch members) must be independent.

    Implement :meth:`sample_noise` (numpy, all the randomness) and
    :meth:`noise_to_frequencies` (torch, deterministic). A coupling with parameters
    registers them as usual on this :class:`torch.nn.Module`. A subclass that sets
    ``name`` is registered in :data:`FREQUENCY_COUPLINGS`; one with constructor
    arguments returns them from :meth:`params`.
    """

    #: Short name used in reports, JSON and the command line.
    name: ClassVar[str] = "coupling"

    @abstractmethod
    def sample_noise(self, num_features: int, dim: int, batch_shape: tuple[int, ...],
                     rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Draw the randomness for ``batch_shape`` independent sets of frequencies.

        :param num_features: Number of frequencies :math:`m` per set (validated, >= 1).
        :param dim: Input dimension :math:`d` (validated, >= 1).
        :param batch_shape: Shape of independent draws; every array must lead with it.
        :param rng: Generator to draw from.
        :return: Named float arrays; their shapes must not depend on anything but the
            arguments.
        """

    @abstractmethod
    def noise_to_frequencies(self, noise: Mapping[str, Tensor]) -> Tensor:
        """Map noise from :meth:`sample_noise` (as tensors) to frequencies.

        :return: Tensor of shape ``(*batch_shape, M, dim)`` with ``M >= num_features``;
            only the first ``num_features`` rows are used.
        """

    @property
    def is_learnable(self) -> bool:
        """Whether the frequencies depend on parameters that require gradients."""
        return any(parameter.requires_grad for parameter in self.parameters())

    def draw_noise(self, num_features: int, dim: int, *, batch_shape: Sequence[int] = (),
                   seed: SeedLike = None, dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None) -> Noise:
        """Draw noise as tensors (the form kernels keep in buffers).

        :param num_features: Number of frequencies :math:`m \\ge 1`.
        :param dim: Input dimension :math:`d \\ge 1`.
        :param batch_shape: Shape of independent draws.
        :param seed: Seed or generator; the same int seed gives identical noise.
        :param dtype: Floating dtype of the tensors (default: torch's default dtype).
        :param device: Device of the tensors.
        """
        num_features = check_positive_int("num_features", num_features)
        dim = check_positive_int("dim", dim)
        shape = check_batch_shape(batch_shape)
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
        arrays = self.sample_noise(num_features, dim, shape, as_numpy_generator(seed))
        noise: Noise = {}
        for key, array in arrays.items():
            if not key.isidentifier():
                raise ValueError(f"{type(self).__name__}.sample_noise returned a key {key!r} "
                                 "that is not a valid identifier")
            tensor = torch.as_tensor(np.asarray(array), dtype=dtype, device=device)
            if tuple(tensor.shape[:len(shape)]) != shape:
                raise ValueError(f"{type(self).__name__}.sample_noise returned {key!r} of shape "
                                 f"{tuple(tensor.shape)}, which does not lead with batch_shape {shape}")
            noise[key] = tensor
        return noise

    def forward(self, noise: Mapping[str, Tensor], num_features: int, *, dim: int | None = None,
                batch_shape: Sequence[int] | None = None) -> Tensor:
        """Frequencies ``(*batch_shape, num_features, dim)`` from stored noise.

        What :meth:`noise_to_frequencies` returns is checked (a user's coupling is an
        edge): a floating tensor of shape ``(*batch_shape, M, dim)``, ``M >= num_features``,
        without NaN or infinite entries (one value read back from an accelerator); a
        batch shape that broadcasts to ``batch_shape`` (noise shared by a hyperparameter
        batch, e.g. after loading NUTS draws) is accepted.

        :param noise: Output of :meth:`draw_noise` (or buffers holding it).
        :param num_features: Number of frequencies to keep.
        :param dim: The input dimension the frequencies must have (default: not checked).
        :param batch_shape: The batch shape they must broadcast to (default: not checked).
        :raises ValueError: Naming the coupling class, if the frequencies are not as expected.
        """
        num_features = check_positive_int("num_features", num_features)
        frequencies = self.noise_to_frequencies(noise)
        where = f"{type(self).__name__}.noise_to_frequencies"
        if not isinstance(frequencies, Tensor) or not frequencies.dtype.is_floating_point:
            kind = (f"a tensor of dtype {frequencies.dtype}" if isinstance(frequencies, Tensor)
                    else type(frequencies).__name__)
            raise ValueError(f"{where} returned {kind}; expected a floating-point tensor "
                             "(*batch_shape, num_features, dim)")
        batch = None if batch_shape is None else tuple(batch_shape)
        axes = [*(("*batch_shape",) if batch is None else map(str, batch)), f"M >= {num_features}",
                "dim" if dim is None else str(dim)]
        expected = f"({', '.join(axes)})"
        if (frequencies.dim() < 2 or (dim is not None and frequencies.shape[-1] != dim)
                or (batch is not None and not _broadcasts_to(tuple(frequencies.shape[:-2]), batch))):
            raise ValueError(f"{where} returned frequencies of shape {tuple(frequencies.shape)}; "
                             f"expected {expected}")
        if frequencies.shape[-2] < num_features:
            raise ValueError(f"the noise holds {frequencies.shape[-2]} frequencies but "
                             f"num_features={num_features} were requested: redraw it")
        frequencies = frequencies[..., :num_features, :]
        if not bool(torch.isfinite(frequencies).all()):
            raise ValueError(f"{where} returned NaN or infinite frequencies")
        return frequencies

    def sample(self, num_features: int, dim: int, *, batch_shape: Sequence[int] = (),
               seed: SeedLike = None, dtype: torch.dtype | None = None,
               device: torch.device | str | None = None) -> Tensor:
        """Draw frequencies of shape ``(*batch_shape, num_features, dim)``.

        Arguments as in :meth:`draw_noise`.
        """
        noise = self.draw_noise(num_features, dim, batch_shape=batch_shape, seed=seed,
                                dtype=dtype, device=device)
        return self(noise, num_features, dim=dim, batch_shape=batch_shape)
