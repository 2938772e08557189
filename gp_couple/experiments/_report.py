"""Shared reporting for experiments: summaries with standard errors, tables and JSON."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Iterable, Sequence, TextIO

import numpy as np


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


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def probability(text: str) -> float:
    """argparse type: a float strictly between 0 and 1."""
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in (0, 1), got {text}")
    return value


def add_common_arguments(parser: argparse.ArgumentParser, *, repeats: int, seed: int = 0) -> None:
    """Add ``--json``, ``--seed`` and ``--repeats`` to an experiment's parser."""
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--seed", type=int, default=seed, help="base random seed (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=repeats,
                        help="independent repeats per configuration (default %(default)s)")


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
