"""Shared reporting for experiments: summaries with standard errors, tables and JSON."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence, TextIO

import numpy as np

logger = logging.getLogger(__name__)


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


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (seeds, iteration counts that may be zero)."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text}")
    return value


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
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--seed", type=non_negative_int, default=seed, help="base random seed")
    parser.add_argument("--repeats", type=positive_int, default=repeats,
                        help="independent repeats per configuration")
    add_plot_argument(parser)


def add_plot_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--plot DIR``: write the experiment's figures (PNG) into ``DIR``."""
    parser.add_argument("--plot", metavar="DIR", default=None,
                        help="write the figures (PNG) into this folder; needs matplotlib "
                             "(pip install 'gp-couple[plot]')")


def figure_folder(args: argparse.Namespace) -> Path | None:
    """The folder named by ``--plot``, or ``None`` when no figures are wanted.

    Call it before the long work: a missing matplotlib is reported at once, not after it.

    :raises ImportError: If figures are wanted and matplotlib is not installed.
    """
    folder = getattr(args, "plot", None)
    if not folder:
        return None
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ImportError("--plot needs matplotlib: pip install 'gp-couple[plot]'")
    return Path(folder)


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


def emit(report: dict[str, Any], *, as_json: bool, columns: Sequence[str] | None = None,
         stream: TextIO | None = None) -> None:
    """Print ``report`` as JSON, or its ``results`` rows as a table."""
    stream = stream or sys.stdout
    if as_json:
        json.dump(report, stream, indent=2, default=_json_default)
        stream.write("\n")
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
