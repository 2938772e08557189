"""Progress bars appear on a terminal, never in a pipe, and not when switched off."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

from gp_couple.progress import progress, progress_bars, progress_enabled

# A short loop through the library's helper, as long work in gp_couple runs it.
SCRIPT = """
import sys, time
from gp_couple.progress import progress, progress_bars
quiet = sys.argv[1] == "quiet"
with progress_bars(not quiet):
    total = sum(progress(range(50), description="working", unit="step"))
print("done", total)
"""


def run_with_stderr_on(terminal: bool, mode: str = "loud") -> str:
    """Run SCRIPT with stderr on a pseudo-terminal (or a pipe); return what stderr received."""
    if not terminal:
        result = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "done 1225" in result.stdout
        return result.stderr
    leader, follower = pty.openpty()
    # A fresh pseudo-terminal is 0 x 0, on which tqdm draws an empty line: size it like a terminal.
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        process = subprocess.Popen([sys.executable, "-c", SCRIPT, mode], stdout=subprocess.PIPE, stderr=follower)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child closed the terminal (Linux raises EIO)
                break
            if not chunk:
                break
            chunks.append(chunk)
        stdout, _ = process.communicate(timeout=120)
    finally:
        os.close(leader)
    assert process.returncode == 0
    assert b"done 1225" in stdout
    return b"".join(chunks).decode(errors="replace")


def test_bar_is_drawn_on_a_terminal() -> None:
    output = run_with_stderr_on(terminal=True)
    assert "working" in output and "/50" in output and "step" in output


def test_no_bar_when_piped() -> None:
    assert run_with_stderr_on(terminal=False) == ""


def test_switch_silences_the_bar_on_a_terminal() -> None:
    assert "working" not in run_with_stderr_on(terminal=True, mode="quiet")


def test_switch_is_a_context_manager_restored_on_exit() -> None:
    items = list(range(5))
    assert progress(items, description="x") is items  # stderr is captured here: no bar
    with progress_bars(False):
        assert not progress_enabled()
        with pytest.raises(RuntimeError):
            with progress_bars(True):
                raise RuntimeError
        assert not progress_enabled()


def test_switch_checks_its_argument() -> None:
    with pytest.raises(TypeError, match="enabled must be a bool"):
        with progress_bars("no"):  # type: ignore[arg-type]
            pass
