"""Seeds and generators.

Every random routine in gp_couple takes a ``seed`` argument of type :data:`SeedLike`
and turns it into the generator it needs with the helpers here, so that the same
seed gives the same result whichever entry point is used. ``seed=None`` follows
torch's and gpytorch's convention: the randomness comes from torch's global generator,
so ``torch.manual_seed(...)`` reproduces it (and each such call advances that generator).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np
import torch

from ._checks import is_int

SeedLike = int | np.integer | np.random.Generator | torch.Generator | None

_UINT64_MASK = (1 << 64) - 1

#: Held by every seeded block (:func:`seeded_torch_rng`) and every draw of ``seed=None``:
#: torch's global generator is one per process, so two seeded blocks in two threads take
#: turns with it. Re-entrant: a seeded block may run another one in the same thread.
_GLOBAL_RNG_LOCK = threading.RLock()


def _check_seed_type(seed: SeedLike) -> None:
    if seed is None or isinstance(seed, (np.random.Generator, torch.Generator)):
        return
    if not is_int(seed):
        raise TypeError(
            "seed must be an int, a numpy.random.Generator, a torch.Generator or None; "
            f"got {type(seed).__name__}"
        )
    if int(seed) < 0:
        raise ValueError(f"seed must be non-negative, got {int(seed)}")


def as_numpy_generator(seed: SeedLike) -> np.random.Generator:
    """Return a :class:`numpy.random.Generator` for ``seed``.

    A numpy generator is returned as is (its state advances); a torch generator, or
    torch's global one for ``None``, is consumed once to seed a fresh numpy generator; an
    int seeds PCG64.
    """
    _check_seed_type(seed)
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or isinstance(seed, torch.Generator):
        return np.random.default_rng(draw_seed(seed))
    return np.random.default_rng(int(seed))


def draw_seed(seed: SeedLike) -> int:
    """Return a 63-bit integer seed derived from ``seed``.

    Used for counter-based random streams (the compiled walk sampler) that need a
    plain integer key. Generators are advanced by one draw; ``None`` draws from torch's
    global generator.
    """
    _check_seed_type(seed)
    if seed is None:
        # Taken in turn with the seeded blocks of other threads (see _GLOBAL_RNG_LOCK); inside
        # a seeded block of this thread, the draw is that block's.
        with _GLOBAL_RNG_LOCK:
            return int(torch.randint(0, 2**62, (1,)).item())
    if isinstance(seed, torch.Generator):
        return int(torch.randint(0, 2**62, (1,), generator=seed).item())
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(0, 2**62))
    # Hash small integers so that seeds 0, 1, 2, ... give unrelated streams.
    return int(np.random.SeedSequence(int(seed)).generate_state(1, dtype=np.uint64)[0]) >> 1


@contextlib.contextmanager
def seeded_torch_rng(seed: SeedLike) -> Iterator[None]:
    """Seed torch's global CPU generator from ``seed`` inside the block, restoring it after.

    gpytorch draws its CG probe vectors and Lanczos start vectors from the global
    generator, so training and fast predictive variances are only reproducible when
    it is seeded; forking keeps the caller's global state untouched. ``None`` leaves
    the global generator as it is.

    Where CUDA is initialised, the block seeds and restores every CUDA device's default
    generator as well (gpytorch draws the probes of a model on the GPU there). It seeds no
    other generator: :func:`torch.manual_seed` would also seed the generators of devices
    the block does not restore (and, before CUDA starts, queue that seeding with a copy of
    the call stack at every evaluation).

    Thread safety: the generator is shared by the whole process, so a seeded block holds
    a process-wide lock from seeding to restoring. Seeded blocks in several threads (e.g.
    ``fit_gp(seed=0)`` on two models at once) therefore run one after the other, each with
    exactly the draws of a sequential run, and never restore another block's state. Code
    that draws from the global generator without a seeded block is not serialised and
    can still perturb a seeded block running in another thread.
    """
    if seed is None:
        yield
        return
    cuda_devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with _GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=cuda_devices):
        value = draw_seed(seed)
        torch.default_generator.manual_seed(value)
        for device in cuda_devices:
            torch.cuda.default_generators[device].manual_seed(value)
        yield
