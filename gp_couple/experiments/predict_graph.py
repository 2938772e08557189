r"""``gp-couple predict-graph``: a GRF-GP on your graph and your node values, predicting every node.

The graph is an edge-list CSV (or any graph spec of :func:`gp_couple.datasets.graph_specs.resolve_graph`);
the observations a CSV with a header line, one column of node indices and one of values.
The values are standardised, a GRF-GP is trained on them to convergence with its observed
nodes sharded across the processes (:func:`gp_couple.sharded_gp.fit_sharded_grf_gp`): its
walks follow the learnt range, phase by phase, and training ends on σ-coupled prediction
walkers drawn for the learnt hyperparameters. The mean and variance of every node are then
written to ``--output`` chunk by chunk (:class:`gp_couple.streaming.StreamedPredictor`), in
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
from ..distributed import finalise, initialise
from ..kernels.walk_schedule import SHARDED_SCHEDULE
from ..sharded_gp import fit_sharded_grf_gp
from ..streaming import StreamedPredictor

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


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    """Fit, predict every node, write ``--output``; return the report (on rank 0; ``None`` elsewhere)."""
    start = time.perf_counter()
    collective = initialise(timeout=args.timeout)
    graph = resolve_graph(args.graph, args.data_dir)
    nodes, values = read_observations(args.observations, args.target, graph.num_nodes)
    offset, scale = float(np.mean(values)), float(np.std(values))
    log = _LOG.info if collective.rank == 0 else _LOG.debug
    log("training on %d observed nodes of %d (%d processes)", nodes.size, graph.num_nodes, collective.size)
    schedule = replace(SHARDED_SCHEDULE, max_train_walkers=args.max_train_walkers,
                       phases=args.phases, predict_walkers=args.predict_walkers,
                       max_predict_walkers=args.max_predict_walkers)
    model, likelihood, history = fit_sharded_grf_gp(graph, nodes, (values - offset) / scale,
                                                    collective=collective, num_walkers=args.train_walkers,
                                                    iterations=args.iterations, schedule=schedule, seed=args.seed)
    trained = time.perf_counter()
    kernel = model.covar_module.base_kernel
    log("predicting %d nodes with %d sigma-coupled walkers per node at p_halt %.3g", graph.num_nodes,
              kernel.num_walkers, kernel.p_halt)
    # The model is only predicted from: the kernel's walks are freed once the predictor has read them.
    predictor = StreamedPredictor(model, likelihood, collective=collective, target_offset=offset,
                                  target_scale=scale, release_kernel_walks=True)
    predictor.write(args.output, chunk_size=args.chunk_size, noise=not args.latent)
    finalise()
    if collective.rank != 0:
        return None
    rows = [("nodes", graph.num_nodes), ("observed nodes", int(nodes.size)), ("processes", collective.size),
            ("training iterations", len(history)), ("training phases", history.phases),
            ("converged", bool(history.converged)),
            ("negative log marginal likelihood per node", float(history[-1]) if len(history) else math.nan),
            ("outputscale", float(model.covar_module.outputscale.detach()) * scale ** 2),
            ("noise variance", float(likelihood.noise.detach()) * scale ** 2),
            *kernel.kernel_family.hyperparameters().items(),
            ("prediction walkers per node", kernel.num_walkers), ("prediction p_halt", kernel.p_halt),
            ("training seconds", trained - start), ("total seconds", time.perf_counter() - start),
            ("output", str(args.output))]
    return {"experiment": "predict-graph",
            "notes": [f"wrote means (column 0) and {'latent' if args.latent else 'predictive'} variances "
                      f"(column 1) of all {graph.num_nodes} nodes to {args.output}"],
            "results": [{"quantity": name, "value": value} for name, value in rows]}
