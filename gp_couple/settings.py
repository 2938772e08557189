r"""Recommended gpytorch settings for GRF Gaussian processes, as context managers.

Library code in gp_couple never changes global gpytorch settings. Experiments and
users opt in with::

    with grf_gp_settings():
        fit_gp(model, likelihood, iterations=1000)

or override single values (``grf_gp_settings(max_cholesky_size=0)`` forces CG/Lanczos).
Every value is restored on exit, also when an exception escapes.

Why these defaults (the numbers are in :class:`GRFGPSettings`; gpytorch's own
defaults are given for comparison):

* ``max_cholesky_size=8192`` (gpytorch: 800). Up to this many training points the
  marginal likelihood is evaluated exactly, through a dense Cholesky factor, and
  :class:`~gp_couple.marginal_likelihood.DenseMarginalLogLikelihood` (the objective of
  :func:`~gp_couple.models.fit_gp`) takes its gradient in closed form, one matrix inverse
  (unless the model's GRF kernel has so few feature entries that CG is cheaper:
  :meth:`~gp_couple.kernels.grf_kernel.GRFKernel.dense_solves_pay`).
  The exact objective also suits L-BFGS: on CG/Lanczos objectives, whose stochastic
  log-determinant and gradient do not agree, its line searches spend several evaluations
  per iteration near the optimum (``benchmarks/RESULTS.md``).
  Above it, CG/Lanczos on the sparse operator: a dense factor costs :math:`n^3/3`. The
  exception is a GRF kernel's bias-corrected training rounds on its prediction walks,
  which factorise densely whatever this value, as long as the factor fits in memory
  (:meth:`~gp_couple.kernels.grf_kernel.GRFKernel.pairs_evaluations`;
  ``WalkSchedule(bias_correction=False)`` leaves them to this setting).
* ``num_trace_samples=32`` (gpytorch: 10): lower-variance log-determinant
  gradients on the CG path; each probe costs only two sparse products.
* ``cg_tolerance=0.01`` (gpytorch: 1) and ``eval_cg_tolerance=0.001`` (gpytorch:
  0.01): accurate quadratic forms and predictive means, which the test RMSE and the
  KL divergence to the exact posterior (Appendix F.2 "Scalable GPs on graphs", paragraph "Training
  GRF-GPs: technical details" [app:grf_gp_details]) depend on; CG iterations are cheap sparse
  products.
* ``max_cg_iterations=2000`` (gpytorch: 1000): GRF Gram matrices with small learnt
  noise can be poorly conditioned.
* ``max_root_decomposition_size=300`` (gpytorch: 100): a more accurate Lanczos
  cache for ``fast_pred_var`` variances.
* Subnormal floats are flushed to zero (:func:`flush_denormals`): Gram matrices and
  their Cholesky factors reach them, and the CPU computes with them many times slower.
* The pivoted-Cholesky preconditioner keeps gpytorch's sizes (rank 15 from 2000
  points): it reads exact rows of the GRF operator. The features change with the
  hyperparameters, so it is rebuilt every iteration, but
  ``preconditioner_pivot_tolerance=0.05`` keeps its pivots while the normalised Gram
  diagonal moved by at most 0.05 (:mod:`gp_couple.operators.preconditioner`): the
  factor is then one block product instead of 15 pivot searches. Over 30 Adam steps
  on a 100 x 100 grid the pivots were searched 13 times instead of 30 and every loss
  and hyperparameter agreed to 4 digits (``benchmarks/RESULTS.md``, products section).

Thread pools
------------
:func:`threads` bounds every thread pool a run uses — torch's intra-op threads, numba's
parallel walk sampler and the BLAS/OpenMP pools behind NumPy, SciPy and torch (through
``threadpoolctl``) — and restores them on exit::

    with threads(1):
        fit_gp(model, likelihood, iterations=300)

Why: on a machine shared with other work, pools sized to every core lose their cores
to other processes, and OpenBLAS and OpenMP workers busy-wait for each other while one
of them is descheduled, so a run slows far more than in proportion to the CPU it
loses (``benchmarks/bench_contention.py`` measures it; ``benchmarks/RESULTS.md``).
The ``gp-couple`` commands therefore run on one thread when other work already keeps
every CPU busy as they start (:func:`threads_for_load`), unless ``--threads`` says
otherwise.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import gpytorch
from linear_operator.settings import _value_context

from ._checks import check_int, check_nonnegative

__all__ = ["GRFGPSettings", "available_cpus", "busy_cpus", "flush_denormals", "grf_gp_settings",
           "kept_chebyshev_terms", "preconditioner_pivot_reuse", "threads", "threads_for_load"]


class kept_chebyshev_terms(_value_context):
    r"""Most numbers of hyperparameter-free Chebyshev terms the matrix-free exact kernel keeps.

    :class:`~gp_couple.kernels.matrix_free.MatrixFreeGraphKernel` keeps the terms
    :math:`T_j(\widetilde{\mathbf W})_{AB}` of the dense blocks it is asked for (the training
    covariance on the dense, Cholesky path), so that every later evaluation and gradient on the
    same nodes is a sum over them rather than a recurrence on the graph
    (:meth:`gp_couple.operators.ChebyshevBasis.block`). They are bounded by the memory of this
    many float64 numbers; they are kept in the model's dtype, so a float32 model keeps twice as
    many. A block of degree :math:`J` takes at most :math:`(J + 1)|A||B|` numbers, about half that
    for a symmetric one (:math:`A = B`, a training covariance:
    :func:`~gp_couple.operators.chebyshev_basis.kept_terms_entries`), and far fewer where the
    nodes are scattered over a graph wider than :math:`J` hops (only the rows within :math:`J`
    hops of each block of columns are kept: :math:`T_j(\widetilde{\mathbf W})_{ab} = 0` beyond
    :math:`j` hops); and twice the columns times the nodes their recurrences reach more, to
    extend them as the degree grows. The default, :math:`2^{26}` (512 MiB), covers in float64
    the training covariance of about 700 observed nodes at degree 260, or 1,024 at degree 123,
    wherever they lie, and 4,000 nodes scattered over a :math:`10^6`-node grid to degree 75; with
    more memory, raise it for more observed nodes (2,000 at degree 140 need
    :math:`2.8 \cdot 10^8`, 2.3 GB in float64), or lower it where memory is short (the training
    then reruns its recurrences, on the nodes they reach, per evaluation, as it does beyond the
    bound). Use as
    ``with kept_chebyshev_terms(1 << 29): ...``; 0 keeps nothing.

    :param entries: The bound, a non-negative integer.
    :raises TypeError: If ``entries`` is not an integer.
    :raises ValueError: If ``entries`` is negative.
    """

    _global_value: int = 1 << 26

    def __init__(self, entries: int) -> None:
        super().__init__(check_int("entries", entries, minimum=0))


class preconditioner_pivot_reuse(_value_context):
    """Reuse pivoted-Cholesky pivots across steps while the normalised Gram diagonal moved at most ``tolerance``.

    Off (``None``) by default; :func:`grf_gp_settings` turns it on. Read by
    :mod:`gp_couple.operators.preconditioner`.
    Use as ``with preconditioner_pivot_reuse(0.05): ...``.

    :param tolerance: Largest change of :math:`\\mathrm{diag}(\\widehat{\\mathbf K}) /
        \\max \\mathrm{diag}(\\widehat{\\mathbf K})` (any entry) before the pivots are
        chosen again; ``None`` chooses them every time.
    :raises TypeError: If ``tolerance`` is not a number or ``None``.
    :raises ValueError: If ``tolerance`` is negative or not finite.
    """

    _global_value: float | None = None

    def __init__(self, tolerance: float | None) -> None:
        super().__init__(None if tolerance is None else check_nonnegative("tolerance", tolerance))


@dataclass(frozen=True)
class GRFGPSettings:
    r"""A set of gpytorch settings; :meth:`context` applies them temporarily.

    :ivar max_cholesky_size: Largest training set solved by (dense) Cholesky; above it
        gpytorch uses CG/Lanczos with the sparse operator.
    :ivar cg_tolerance: Relative residual at which training-time CG stops.
    :ivar eval_cg_tolerance: Relative residual for prediction-time CG solves.
    :ivar max_cg_iterations: Upper bound on CG iterations.
    :ivar max_preconditioner_size: Rank of the pivoted-Cholesky preconditioner.
    :ivar min_preconditioning_size: Smallest system that is preconditioned.
    :ivar num_trace_samples: Probe vectors of the stochastic log-determinant gradient.
    :ivar max_lanczos_quadrature_iterations: Lanczos steps of the log-determinant quadrature
        (at most ``max_cg_iterations``: the quadrature reads the CG run's coefficients, and
        CG runs at least this many steps when it is asked for the log-determinant). The
        value the optimiser sees must rank hyperparameters as the exact likelihood does, or
        L-BFGS's line search stops where the gradient is not zero: with the
        preconditioned spectrum of a high signal-to-noise covariance the quadrature needs
        far more nodes than gpytorch's default of 20 (stochastic Lanczos quadrature
        converges like :math:`\exp(-2m/\sqrt{\kappa})` in the number of nodes :math:`m`).
    :ivar max_root_decomposition_size: Lanczos rank of the ``fast_pred_var`` caches.
    :ivar preconditioner_pivot_tolerance: Largest change of the normalised GRF Gram
        diagonal for which the preconditioner's pivots are reused across steps
        (:class:`preconditioner_pivot_reuse`).
    """

    max_cholesky_size: int = 8192
    cg_tolerance: float = 0.01
    eval_cg_tolerance: float = 0.001
    max_cg_iterations: int = 2000
    max_preconditioner_size: int = 15
    min_preconditioning_size: int = 2000
    num_trace_samples: int = 32
    max_lanczos_quadrature_iterations: int = 100
    max_root_decomposition_size: int = 300
    preconditioner_pivot_tolerance: float = 0.05

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.type in ("int", int):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError(f"{field.name} must be an int, got {type(value).__name__}")
                if value < 0:
                    raise ValueError(f"{field.name} must be non-negative, got {value}")
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(f"{field.name} must be a float, got {type(value).__name__}")
                if not (value > 0 and math.isfinite(value)):
                    raise ValueError(f"{field.name} must be positive and finite, got {value}")
        for name in ("max_cg_iterations", "num_trace_samples", "max_lanczos_quadrature_iterations",
                     "max_root_decomposition_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_lanczos_quadrature_iterations > self.max_cg_iterations:
            raise ValueError(
                f"max_lanczos_quadrature_iterations ({self.max_lanczos_quadrature_iterations}) must not exceed "
                f"max_cg_iterations ({self.max_cg_iterations}): the quadrature reads the CG run's coefficients")

    def as_dict(self) -> dict[str, Any]:
        """The settings as a JSON-serialisable dict (for experiment reports)."""
        return asdict(self)

    @contextlib.contextmanager
    def context(self) -> Iterator[GRFGPSettings]:
        """Apply the settings inside a ``with`` block; the previous values return on exit."""
        managers = (
            gpytorch.settings.max_cholesky_size(self.max_cholesky_size),
            gpytorch.settings.cg_tolerance(self.cg_tolerance),
            gpytorch.settings.eval_cg_tolerance(self.eval_cg_tolerance),
            gpytorch.settings.max_cg_iterations(self.max_cg_iterations),
            gpytorch.settings.max_preconditioner_size(self.max_preconditioner_size),
            gpytorch.settings.min_preconditioning_size(self.min_preconditioning_size),
            gpytorch.settings.num_trace_samples(self.num_trace_samples),
            gpytorch.settings.max_lanczos_quadrature_iterations(self.max_lanczos_quadrature_iterations),
            gpytorch.settings.max_root_decomposition_size(self.max_root_decomposition_size),
            preconditioner_pivot_reuse(self.preconditioner_pivot_tolerance),
            flush_denormals(),
        )
        with contextlib.ExitStack() as stack:
            for manager in managers:
                stack.enter_context(manager)
            yield self


def _flushing_denormals() -> bool:
    """Whether this thread's CPU flushes subnormal floats to zero now (half the smallest normal float32 is zero)."""
    import torch

    return bool(torch.tensor(torch.finfo(torch.float32).tiny) / 2 == 0)


@contextlib.contextmanager
def flush_denormals(enabled: bool = True) -> Iterator[bool]:
    r"""Treat subnormal floating-point numbers as zero on this thread's CPU inside the block.

    GRF and exact diffusion Gram matrices hold entries many orders of magnitude apart
    (far nodes, long walks), and their Cholesky factors decay further: float32 values
    below :math:`1.2 \cdot 10^{-38}` (float64: :math:`2.2 \cdot 10^{-308}`) are subnormal,
    and x86 CPUs compute with them up to a hundred times slower. Flushing them to zero
    changes no result by more than that magnitude, far below rounding, and makes
    dense training steps several times faster (``benchmarks/RESULTS.md``). :func:`gp_couple.models.fit_gp`,
    :func:`gp_couple.models.predict` and :func:`grf_gp_settings` enter this block.

    The flags (x86 MXCSR's flush-to-zero and denormals-are-zero, or ARM's FPCR, through
    :func:`torch.set_flush_denormal`) belong to the calling thread; the previous state
    returns on exit, also when an exception escapes, and blocks nest.

    :param enabled: Flush inside the block (``False`` keeps subnormals inside it).
    :return: A context manager yielding whether subnormals are flushed inside the block
        (``False`` on CPUs without the flags).
    """
    import torch

    previous = _flushing_denormals()
    supported = torch.set_flush_denormal(enabled)
    try:
        yield supported and enabled
    finally:
        torch.set_flush_denormal(previous)


def grf_gp_settings(**overrides: Any) -> contextlib.AbstractContextManager[GRFGPSettings]:
    """The recommended settings for GRF GPs (:class:`GRFGPSettings`), with optional overrides.

    :param overrides: Any :class:`GRFGPSettings` field, e.g. ``max_cholesky_size=0`` to
        force CG/Lanczos.
    :return: A context manager yielding the :class:`GRFGPSettings` in effect.
    :raises TypeError: For an unknown setting name or a value of the wrong type.
    :raises ValueError: For an out-of-range value.
    """
    known = {field.name for field in fields(GRFGPSettings)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"unknown GRF GP setting(s) {unknown}; choose from {sorted(known)}")
    return replace(GRFGPSettings(), **overrides).context()


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where unsupported)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def busy_cpus(samples: int = 5, interval: float = 0.02) -> int | None:
    """Runnable tasks on the machine besides the calling one, now (``None`` where unknown).

    The median over ``samples`` readings of ``/proc/loadavg`` (Linux), ``interval`` seconds
    apart, of the runnable scheduling entities, less the calling thread: an instantaneous
    count, unlike the load averages, which trail a change by a minute.
    """
    import time

    counts = []
    for sample in range(samples):
        try:
            with open("/proc/loadavg") as loadavg:
                counts.append(int(loadavg.read().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            return None
        if sample + 1 < samples:
            time.sleep(interval)
    return max(0, sorted(counts)[len(counts) // 2])


def threads_for_load() -> int | None:
    """1 when other work already keeps every CPU available to this process busy, else ``None`` (pools as they are).

    On CPUs busy with other work, thread pools wait for descheduled peers and burn CPU
    without speeding up (:func:`threads`); one thread then runs as fast for less CPU. On
    an idle machine the pools are left alone. The commands of ``gp-couple`` use this when
    ``--threads`` is not given.
    """
    busy = busy_cpus()
    return 1 if busy is not None and busy >= available_cpus() else None


@contextlib.contextmanager
def threads(num_threads: int | None) -> Iterator[int]:
    """Bound torch's, numba's and every BLAS/OpenMP thread pool to ``num_threads`` inside the block.

    Sets torch's intra-op threads (:func:`torch.set_num_threads`), numba's threads for
    the compiled parallel walk sampler (:func:`numba.set_num_threads`, at most numba's
    pool size ``NUMBA_NUM_THREADS``) and the BLAS/OpenMP pools of loaded libraries
    (OpenBLAS or MKL behind NumPy/SciPy, OpenMP; ``threadpoolctl.threadpool_limits``).
    All of them return to their previous values on exit, also when an exception
    escapes; blocks nest. The walks do not depend on the thread count (the sampler's
    random streams are counter-based), and neither do streamed predictions' training sides
    (factorised on one BLAS thread); threaded torch and LAPACK reductions may sum in
    another order, so other results can differ in their last bits between thread counts.
    torch's inter-op pool is left alone: it can be sized only once per process.

    :param num_threads: Threads allowed (>= 1); ``None`` changes nothing (the block
        runs with the current pools). More than :func:`available_cpus` is capped there
        with a warning: extra threads only contend for the same CPUs, and pools of
        thousands of threads exhaust memory or crash the thread libraries.
    :return: A context manager yielding the thread count in effect (torch's).
    :raises TypeError: If ``num_threads`` is not an int or ``None``.
    :raises ValueError: If ``num_threads`` < 1.
    """
    if num_threads is None:
        import torch

        yield torch.get_num_threads()
        return
    if isinstance(num_threads, bool) or not isinstance(num_threads, int):
        raise TypeError(f"num_threads must be an int or None, got {type(num_threads).__name__}")
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    cpus = available_cpus()
    if num_threads > cpus:
        warnings.warn(f"num_threads={num_threads} is more than the {cpus} CPUs available to this process; "
                      f"using {cpus}", RuntimeWarning, stacklevel=3)
        num_threads = cpus
    import numba
    import torch
    from threadpoolctl import threadpool_limits

    previous_torch, previous_numba = torch.get_num_threads(), numba.get_num_threads()
    try:
        torch.set_num_threads(num_threads)
        numba.set_num_threads(min(num_threads, numba.config.NUMBA_NUM_THREADS))
        with threadpool_limits(limits=num_threads):
            yield num_threads
    finally:
        torch.set_num_threads(previous_torch)
        numba.set_num_threads(previous_numba)
