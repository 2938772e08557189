"""Every plotting function writes a PNG of its stated pixel size (Agg, no display needed)."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import trimesh

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")

from gp_couple.experiments import plotting  # noqa: E402


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    return struct.unpack(">II", data[16:24])


def summary(mean: float, se: float = 0.01) -> dict[str, float]:
    return {"mean": mean, "se": se, "n": 3}


def test_mesh_posterior(tmp_path: Path) -> None:
    mesh = trimesh.creation.icosphere(subdivisions=1)
    truth = mesh.face_normals[:, 2]
    rng = np.random.default_rng(0)
    path = plotting.plot_mesh_posterior(mesh.vertices, mesh.faces, truth, truth + 0.1 * rng.standard_normal(80),
                                        np.full(80, 0.2), tmp_path / "sub" / "mesh.png", test_faces=[0, 5, 9])
    assert path == tmp_path / "sub" / "mesh.png"
    assert png_size(path) == (1500, 500)


def test_traffic_map(tmp_path: Path) -> None:
    lonlat = np.column_stack([np.linspace(-121.9, -121.8, 6), np.linspace(37.3, 37.4, 6)])
    edges = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]])
    path = plotting.plot_traffic_map(lonlat, edges, [0, 2, 5], [60.0, 55.0, 40.0], np.linspace(40, 60, 6),
                                     np.full(6, 3.0), tmp_path / "map.png", test_nodes=[5])
    assert png_size(path) == (1500, 500)


def test_gram_error_with_permutation_insets(tmp_path: Path) -> None:
    rows = [{"kernel": "diffusion", "walkers": 2, "p_halt": p, "coupling": c, "error": summary(p + 0.1 * i)}
            for p in (0.3, 0.5) for i, c in enumerate(("iid", "antithetic", "sigma"))]
    fits = [{"kernel": "diffusion", "p_halt": p, "permutation": list(np.random.default_rng(1).permutation(10))}
            for p in (0.3, 0.5)]
    path = plotting.plot_gram_error_vs_p_halt(rows, tmp_path / "gram.png", permutations=fits)
    assert png_size(path) == (700, 450)


def test_metric_curves_one_panel_row_per_key(tmp_path: Path) -> None:
    rows = [{"mesh": mesh, "walkers": m, "coupling": c, "test_rmse": summary(1 / m), "kl": 2.0 / m}
            for mesh in ("a", "b") for m in (4, 8, 16) for c in ("iid", "sigma")]
    path = plotting.plot_metric_curves(rows, tmp_path / "curves.png", x="walkers", metrics=("test_rmse", "kl"),
                                       panel=("mesh",), log_x=True)
    assert png_size(path) == (900, 700)


def test_metric_bars(tmp_path: Path) -> None:
    rows = [{"features": "rff", "coupling": c, "kernel_rmse": summary(1.0 - 0.1 * i)}
            for i, c in enumerate(("iid", "orthogonal", "pnc"))]
    path = plotting.plot_metric_bars(rows, tmp_path / "bars.png", category="coupling", metrics=("kernel_rmse",),
                                     panel=("features",))
    assert png_size(path) == (450, 350)


def test_training_curves(tmp_path: Path) -> None:
    path = plotting.plot_training_curves({"a": np.linspace(2, 1, 50), "b": ([10, 20, 30], [1.5, 1.2, 1.1])},
                                         tmp_path / "train.png")
    assert png_size(path) == (700, 450)
    assert path.stat().st_size > 5000


@pytest.mark.parametrize("call, message", [
    (lambda p: plotting.plot_training_curves({}, p), "curves is empty"),
    (lambda p: plotting.plot_training_curves({"a": [1.0]}, p.with_suffix(".pdf")), "must name a .png"),
    (lambda p: plotting.plot_metric_curves([{"walkers": 1}], p, x="walkers", metrics=("kl",)), "lack the keys"),
    (lambda p: plotting.plot_mesh_posterior(np.zeros((3, 3)), [[0, 1, 2]], [1.0], [1.0, 2.0], [1.0], p),
     "mean must have 1 values"),
    (lambda p: plotting.plot_traffic_map(np.zeros((2, 2)), [[0, 1]], [3], [1.0], [0, 0], [1, 1], p),
     r"observed_nodes contains node index 3 outside \[0, 2\)"),
])
def test_bad_input_names_the_argument(tmp_path: Path, call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        call(tmp_path / "figure.png")
    assert not (tmp_path / "figure.png").exists()


def test_missing_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # "import matplotlib.figure" now fails
    with pytest.raises(ImportError, match=r"gp-couple\[plot\]"):
        plotting.plot_training_curves({"a": [1.0, 0.5]}, tmp_path / "train.png")


def test_a_failed_render_keeps_the_previous_figure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    path = plotting.plot_training_curves({"a": [1.0, 0.5]}, tmp_path / "train.png")
    before = path.read_bytes()

    def broken(self, handle, **kwargs):  # type: ignore[no-untyped-def]
        handle.write(b"\x89PNG half a figure")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", broken)
    with pytest.raises(OSError, match="No space left"):
        plotting.plot_training_curves({"a": [2.0, 1.0]}, path)
    assert path.read_bytes() == before
    assert [entry.name for entry in tmp_path.iterdir()] == ["train.png"]
