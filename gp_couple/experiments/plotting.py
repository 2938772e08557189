r"""Figures of the paper's experiments, written as PNG files (optional: ``pip install 'gp-couple[plot]'``).

Every function takes plain arrays or the ``results`` rows of an experiment report (the
dictionaries that ``gp-couple COMMAND --json`` prints), writes one PNG of a fixed pixel
size (``figsize * dpi``), atomically (:func:`gp_couple._files.atomic_write`: a failure leaves
an earlier file of that name intact), and returns its path:

* :func:`plot_mesh_posterior`: a mesh coloured by the truth, the posterior mean and the
  posterior standard deviation, held-out faces outlined (Section 4.2 "Experiments with σ-coupled
  GRFs" [sec:graph_gp_experiments]);
* :func:`plot_traffic_map`: the San Jose road graph at its node coordinates, coloured by
  observed speed, predicted speed and predictive standard deviation (Appendix F.3 "Probabilistic
  traffic interpolation" [sec:traffic_expt]);
* :func:`plot_gram_error_vs_p_halt`: Gram-matrix error against :math:`p_\mathrm{halt}` for
  each coupling with the fitted :math:`\sigma` permutations as insets (the paper's figure
  on permuton couplings for GRFs, Figure 3, Section 4.2 [fig:permuton_grf]);
* :func:`plot_metric_curves`: any metric against a swept setting for each coupling, e.g.
  RMSE / NLPD / KL against the number of walkers (Figure 4, Section 4.2 [fig:graph_gps_results_2]);
* :func:`plot_metric_bars`: metrics per coupling as bars (the UCI kernel-estimation tables);
* :func:`plot_training_curves`: loss against optimisation step.

Rendering is headless by construction. Figures are built with matplotlib's
object-oriented API (:class:`matplotlib.figure.Figure`, never ``pyplot``) and saved by the
Agg rasteriser, so nothing needs a display, an OpenGL context or a GUI toolkit, and
matplotlib's global backend is never touched. Meshes are drawn with mplot3d's
:class:`~mpl_toolkits.mplot3d.art3d.Poly3DCollection`, which projects and depth-sorts the
triangles in software: slower than an OpenGL viewer (trimesh's pyglet scene, pyvista)
but those need a display or an off-screen GL library that servers and CI machines lack,
and it is fast enough for the paper's meshes (10⁴ faces in a few seconds).

matplotlib is imported only when a function here is called; without it they raise an
:class:`ImportError` that names the ``plot`` extra.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._files import atomic_write
from .._nodes import node_index_array

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "plot_mesh_posterior",
    "plot_traffic_map",
    "plot_gram_error_vs_p_halt",
    "plot_metric_curves",
    "plot_metric_bars",
    "plot_training_curves",
]

#: Resolution of every figure (dots per inch); sizes below are in inches.
DPI = 100

PathLike = str | Path


def _figure(width: float, height: float) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError as error:  # pragma: no cover - exercised only without matplotlib
        raise ImportError("gp_couple.experiments.plotting needs matplotlib; install the plot extra: "
                          "pip install 'gp-couple[plot]' (or pip install matplotlib)") from error
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _save(figure: Figure, path: PathLike) -> Path:
    target = Path(path)
    if target.suffix.lower() != ".png":
        raise ValueError(f"path must name a .png file, got {str(path)!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Atomically: a failed render or write leaves an earlier figure of that name intact.
    with atomic_write(target, "wb") as handle:
        # No bbox_inches="tight": the file keeps exactly figsize * dpi pixels.
        figure.savefig(handle, dpi=DPI, format="png")
    return target


def _vector(values: Any, name: str, size: int | None = None) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if size is not None and array.size != size:
        raise ValueError(f"{name} must have {size} values, got {array.size}")
    return array


# --------------------------------------------------------------------------- meshes


def plot_mesh_posterior(vertices: Any, faces: Any, truth: Any, mean: Any, std: Any, path: PathLike, *,
                        test_faces: Any = None, title: str | None = None,
                        elevation: float = 25.0, azimuth: float = -60.0) -> Path:
    """Three views of a mesh: faces coloured by truth, posterior mean and posterior std.

    Truth and mean share one colour scale; held-out (``test_faces``) faces are outlined
    in black in every panel.

    :param vertices: Vertex positions ``(V, 3)``.
    :param faces: Triangles ``(F, 3)`` of vertex indices; face ``i`` is graph node ``i``.
    :param truth: Target value of each face ``(F,)``.
    :param mean: Posterior mean of each face ``(F,)``.
    :param std: Posterior standard deviation of each face ``(F,)``.
    :param path: Output ``.png`` file (parent folders are created).
    :param test_faces: Indices of held-out faces to outline.
    :param title: Figure title.
    :param elevation: Camera elevation in degrees.
    :param azimuth: Camera azimuth in degrees.
    :return: ``path`` as a :class:`~pathlib.Path` (a 1500 x 500 pixel PNG).
    :raises TypeError: If ``test_faces`` are not integers.
    :raises ValueError: If the arrays' shapes disagree or ``test_faces`` are out of range.
    """
    points = np.asarray(vertices, dtype=np.float64)
    triangles = np.asarray(faces, dtype=np.int64)
    if points.ndim != 2 or points.shape[1] != 3:
        raise ValueError(f"vertices must have shape (V, 3), got {points.shape}")
    if triangles.ndim != 2 or triangles.shape[1] != 3:
        raise ValueError(f"faces must have shape (F, 3), got {triangles.shape}")
    count = len(triangles)
    values = {"truth": _vector(truth, "truth", count), "posterior mean": _vector(mean, "mean", count),
              "posterior std": _vector(std, "std", count)}
    held_out = np.zeros(count, dtype=bool)
    if test_faces is not None:
        held_out[node_index_array(test_faces, "test_faces", count, allow_empty=True)] = True
    shared = np.concatenate([values["truth"], values["posterior mean"]])
    limits = {"truth": (shared.min(), shared.max()), "posterior mean": (shared.min(), shared.max()),
              "posterior std": (values["posterior std"].min(), values["posterior std"].max())}
    figure = _figure(15, 5)  # first: it reports a missing matplotlib
    import matplotlib.colors
    from mpl_toolkits.mplot3d.art3d import Poly3DCollection

    polygons = points[triangles]
    # Outlined faces are drawn last so that their edges are not hidden by their neighbours'.
    order = np.argsort(held_out, kind="stable")
    centre = points.mean(axis=0)
    radius = np.abs(points - centre).max()
    for column, (label, data) in enumerate(values.items()):
        axes = figure.add_subplot(1, 3, column + 1, projection="3d")
        low, high = limits[label]
        norm = matplotlib.colors.Normalize(low, high if high > low else low + 1.0)
        cmap = "magma" if label == "posterior std" else "viridis"
        mapper = _scalar_mappable(norm, cmap)
        collection = Poly3DCollection(polygons[order], facecolors=mapper.to_rgba(data[order]),
                                      edgecolors=np.where(held_out[order, None], [[0, 0, 0, 1]],
                                                          [[0, 0, 0, 0]]),
                                      linewidths=np.where(held_out[order], 0.8, 0.0))
        axes.add_collection3d(collection)
        for setter, index in ((axes.set_xlim, 0), (axes.set_ylim, 1), (axes.set_zlim, 2)):
            setter(centre[index] - radius, centre[index] + radius)
        axes.set_box_aspect((1, 1, 1))
        axes.view_init(elev=elevation, azim=azimuth)
        axes.set_axis_off()
        axes.set_title(label)
        figure.colorbar(mapper, ax=axes, shrink=0.7)
    figure.suptitle(title or f"{count} faces; {int(held_out.sum())} held-out faces outlined")
    return _save(figure, path)


def _scalar_mappable(norm: Any, cmap: str) -> Any:
    import matplotlib.cm

    return matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)


# --------------------------------------------------------------------------- traffic


def plot_traffic_map(node_lonlat: Any, edges: Any, observed_nodes: Any, observed_values: Any,
                     mean: Any, std: Any, path: PathLike, *, test_nodes: Any = None,
                     units: str = "mph", title: str | None = None) -> Path:
    """The road graph at its coordinates: observed, predicted and uncertainty panels.

    Panel 1 shows the sensors coloured by their observed value (held-out sensors as
    triangles), panel 2 the posterior mean at every node, panel 3 the predictive standard
    deviation at every node with the training sensors marked. Observed and predicted
    values share one colour scale.

    :param node_lonlat: Longitude and latitude of every node ``(N, 2)``.
    :param edges: Edge list ``(E, 2)`` of node indices (e.g. ``graph.edge_list()[0]``).
    :param observed_nodes: Sensor nodes ``(S,)``.
    :param observed_values: Observed value at each sensor ``(S,)``.
    :param mean: Predicted value at every node ``(N,)``.
    :param std: Predictive standard deviation at every node ``(N,)``.
    :param path: Output ``.png`` file.
    :param test_nodes: Held-out sensor nodes (drawn as triangles).
    :param units: Unit of the values, for the colour-bar labels.
    :param title: Figure title.
    :return: ``path`` as a :class:`~pathlib.Path` (a 1500 x 500 pixel PNG).
    :raises TypeError: If node indices are not integers.
    :raises ValueError: If the arrays' shapes disagree or node indices are out of range.
    """
    coordinates = np.asarray(node_lonlat, dtype=np.float64)
    if coordinates.ndim != 2 or coordinates.shape[1] != 2:
        raise ValueError(f"node_lonlat must have shape (N, 2), got {coordinates.shape}")
    count = len(coordinates)
    pairs = np.asarray(edges)
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"edges must have shape (E, 2), got {pairs.shape}")
    pairs = node_index_array(pairs.reshape(-1), "edges", count, allow_empty=True).reshape(-1, 2)
    sensors = node_index_array(observed_nodes, "observed_nodes", count, allow_empty=True)
    observed = _vector(observed_values, "observed_values", sensors.size)
    predicted = _vector(mean, "mean", count)
    spread = _vector(std, "std", count)
    held_out = np.zeros(sensors.size, dtype=bool) if test_nodes is None else np.isin(
        sensors, node_index_array(test_nodes, "test_nodes", count, allow_empty=True))
    figure = _figure(15, 5)  # first: it reports a missing matplotlib
    import matplotlib.colors
    from matplotlib.collections import LineCollection
    from matplotlib.ticker import MaxNLocator

    both = np.concatenate([observed, predicted])
    value_norm = matplotlib.colors.Normalize(both.min(), both.max())
    panels = (("observed", value_norm, "viridis"), ("predicted", value_norm, "viridis"),
              ("predictive std", matplotlib.colors.Normalize(spread.min(), spread.max()), "magma"))
    for column, (label, norm, cmap) in enumerate(panels):
        axes = figure.add_subplot(1, 3, column + 1)
        axes.add_collection(LineCollection(coordinates[pairs], colors="0.75", linewidths=0.6, zorder=1))
        if label == "observed":
            for mask, marker, name in ((~held_out, "o", "training"), (held_out, "^", "held out")):
                axes.scatter(*coordinates[sensors[mask]].T, c=observed[mask], cmap=cmap, norm=norm,
                             s=14, marker=marker, edgecolors="k", linewidths=0.2, zorder=2, label=name)
            axes.legend(loc="lower left", fontsize="small")
        else:
            data = predicted if label == "predicted" else spread
            axes.scatter(*coordinates.T, c=data, cmap=cmap, norm=norm, s=6, zorder=2)
            if label == "predictive std":
                axes.scatter(*coordinates[sensors[~held_out]].T, s=10, facecolors="none",
                             edgecolors="w", linewidths=0.4, zorder=3)
        axes.set_aspect(1.0 / math.cos(math.radians(float(coordinates[:, 1].mean()))))
        axes.autoscale_view()
        axes.xaxis.set_major_locator(MaxNLocator(4))  # longitudes are long labels
        axes.set_xlabel("longitude")
        axes.set_ylabel("latitude")
        axes.set_title(label)
        figure.colorbar(_scalar_mappable(norm, cmap), ax=axes, shrink=0.8, label=units)
    figure.suptitle(title or f"{count} nodes, {sensors.size} sensors ({int(held_out.sum())} held out)")
    return _save(figure, path)


# --------------------------------------------------------------------------- metric figures


def _mean_se(cell: Any) -> tuple[float, float]:
    """``(mean, se)`` of a report cell: a ``{"mean", "se"}`` summary or a number."""
    if isinstance(cell, Mapping):
        se = cell.get("se")
        return float(cell["mean"]), float(se) if se is not None else 0.0
    return float(cell), 0.0


def _panel_key(row: Mapping[str, Any], panel: Sequence[str]) -> tuple[Any, ...]:
    return tuple(row[key] for key in panel)


def _panels(rows: Sequence[Mapping[str, Any]], panel: Sequence[str]) -> list[tuple[Any, ...]]:
    return list(dict.fromkeys(_panel_key(row, panel) for row in rows))


def _label(key: tuple[Any, ...], panel: Sequence[str]) -> str:
    return ", ".join(f"{name}={value}" for name, value in zip(panel, key))


def _draw_curves(axes: Axes, rows: Sequence[Mapping[str, Any]], x: str, metric: str, group: str) -> None:
    for name in dict.fromkeys(row[group] for row in rows):
        selected = sorted((row for row in rows if row[group] == name), key=lambda row: row[x])
        xs = [row[x] for row in selected]
        means, ses = zip(*(_mean_se(row[metric]) for row in selected))
        axes.errorbar(xs, means, yerr=ses, marker="o", markersize=4, capsize=3, label=str(name))
    axes.set_xlabel(x.replace("_", " "))
    axes.set_ylabel(metric.replace("_", " "))
    axes.grid(alpha=0.3)


def _check_rows(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> None:
    if not rows:
        raise ValueError("rows is empty: nothing to plot")
    missing = [key for key in keys if key not in rows[0]]
    if missing:
        raise ValueError(f"rows lack the keys {missing}; they have {sorted(rows[0])}")


def plot_metric_curves(rows: Sequence[Mapping[str, Any]], path: PathLike, *, x: str,
                       metrics: Sequence[str], group: str = "coupling", panel: Sequence[str] = (),
                       log_x: bool = False, log_y: bool = False, title: str | None = None) -> Path:
    """Each metric against ``x``, one line per ``group`` value, with standard-error bars.

    One column per metric and one row of panels per distinct value of the ``panel`` keys
    (e.g. per mesh or kernel). Cells may be numbers or ``{"mean", "se"}`` summaries.

    :param rows: Report rows, e.g. ``report["results"]`` of ``gp-couple mesh --json``.
    :param path: Output ``.png`` file.
    :param x: Key of the swept setting (``"walkers"``, ``"p_halt"``, ``"num_features"``).
    :param metrics: Keys of the metrics to draw, one column each.
    :param group: Key naming each line (default the coupling).
    :param panel: Keys whose values split the rows into panel rows.
    :param log_x: Logarithmic ``x`` axis (base 2).
    :param log_y: Logarithmic metric axes.
    :param title: Figure title.
    :return: ``path`` (``4.5 * len(metrics)`` by ``3.5 * panel rows`` inches at 100 dpi).
    :raises ValueError: If ``rows`` is empty or lacks a key.
    """
    _check_rows(rows, [x, group, *metrics, *panel])
    keys = _panels(rows, panel)
    figure = _figure(4.5 * len(metrics), 3.5 * len(keys))
    grid = figure.subplots(len(keys), len(metrics), squeeze=False)
    for row_axes, key in zip(grid, keys):
        selected = [row for row in rows if _panel_key(row, panel) == key]
        for axes, metric in zip(row_axes, metrics):
            _draw_curves(axes, selected, x, metric, group)
            if log_x:
                axes.set_xscale("log", base=2)
                axes.minorticks_off()
            values = sorted({row[x] for row in selected})
            if len(values) <= 12:  # label the settings that were run, as typed
                axes.set_xticks(values, [f"{value:g}" for value in values])
            if log_y:
                axes.set_yscale("log")
            if panel:
                axes.set_title(_label(key, panel), fontsize="medium")
    grid[0][0].legend(fontsize="small")
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def plot_gram_error_vs_p_halt(rows: Sequence[Mapping[str, Any]], path: PathLike, *,
                              permutations: Sequence[Mapping[str, Any]] = (), metric: str = "error",
                              panel: Sequence[str] = ("kernel", "walkers"),
                              title: str | None = None) -> Path:
    r"""Gram-matrix error against :math:`p_\mathrm{halt}` per coupling, σ permutations as insets.

    Each inset shows a fitted permutation :math:`\sigma` of the length quantile bins as
    the points :math:`(q, \sigma(q))`: the diagonal is the identity (i.i.d.-like
    matching), the anti-diagonal antithetic-like; the paper's Figure 3, Section 4.2
    [fig:permuton_grf]. The PageRank experiment draws its error against :math:`p_\mathrm{halt}` the
    same way.

    :param rows: ``report["results"]`` of ``gp-couple grf-gram --json``.
    :param path: Output ``.png`` file.
    :param permutations: ``report["sigma_permutations"]``: entries with ``kernel``,
        ``p_halt`` and ``permutation``; drawn above the matching panel and ``p_halt``.
    :param metric: The error key.
    :param panel: Keys whose values give one panel each (stacked vertically).
    :param title: Figure title.
    :return: ``path`` (7 by ``4.5 * panels`` inches at 100 dpi).
    :raises ValueError: If ``rows`` is empty or lacks a key.
    """
    _check_rows(rows, ["p_halt", "coupling", metric, *panel])
    keys = _panels(rows, panel)
    figure = _figure(7, 4.5 * len(keys))
    grid = figure.subplots(len(keys), 1, squeeze=False)
    p_values = sorted({row["p_halt"] for row in rows})
    margin = 0.08 if len(p_values) == 1 else 0.6 * min(np.diff(p_values))
    lower, upper = p_values[0] - margin, p_values[-1] + margin
    for (axes,), key in zip(grid, keys):
        selected = [row for row in rows if _panel_key(row, panel) == key]
        _draw_curves(axes, selected, "p_halt", metric, "coupling")
        axes.set_xlim(lower, upper)
        axes.set_title(_label(key, panel), fontsize="medium", loc="left")
        axes.legend(fontsize="small", loc="lower right")
        kernel = dict(zip(panel, key)).get("kernel")
        fits = [fit for fit in permutations if kernel is None or fit.get("kernel") == kernel]
        width = min(0.14, 0.8 / max(len(fits), 1))
        for fit in fits:
            centre = (fit["p_halt"] - lower) / (upper - lower)
            inset = axes.inset_axes((centre - width / 2, 1.02, width, width * 7 / 4.5 * 1.2))
            order = np.asarray(fit["permutation"])
            inset.scatter(np.arange(order.size), order, s=2, c="C2")
            inset.set_xticks([])
            inset.set_yticks([])
            inset.set_box_aspect(1)
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def plot_metric_bars(rows: Sequence[Mapping[str, Any]], path: PathLike, *, category: str,
                     metrics: Sequence[str], panel: Sequence[str] = (), title: str | None = None) -> Path:
    """Each metric per ``category`` value as bars with standard-error whiskers.

    :param rows: Report rows (e.g. ``gp-couple kernel-estimation --json``'s ``results``).
    :param path: Output ``.png`` file.
    :param category: Key of the bars' labels (e.g. ``"coupling"``).
    :param metrics: Keys of the metrics, one column each.
    :param panel: Keys whose values split the rows into panel rows (e.g. ``("features",)``).
    :param title: Figure title.
    :return: ``path`` (``4.5 * len(metrics)`` by ``3.5 * panel rows`` inches at 100 dpi).
    :raises ValueError: If ``rows`` is empty or lacks a key.
    """
    _check_rows(rows, [category, *metrics, *panel])
    keys = _panels(rows, panel)
    figure = _figure(4.5 * len(metrics), 3.5 * len(keys))
    grid = figure.subplots(len(keys), len(metrics), squeeze=False)
    for row_axes, key in zip(grid, keys):
        selected = [row for row in rows if _panel_key(row, panel) == key]
        labels = [str(row[category]) for row in selected]
        for axes, metric in zip(row_axes, metrics):
            means, ses = zip(*(_mean_se(row[metric]) for row in selected))
            axes.bar(range(len(labels)), means, yerr=ses, capsize=3, color="C0")
            axes.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize="small")
            axes.set_ylabel(metric.replace("_", " "))
            axes.grid(axis="y", alpha=0.3)
            if panel:
                axes.set_title(_label(key, panel), fontsize="medium")
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def plot_training_curves(curves: Mapping[str, Any], path: PathLike, *, ylabel: str = "loss",
                         xlabel: str = "step", title: str | None = None) -> Path:
    """Loss against step, one line per entry of ``curves``.

    :param curves: Label to either a sequence of losses (one per step, steps 1, 2, ...)
        or a ``(steps, losses)`` pair.
    :param path: Output ``.png`` file.
    :param ylabel: Label of the loss axis.
    :param xlabel: Label of the step axis.
    :param title: Figure title.
    :return: ``path`` (a 700 x 450 pixel PNG).
    :raises ValueError: If ``curves`` is empty or a curve is empty.
    """
    if not curves:
        raise ValueError("curves is empty: nothing to plot")
    figure = _figure(7, 4.5)
    axes = figure.subplots()
    for label, curve in curves.items():
        if isinstance(curve, tuple) and len(curve) == 2:
            steps, losses = _vector(curve[0], f"steps of {label!r}"), _vector(curve[1], f"losses of {label!r}")
        else:
            losses = _vector(curve, f"losses of {label!r}")
            steps = np.arange(1, losses.size + 1)
        if losses.size == 0 or losses.size != steps.size:
            raise ValueError(f"curve {label!r} must be non-empty with one step per loss")
        axes.plot(steps, losses, label=str(label))
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    if title:
        axes.set_title(title)
    return _save(figure, path)
