"""UCI regression datasets as ``(X, y)`` arrays.

Each dataset is the normalised CSV of ``<data_dir>/uci/`` (one header line, all numeric,
target in the last column). ``cpu`` uses ``machine_numeric.csv``, which leaves out the
vendor and model names and ``ERP`` (the original paper's estimate of the target, which
must not be used as an input); ``abalone`` uses ``abalone_numeric.csv``, with ``sex``
one-hot encoded. No standardisation is applied.
"""

from __future__ import annotations

import io

import numpy as np

from ._paths import PathLike, data_file, read_text

__all__ = ["UCI_ALIASES", "UCI_DATASETS", "UCI_FILES", "load_uci"]

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
    key = name.strip().lower()
    key = UCI_ALIASES.get(key, key)
    if key not in UCI_FILES:
        raise ValueError(f"unknown UCI dataset {name!r}: expected one of {', '.join(UCI_DATASETS)}")
    relative, rows, columns = UCI_FILES[key]
    path = data_file(relative, data_dir, verify)
    text = read_text(path)
    try:
        table = np.loadtxt(io.StringIO(text), delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    except ValueError as error:
        raise ValueError(f"{relative} is not an all-numeric CSV ({error})") from error
    if table.shape != (rows, columns):
        raise ValueError(f"{relative} has shape {table.shape}, expected {(rows, columns)}")
    if not np.all(np.isfinite(table)):
        raise ValueError(f"{relative} contains NaN or infinite values")
    return np.ascontiguousarray(table[:, :-1]), np.ascontiguousarray(table[:, -1])
