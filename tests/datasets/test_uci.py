"""UCI regression loaders."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from gp_couple.datasets import UCI_DATASETS, load_uci

# datasets/uci.md: rows x columns of <name>.csv (target last).
README_SHAPES = {
    "concrete": (1030, 9), "abalone": (4177, 11), "cpu": (209, 7), "power": (9568, 5),
    "airfoil": (1503, 6), "boston": (506, 14), "energy": (768, 9), "yacht": (308, 7),
    "kin8nm": (8192, 9),
}


def test_signature_is_stable() -> None:
    parameters = inspect.signature(load_uci).parameters
    assert list(parameters) == ["name", "data_dir", "verify"]
    assert parameters["data_dir"].default is None and parameters["verify"].default is True
    assert set(UCI_DATASETS) == set(README_SHAPES)


@pytest.mark.parametrize("name", UCI_DATASETS)
def test_shapes(data_dir: Path, name: str) -> None:
    rows, columns = README_SHAPES[name]
    X, y = load_uci(name, data_dir)
    assert X.shape == (rows, columns - 1) and y.shape == (rows,)
    assert X.dtype == y.dtype == np.float64
    assert np.all(np.isfinite(X)) and np.all(np.isfinite(y))
    assert X.flags.writeable and X.flags.c_contiguous


def test_target_is_last_column(data_dir: Path) -> None:
    X, y = load_uci("cpu", data_dir)
    assert X.shape[1] == 6  # MYCT..CHMAX; vendor, model and ERP are not inputs
    assert tuple(X[0]) == (125, 256, 6000, 256, 16, 128) and y[0] == 198
    X, y = load_uci("abalone", data_dir)
    assert np.all(X[:, :3].sum(axis=1) == 1)  # one-hot sex
    assert y[0] == 15


def test_aliases_and_case(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for alias, name in [("machine_cpu", "cpu"), ("power_plant", "power"), ("Boston_Housing", "boston")]:
        assert np.array_equal(load_uci(alias, data_dir)[1], load_uci(name, data_dir)[1])
    monkeypatch.setenv("GP_COUPLE_DATA", str(data_dir))
    assert load_uci("yacht")[0].shape == (308, 6)


def test_checksum_mismatch(corrupted_copy) -> None:
    copy_dir = corrupted_copy("uci/concrete/concrete.csv")
    with pytest.raises(ValueError, match=r"checksum mismatch for uci/concrete/concrete\.csv"):
        load_uci("concrete", copy_dir)
    X, _ = load_uci("concrete", copy_dir, verify=False)  # still parses: only a digit changed
    assert X.shape == (1030, 8)


def test_wrong_shape_without_verification(tmp_path: Path) -> None:
    (tmp_path / "uci" / "yacht").mkdir(parents=True)
    (tmp_path / "uci" / "yacht" / "yacht.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"has shape \(1, 2\), expected \(308, 7\)"):
        load_uci("yacht", tmp_path, verify=False)


def test_errors(tmp_path: Path, no_env_data: None) -> None:
    with pytest.raises(ValueError, match=r"unknown UCI dataset 'wine'.*concrete"):
        load_uci("wine", tmp_path)
    with pytest.raises(TypeError, match="name"):
        load_uci(3)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match=r"uci/kin8nm/kin8nm\.csv"):
        load_uci("kin8nm", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"data_dir.*GP_COUPLE_DATA"):
        load_uci("kin8nm")


def _write_yacht(directory: Path, content: bytes) -> Path:
    (directory / "uci" / "yacht").mkdir(parents=True, exist_ok=True)
    (directory / "uci" / "yacht" / "yacht.csv").write_bytes(content)
    return directory


def test_byte_order_mark_and_encodings(tmp_path: Path) -> None:
    rows = "".join(f"{i},1,2,3,4,5,{i / 10}\n" for i in range(308))
    text = "a,b,c,d,e,f,y\n" + rows
    X, y = load_uci("yacht", _write_yacht(tmp_path, text.encode("utf-8-sig")), verify=False)
    assert X.shape == (308, 6) and X[0, 0] == 0 and y[-1] == pytest.approx(30.7)
    with pytest.raises(ValueError, match=r"yacht\.csv is UTF-16-LE text"):
        load_uci("yacht", _write_yacht(tmp_path, text.encode("utf-16")), verify=False)
    with pytest.raises(ValueError, match=r"yacht\.csv is not UTF-8 text: line 1"):
        load_uci("yacht", _write_yacht(tmp_path, b"\xe9" + text.encode()), verify=False)


# ------------------------------------------------------------------ a CSV file of your own
def _table(tmp_path: Path, text: str, name: str = "my.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_regression_table_from_a_csv_file(tmp_path: Path) -> None:
    from gp_couple.datasets import load_regression

    path = _table(tmp_path, "size, price ,rooms\n1,10,3\n2,20,4\n3,30,5\n")
    X, y = load_regression(path)  # the last column by default
    assert X.tolist() == [[1, 10], [2, 20], [3, 30]] and y.tolist() == [3, 4, 5]
    X, y = load_regression(str(path), target="price")  # by header name (spaces around names ignored)
    assert X.tolist() == [[1, 3], [2, 4], [3, 5]] and y.tolist() == [10, 20, 30]
    assert X.dtype == np.float64 and X.flags.c_contiguous and y.flags.c_contiguous


def test_regression_table_errors(tmp_path: Path) -> None:
    from gp_couple.datasets import load_regression

    good = _table(tmp_path, "a,b\n1,2\n")
    with pytest.raises(ValueError, match="has no column 'c': its columns are a, b"):
        load_regression(good, target="c")
    with pytest.raises(ValueError, match="not an all-numeric CSV"):
        load_regression(_table(tmp_path, "a,b\n1,x\n", "text.csv"))
    with pytest.raises(ValueError, match="needs an input column and a target column"):
        load_regression(_table(tmp_path, "a\n1\n", "one.csv"))
    with pytest.raises(ValueError, match="NaN or infinite"):
        load_regression(_table(tmp_path, "a,b\n1,nan\n", "nan.csv"))
    with pytest.raises(ValueError, match="2 column names in its header but 3 columns"):
        load_regression(_table(tmp_path, "a,b\n1,2,3\n", "ragged.csv"))
    with pytest.raises(FileNotFoundError, match="CSV file .*missing.csv does not exist"):
        load_regression(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="unknown UCI dataset 'wine'"):
        load_regression("wine")
    with pytest.raises(ValueError, match="target applies to a CSV file"):
        load_regression("boston", target="medv")
