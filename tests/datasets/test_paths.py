"""Data-directory resolution and checksum verification."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gp_couple.datasets import _paths
from gp_couple.datasets._paths import CHECKSUMS, data_file, resolve_data_dir, verify_file
from gp_couple.datasets.graphs import GRAPHS, NODE_LABELS
from gp_couple.datasets.meshes import MESHES
from gp_couple.datasets.traffic import TRAFFIC_FILE
from gp_couple.datasets.uci import UCI_FILES

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_explicit_dir_wins_over_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv("GP_COUPLE_DATA", str(other))
    assert resolve_data_dir(tmp_path) == tmp_path.absolute()
    assert resolve_data_dir(str(tmp_path)) == tmp_path.absolute()


def test_env_var_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GP_COUPLE_DATA", str(tmp_path))
    assert resolve_data_dir() == tmp_path.absolute()


@pytest.mark.parametrize("value", [None, "", "  "])
def test_neither_given_names_both(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("GP_COUPLE_DATA", raising=False)
    else:
        monkeypatch.setenv("GP_COUPLE_DATA", value)
    with pytest.raises(FileNotFoundError, match=r"data_dir.*GP_COUPLE_DATA"):
        resolve_data_dir()


def test_missing_dir_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        resolve_data_dir(missing)
    monkeypatch.setenv("GP_COUPLE_DATA", str(missing))
    with pytest.raises(FileNotFoundError, match=r"nowhere.*GP_COUPLE_DATA"):
        resolve_data_dir()


def test_file_is_not_a_dir(tmp_path: Path) -> None:
    path = tmp_path / "file.txt"
    path.write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        resolve_data_dir(path)


def test_bad_type() -> None:
    with pytest.raises(TypeError, match="data_dir"):
        resolve_data_dir(3)  # type: ignore[arg-type]


def test_missing_file_names_file_and_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        data_file("uci/concrete/concrete.csv", tmp_path)
    message = str(info.value)
    assert "uci/concrete/concrete.csv" in message and str(tmp_path) in message


def test_registry_covers_exactly_the_files_loaders_read() -> None:
    read = ({spec.file for spec in GRAPHS.values()} | {f"meshes/{f}" for f, _ in MESHES.values()}
            | {spec.file for spec in NODE_LABELS.values()}
            | {f for f, _, _ in UCI_FILES.values()} | {TRAFFIC_FILE})
    assert set(CHECKSUMS) == read
    assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in CHECKSUMS.values())


def test_unknown_registry_name(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a\n")
    with pytest.raises(KeyError, match="no registered checksum"):
        verify_file(path, "uci/nothing.csv")


def test_every_registered_file_matches(data_dir: Path) -> None:
    for relative in CHECKSUMS:
        verify_file(data_dir / relative, relative)


def test_mismatch_names_file_and_digests(corrupted_copy, data_dir: Path) -> None:
    relative = "graphs/karate/karate_edges.csv"
    copy_dir = corrupted_copy(relative)
    actual = _paths.sha256_file(copy_dir / relative)
    with pytest.raises(ValueError) as info:
        verify_file(copy_dir / relative, relative)
    message = str(info.value)
    assert relative in message and CHECKSUMS[relative] in message and actual in message


def test_verification_is_cached_per_file_version(data_dir: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    relative = "graphs/karate/karate_edges.csv"
    copy = tmp_path / "karate_edges.csv"
    copy.write_bytes((data_dir / relative).read_bytes())
    calls: list[str] = []
    real = _paths.sha256_file

    def counting(path):  # type: ignore[no-untyped-def]
        calls.append(str(path))
        return real(path)

    monkeypatch.setattr(_paths, "sha256_file", counting)
    verify_file(copy, relative)
    verify_file(copy, relative)
    assert len(calls) == 1
    copy.write_bytes(copy.read_bytes() + b"0,1\n")  # a changed file is hashed again
    with pytest.raises(ValueError, match="checksum mismatch"):
        verify_file(copy, relative)
    assert len(calls) == 2


def test_no_data_in_repo() -> None:
    cards = REPO_ROOT / "datasets"
    if cards.is_dir():
        assert all(p.suffix == ".md" for p in cards.rglob("*") if p.is_file())


def test_cards_list_every_checksum() -> None:
    for relative, digest in CHECKSUMS.items():
        card = REPO_ROOT / "datasets" / f"{relative.split('/')[0]}.md"
        assert f"| `{relative}` | `{digest}` |" in card.read_text(encoding="utf-8"), relative


# ------------------------------------------------------------------ text files
def test_read_text_drops_a_utf8_byte_order_mark(tmp_path: Path) -> None:
    from gp_couple.datasets._paths import read_text

    path = tmp_path / "a.csv"
    path.write_bytes("\ufeffnode,label\r\n0,é\n".encode("utf-8"))
    assert read_text(path) == "node,label\r\n0,é\n"
    path.write_bytes("x\n".encode("utf-8-sig") * 2)  # only a leading mark is dropped
    assert read_text(path) == "x\n\ufeffx\n"


@pytest.mark.parametrize("content, message", [
    ("a".encode("utf-16-le"), "line 1 contains a NUL byte"),
    ("a".encode("utf-16-be"), "line 1 contains a NUL byte"),
    ("a,b".encode("utf-16"), "is UTF-16-LE text"),
    (b"\xfe\xff\x00a", "is UTF-16-BE text"),
    ("a".encode("utf-32"), "is UTF-32-LE text"),
    (b"\x00\x00\xfe\xff\x00\x00\x00a", "is UTF-32-BE text"),
    (b"ok\nok\n\xff\xfe\n", r"is not UTF-8 text: line 3 has the byte 0xff \(invalid start byte\)"),
    (b"ok\n\xc3", r"line 2 has the byte 0xc3 \(unexpected end of data\)"),
])
def test_read_text_refuses_other_encodings_naming_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    from gp_couple.datasets._paths import read_text

    path = tmp_path / "data.csv"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"^{path} .*{message}"):
        read_text(path)
