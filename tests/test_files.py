"""Output files: paths checked before a run, contents replaced in one step."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gp_couple._files import atomic_write, check_output_file, check_output_folder, write_text_atomically


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    write_text_atomically(target, "first\n")
    write_text_atomically(target, "second\n")
    assert target.read_text() == "second\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.json"]


def test_a_failed_write_keeps_the_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("good\n")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_write(target) as handle:
            handle.write("half of a new rep")
            raise RuntimeError("disk full")
    assert target.read_text() == "good\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.json"]


def test_bytes_permissions_and_links(tmp_path: Path) -> None:
    target = tmp_path / "figure.png"
    target.write_bytes(b"old")
    target.chmod(0o640)
    link = tmp_path / "link.png"
    link.symlink_to(target)
    with atomic_write(link, "wb") as handle:
        handle.write(b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_atomic_write_refuses_folders_and_bad_modes(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        with atomic_write(tmp_path):
            pass
    with pytest.raises(ValueError, match="mode"):
        with atomic_write(tmp_path / "x", "a"):
            pass
    with pytest.raises(TypeError, match="path"):
        with atomic_write(3):  # type: ignore[arg-type]
            pass


def test_output_folders(tmp_path: Path) -> None:
    assert check_output_folder(tmp_path, "--plot") == tmp_path
    assert check_output_folder(tmp_path / "new" / "deeper", "--plot") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # nothing is created
    assert list(tmp_path.iterdir()) == []  # the probe file is gone
    regular = tmp_path / "out.json"
    regular.write_text("{}")
    with pytest.raises(ValueError, match=r"--plot '.*out\.json' is an existing file, not a folder"):
        check_output_folder(regular, "--plot")
    with pytest.raises(ValueError, match="cannot be created: .*out.json' is a file"):
        check_output_folder(regular / "figures", "--plot")
    with pytest.raises(ValueError, match="empty path"):
        check_output_folder("", "--plot")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's read-only /proc")
def test_unwritable_folder_is_refused_even_for_root() -> None:
    with pytest.raises(ValueError, match="--plot '/proc/gp-couple-figures': cannot create files in '/proc'"):
        check_output_folder("/proc/gp-couple-figures", "--plot")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="cannot create files"):
            check_output_file(locked / "out.json", "--json")
    finally:
        locked.chmod(0o700)


def test_output_files(tmp_path: Path) -> None:
    assert check_output_file(tmp_path / "new" / "out.json", "--json") == tmp_path / "new" / "out.json"
    existing = tmp_path / "old.json"
    existing.write_text("{}")
    assert check_output_file(existing, "--json") == existing
    with pytest.raises(ValueError, match="is a folder, not a file"):
        check_output_file(tmp_path, "--json")
    if Path("/dev/null").exists():
        with pytest.raises(ValueError, match="not a regular file"):
            check_output_file("/dev/null", "--json")
