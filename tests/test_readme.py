"""README.md's Python examples run as written: every ```python block, each on its own.

A new user copies a block into a fresh interpreter, so each block runs in a namespace of
its own (it must import and define everything it uses) and must finish quickly: the
examples are kept small (all three take about 30 s on the 2-core development machine).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README.read_text(encoding="utf-8"), flags=re.S | re.M)


def _first_line(code: str) -> str:
    return next(line for line in code.splitlines() if line.strip() and not line.startswith(("import", "from")))


def test_the_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{index}" for index in range(1, len(BLOCKS) + 1)])
def test_readme_block_runs_on_its_own(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    namespace = {"__name__": "__readme__"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # short runs may warn that training has not converged
        exec(compile(code, f"README.md python block starting {_first_line(code)!r}", "exec"), namespace)
    printed = capsys.readouterr().out
    assert printed.strip(), "every example prints what it computed"
    if "converged: {history.converged}" in code:
        # The quick start is the recommended model on a realistic signal: it converges, quietly.
        assert "converged: True" in printed
        assert not [str(warning.message) for warning in caught if warning.category.__module__.startswith("gp_couple")]
