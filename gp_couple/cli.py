"""The ``gp-couple`` command line: one sub-command per experiment.

``gp-couple --help`` lists the commands from the table below, and ``gp-couple COMMAND
--help`` or a mistyped option answers from the command's options
(:mod:`gp_couple.experiments._options`), without importing torch or any experiment, so
both answer at once; only a command that runs imports its module
(``gp_couple.experiments.<module>``, which defines ``run(args)`` returning the report).

Errors reach the user as one line, ``gp-couple COMMAND: error: ...``, whatever raised
them (bad input, a missing or unreadable file, a failure inside a library), naming
options as they are typed (a library's ``data_dir`` is ``--data-dir``); ``--debug``
shows the full traceback instead. Every command reports progress the same way
(:mod:`gp_couple.progress`): bars on a terminal, a log line now and then otherwise (a
pipe, a file, a CI log); ``--quiet`` silences both. Every output path (``--json FILE``, ``--plot DIR``,
``--save-couplings DIR``) is checked before the command starts
(:func:`gp_couple.experiments._report.check_outputs`), and files are written atomically.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = ["COMMANDS", "Command", "as_typed", "build_parser", "main"]


@dataclass(frozen=True)
class Command:
    """A sub-command: its module in ``gp_couple.experiments``, a summary and an example.

    Its options are declared in :data:`gp_couple.experiments._options.COMMAND_OPTIONS`.

    :ivar module: Module name in :mod:`gp_couple.experiments` defining ``run(args)``.
    :ivar summary: One line for the ``gp-couple --help`` listing.
    :ivar example: A command line shown at the end of ``gp-couple COMMAND --help``.
    :ivar description: The first line of ``gp-couple COMMAND --help`` (default: the summary).
    """

    module: str
    summary: str
    example: str
    description: str | None = None


#: Every sub-command, in the order ``gp-couple --help`` lists them.
COMMANDS: dict[str, Command] = {
    "demo": Command("demo", "quick mesh-interpolation demo on a built-in mesh (no data needed)",
                    "gp-couple demo --walkers 16 32 --repeats 3 --plot figures/demo",
                    "GRF-GP mesh interpolation demo (no data needed)."),
    "grf-gram": Command("grf_gram", "Gram-matrix error of iid / antithetic / sigma-coupled GRFs",
                        "gp-couple grf-gram --graph karate --p-halt 0.3 0.5 --walkers 2 --repeats 10 "
                        "--plot figures/grf-gram",
                        "gp-couple grf-gram: Gram-matrix estimation with coupled GRFs (paper, Figure 3, Section 4.2\n"
                        "[fig:permuton_grf], Figure 10, Appendix F.1 [fig:grfs_more_graphs])."),
    "pagerank": Command("pagerank", "PageRank error with iid / antithetic / sigma walkers",
                        "gp-couple pagerank --graphs karate dolphins --p-halt 0.3 0.5 --repeats 100",
                        "PageRank estimation with two coupled walkers (paper, Appendix E)."),
    "mesh": Command("mesh", "mesh interpolation with iid / antithetic / sigma GRF-GPs",
                    "gp-couple mesh --mesh teapot --data-dir ../shared/datasets --plot figures/mesh",
                    "Probabilistic mesh interpolation (paper, Section 4.2 and Appendix F.2)."),
    "traffic": Command("traffic", "San Jose traffic-speed interpolation with GRF-GPs",
                       "gp-couple traffic --data-dir ../shared/datasets --repeats 3 --plot figures/traffic",
                       "Probabilistic traffic interpolation (paper, Appendix F.3)."),
    "traffic-nuts": Command("traffic_nuts", "NUTS posterior of the traffic GRF-GP's outputscale, gamma and noise",
                            "gp-couple traffic-nuts --data-dir ../shared/datasets --num-samples 200 --warmup 200",
                            "Fully Bayesian GRF-GP on the traffic graph: NUTS over outputscale, gamma and noise."),
    "kernel-estimation": Command(
        "kernel_estimation", "kernel RMSE, posterior KL and predictive RMSE of coupled RFFs/RLFs on UCI or CSV data",
        "gp-couple kernel-estimation --dataset boston --data-dir ../shared/datasets --repeats 5\n"
        "  gp-couple kernel-estimation --dataset ./my.csv --target price --repeats 5",
        "gp-couple kernel-estimation: coupled RFFs and RLFs on UCI data or a CSV file of your own (paper, "
        "Table 1,\nSection 3.3 [tab:rff], Table 2, Appendix B.2 [tab:kld], Table 3, Appendix B.2 [tab:pred-rmse])."),
    "attention": Command("attention", "kernel variance, covariance and attention MSE of norm-coupled Performers",
                         "gp-couple attention --num-features 16 64 --draws 200 --repeats 5",
                         "gp-couple attention: norm couplings for Performer attention (paper, Appendix B.3\n"
                         '"Norm-coupled RLFs in Performers" [app:performers], Figure 7, Appendix B.3 [fig:var_fig]).'),
    "predict-graph": Command(
        "predict_graph", "fit a graph GP to your node values on your graph and predict every node (torchrun-ready)",
        "gp-couple predict-graph --graph edges.csv --observations values.csv --output predictions.npy\n"
        "  torchrun --nproc-per-node 4 -m gp_couple predict-graph --graph edges.csv --observations values.csv "
        "--output predictions.npy",
        "gp-couple predict-graph: a graph GP (the exact GP on small graphs, a GRF-GP on large ones) trained\n"
        "on your observed node values, predicting the mean and variance at every node of your graph, chunk\n"
        "by chunk, on one or many processes."),
    "copula-learning": Command(
        "copula", "learn a Gaussian-copula norm coupling and compare it with PNC",
        "gp-couple copula-learning --dataset boston --data-dir ../shared/datasets --iterations 200",
        "gp-couple copula-learning: learning a Gaussian-copula norm coupling (paper, Appendix A.5\n"
        '"Copulas as numerical OT solvers" [app:copulas], Figure 5, Appendix A.5 [fig:boston-losses]).'),
}

_DESCRIPTION = "Variance-reducing couplings for random features (Reid et al., ICLR 2025)."
_EPILOG = ("Run 'gp-couple COMMAND --help' for a command's options and an example. Every command\n"
           "prints a table (JSON with --json, or into FILE with --json FILE) and writes its figures\n"
           "as PNG files with --plot DIR.\n\n"
           "example:\n  gp-couple demo")

#: reST markup that docstring-derived descriptions may carry, and its plain-text form.
_REST_PATTERNS = ((re.compile(r":math:`\\?([^`]*)`"), r"\1"), (re.compile(r":\w+:`~?([^`]*)`"), r"\1"),
                  (re.compile(r"``([^`]*)``"), r"\1"), (re.compile(r"`([^`]*)`"), r"\1"))


def plain_text(text: str | None) -> str | None:
    """``text`` without reST roles and literals (``:math:`\\sigma``` becomes ``sigma``)."""
    if text is None:
        return None
    for pattern, replacement in _REST_PATTERNS:
        text = pattern.sub(replacement, text)
    # Leftovers of a docstring's first line: a leading r, quotes, backquotes.
    return text.strip("r\"`' ").replace("``", "")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the example's layout and appends every option's default to its help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        flag = action.nargs == 0  # store_true, help, version: nothing to show
        if "%(default)" not in text and not flag and action.default not in (None, argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text

    def _expand_help(self, action: argparse.Action) -> str:
        if isinstance(action.default, (list, tuple)):
            # "16 32 64", as it is typed, rather than "[16, 32, 64]".
            action = copy.copy(action)
            action.default = " ".join(map(str, action.default))
        return super()._expand_help(action)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line that names the option."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _runtime_options(*, top_level: bool) -> argparse.ArgumentParser:
    """``--quiet`` and ``--debug``, accepted before and after the command name."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("output")
    # After the command, an option left out must not overwrite one given before it.
    default = False if top_level else argparse.SUPPRESS
    group.add_argument("--quiet", action="store_true", default=default,
                       help="no progress (bars on a terminal, a line every 30 s in a log) or notes on stderr")
    group.add_argument("--debug", action="store_true", default=default,
                       help="show the full traceback of an error and debug log messages")
    return parent


class _Subcommands:
    """Wraps ``add_subparsers()`` so that every command gets the same help style,
    plain-text description, example epilog and runtime options."""

    def __init__(self, subparsers: Any) -> None:
        self._subparsers = subparsers
        self._parent = _runtime_options(top_level=False)

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        command = COMMANDS.get(name)
        kwargs["description"] = plain_text(kwargs.get("description")
                                           or (command and (command.description or command.summary)))
        if command is not None:
            kwargs["help"] = command.summary
            kwargs.setdefault("epilog", f"example:\n  {command.example}")
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs["parents"] = [*kwargs.get("parents", ()), self._parent]
        return self._subparsers.add_parser(name, **kwargs)


def build_parser(commands: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser with ``commands`` fully registered (default: all of them).

    Commands not in ``commands`` are listed with their summary only. Registering a command
    imports neither torch nor its module (:mod:`gp_couple.experiments._options`); running
    it imports the module.

    :param commands: Names of :data:`COMMANDS` whose options are registered.
    :return: The parser.
    """
    chosen = list(COMMANDS) if commands is None else list(commands)
    parser = _Parser(prog="gp-couple", description=_DESCRIPTION, epilog=_EPILOG,
                                     formatter_class=_HelpFormatter, parents=[_runtime_options(top_level=True)])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    wrapped = _Subcommands(subparsers)
    for name, command in COMMANDS.items():
        if name in chosen:
            from .experiments._options import COMMAND_OPTIONS

            command_parser = wrapped.add_parser(name)
            columns = COMMAND_OPTIONS[name](command_parser)
            # What the user typed for each destination, for the error messages (the first option wins).
            typed = {action.dest: action.option_strings[0] for action in reversed(command_parser._actions)
                     if action.option_strings}
            command_parser.set_defaults(func=functools.partial(_run_command, command.module, columns),
                                        option_names=typed)
        else:
            subparsers.add_parser(name, help=command.summary, add_help=False)
    return parser


def _run_command(module: str, columns: Any, args: argparse.Namespace) -> None:
    """Import the command's module, run it and print (or write) its report."""
    from .experiments._report import emit

    report = importlib.import_module(f"gp_couple.experiments.{module}").run(args)
    if report is None:  # a process other than rank 0 of a multi-process command
        return
    emit(report, as_json=args.json, columns=columns(args) if callable(columns) else columns)


def as_typed(message: str, option_names: dict[str, str]) -> str:
    """``message`` with the library's parameter names replaced by the options that set them.

    Only names with an underscore are replaced (``data_dir`` becomes ``--data-dir``,
    ``data_dir=...`` becomes ``--data-dir=...``): a single word (``seed``, ``test``) is too
    likely to be prose. Names inside a path are left alone.

    :param message: An error message.
    :param option_names: Option string per argparse destination (``{"data_dir": "--data-dir"}``).
    :return: The message as the user would type its options.
    """
    for dest, option in option_names.items():
        if "_" in dest:
            message = re.sub(rf"(?<![\w./-]){re.escape(dest)}(?![\w/-])", option, message)
    return message


def _command_in(argv: Sequence[str]) -> str | None:
    """The first argument naming a command (options before it take no values)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def error_line(error: BaseException) -> str:
    """One line describing ``error`` for the user.

    Bad input (``ValueError``, ``TypeError``) is described by its message alone, file
    errors by what went wrong and the path, anything else by its type and message.

    :param error: The exception.
    :return: The line (without the ``gp-couple COMMAND: error:`` prefix).
    """
    if isinstance(error, OSError) and error.strerror:
        path = f": {error.filename}" if error.filename is not None else ""
        return f"{error.strerror}{path}"
    message = str(error).strip() or type(error).__name__
    if isinstance(error, KeyError):
        message = f"missing key {message}"
    first = message.splitlines()[0].strip()
    if not isinstance(error, (ValueError, TypeError, OSError)):
        first = f"{type(error).__name__}: {first}"
    return first + (" ..." if len(message.splitlines()) > 1 else "")


def _configure_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.debug else logging.WARNING if args.quiet else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("gp_couple")
    for old in [h for h in logger.handlers if getattr(h, "_gp_couple_cli", False)]:
        logger.removeHandler(old)
    handler._gp_couple_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)


#: Environment variables by which a user tunes glibc's malloc; any of them set, the commands leave it alone.
_MALLOC_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


def _on_glibc() -> bool:
    """Whether this process's C library is glibc (whose ``mallopt`` :func:`_reuse_freed_memory` calls)."""
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (AttributeError, ValueError, OSError):  # no confstr, or not a name this C library knows
        return False


def _reuse_freed_memory() -> None:
    """Have glibc's ``malloc`` serve every block from its heap and keep freed memory for reuse.

    glibc serves blocks above 32 MB (less before its threshold adapts) by ``mmap`` and
    unmaps them when they are freed, so a block of that size made again, as every
    evaluation of a dense likelihood makes its n x n matrices and every draw of walks its
    buffers, is faulted in and zeroed by the kernel page by page, every time. With
    ``mmap`` off (``M_MMAP_MAX`` 0) and the heap trimmed only above 2 GB free at its top
    (``M_TRIM_THRESHOLD``), freed blocks are reused instead; the process keeps its peak
    memory until it exits (benchmarks/RESULTS.md, "Freed memory reused"). Only for the
    ``gp-couple`` process itself, on glibc, and not where the user tuned ``malloc``
    (any of ``_MALLOC_VARIABLES`` set).
    """
    if any(name in os.environ for name in _MALLOC_VARIABLES) or not _on_glibc():
        return
    import ctypes

    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    trim_threshold, mmap_max = -1, -4  # <malloc.h>'s M_TRIM_THRESHOLD and M_MMAP_MAX
    mallopt(trim_threshold, 2 ** 31 - 1)
    mallopt(mmap_max, 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``gp-couple`` and ``python -m gp_couple``.

    Run as the program (``argv`` not given), it also sets up the process's memory
    allocator (freed blocks reused, not returned to the system).

    :param argv: Arguments (default ``sys.argv[1:]``).
    :return: The exit status: 0 on success, 2 for bad input or files, 1 for any other
        error, 130 when interrupted.
    """
    # The commands are programs of their own, so they may set up their process: idle
    # OpenMP workers (torch's, MKL's and numba's) spin only briefly, then sleep. Spinning
    # for milliseconds (GNU OpenMP's default) multiplies the CPU time a run burns on a
    # machine busy with other work; sleeping at once costs a futex wake-up per parallel
    # region, a large share of the main job's time on an idle machine. 1,000 spins (tens
    # of microseconds) keep both costs small (benchmarks/RESULTS.md, "OpenMP workers that spin
    # briefly"). GNU OpenMP reads these when torch loads, which is after parsing; a wait
    # policy or spin count the user set is kept.
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = "1000"
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # OpenBLAS (numpy's and scipy's BLAS and LAPACK; torch has its own) on one thread, read
    # when numpy loads: its threaded factorisations (potrf, potri) at the sizes the commands
    # use are no faster on an idle machine and several times slower, burning CPU, on cores
    # shared with other work (benchmarks/RESULTS.md, "Thread pools under CPU contention").
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # torch's CPU allocator backs tensors of 2 MB or more with transparent huge pages (Linux;
    # read at the process's first tensor, so set here, before any). Every evaluation of the
    # dense likelihood allocates its n x n covariance, factor and gradients afresh, and
    # faulting those in 4 kB pages costs several per cent of a training run's CPU time
    # (benchmarks/RESULTS.md, "Page faults in training").
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    if argv is None:
        _reuse_freed_memory()
    arguments = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(arguments)
    parser = build_parser([command] if command in COMMANDS else [])
    args = parser.parse_args(arguments)
    _configure_logging(args)
    from .progress import progress_bars

    try:
        from .experiments._report import check_outputs
        from .settings import threads, threads_for_load

        # Every output path is checked before the run, not found unusable after it.
        check_outputs(args)
        # Commands with --threads run with their thread pools bounded; without the option,
        # on one thread when other work keeps every CPU busy (else the pools are unchanged).
        count = getattr(args, "threads", None)
        if count is None and hasattr(args, "threads"):
            count = threads_for_load()
            if count is not None:
                logging.getLogger(__name__).info("the CPUs are busy with other work: running on %d thread", count)
        with progress_bars(not args.quiet), threads(count):
            args.func(args)
    except KeyboardInterrupt:
        print(f"gp-couple {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # every error becomes one line; --debug shows the traceback
        if args.debug:
            raise
        line = as_typed(error_line(error), getattr(args, "option_names", {}))
        print(f"gp-couple {args.command}: error: {line}", file=sys.stderr)
        return 2 if isinstance(error, (ValueError, TypeError, OSError)) else 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
