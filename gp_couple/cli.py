"""The ``gp-couple`` command line: one sub-command per experiment.

``gp-couple --help`` lists the commands from the table below without importing torch or
any experiment, so it answers at once; ``gp-couple COMMAND ...`` imports only that
command's module (``gp_couple.experiments.<module>``, which defines
``register(subparsers)``).

Errors reach the user as one line, ``gp-couple COMMAND: error: ...``, whatever raised
them (bad input, a missing or unreadable file, a failure inside a library); ``--debug``
shows the full traceback instead. Progress bars appear on a terminal and ``--quiet``
silences them (:mod:`gp_couple.progress`). Every output path (``--json FILE``, ``--plot DIR``,
``--save-couplings DIR``) is checked before the command starts
(:func:`gp_couple.experiments._report.check_outputs`), and files are written atomically.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import logging
import re
import sys
from dataclasses import dataclass
from typing import Any, NoReturn, Sequence

__all__ = ["COMMANDS", "Command", "build_parser", "main"]


@dataclass(frozen=True)
class Command:
    """A sub-command: its module in ``gp_couple.experiments``, a summary and an example.

    :ivar module: Module name in :mod:`gp_couple.experiments` defining ``register``.
    :ivar summary: One line for the ``gp-couple --help`` listing.
    :ivar example: A command line shown at the end of ``gp-couple COMMAND --help``.
    """

    module: str
    summary: str
    example: str


#: Every sub-command, in the order ``gp-couple --help`` lists them.
COMMANDS: dict[str, Command] = {
    "demo": Command("demo", "quick mesh-interpolation demo on a built-in mesh (no data needed)",
                    "gp-couple demo --walkers 16 32 --repeats 3 --plot figures/demo"),
    "grf-gram": Command("grf_gram", "Gram-matrix error of iid / antithetic / sigma-coupled GRFs",
                        "gp-couple grf-gram --graph karate --p-halt 0.3 0.5 --walkers 2 --repeats 10 "
                        "--plot figures/grf-gram"),
    "pagerank": Command("pagerank", "PageRank error with iid / antithetic / sigma walkers",
                        "gp-couple pagerank --graphs karate dolphins --p-halt 0.3 0.5 --repeats 100"),
    "mesh": Command("mesh", "mesh interpolation with iid / antithetic / sigma GRF-GPs",
                    "gp-couple mesh --mesh teapot --data-dir ../shared/datasets --plot figures/mesh"),
    "traffic": Command("traffic", "San Jose traffic-speed interpolation with GRF-GPs",
                       "gp-couple traffic --data-dir ../shared/datasets --repeats 3 --plot figures/traffic"),
    "traffic-nuts": Command("traffic_nuts", "NUTS posterior of the traffic GRF-GP's outputscale, gamma and noise",
                            "gp-couple traffic-nuts --data-dir ../shared/datasets --num-samples 200 --warmup 200"),
    "kernel-estimation": Command(
        "kernel_estimation", "kernel RMSE, posterior KL and predictive RMSE of coupled RFFs/RLFs on UCI data",
        "gp-couple kernel-estimation --dataset boston --data-dir ../shared/datasets --repeats 5"),
    "attention": Command("attention", "kernel variance, covariance and attention MSE of norm-coupled Performers",
                         "gp-couple attention --num-features 16 64 --draws 200 --repeats 5"),
    "copula-learning": Command(
        "copula", "learn a Gaussian-copula norm coupling and compare it with PNC",
        "gp-couple copula-learning --dataset boston --data-dir ../shared/datasets --steps 200"),
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
                       help="no progress bars or notes on stderr (bars appear only on a terminal anyway)")
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
        kwargs["description"] = plain_text(kwargs.get("description") or (command and command.summary))
        if command is not None:
            kwargs["help"] = command.summary
            kwargs.setdefault("epilog", f"example:\n  {command.example}")
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs["parents"] = [*kwargs.get("parents", ()), self._parent]
        return self._subparsers.add_parser(name, **kwargs)


def build_parser(commands: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser with ``commands`` fully registered (default: all of them).

    Commands not in ``commands`` are listed with their summary only, so that building the
    parser for ``--help`` or for one command imports nothing else.

    :param commands: Names of :data:`COMMANDS` whose modules are imported and registered.
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
            importlib.import_module(f"gp_couple.experiments.{command.module}").register(wrapped)
        else:
            subparsers.add_parser(name, help=command.summary, add_help=False)
    return parser


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``gp-couple`` and ``python -m gp_couple``.

    :param argv: Arguments (default ``sys.argv[1:]``).
    :return: The exit status: 0 on success, 2 for bad input or files, 1 for any other
        error, 130 when interrupted.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(arguments)
    parser = build_parser([command] if command in COMMANDS else [])
    args = parser.parse_args(arguments)
    _configure_logging(args)
    from .progress import progress_bars

    try:
        from .experiments._report import check_outputs
        from .settings import threads

        # Every output path is checked before the run, not found unusable after it.
        check_outputs(args)
        # Commands with --threads run with their thread pools bounded (None: unchanged).
        with progress_bars(not args.quiet), threads(getattr(args, "threads", None)):
            args.func(args)
    except KeyboardInterrupt:
        print(f"gp-couple {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # every error becomes one line; --debug shows the traceback
        if args.debug:
            raise
        print(f"gp-couple {args.command}: error: {error_line(error)}", file=sys.stderr)
        return 2 if isinstance(error, (ValueError, TypeError, OSError)) else 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
