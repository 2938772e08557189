"""Progress: bars on a terminal, log lines elsewhere (never raw output in a pipe), nothing when switched off."""

from __future__ import annotations

import fcntl
import logging
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


def test_switch_is_a_context_manager_restored_on_exit(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gp_couple")
    items = list(range(5))
    assert progress(items, description="x") is items  # stderr is captured here and INFO is off: nothing
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


def test_without_a_terminal_progress_goes_to_the_log(caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import gp_couple.progress as module

    monkeypatch.setattr(module, "LOG_INTERVAL", 0.0)  # a line per item
    caplog.set_level(logging.INFO, logger="gp_couple.progress")
    assert list(progress(range(3), description="repeats", unit="repeat")) == [0, 1, 2]
    lines = [record.getMessage() for record in caplog.records if record.name == "gp_couple.progress"]
    assert [line.split(" (")[0] for line in lines] == ["repeats: 1/3 repeat done", "repeats: 2/3 repeats done",
                                                       "repeats: 3/3 repeats done"]
    caplog.clear()
    with progress_bars(False):
        assert list(progress(iter(range(3)), description="quiet")) == [0, 1, 2]
    assert not caplog.records


@pytest.mark.parametrize("quiet", [False, True])
def test_every_command_logs_progress_when_stderr_is_not_a_terminal(quiet: bool, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import gp_couple.progress as module
    from gp_couple.cli import main

    monkeypatch.setattr(module, "LOG_INTERVAL", 0.0)
    argv = ["attention", "--tokens", "4", "--dim", "4", "--num-features", "4", "--draws", "5", "--repeats", "2"]
    assert main(["--quiet", *argv] if quiet else argv) == 0
    err = capsys.readouterr().err
    assert ("key sets: 2/2 repeats done" in err) is not quiet, err
