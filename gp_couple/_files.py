"""Output files: checked before a run starts, written atomically.

A long computation must not lose its results to an output path that turns out to be
unusable at the end, and a write that fails half-way must not destroy the previous good
file. So

* :func:`check_output_folder` and :func:`check_output_file` check, before any work, that
  a path can be written: a folder is an existing folder (or can be created) in which
  files can be created, a file is not a folder and lies in such a folder. They create
  nothing (the probe file they write is removed at once);
* :func:`atomic_write` writes the new content to a temporary file in the target's own
  folder and moves it over the target with :func:`os.replace`, which is atomic: readers
  and later runs see the old file or the new one, never a truncated one, and a failure
  (a full disk, an exception while serialising) leaves the old file as it was.

Every file gp_couple writes (JSON reports, figures, σ-couplings) goes through
:func:`atomic_write`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_write", "write_text_atomically", "check_output_file", "check_output_folder"]

PathLike = str | os.PathLike


def _target(path: PathLike, name: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(path).__name__}")
    if not os.fspath(path):
        raise ValueError(f"{name} is an empty path")
    return Path(path)


@contextlib.contextmanager
def atomic_write(path: PathLike, mode: str = "w", *, encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """Open ``path`` for writing so that it is replaced in one step when the block ends.

    The content goes to a temporary file in the same folder (so the final
    :func:`os.replace` never crosses file systems), which is flushed to disk and then
    moved over ``path``; if the block raises, the temporary file is removed and ``path``
    is untouched. A symbolic link is followed (the file it points to is replaced, the
    link stays). The new file keeps an existing file's permissions, else gets the
    permissions a plain ``open`` would give it (``0o666`` less the umask).

    :param path: The file to write; its folder must exist.
    :param mode: ``"w"`` (text, ``encoding``) or ``"wb"`` (bytes).
    :param encoding: Encoding of a text file.
    :return: A context manager yielding the open temporary file.
    :raises ValueError: If ``mode`` is not ``"w"`` or ``"wb"``.
    :raises IsADirectoryError: If ``path`` is a folder.
    :raises OSError: If the folder does not exist or cannot be written.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    target = Path(os.path.realpath(_target(path, "path")))
    if target.is_dir():
        raise IsADirectoryError(21, "Is a directory", str(target))
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    # O_EXCL: never write through a file (or link) that appeared under the temporary name.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, mode, **({} if "b" in mode else {"encoding": encoding})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(temporary, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_text_atomically(path: PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` with :func:`atomic_write`."""
    with atomic_write(path, "w") as handle:
        handle.write(text)


def _probe(folder: Path, name: str, path: Path) -> None:
    """Create and remove a file in ``folder``: the only reliable writability test (root ignores modes)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".gp-couple-probe-"):
            pass
    except OSError as error:
        raise ValueError(f"{name} {str(path)!r}: cannot create files in {str(folder)!r} "
                         f"({error.strerror or error})") from None


def check_output_folder(path: PathLike, name: str) -> Path:
    """Check, before any work, that files can be written into the folder ``path``.

    The folder is an existing folder, or can be created (its nearest existing ancestor is
    a folder); either way files can be created there. Nothing is created.

    :param path: The folder.
    :param name: The option or argument naming it, for messages (e.g. ``"--plot"``).
    :return: ``path`` as a :class:`~pathlib.Path`.
    :raises TypeError: If ``path`` is not a path.
    :raises ValueError: If ``path`` is an existing file (or something else that is not a
        folder), lies below a file, or cannot be written.
    """
    folder = _target(path, name)
    if folder.exists() and not folder.is_dir():
        kind = "file" if folder.is_file() else "non-folder"
        raise ValueError(f"{name} {str(folder)!r} is an existing {kind}, not a folder")
    existing = folder.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{name} {str(folder)!r} cannot be created: {str(existing)!r} is a file")
    _probe(existing, name, folder)
    return folder


def check_output_file(path: PathLike, name: str) -> Path:
    """Check, before any work, that the file ``path`` can be written (atomically).

    The file is absent or a regular file, and its folder passes
    :func:`check_output_folder` (it may not exist yet). Nothing is created.

    :param path: The file.
    :param name: The option or argument naming it, for messages (e.g. ``"--json"``).
    :return: ``path`` as a :class:`~pathlib.Path`.
    :raises TypeError: If ``path`` is not a path.
    :raises ValueError: If ``path`` is a folder or another non-regular file (a device, a
        pipe), or its folder cannot be written.
    """
    file = _target(path, name)
    if file.is_dir():
        raise ValueError(f"{name} {str(file)!r} is a folder, not a file")
    if file.exists() and not file.is_file():
        raise ValueError(f"{name} {str(file)!r} exists and is not a regular file")
    check_output_folder(Path(os.path.realpath(file)).parent, name)
    return file
