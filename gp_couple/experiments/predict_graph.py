r"""``gp-couple predict-graph``: a graph GP on your graph and your node values, predicting every node.

The graph is an edge-list CSV (or any graph spec of :func:`gp_couple.datasets.graph_specs.resolve_graph`);
the observations a CSV with a header line, one column of node indices and one of values.
The values are standardised and a diffusion-kernel GP is trained on them to convergence:

* ``--kernel auto`` (the default) chooses by :func:`gp_couple.recipes.choose_graph_kernel`
  for predicting every node: the exact GP on graphs of at most 20,000 nodes or 15 nodes per
  observed node (50 with at most 1,024 observed, :func:`gp_couple.recipes.matrix_free_nodes_per_observed`),
  with at most 10,000 observed, the GRF-GP above (or whenever a GRF option
  such as ``--predict-walkers`` is given);
* ``--kernel matrix_free``: the exact GP (:class:`~gp_couple.kernels.matrix_free.MatrixFreeGraphKernel`,
  trained by :func:`gp_couple.recipes.fit_graph_kernel` on every process), streamed by
  :class:`gp_couple.streaming.ExactStreamedPredictor`;
* ``--kernel grf``: a GRF-GP with its observed nodes sharded across the processes
  (:func:`gp_couple.sharded_gp.fit_sharded_grf_gp`): its walks follow the learnt range,
  phase by phase, and training ends on σ-coupled prediction walkers drawn for the learnt
  hyperparameters; streamed by :class:`gp_couple.streaming.StreamedPredictor`.

The mean and variance of every node are then written to ``--output`` chunk by chunk, in
the original units.

Run it as it is on one process, or under ``torchrun --nproc-per-node N -m gp_couple
predict-graph ...`` (also multi-node): every process reads the graph and the observations,
rank 0 prints the report and writes the file. A process that dies or hangs makes the
others fail after ``--timeout`` seconds at the latest.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from dataclasses import replace
from typing import Any

import numpy as np

from .._nodes import node_index_array
from ..datasets.graph_specs import resolve_graph
from ..datasets.uci import load_regression
from ..distributed import Collective, finalise, initialise
from ..graphs import Graph
from ..kernel_families import Diffusion
from ..kernels.matrix_free import MatrixFreeGraphKernel
from ..kernels.walk_schedule import SHARDED_SCHEDULE
from ..predictive_variance import DENSE_VARIANCE_SIZE
from ..recipes import choose_graph_kernel, fit_graph_kernel
from ..sharded_gp import fit_sharded_grf_gp
from ..streaming import ExactStreamedPredictor, StreamedPosterior, StreamedPredictor
from ._options import RECIPE_MAX_PREDICT_WALKERS, RECIPE_MAX_TRAIN_WALKERS, RECIPE_PHASES, RECIPE_TRAIN_WALKERS

_LOG = logging.getLogger(__name__)


def read_observations(path: str, target: str | None, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Observed nodes and values of a CSV file with a header: one node column and one value column.

    :raises ValueError: If the file has other columns, fractional or out-of-range node
        indices, repeated nodes, or non-finite values.
    """
    inputs, values = load_regression(path, target=target)
    if inputs.shape[1] != 1:
        raise ValueError(f"{path} must have two columns, a node column and a value column; it has "
                         f"{inputs.shape[1] + 1}")
    column = inputs[:, 0]
    fractional = np.flatnonzero(column != np.round(column))
    if fractional.size:
        raise ValueError(f"{path}: node index {float(column[fractional[0]]):g} (data row {fractional[0] + 1}) is not "
                         "an integer")
    nodes = node_index_array(column.astype(np.int64), f"the node column of {path}", num_nodes, unique=True)
    if nodes.size < 2 or not float(np.std(values)) > 0:
        raise ValueError(f"{path} needs at least two observations with different values")
    return nodes, values


#: The options of the GRF kernel's training and prediction (``args`` attributes), with their defaults.
GRF_OPTION_DEFAULTS: dict[str, int | None] = {
    "train_walkers": RECIPE_TRAIN_WALKERS, "max_train_walkers": RECIPE_MAX_TRAIN_WALKERS, "phases": RECIPE_PHASES,
    "predict_walkers": None, "max_predict_walkers": RECIPE_MAX_PREDICT_WALKERS}


def chosen_kernel(args: argparse.Namespace, graph: Graph, num_observed: int) -> str:
    """``"matrix_free"`` or ``"grf"``: ``--kernel``; for ``auto``, the GRF kernel where one of its options is given.

    Otherwise ``auto`` follows :func:`gp_couple.recipes.choose_graph_kernel` for predicting
    every node: the exact GP on small graphs, the GRF-GP on large ones.

    :raises ValueError: For GRF options given with ``--kernel matrix_free``, or more observed
        nodes than its dense factor takes.
    """
    given = [name for name in GRF_OPTION_DEFAULTS if getattr(args, name) is not None]
    if args.kernel == "matrix_free" and given:
        raise ValueError("--kernel matrix_free trains the exact GP, which has no walkers: "
                         + ", ".join("--" + name.replace("_", "-") for name in given) + " apply to --kernel grf")
    if args.kernel == "matrix_free" and num_observed > DENSE_VARIANCE_SIZE:
        raise ValueError(f"--kernel matrix_free predicts from a dense factor of the observed nodes' covariance: at "
                         f"most {DENSE_VARIANCE_SIZE} observed nodes, got {num_observed} (use --kernel grf or auto)")
    if args.kernel != "auto":
        return str(args.kernel)
    return "grf" if given else choose_graph_kernel(graph, num_observed, predict_all_nodes=True)


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    """Fit, predict every node, write ``--output``; return the report (on rank 0; ``None`` elsewhere)."""
    start = time.perf_counter()
    collective = initialise(timeout=args.timeout)
    graph = resolve_graph(args.graph, args.data_dir)
    nodes, values = read_observations(args.observations, args.target, graph.num_nodes)
    kernel_name = chosen_kernel(args, graph, nodes.size)
    offset, scale = float(np.mean(values)), float(np.std(values))
    targets = (values - offset) / scale
    log = _LOG.info if collective.rank == 0 else _LOG.debug
    log("training the %s kernel on %d observed nodes of %d (%d processes)", kernel_name, nodes.size,
        graph.num_nodes, collective.size)
    predictor: StreamedPosterior
    if kernel_name == "grf":
        model, likelihood, history = _fit_grf(args, graph, nodes, targets, collective)
        kernel = model.covar_module.base_kernel
        log("predicting %d nodes with %d sigma-coupled walkers per node at p_halt %.3g", graph.num_nodes,
            kernel.num_walkers, kernel.p_halt)
        # The model is only predicted from: the kernel's walks are freed once the predictor has read them.
        predictor = StreamedPredictor(model, likelihood, collective=collective, target_offset=offset,
                                      target_scale=scale, release_kernel_walks=True)
        schedule_rows = [("training phases", history.phases)]
        walker_rows = [("prediction walkers per node", kernel.num_walkers), ("prediction p_halt", kernel.p_halt)]
    else:
        model, likelihood, history = fit_graph_kernel(MatrixFreeGraphKernel(graph, Diffusion(1.0)), nodes, targets,
                                                      iterations=args.iterations, seed=args.seed)
        # Every process trained the same model; all adopt rank 0's hyperparameters, to the last bit.
        model.load_state_dict(collective.all_gather_objects(model.state_dict() if collective.rank == 0 else None)[0])
        log("predicting %d nodes with the exact GP (one dense factor of the %d observed nodes' covariance)",
            graph.num_nodes, nodes.size)
        predictor = ExactStreamedPredictor(model, likelihood, collective=collective, target_offset=offset,
                                           target_scale=scale)
        schedule_rows, walker_rows = [], []
    trained = time.perf_counter()
    predictor.write(args.output, chunk_size=args.chunk_size, noise=not args.latent)
    finalise()
    if collective.rank != 0:
        return None
    rows = [("nodes", graph.num_nodes), ("observed nodes", int(nodes.size)), ("processes", collective.size),
            ("kernel", kernel_name), ("training iterations", len(history)), *schedule_rows,
            ("converged", bool(history.converged)),
            ("negative log marginal likelihood per node", float(history[-1]) if len(history) else math.nan),
            ("outputscale", float(model.covar_module.outputscale.detach()) * scale ** 2),
            ("noise variance", float(likelihood.noise.detach()) * scale ** 2),
            *model.covar_module.base_kernel.kernel_family.hyperparameters().items(), *walker_rows,
            ("training seconds", trained - start), ("total seconds", time.perf_counter() - start),
            ("output", str(args.output))]
    return {"experiment": "predict-graph",
            "notes": [f"wrote means (column 0) and {'latent' if args.latent else 'predictive'} variances "
                      f"(column 1) of all {graph.num_nodes} nodes to {args.output}"],
            "results": [{"quantity": name, "value": value} for name, value in rows]}


def _fit_grf(args: argparse.Namespace, graph: Graph, nodes: np.ndarray, targets: np.ndarray,
             collective: Collective) -> tuple[Any, Any, Any]:
    """The sharded GRF-GP trained on the walk schedule, with the GRF options of ``args``."""
    options = {name: default if getattr(args, name) is None else getattr(args, name)
               for name, default in GRF_OPTION_DEFAULTS.items()}
    schedule = replace(SHARDED_SCHEDULE, max_train_walkers=options["max_train_walkers"], phases=options["phases"],
                       predict_walkers=options["predict_walkers"],
                       max_predict_walkers=options["max_predict_walkers"])
    return fit_sharded_grf_gp(graph, nodes, targets, collective=collective, num_walkers=options["train_walkers"],
                              iterations=args.iterations, schedule=schedule, seed=args.seed)
