r"""``gp-couple mesh``: probabilistic mesh interpolation with coupled GRFs (Section 4.2 "Experiments
with σ-coupled GRFs" [sec:graph_gp_experiments], Appendix F.2 "Scalable GPs on graphs", paragraph
"Training GRF-GPs: technical details" [app:grf_gp_details]).

Faces are nodes; the target is the :math:`z`-component of each face normal, with
:math:`\lfloor 0.05 N\rfloor` random faces held out. Runs the protocol of
:mod:`gp_couple.experiments.graph_gp` on each mesh.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from ..datasets import MeshDataset, default_mesh, load_mesh, split_test_nodes
from ._report import figure_folder, log_figures
from .graph_gp import GraphGPProtocol, run_protocol


def protocol_from_args(args: argparse.Namespace, **overrides: Any) -> GraphGPProtocol:
    """The protocol settings chosen on the command line (``overrides`` replace fields, e.g. a resolved ``p_halt``)."""
    settings = dict(
        train_walkers=args.train_walkers, train_iterations=args.train_iterations,
        learning_rate=args.lr, walkers=tuple(args.walkers), couplings=tuple(args.couplings),
        proposal=args.proposal, directions=tuple(args.directions),
        p_halt=args.p_halt, sigma_order=args.order, sigma_fit_samples=args.fit_samples,
        repeats=args.repeats, seed=args.seed, family_name=args.kernel, train_directions=args.train_directions,
        device=args.device)
    return GraphGPProtocol(**(settings | overrides))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the protocol on every requested mesh."""
    protocol = protocol_from_args(args)
    folder = figure_folder(args)
    meshes, results = {}, []
    for name in args.mesh:
        dataset = default_mesh() if name == "default" else load_mesh(name, args.data_dir)
        train, test = split_test_nodes(dataset.graph.num_nodes, seed=args.seed)
        report = run_protocol(dataset.graph, dataset.targets, train, test, protocol,
                              node_posterior=folder is not None)
        if folder is not None:
            log_figures(mesh_figures(dataset, test, report, folder))
        meshes[dataset.name] = {key: report[key] for key in ("nodes", "train", "test", "trained",
                                                             "exact_at_trained")}
        results.extend({"mesh": dataset.name, **row} for row in report["results"])
        notes = report["notes"]
    return {"experiment": "mesh", "meshes": meshes, "protocol": report["protocol"],
            "notes": notes, "results": results}


def mesh_figures(dataset: MeshDataset, test: np.ndarray, report: dict[str, Any], folder: Path) -> list[Path]:
    """The mesh coloured by truth / posterior mean / std, metrics against walkers, training curve.

    :param dataset: The mesh.
    :param test: Held-out faces.
    :param report: :func:`~gp_couple.experiments.graph_gp.run_protocol`'s report, run with
        ``node_posterior=True``; its ``node_posterior`` entry is removed once drawn.
    :param folder: Output folder.
    :return: The PNG files written.
    """
    from . import plotting
    from .graph_gp import protocol_figures

    posterior = report.pop("node_posterior")  # drawn here; too long to print with the report
    mesh_figure = plotting.plot_mesh_posterior(
        dataset.mesh.vertices, dataset.mesh.faces, dataset.targets, posterior["mean"], posterior["std"],
        folder / f"{dataset.name}_posterior.png", test_faces=test,
        title=f"{dataset.name}: normal z, GRF-GP with {posterior['walkers']} {posterior['coupling']} "
              f"walkers per face; {len(test)} held-out faces outlined")
    return [mesh_figure, *protocol_figures(report, folder, dataset.name)]
