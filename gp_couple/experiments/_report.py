"""Shared reporting for experiments: summaries with standard errors, tables and JSON."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .._files import check_output_file, check_output_folder, write_text_atomically

logger = logging.getLogger(__name__)

#: The largest count any integer option accepts (iterations, steps, sizes, features):
#: beyond it a run would go on for days or exhaust memory, so a typo such as
#: ``--steps 10000000000`` is refused at once rather than discovered by a kill.
MAX_COUNT = 10_000_000
#: The largest ``--repeats`` (``--splits``): every repeat redoes a whole configuration.
MAX_REPEATS = 100_000
#: The largest number of random draws per configuration (``--draws``, ``--eval-draws``).
MAX_DRAWS = 1_000_000
#: The largest number of walkers per node (``--walkers``; the walk sampler also refuses
#: walks that would not fit in memory).
MAX_WALKERS = 100_000
#: The largest seed: seeds are hashed into 64-bit generator states.
MAX_SEED = 2**64 - 1


def summarize(samples: Iterable[float]) -> dict[str, float | int | None]:
    """Mean, standard error of the mean and number of repeats of ``samples``.

    With a single repeat the standard error is ``None`` (``null`` in JSON): it is
    undefined, and NaN is not valid JSON.

    NaNs are an error rather than silently dropped: an experiment that produced one has
    a bug or a numerical failure that must be reported.
    """
    values = np.asarray(list(samples), dtype=np.float64)
    if values.size == 0:
        raise ValueError("cannot summarize zero samples")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"non-finite values among samples: {values[~np.isfinite(values)][:5]}")
    se = float(values.std(ddof=1) / math.sqrt(values.size)) if values.size > 1 else None
    return {"mean": float(values.mean()), "se": se, "n": int(values.size)}


def add_ratio_to_baseline(rows: list[dict[str, Any]], metric: str, *, key: str = "coupling",
                          baseline: str = "iid") -> None:
    """Add ``<metric>_vs_<baseline>``: each row's mean over the baseline row's mean."""
    reference = next((row[metric]["mean"] for row in rows if row[key] == baseline), None)
    if not reference:
        return
    for row in rows:
        row[f"{metric}_vs_{baseline}"] = row[metric]["mean"] / reference


# argparse types: argparse names the option in its message ("argument --seed: expected
# a non-negative integer, got -1"), which a check deep in the library cannot.


def _number(text: str, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None


def bounded_int(minimum: int, maximum: int) -> Callable[[str], int]:
    """argparse type: an integer in ``[minimum, maximum]`` (the bound is named in the error)."""
    kind = "a positive" if minimum == 1 else "a non-negative" if minimum == 0 else "an"

    def parse(text: str) -> int:
        value = _number(text, int)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {kind} integer, got {text}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected at most {maximum}, got {text} (a larger value "
                                             "would not finish in reasonable time or memory)")
        return value

    parse.__name__ = f"integer in [{minimum}, {maximum}]"
    return parse


#: argparse type: an integer in ``[1, MAX_COUNT]``.
positive_int = bounded_int(1, MAX_COUNT)
#: argparse type: an integer in ``[0, MAX_COUNT]`` (iteration counts that may be zero).
non_negative_int = bounded_int(0, MAX_COUNT)
#: argparse type of ``--seed``: an integer in ``[0, 2**64 - 1]``.
seed_int = bounded_int(0, MAX_SEED)
#: argparse type of ``--repeats``: an integer in ``[1, MAX_REPEATS]``.
repeats_int = bounded_int(1, MAX_REPEATS)
#: argparse type of ``--draws``: an integer in ``[1, MAX_DRAWS]``.
draws_int = bounded_int(1, MAX_DRAWS)
#: argparse type of ``--walkers``: an integer in ``[1, MAX_WALKERS]``.
walkers_int = bounded_int(1, MAX_WALKERS)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (learning rates, scales; rejects nan and inf)."""
    value = _number(text, float)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text}")
    return value


def probability(text: str) -> float:
    """argparse type: a float strictly between 0 and 1."""
    value = _number(text, float)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in (0, 1), got {text}")
    return value


def probability_or_auto(text: str) -> float | str:
    """argparse type: ``auto`` or a float strictly between 0 and 1."""
    return "auto" if text == "auto" else probability(text)


def add_common_arguments(parser: argparse.ArgumentParser, *, repeats: int, seed: int = 0) -> None:
    """Add ``--json``, ``--seed``, ``--repeats`` and ``--plot`` to an experiment's parser."""
    add_json_argument(parser)
    parser.add_argument("--seed", type=seed_int, default=seed, help="base random seed")
    parser.add_argument("--repeats", type=repeats_int, default=repeats,
                        help=f"independent repeats per configuration (at most {MAX_REPEATS})")
    add_plot_argument(parser)


#: Namespace attribute listing a command's output options as ``(dest, option, kind)``.
OUTPUTS = "output_options"


def add_output_argument(parser: argparse.ArgumentParser, option: str, *, kind: str,
                        **kwargs: Any) -> argparse.Action:
    """Add an option naming an output ``"folder"`` or ``"file"``, checked by :func:`check_outputs`.

    :param parser: The command's parser.
    :param option: The option string (e.g. ``"--save-couplings"``).
    :param kind: ``"folder"`` (files are written into it) or ``"file"``.
    :param kwargs: Passed to :meth:`argparse.ArgumentParser.add_argument`.
    :return: The argparse action.
    """
    if kind not in ("folder", "file"):
        raise ValueError(f"kind must be 'folder' or 'file', got {kind!r}")
    action = parser.add_argument(option, **kwargs)
    declared = tuple(parser.get_default(OUTPUTS) or ())
    parser.set_defaults(**{OUTPUTS: (*declared, (action.dest, option, kind))})
    return action


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--json [FILE]``: the report as JSON on standard output, or written (atomically) to ``FILE``."""
    add_output_argument(parser, "--json", kind="file", nargs="?", const=True, default=False, metavar="FILE",
                        help="print the report as JSON, or write it to FILE (replaced in one step "
                             "when the run has finished)")


def add_plot_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--plot DIR``: write the experiment's figures (PNG) into ``DIR``."""
    add_output_argument(parser, "--plot", kind="folder", metavar="DIR", default=None,
                        help="write the figures (PNG) into this folder; needs matplotlib "
                             "(pip install 'gp-couple[plot]')")


def _same_file(first: Path, second: Path) -> bool:
    if first.exists() and second.exists():
        return os.path.samefile(first, second)
    return os.path.realpath(first) == os.path.realpath(second)


def _is_standard_output(path: Path) -> bool:
    """Whether standard output is redirected to the file ``path`` (e.g. ``--json > path``)."""
    try:
        redirected, target = os.fstat(sys.stdout.fileno()), os.stat(path)
    except (AttributeError, OSError, ValueError):  # no real stdout (captured), or no such file
        return False
    return (redirected.st_dev, redirected.st_ino) == (target.st_dev, target.st_ino)


def check_outputs(args: argparse.Namespace) -> None:
    """Check every output path of a command before it runs (:mod:`gp_couple._files`).

    Every option declared with :func:`add_output_argument` that was given is checked:
    a folder (``--plot``, ``--save-couplings``) must be a folder or creatable, a file
    (``--json FILE``) absent or a regular file, both writable; and a file output may not
    be the same path as another output. So an unusable path fails at once instead of
    after the computation, whose results it would lose. The CLI calls it for every
    command; :func:`figure_folder` checks ``--plot`` again for direct callers.

    :raises ValueError: Naming the option and the path.
    """
    chosen: list[tuple[str, str, Path]] = []
    for dest, option, kind in getattr(args, OUTPUTS, ()):
        value = getattr(args, dest, None)
        if isinstance(value, bool) or not value:
            continue  # not given (or --json without FILE: standard output)
        if kind == "folder" and _is_standard_output(Path(value)):
            raise ValueError(f"{option} {str(value)!r} is the file standard output is redirected to (where "
                             "the report goes): name a folder for the figures")
        check = check_output_folder if kind == "folder" else check_output_file
        path = check(value, option)
        for other_option, other_kind, other in chosen:
            if "file" in (kind, other_kind) and _same_file(path, other):
                raise ValueError(f"{option} and {other_option} name the same path {str(path)!r}: "
                                 "one output would overwrite the other")
        chosen.append((option, kind, path))


def figure_folder(args: argparse.Namespace) -> Path | None:
    """The folder named by ``--plot``, or ``None`` when no figures are wanted.

    Call it before the long work: a missing matplotlib or an unusable folder is reported
    at once, not after it.

    :raises ImportError: If figures are wanted and matplotlib is not installed.
    :raises ValueError: If the folder cannot be written (:func:`check_outputs`).
    """
    folder = getattr(args, "plot", None)
    if not folder:
        return None
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ImportError("--plot needs matplotlib: pip install 'gp-couple[plot]'")
    return check_output_folder(folder, "--plot")


def log_figures(paths: Iterable[Path]) -> list[Path]:
    """Tell the user (log level INFO, on stderr in the CLI) which figures were written."""
    written = list(paths)
    for path in written:
        logger.info("wrote %s", path)
    return written


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Plain-text table; ``{"mean", "se"}`` cells print as ``mean ± se``."""

    def cell(value: Any) -> str:
        if isinstance(value, dict) and "mean" in value:
            se = value.get("se")
            return f"{value['mean']:.4g} ± {se:.2g}" if se is not None and math.isfinite(se) else f"{value['mean']:.4g}"
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    body = [[cell(row.get(column, "")) for column in columns] for row in rows]
    widths = [max(len(column), *(len(r[i]) for r in body)) if body else len(column)
              for i, column in enumerate(columns)]
    lines = ["  ".join(column.ljust(w) for column, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(value.ljust(w) for value, w in zip(r, widths)) for r in body]
    return "\n".join(lines)


def emit(report: dict[str, Any], *, as_json: bool | str | os.PathLike, columns: Sequence[str] | None = None,
         stream: TextIO | None = None) -> None:
    """Print ``report`` as JSON, or its ``results`` rows as a table; or write the JSON to a file.

    :param report: The report.
    :param as_json: ``False`` for the table, ``True`` for JSON on ``stream``, or a path:
        the JSON is written there atomically (its folder is created), nothing is printed.
    :param columns: Table columns (default: those of the first row).
    :param stream: Where to print (default standard output).
    """
    stream = stream or sys.stdout
    if as_json:
        # Serialised whole before anything is written: an unserialisable value leaves
        # no half-written report behind.
        text = json.dumps(report, indent=2, default=_json_default) + "\n"
        if isinstance(as_json, bool):
            stream.write(text)
            return
        path = Path(as_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, text)
        logger.info("wrote %s", path)
        return
    title = report.get("experiment", "results")
    stream.write(f"{title}\n")
    for note in report.get("notes", []):
        stream.write(f"  {note}\n")
    rows = report.get("results", [])
    if rows:
        stream.write(format_table(rows, columns or list(rows[0].keys())) + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")
