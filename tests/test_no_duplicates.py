"""No copy-paste in ``gp_couple/``: no block of six or more repeated lines.

CI has no ``duplicates`` tool, so the check is written here. Every ``.py`` file of the
package is reduced to its *code lines*: white space is folded, and these are left out

* blank lines and comment-only lines;
* docstrings (module, class and function): documentation may say the same thing where
  the same parameter recurs, and prose is not logic;
* import statements, parenthesised continuations included: the same names imported in
  two modules are not shared logic;
* lines of lone punctuation (``)``, ``],``, ``}``), which carry nothing of their own.

Every window of :data:`MIN_LINES` consecutive code lines is hashed; a window that
stands in two places (two files, or two non-overlapping places of one file) is a
repeat, and overlapping windows of the same pair of places merge into one block, which
the failure names as ``file:first-last ~ file:first-last`` (real line numbers).
Unlike the ``duplicates`` tool, only repeats identical to the letter (after folding
white space) count, not lines of the same shape with other names.

Repeats between files that other changes are rewriting at the time are listed in
:data:`PENDING` (pairs of files): the test reports them as a warning instead of failing,
and :func:`test_pending_entries_still_repeat` fails once an entry is stale, so the list
only shrinks.
"""

from __future__ import annotations

import ast
import hashlib
import re
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gp_couple"
MIN_LINES = 6

#: Pairs of files (relative to the repository root, sorted) whose repeats are known and
#: waiting for the rewrites in progress in those files.
PENDING: frozenset[tuple[str, str]] = frozenset()

_PUNCTUATION = re.compile(r"^[\s()\[\]{},:;.]*$")


@dataclass(frozen=True)
class Block:
    """A run of code lines standing in two places: ``(file, first line, last line)`` each."""

    first: tuple[str, int, int]
    second: tuple[str, int, int]

    @property
    def files(self) -> tuple[str, str]:
        return tuple(sorted((self.first[0], self.second[0])))  # type: ignore[return-value]

    def __str__(self) -> str:
        (a, a0, a1), (b, b0, b1) = self.first, self.second
        return f"{a}:{a0}-{a1} ~ {b}:{b0}-{b1}"


def _skipped_lines(tree: ast.AST) -> set[int]:
    """Line numbers of docstrings and import statements (whole statements)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            skipped.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                skipped.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return skipped


def code_lines(source: str) -> list[tuple[int, str]]:
    """``(line number, folded text)`` of the lines that count (see the module docstring)."""
    skipped = _skipped_lines(ast.parse(source))
    kept = []
    for number, line in enumerate(source.splitlines(), start=1):
        folded = " ".join(line.split())
        if (number in skipped or not folded or folded.startswith("#")
                or _PUNCTUATION.match(folded)):
            continue
        kept.append((number, folded))
    return kept


def repeated_blocks(files: dict[str, str], min_lines: int = MIN_LINES) -> list[Block]:
    """Blocks of ``min_lines`` or more code lines that stand in two places of ``files`` (name -> source)."""
    lines = {name: code_lines(source) for name, source in files.items()}
    places: dict[bytes, list[tuple[str, int]]] = defaultdict(list)
    for name, kept in lines.items():
        for start in range(len(kept) - min_lines + 1):
            window = "\n".join(text for _, text in kept[start:start + min_lines])
            places[hashlib.sha1(window.encode()).digest()].append((name, start))
    # Pairs of window starts, then runs of consecutive windows per pair of places.
    pairs: set[tuple[str, int, str, int]] = set()
    for found in places.values():
        for i, (a, a_start) in enumerate(found):
            for b, b_start in found[i + 1:]:
                if a == b and abs(a_start - b_start) < min_lines:
                    continue  # a run overlapping itself (e.g. repeated identical lines)
                pairs.add((a, a_start, b, b_start))
    blocks = []
    for a, a_start, b, b_start in sorted(pairs):
        if (a, a_start - 1, b, b_start - 1) in pairs:
            continue  # inside a run that started earlier
        length = 0
        while (a, a_start + length, b, b_start + length) in pairs:
            length += 1
        a_end, b_end = a_start + length + min_lines - 2, b_start + length + min_lines - 2
        blocks.append(Block((a, lines[a][a_start][0], lines[a][a_end][0]),
                            (b, lines[b][b_start][0], lines[b][b_end][0])))
    return blocks


def _package_blocks() -> list[Block]:
    root = PACKAGE.parent
    files = {str(path.relative_to(root)): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}
    return repeated_blocks(files)


def test_no_repeated_blocks() -> None:
    blocks = _package_blocks()
    pending = [str(block) for block in blocks if block.files in PENDING]
    if pending:
        warnings.warn("repeats waiting for the rewrites in progress (PENDING):\n" + "\n".join(pending),
                      stacklevel=1)
    new = [str(block) for block in blocks if block.files not in PENDING]
    assert not new, (f"blocks of {MIN_LINES} or more repeated code lines (factor the shared logic):\n"
                     + "\n".join(new))


def test_pending_entries_still_repeat() -> None:
    # Remove an entry of PENDING once its files no longer repeat each other.
    repeating = {block.files for block in _package_blocks()}
    assert not PENDING - repeating, f"stale PENDING entries: {sorted(PENDING - repeating)}"


def test_the_check_finds_repeats_and_ignores_what_does_not_count() -> None:
    body = "".join(f"    total = total + {i} * value\n" for i in range(6))
    first = f'"""Module."""\nimport os\n\n\ndef f(value):\n    total = 0\n{body}    return total\n'
    second = ('from typing import (\n    Any,\n)\n\n\ndef g(value):\n    """Doc."""\n'
              f"    # a comment\n    total = 1\n{body}\n    return -total\n")
    blocks = repeated_blocks({"a.py": first, "b.py": second})
    assert [str(block) for block in blocks] == ["a.py:7-12 ~ b.py:10-15"]
    # Five repeated lines are not enough; imports, docstrings and comments never count.
    shorter = "".join(f"    total = total + {i} * value\n" for i in range(5))
    assert repeated_blocks({"a.py": f"def f(value):\n{shorter}", "b.py": f"def g(value):\n{shorter}"}) == []
    prose = '"""' + "\n".join(f":param x{i}: The same." for i in range(8)) + '"""\n'
    imports = "from os import (\n" + "".join(f"    name{i},\n" for i in range(8)) + ")\n"
    assert repeated_blocks({"a.py": prose + imports, "b.py": prose + imports}) == []


def test_a_longer_repeat_is_one_block_and_repeats_within_one_file_count() -> None:
    body = "".join(f"x{i} = f({i})\n" for i in range(9))
    source = f"{body}y = 0\n{body}"
    assert [str(block) for block in repeated_blocks({"m.py": source})] == ["m.py:1-9 ~ m.py:11-19"]
