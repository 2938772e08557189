r"""Processes working on one GP: the collectives gp_couple needs, on torch.distributed.

Every distributed path of gp_couple (the sharded GRF Gram operator, sharded sparse-spectrum
GPs, streamed prediction) talks to the other processes through a :class:`Collective`. When
``torch.distributed`` is not initialised, a :class:`Collective` is the trivial group of one
process: its reductions return their input, so the same code runs unchanged from a
notebook to ``torchrun --nnodes 8 --nproc-per-node 8`` (a process group of one process,
e.g. ``torchrun --nproc-per-node 1``, runs its collectives for real).

Launching: start the processes with ``torchrun`` (which sets ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` and also covers multi-node rendezvous) and call
:func:`initialise` once in each: gloo on the CPU, NCCL when the model lives on a GPU.
Rows (observed nodes, data points, prediction nodes) are split by :meth:`Collective.shard`
into contiguous, nearly equal blocks in rank order.

Failures: :func:`initialise` sets the timeout of the rendezvous and of every collective
(:data:`DEFAULT_TIMEOUT`). A process that dies makes the collectives of the others fail
with a :class:`DistributedError` naming the operation, at the latest after the timeout,
never hang: gloo reports a closed connection at once, a silent peer after the timeout.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from ._checks import check_int

__all__ = ["DEFAULT_TIMEOUT", "Collective", "DistributedError", "finalise", "initialise"]

#: Seconds a rendezvous or a collective may wait for the other processes.
DEFAULT_TIMEOUT = 300.0


class DistributedError(RuntimeError):
    """A collective operation failed: a process died, or did not answer within the timeout."""


def initialise(backend: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
               init_method: str | None = None, rank: int | None = None,
               world_size: int | None = None) -> Collective:
    """Join (or start) the default process group and return its :class:`Collective`.

    Under ``torchrun`` call it without arguments. Without a launcher, pass ``init_method``
    (e.g. ``"file:///shared/rendezvous"`` or ``"tcp://host:port"``), ``rank`` and
    ``world_size``. When neither a launcher's environment nor ``init_method`` is given,
    nothing is initialised and the single-process :class:`Collective` is returned.

    :param backend: ``"gloo"`` (CPU tensors) or ``"nccl"`` (CUDA tensors); default
        NCCL when CUDA is available and the launcher set ``LOCAL_RANK``, gloo otherwise.
    :param timeout: Seconds the rendezvous and every later collective may wait.
    :param init_method: Rendezvous URL (default: the launcher's environment variables).
    :param rank: This process's rank (default from the environment).
    :param world_size: Number of processes (default from the environment).
    :return: The :class:`Collective` of the default group.
    :raises ValueError: For an unknown backend or a non-positive timeout.
    :raises DistributedError: If the rendezvous fails or times out.
    """
    if backend is not None and backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None, got {backend!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if dist.is_available() and dist.is_initialized():
        return Collective()
    launched = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    if init_method is None and not launched:
        return Collective()
    if not dist.is_available():
        raise DistributedError("torch.distributed is not available in this build of torch")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and "LOCAL_RANK" in os.environ else "gloo"
    kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(seconds=float(timeout))}
    if init_method is not None:
        kwargs["init_method"] = init_method
    if rank is not None:
        kwargs["rank"] = check_int("rank", rank, 0)
    if world_size is not None:
        kwargs["world_size"] = check_int("world_size", world_size, 1)
    try:
        dist.init_process_group(**kwargs)
    except Exception as error:  # torch raises RuntimeError, DistStoreError, ValueError ...
        raise DistributedError(f"the rendezvous of the process group failed ({backend}, timeout {timeout:g} s): "
                               f"{error}") from error
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return Collective()


def finalise() -> None:
    """Wait for every process, then leave the default process group (nothing without one).

    Call it once at the end of a multi-process program: a process that exits while the
    others still talk to it makes their collectives fail, and gloo aborts a process that
    exits with its group still open.
    """
    if dist.is_available() and dist.is_initialized():
        Collective().barrier()
        dist.destroy_process_group()


class Collective:
    """The processes working on one GP, and the collectives gp_couple uses between them.

    :param group: A ``torch.distributed`` process group (default: the default group when
        torch.distributed is initialised, else the single process).
    """

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.size = dist.get_world_size(group) if self.distributed else 1
        #: Bytes this process contributed to collectives (the payload of every all-reduce and
        #: all-gather it took part in), for measuring communication.
        self.bytes_communicated = 0

    def __repr__(self) -> str:
        return f"Collective(rank={self.rank}, size={self.size})"

    @property
    def device(self) -> torch.device:
        """Where tensors must be for this group's collectives: the current GPU under NCCL, else the CPU."""
        if self.distributed and dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    # ---------------------------------------------------------------- sharding
    def shard_bounds(self, count: int) -> list[int]:
        """Boundaries of the contiguous blocks of ``count`` rows, one per rank (``size + 1`` entries)."""
        return [count * rank // self.size for rank in range(self.size + 1)]

    def shard(self, count: int) -> slice:
        """This rank's contiguous block of ``count`` rows (nearly equal blocks in rank order)."""
        bounds = self.shard_bounds(count)
        return slice(bounds[self.rank], bounds[self.rank + 1])

    # ---------------------------------------------------------------- collectives
    def _run(self, what: str, operation: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return operation(*args, group=self.group, **kwargs)
        except Exception as error:  # gloo raises RuntimeError / DistBackendError on a dead peer or timeout
            raise DistributedError(f"{what} across {self.size} processes failed on rank {self.rank} (a process "
                                   f"died or did not answer within the timeout): {error}") from error

    def all_reduce(self, tensor: Tensor) -> Tensor:
        """The sum of ``tensor`` over all processes (a new tensor; ``tensor`` itself in one process)."""
        if not self.distributed:
            return tensor
        total = tensor.detach().clone().contiguous()
        self.bytes_communicated += total.numel() * total.element_size()
        self._run("all_reduce", dist.all_reduce, total)
        return total

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        """Every process's ``tensor`` in rank order; the first dimension may differ between processes."""
        if not self.distributed:
            return [tensor]
        tensor = tensor.detach().contiguous()
        sizes = torch.zeros(self.size, dtype=torch.int64, device=tensor.device)
        sizes[self.rank] = tensor.shape[0]
        sizes = self.all_reduce(sizes).tolist()
        padded = tensor.new_zeros((max(sizes), *tensor.shape[1:]))
        padded[:tensor.shape[0]] = tensor
        gathered = [torch.empty_like(padded) for _ in range(self.size)]
        self.bytes_communicated += padded.numel() * padded.element_size()
        self._run("all_gather", dist.all_gather, gathered, padded)
        return [part[:size] for part, size in zip(gathered, sizes)]

    def all_gather_rows(self, tensor: Tensor) -> Tensor:
        """The row blocks of all processes concatenated in rank order."""
        return tensor if not self.distributed else torch.cat(self.all_gather(tensor), dim=0)

    def all_gather_objects(self, value: Any) -> list[Any]:
        """Every process's picklable ``value`` in rank order."""
        if not self.distributed:
            return [value]
        gathered: list[Any] = [None] * self.size
        self._run("all_gather_object", dist.all_gather_object, gathered, value)
        return gathered

    def barrier(self) -> None:
        """Wait until every process arrives."""
        if self.distributed:
            self._run("barrier", dist.barrier)

    def check_same(self, name: str, value: Any) -> None:
        """Refuse to go on unless every process passed an equal ``value`` (arguments that must agree).

        :raises ValueError: Naming the argument and the ranks that disagree.
        """
        values = self.all_gather_objects(value)
        differing = [rank for rank, other in enumerate(values) if not _equal(other, values[0])]
        if differing:
            raise ValueError(f"{name} differs between processes: rank 0 and rank(s) {differing} passed different "
                             "values; every process must pass the same")

    @contextlib.contextmanager
    def summed_gradients(self, parameters: Sequence[torch.nn.Parameter]) -> Iterator[None]:
        """Inside the block, the gradients of ``parameters`` are summed over the processes.

        For parameters whose gradient each process computes only in part (from its own
        rows); parameters whose gradient every process computes whole must not be passed.
        Every process must run the same backward passes inside the block.
        """
        handles = [parameter.register_hook(self.all_reduce) for parameter in parameters] if self.distributed else []
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape \
            and bool(np.array_equal(a, b))
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    return bool(a == b)
