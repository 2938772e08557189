"""UCI regression datasets, and regression tables of your own, as ``(X, y)`` arrays.

Each dataset is the normalised CSV of ``<data_dir>/uci/`` (one header line, all numeric,
target in the last column); :func:`load_regression` also reads a CSV file of your own in
the same layout, with the target column chosen by its header name. ``cpu`` uses
``machine_numeric.csv``, which leaves out the vendor and model names and ``ERP`` (the
original paper's estimate of the target, which must not be used as an input); ``abalone``
uses ``abalone_numeric.csv``, with ``sex`` one-hot encoded. No standardisation is applied.
"""

from __future__ import annotations

import io

import numpy as np

from ._paths import PathLike, data_file, existing_path, read_text

__all__ = ["UCI_ALIASES", "UCI_DATASETS", "UCI_FILES", "load_regression", "load_uci"]

#: Dataset names accepted by :func:`load_uci`.
UCI_DATASETS: tuple[str, ...] = ("concrete", "abalone", "cpu", "power", "airfoil", "boston",
                                 "energy", "yacht", "kin8nm")

#: Name -> (file relative to the data directory, rows, columns including the target).
UCI_FILES: dict[str, tuple[str, int, int]] = {
    "concrete": ("uci/concrete/concrete.csv", 1030, 9),
    "abalone": ("uci/abalone/abalone_numeric.csv", 4177, 11),
    "cpu": ("uci/machine_cpu/machine_numeric.csv", 209, 7),
    "power": ("uci/power_plant/power_plant.csv", 9568, 5),
    "airfoil": ("uci/airfoil/airfoil.csv", 1503, 6),
    "boston": ("uci/boston_housing/boston_housing.csv", 506, 14),
    "energy": ("uci/energy/energy.csv", 768, 9),
    "yacht": ("uci/yacht/yacht.csv", 308, 7),
    "kin8nm": ("uci/kin8nm/kin8nm.csv", 8192, 9),
}

#: Alternative names (the directory names of the data snapshot).
UCI_ALIASES: dict[str, str] = {"machine_cpu": "cpu", "power_plant": "power",
                               "boston_housing": "boston"}


def load_uci(name: str, data_dir: PathLike | None = None,
             verify: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Load a UCI regression dataset.

    :param name: One of :data:`UCI_DATASETS` (``concrete``, ``abalone``, ``cpu``, ``power``,
        ``airfoil``, ``boston``, ``energy``, ``yacht``, ``kin8nm``) or an alias
        (``machine_cpu``, ``power_plant``, ``boston_housing``); case-insensitive.
    :param data_dir: Data directory (default ``$GP_COUPLE_DATA``).
    :param verify: Verify the file's SHA-256 digest (cached per process).
    :return: ``(X, y)``: inputs ``(n, d)`` float64 and targets ``(n,)`` float64, fresh
        writable arrays, unstandardised.
    :raises TypeError: If ``name`` is not a str.
    :raises ValueError: For an unknown name, a checksum mismatch, or a file that is not
        UTF-8 text (a byte-order mark is fine), or has the wrong shape or non-finite values.
    :raises FileNotFoundError: If the data directory or the file is missing.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    key = _uci_key(name)
    if key not in UCI_FILES:
        raise ValueError(f"unknown UCI dataset {name!r}: expected one of {', '.join(UCI_DATASETS)}")
    relative, rows, columns = UCI_FILES[key]
    _, table = _numeric_csv(data_file(relative, data_dir, verify), relative)
    if table.shape != (rows, columns):
        raise ValueError(f"{relative} has shape {table.shape}, expected {(rows, columns)}")
    return np.ascontiguousarray(table[:, :-1]), np.ascontiguousarray(table[:, -1])


def load_regression(name_or_path: PathLike, data_dir: PathLike | None = None, verify: bool = True, *,
                    target: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Load a UCI dataset by name (:func:`load_uci`) or a regression table of your own from a CSV file.

    The file has one header line of column names, then one row of numbers per point,
    comma-separated (a UTF-8 byte-order mark is fine); every column but the target is an input.

    :param name_or_path: A UCI name or alias (see :func:`load_uci`), or a path to a CSV file.
    :param data_dir: Data directory for UCI names (default ``$GP_COUPLE_DATA``).
    :param verify: Verify a UCI file's SHA-256 digest.
    :param target: The target column of a CSV file, by its header name (default: the
        last column). UCI datasets' targets are fixed (their last column).
    :return: ``(X, y)`` as :func:`load_uci` returns them.
    :raises TypeError: If ``name_or_path`` is neither a str nor a path, or ``target`` not a str.
    :raises ValueError: For an unknown name, a file that is not an all-numeric CSV with a
        header and at least two columns, non-finite values, an unknown ``target`` (the
        message lists the columns), or a ``target`` for a UCI dataset.
    :raises FileNotFoundError: If the file, or the data directory of a UCI name, is missing.
    """
    if target is not None and not isinstance(target, str):
        raise TypeError(f"target must be a column name (str) or None, got {type(target).__name__}")
    if isinstance(name_or_path, str) and _uci_key(name_or_path) in UCI_FILES:
        if target is not None:
            raise ValueError(f"target applies to a CSV file of your own; the UCI dataset {name_or_path!r} "
                             "predicts its last column")
        return load_uci(name_or_path, data_dir, verify)
    path = existing_path(name_or_path, "name_or_path", "UCI dataset", UCI_DATASETS, expected="a path to a CSV file",
                         missing="CSV file")
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not a CSV file")
    header, table = _numeric_csv(path, str(path))
    if table.shape[1] < 2:
        raise ValueError(f"{path} has {table.shape[1]} column: it needs an input column and a target column")
    if len(header) != table.shape[1]:
        raise ValueError(f"{path} has {len(header)} column names in its header but {table.shape[1]} columns of numbers")
    if target is None:
        column = table.shape[1] - 1
    elif target.strip() in header:
        column = header.index(target.strip())
    else:
        raise ValueError(f"{path} has no column {target!r}: its columns are {', '.join(header)}")
    inputs = np.delete(table, column, axis=1)
    return np.ascontiguousarray(inputs), np.ascontiguousarray(table[:, column])


def _uci_key(name: str) -> str:
    key = name.strip().lower()
    return UCI_ALIASES.get(key, key)


def _numeric_csv(path: PathLike, label: str) -> tuple[list[str], np.ndarray]:
    """The header's column names and the finite float64 table ``(rows, columns)`` below it."""
    text = read_text(path)
    header = [name.strip().strip('"').strip() for name in text.partition("\n")[0].rstrip("\r").split(",")]
    try:
        table = np.loadtxt(io.StringIO(text), delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    except ValueError as error:
        raise ValueError(f"{label} is not an all-numeric CSV below its header line ({error})") from error
    if table.size == 0:
        raise ValueError(f"{label} has no rows below its header line")
    if not np.all(np.isfinite(table)):
        raise ValueError(f"{label} contains NaN or infinite values")
    return header, table
