"""Benchmark: how closely GRF-GPs predict like the exact GP, and what the accuracy costs.

Issue "GRF-GPs that predict like exact GPs", sections 2-3. Every method is trained and
evaluated on the same problem (the protocol of ``bench_graph_gp.py``: diffusion kernel,
``--iterations`` Adam steps at learning rate 0.05 from gamma = 1 on the exact marginal
likelihood, CG/Lanczos under ``grf_gp_settings``, predictive mean and variance at every
test node with ``fast_pred_var``), each in a fresh subprocess, and reports

* test RMSE (against the noise-free signal) and NLPD (against the noisy observations),
* ``kl``: KL(exact GP || method) between the predictive distributions of the noisy
  observations at ``--subset`` test nodes (full covariances, nats, a total), each model
  with its own learnt hyperparameters (end to end: hyperparameters and kernel estimate;
  dense float64 posterior from the kernel blocks, so keep it for training sets of a few
  thousand nodes: ``--subset 0`` turns it off),
* the learnt outputscale, gamma and noise, setup / training / prediction wall time, and
  the CPU time of all three (``cpu_s``, all threads: on a machine shared with other work
  it is a steadier measure than wall time, and an upper bound on a quiet machine's
  wall time).

Methods (``--methods``; a method is ``name`` or ``key=value,...`` with the keys below):

* ``exact``: the dense ``ExactGraphKernel`` up to ``--dense-limit`` nodes, the
  matrix-free ``MatrixFreeGraphKernel`` above it.
* ``exact_matrix_free``: the matrix-free exact GP at any size (to compare its cost with
  the dense one's where both fit).
* ``exact_at:OUTPUTSCALE:GAMMA:NOISE``: the exact kernel at given hyperparameters, without
  training (e.g. a GRF-GP's learnt ones: separates the kernel estimate's error from the
  hyperparameters').
* ``exact_true`` (``prior:`` problems only): the same exact kernel at the hyperparameters
  that generated the data, without training: the Bayes-optimal predictor, a reference
  that costs one solve where training the exact GP would take hours.
* GRF-GPs ``walkers=M,coupling=C,directions=D,p_halt=P`` with optional
  ``predict_walkers=M2`` (after training, redraw the walks with ``M2`` walkers for
  prediction: one CG solve and a Lanczos cache, cheap next to training; with
  ``predict_coupling=sigma`` their lengths are sigma-coupled, fitted at the learnt
  hyperparameters) and
  ``diagonal=split`` (the two independent half-sets estimator of the diagonal,
  :math:`\\widehat K_{ii} = \\phi^{(1)}_i\\cdot\\phi^{(2)}_i`, unbiased; in training and
  prediction). ``coupling=sigma`` trains in two phases: the first half of the iterations
  with antithetic lengths, then a sigma-coupling is fitted at the current
  hyperparameters (order 50) and the walks are redrawn with it for the second half (and
  refitted at the final hyperparameters for ``predict_walkers``).

Problems (``--problems``): ``grid:RxC``, ``icosphere:K`` (the smooth random-walk signal
of ``bench_graph_gp.py``), ``mesh:NAME`` (paper meshes from ``--data-dir``; normal-z
targets, 5 % test split), ``bumpy`` (the built-in mesh of ``gp-couple demo``), and
``prior:GAMMA:GRAPH``: a draw from the exact diffusion-GP prior
:math:`\\mathcal N(0, \\exp(-\\gamma^2\\widetilde{\\mathbf L}))` on ``GRAPH`` (unit variance,
noise 0.1, the split of ``bench_graph_gp.py``), a signal the exact GP can learn by
construction, smooth at the scale of the training density when gamma is a few hops;
``GRAPH`` may be ``traffic``, the weighted San Jose road graph from ``--data-dir``;
``prior:GAMMA:GRAPH@N`` observes ``N`` nodes instead of ``min(10000, nodes / 2)`` (the
test nodes stay ``min(10000, the rest)``).
``traffic`` is the San Jose traffic speeds from ``--data-dir`` (the paper's 250/75 split of
the 325 sensors, standardised speeds; RMSE against the observations, no noise-free signal).

``--exact-from FILE`` reuses the exact GP of an earlier run of ``bench_graph_gp.py`` (same
problem, seed and training protocol) instead of retraining it: its wall times and metrics
are copied from the file, and its predictive distribution on the subset is recomputed at
its saved hyperparameters (exact kernel columns, float64), so the KL column is still
measured here. Reused rows say so (``"exact_from"``).

The default run (the built-in mesh; the exact GP, the previous default, the recommended
configuration and two variants) takes a few minutes; on a machine shared with other work
run it with ``OMP_NUM_THREADS=1`` (two torch threads under contention ran 10-30x slower);
``--methods full`` adds every walker count, coupling and direction scheme and the
gap-closing variants; pass the paper-scale problems explicitly, e.g.
``--problems grid:100x100 mesh:torus --data-dir ../shared/datasets --exact-from
benchmarks/results/graph_gp.json``.

Run: ``python benchmarks/bench_graph_gp_accuracy.py --json-out benchmarks/results/graph_gp_accuracy.json``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import dispatch_worker, emit_report, run_in_subprocess  # noqa: E402
from bench_graph_gp import _metrics, problem as random_walk_problem, scaled_graph_gp  # noqa: E402

#: Walker counts, couplings and direction schemes of the full comparison (issue, section 2).
WALKERS = (16, 64, 256)
COUPLINGS = ("iid", "antithetic", "sigma")
DIRECTIONS = ("independent", "repelling")
#: The configuration recommended in the README (train with 48 walkers, predict with 512).
RECOMMENDED = ("walkers=48,coupling=antithetic,directions=repelling,p_halt=0.1,predict_walkers=512,"
               "predict_coupling=sigma")
#: Gap-closing variants measured next to the grid of configurations.
VARIANTS = (
    "walkers=16,coupling=iid,p_halt=0.1,diagonal=split",
    "walkers=64,coupling=iid,p_halt=0.1,diagonal=split",
    RECOMMENDED,
    "walkers=64,coupling=sigma,directions=repelling,p_halt=0.1,predict_walkers=1024",
    "walkers=256,coupling=sigma,directions=repelling,p_halt=0.1,predict_walkers=1024",
)
#: Order and samples per bin of the sigma-couplings fitted during training.
SIGMA_ORDER, SIGMA_SAMPLES = 50, 40
OBSERVATION_NOISE = 0.1


#: The default run: the exact GP, the previous default, the recommended configuration and
#: the walker budget of the repelling, sigma-coupled estimator.
DEFAULT_METHODS = ("exact", "walkers=16,coupling=iid,p_halt=0.1", RECOMMENDED,
                   "walkers=64,coupling=iid,p_halt=0.1,diagonal=split",
                   "walkers=256,coupling=sigma,directions=repelling,p_halt=0.1")


def expand_methods(names: list[str]) -> list[str]:
    """Methods with ``full`` replaced by every (walkers, coupling, directions) and the variants."""
    methods: list[str] = []
    for name in names:
        if name == "full":
            methods += [f"walkers={m},coupling={c},directions={d},p_halt=0.1"
                        for m in WALKERS for c in COUPLINGS for d in DIRECTIONS] + list(VARIANTS)
        else:
            methods.append(name)
    return list(dict.fromkeys(methods))


def parse_method(text: str) -> dict[str, Any]:
    """``exact`` or ``key=value,...`` to a configuration dict (validated)."""
    if text == "exact":
        return {"kernel": "exact"}
    if text == "exact_true":
        return {"kernel": "exact", "fixed": True}
    if text == "exact_matrix_free":
        return {"kernel": "exact", "matrix_free": True}
    if text.startswith("exact_at:"):
        try:
            outputscale, gamma, noise = (float(v) for v in text.split(":")[1:])
        except ValueError:
            raise ValueError(f"method {text!r}: expected exact_at:OUTPUTSCALE:GAMMA:NOISE") from None
        return {"kernel": "exact", "fixed": True, "at": {"outputscale": outputscale, "gamma": gamma, "noise": noise}}
    config: dict[str, Any] = {"kernel": "grf", "walkers": 16, "coupling": "iid", "directions": "independent",
                              "p_halt": 0.1, "predict_walkers": None, "predict_coupling": "same",
                              "diagonal": "plain"}
    casts = {"walkers": int, "predict_walkers": int, "p_halt": float}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or key not in config or key == "kernel":
            raise ValueError(f"method {text!r}: expected key=value pairs with keys "
                             f"{sorted(set(config) - {'kernel'})}, got {item!r}")
        config[key] = casts.get(key, str)(value)
    if config["predict_coupling"] not in ("same", "sigma"):
        raise ValueError(f"method {text!r}: predict_coupling must be 'same' or 'sigma'")
    if config["diagonal"] not in ("plain", "split"):
        raise ValueError(f"method {text!r}: diagonal must be 'plain' or 'split'")
    if config["diagonal"] == "split" and (config["predict_walkers"] or config["coupling"] == "sigma"):
        raise ValueError(f"method {text!r}: diagonal=split is measured with a fixed set of walks")
    return config


def method_label(config: dict[str, Any]) -> str:
    if config["kernel"] == "exact":
        if config.get("at"):
            return "exact at outputscale={outputscale:g}, gamma={gamma:g}, noise={noise:g}".format(**config["at"])
        if config.get("fixed"):
            return "exact at the generating hyperparameters"
        return "exact (matrix-free)" if config.get("matrix_free") else "exact"
    label = f"m={config['walkers']} {config['coupling']} {config['directions']} p={config['p_halt']}"
    if config["predict_walkers"]:
        label += f" predict m={config['predict_walkers']}"
        if config["predict_coupling"] != "same":
            label += f" {config['predict_coupling']}"
    if config["diagonal"] != "plain":
        label += f" diagonal={config['diagonal']}"
    return label


# ---------------------------------------------------------------- problems
def problem(spec: str, seed: int) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Graph, noise-free signal, noisy observations, train and test nodes (see the module doc)."""
    if spec == "bumpy":
        from gp_couple.datasets import default_mesh, split_test_nodes

        mesh = default_mesh()
        train, test = split_test_nodes(mesh.graph.num_nodes, seed=seed)
        targets = np.asarray(mesh.targets)
        return mesh.graph, targets, targets, train, test
    if spec == "traffic":
        return traffic_problem(seed)
    if not spec.startswith("prior:"):
        return random_walk_problem(spec, seed)
    import scipy.sparse as sp
    from scipy.sparse.linalg import expm_multiply

    gamma, graph_spec, observed_count = _prior_spec(spec)
    graph = _prior_graph(graph_spec)
    rng = np.random.default_rng(seed)
    laplacian = sp.identity(graph.num_nodes, format="csr") - graph.normalized_adjacency()
    # exp(-gamma^2 L / 2) z has covariance exp(-gamma^2 L): an exact draw from the GP prior.
    signal = expm_multiply(-0.5 * float(gamma) ** 2 * laplacian, rng.normal(size=graph.num_nodes))
    signal = (signal - signal.mean()) / signal.std()
    observed = signal + OBSERVATION_NOISE * rng.normal(size=graph.num_nodes)
    n_train = int(observed_count) if observed_count else min(10_000, graph.num_nodes // 2)
    if not 0 < n_train < graph.num_nodes:
        raise ValueError(f"{spec}: the observed count must lie in [1, {graph.num_nodes - 1}], got {n_train}")
    n_test = min(10_000, graph.num_nodes - n_train)
    order = rng.permutation(graph.num_nodes)
    return graph, signal, observed, np.sort(order[:n_train]), np.sort(order[n_train:n_train + n_test])


def _prior_spec(spec: str) -> tuple[str, str, str]:
    """``prior:GAMMA:GRAPH[@N]`` as ``(GAMMA, GRAPH, N)`` (``N`` empty when not given)."""
    _, gamma, graph_spec = spec.split(":", 2)
    graph_spec, _, observed_count = graph_spec.partition("@")
    return gamma, graph_spec, observed_count


def _prior_graph(graph_spec: str) -> Any:
    """The graph of a ``prior:GAMMA:GRAPH`` problem: a ``resolve_graph`` spec, or ``traffic``
    (the weighted San Jose road graph of ``$GP_COUPLE_DATA``, edge weights 0.17-290)."""
    from gp_couple.datasets import load_traffic, resolve_graph

    return load_traffic().graph if graph_spec == "traffic" else resolve_graph(graph_spec)


def traffic_problem(seed: int) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The San Jose traffic speeds of ``$GP_COUPLE_DATA`` (weighted road graph of 1016 nodes).

    The paper's protocol: a random 250/75 split of the 325 sensors (``traffic_split``), speeds
    standardised by the training mean and standard deviation. There is no noise-free signal:
    the "signal" is the standardised observed speed (NaN at unobserved nodes), so the test
    RMSE is against observations, in training standard deviations.
    """
    from gp_couple.datasets import load_traffic, traffic_split

    data = load_traffic()
    train, test = traffic_split(data.observed_nodes.size, seed=seed)
    speeds = np.asarray(data.speeds)
    standardised = (speeds - speeds[train].mean()) / speeds[train].std()
    observed = np.full(data.graph.num_nodes, np.nan)
    observed[data.observed_nodes] = standardised
    return (data.graph, observed, observed, np.sort(data.observed_nodes[train]),
            np.sort(data.observed_nodes[test]))


def generating_hyperparameters(spec: str, seed: int) -> dict[str, float]:
    """Outputscale, gamma and noise that generated a ``prior:GAMMA:GRAPH`` problem.

    The draw is standardised, so its outputscale is one over the raw draw's variance.
    """
    import scipy.sparse as sp
    from scipy.sparse.linalg import expm_multiply

    if not spec.startswith("prior:"):
        raise ValueError(f"exact_true needs a prior:GAMMA:GRAPH problem, got {spec!r}")
    gamma, graph_spec, _ = _prior_spec(spec)
    graph = _prior_graph(graph_spec)
    rng = np.random.default_rng(seed)
    laplacian = sp.identity(graph.num_nodes, format="csr") - graph.normalized_adjacency()
    raw = expm_multiply(-0.5 * float(gamma) ** 2 * laplacian, rng.normal(size=graph.num_nodes))
    return {"outputscale": float(1.0 / raw.var()), "gamma": float(gamma), "noise": OBSERVATION_NOISE ** 2}


# ---------------------------------------------------------------- the split-diagonal variant
def _merge_halves(first: Any, second: Any) -> tuple[Any, Any]:
    r"""Features :math:`(\Phi_1 + \Phi_2)/2` of two independent half-sets, and the weights of
    :math:`(\Phi_1 - \Phi_2)/2`.

    Both share one pattern (the union of the halves'), so the second is only a weight vector.
    """
    import torch

    from gp_couple.features.graph_random_features import GraphRandomFeatures

    num_nodes = first.num_nodes
    parts = []
    for features, sign in ((first, 1.0), (second, -1.0)):
        slot = torch.repeat_interleave(torch.arange(features.nnz), torch.diff(features.slot_pointer))
        row = torch.repeat_interleave(torch.arange(features.num_rows), torch.diff(features.row_pointer))[slot]
        parts.append((row, features.columns[slot], features.steps, 0.5 * features.weights, sign))
    rows, columns, steps = (torch.cat([part[i] for part in parts]) for i in range(3))
    weights = torch.cat([part[3] for part in parts])
    signs = torch.cat([torch.full_like(part[3], part[4]) for part in parts])
    num_terms = int(steps.max()) + 1
    keys, inverse = torch.unique((rows * num_nodes + columns) * num_terms + steps, return_inverse=True)
    plus = torch.zeros(keys.numel(), dtype=weights.dtype).index_add_(0, inverse, weights)
    minus = torch.zeros(keys.numel(), dtype=weights.dtype).index_add_(0, inverse, weights * signs)
    slots, slot_of_entry = torch.unique(keys // num_terms, return_inverse=True)
    slot_pointer = torch.zeros(slots.numel() + 1, dtype=torch.int64)
    slot_pointer[1:] = torch.bincount(slot_of_entry, minlength=slots.numel()).cumsum(0)
    row_pointer = torch.zeros(first.num_rows + 1, dtype=torch.int64)
    row_pointer[1:] = torch.bincount(slots // num_nodes, minlength=first.num_rows).cumsum(0)
    merged = GraphRandomFeatures.from_tensors(
        {"start_nodes": first.start_nodes, "row_pointer": row_pointer, "columns": slots % num_nodes,
         "slot_pointer": slot_pointer, "steps": keys % num_terms, "weights": plus}, num_nodes)
    return merged, minus


def split_diagonal_kernel(kernel: Any) -> Any:
    r"""A copy of a GRF kernel with :math:`m/2 + m/2` independent walkers and the unbiased split diagonal.

    .. math::

        \widehat{\mathbf K} = \Phi\Phi^\top - \mathrm{diag}\big(\|\tfrac12(\phi^{(1)}_i - \phi^{(2)}_i)\|^2\big),
        \qquad \Phi = \tfrac12(\Phi_1 + \Phi_2),

    whose diagonal is :math:`\phi^{(1)}_i\cdot\phi^{(2)}_i` (unbiased: the halves are
    independent) and whose off-diagonal entries are those of :math:`\Phi\Phi^\top`. Not
    positive semi-definite in general: the learnt noise must cover it. A measured variant
    of this benchmark, not a library feature (it did not close the gap; see RESULTS.md).
    """
    import torch
    from linear_operator.operators import DiagLinearOperator

    from gp_couple.features.graph_random_features import GraphRandomFeatures
    from gp_couple.kernels.grf_kernel import GRFKernel
    from gp_couple.sparse_pattern import segment_sum, sparse_csr

    class SplitDiagonalGRFKernel(GRFKernel):
        def correction(self, nodes: torch.Tensor) -> torch.Tensor:
            features = self._features()
            f = self.kernel_family.modulation(features.num_terms)[..., :features.num_terms].to(self.minus_weights.dtype)
            steps = sparse_csr(features.slot_pointer, features.steps, self.minus_weights,
                               (features.nnz, features.num_terms))
            values = (steps @ f.reshape(-1, features.num_terms).T).T.reshape(*f.shape[:-1], features.nnz)
            pattern = self._pattern()
            return segment_sum(values.square(), pattern.row_indices, pattern.num_rows)[..., self.rows(nodes)]

        def forward(self, x1: torch.Tensor, x2: torch.Tensor, diag: bool = False, **params: Any) -> Any:
            gram = super().forward(x1, x2, diag=diag, **params)
            if not (x1 is x2 or (x1.shape == x2.shape and torch.equal(x1, x2))):
                return gram  # cross-covariances are off-diagonal entries
            correction = self.correction(self.node_indices(x1, "x1"))
            return gram - correction if diag else gram + DiagLinearOperator(-correction)

    half = kernel.num_walkers // 2
    first = GraphRandomFeatures.sample(kernel.graph, half, kernel.p_halt, kernel.coupling, seed=kernel.seed,
                                       start_nodes=kernel.nodes.numpy(), directions=kernel.directions)
    second = GraphRandomFeatures.sample(kernel.graph, half, kernel.p_halt, kernel.coupling, seed=kernel.seed + 7919,
                                        start_nodes=kernel.nodes.numpy(), directions=kernel.directions)
    merged, minus = _merge_halves(first, second)
    split = SplitDiagonalGRFKernel(kernel.graph, num_walkers=half, p_halt=kernel.p_halt, coupling=kernel.coupling,
                                   kernel_family=kernel.kernel_family, seed=kernel.seed, nodes=kernel.nodes.numpy(),
                                   directions=kernel.directions, schedule=None)
    for name, tensor in merged.tensors().items():
        setattr(split, f"features_{name}", tensor)
    split.register_buffer("minus_weights", minus)
    split._invalidate()
    return split


# ---------------------------------------------------------------- workers
def _predictive_on_subset(model: Any, likelihood: Any, train: np.ndarray, nodes: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Mean and full covariance of the noisy observations at ``nodes`` (float64 dense blocks; not timed).

    A GRF kernel's blocks come from its sparse features (scipy products), an exact
    kernel's from its dense evaluation, so no method pays for CG with one right-hand
    side per subset node.
    """
    import torch

    from gp_couple.evaluation.posterior import gp_posterior_from_blocks
    from gp_couple.kernels.grf_kernel import GRFKernel

    base = model.covar_module.base_kernel
    outputscale = float(model.covar_module.outputscale)
    with torch.no_grad():
        if isinstance(base, GRFKernel):
            features = base.features
            phi = features.scipy_feature_matrix(base.kernel_family.modulation(features.num_terms).double())
            left = phi[base.rows(torch.as_tensor(train)).numpy()]
            right = phi[base.rows(torch.as_tensor(nodes)).numpy()]
            blocks = [outputscale * (a @ b.T).toarray() for a, b in ((left, left), (right, left), (right, right))]
            if hasattr(base, "correction"):  # the split-diagonal variant
                blocks[0] -= np.diag(outputscale * base.correction(torch.as_tensor(train)).double().numpy())
                blocks[2] -= np.diag(outputscale * base.correction(torch.as_tensor(nodes)).double().numpy())
        else:
            x_train, x_nodes = model.node_inputs(train), model.node_inputs(nodes)
            kernel = model.covar_module
            blocks = [kernel(a, b).to_dense().double().numpy()
                      for a, b in ((x_train, x_train), (x_nodes, x_train), (x_nodes, x_nodes))]
    targets = model.train_targets.double().numpy()
    posterior = gp_posterior_from_blocks(*blocks, targets, float(likelihood.noise))
    return posterior.mean, posterior.covariance


def _sigma_coupling(kernel: Any, p_halt: float, seed: int) -> Any:
    """A sigma-coupling fitted at the kernel's current hyperparameters."""
    from copy import deepcopy

    import torch

    from gp_couple.features.sigma_fit import fit_sigma_coupling

    family = deepcopy(kernel.kernel_family)
    with torch.no_grad():
        return fit_sigma_coupling(family, p_halt, SIGMA_ORDER, samples_per_bin=SIGMA_SAMPLES, seed=seed)


def run_method(spec: str, method: str, iterations: int, subset: int, seed: int, out_dir: str) -> dict[str, Any]:
    """Train and predict with one method; the subset's predictive distribution goes to ``out_dir``."""
    from gp_couple import Diffusion, ExactGraphKernel, GRFKernel, fit_gp, grf_gp_settings, predict

    config = parse_method(method)
    graph, signal, observed, train, test = problem(spec, seed)
    nodes = np.concatenate([train, test])
    cpu_start = time.process_time()
    start = time.perf_counter()
    if config["kernel"] == "exact":
        from gp_couple.exact import DENSE_LIMIT, normalized_adjacency_eigh

        if graph.num_nodes <= DENSE_LIMIT and not config.get("matrix_free"):
            base = ExactGraphKernel(graph, Diffusion(1.0))
            normalized_adjacency_eigh(graph)  # the dense eigendecomposition: part of setup
            config["exact_kernel"] = "dense"
        else:
            from gp_couple.kernels.matrix_free import MatrixFreeGraphKernel

            base = MatrixFreeGraphKernel(graph, Diffusion(1.0))
            config["exact_kernel"] = "matrix-free"
    else:
        first_coupling = "antithetic" if config["coupling"] == "sigma" else config["coupling"]
        base = GRFKernel(graph, num_walkers=config["walkers"], p_halt=config["p_halt"], coupling=first_coupling,
                         directions=config["directions"], kernel_family=Diffusion(1.0), seed=seed, nodes=nodes,
                         schedule=None)
        if config["diagonal"] == "split":
            base = split_diagonal_kernel(base)
    setup = time.perf_counter() - start
    kernel, likelihood, model = scaled_graph_gp(base, train, observed)
    with grf_gp_settings():
        start = time.perf_counter()
        if config.get("fixed"):
            truth = config.get("at") or generating_hyperparameters(spec, seed)
            kernel.outputscale = truth["outputscale"]
            base.kernel_family.gamma = truth["gamma"]
            likelihood.noise = truth["noise"]
            losses = [float("nan")]
        elif config.get("coupling") == "sigma":
            losses = fit_gp(model, likelihood, iterations=iterations // 2, lr=0.05, seed=seed)
            base.resample(seed + 1, coupling=_sigma_coupling(base, config["p_halt"], seed))
            losses += fit_gp(model, likelihood, iterations=iterations - iterations // 2, lr=0.05, seed=seed + 1)
        else:
            losses = fit_gp(model, likelihood, iterations=iterations, lr=0.05, seed=seed)
        training = time.perf_counter() - start
        start = time.perf_counter()
        if config.get("predict_walkers"):
            refit = "sigma" in (config["coupling"], config["predict_coupling"])
            coupling = _sigma_coupling(base, config["p_halt"], seed) if refit else None
            base.resample(seed + 2, num_walkers=config["predict_walkers"], coupling=coupling)
        mean, variance = predict(model, likelihood, test, seed=seed)
        prediction = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    result: dict[str, Any] = {
        "method": method_label(config), "config": config, "setup_s": setup, "train_s": training,
        "predict_s": prediction, "total_s": setup + training + prediction, "cpu_s": cpu, "final_loss": losses[-1],
        "outputscale": float(kernel.outputscale), "gamma": float(base.kernel_family.gamma),
        "noise": float(likelihood.noise)}
    result.update(_metrics(mean.numpy(), variance.numpy(), signal, observed, test))
    if subset > 0:
        subset_mean, subset_cov = _predictive_on_subset(model, likelihood, train, test[:subset])
        path = os.path.join(out_dir, f"{os.getpid()}_{time.perf_counter_ns()}.npz")
        np.savez(path, mean=subset_mean, cov=subset_cov)
        result["subset_file"] = path
    return result


def run_exact_at(spec: str, outputscale: float, gamma: float, noise: float, subset: int, seed: int,
                 out_dir: str) -> dict[str, Any]:
    """The exact predictive distribution at given hyperparameters (float64; exact kernel columns)."""
    import torch

    from gp_couple import Diffusion
    from gp_couple.evaluation.posterior import gp_posterior_from_blocks
    from gp_couple.exact import exact_kernel_columns

    graph, signal, observed, train, test = problem(spec, seed)
    nodes = test[:subset]
    family = Diffusion().double()
    family.gamma = gamma
    start = time.perf_counter()
    needed = np.concatenate([train, test])
    with torch.no_grad():
        columns = np.concatenate([exact_kernel_columns(family, graph, needed[i:i + 500])
                                  for i in range(0, needed.size, 500)], axis=1) * outputscale
    position = {node: i for i, node in enumerate(needed)}
    train_cols = columns[:, [position[v] for v in train]]
    test_cols = columns[:, [position[v] for v in test]]
    full = gp_posterior_from_blocks(train_cols[train], test_cols[train].T, test_cols[test], observed[train], noise)
    result = {"recomputed_s": time.perf_counter() - start}
    result.update({f"recomputed_{key}": value for key, value in
                   _metrics(full.mean, np.diag(full.covariance), signal, observed, test).items()})
    path = os.path.join(out_dir, f"exact_{os.getpid()}.npz")
    np.savez(path, mean=full.mean[:nodes.size], cov=full.covariance[:nodes.size, :nodes.size])
    result["subset_file"] = path
    return result


# ---------------------------------------------------------------- driver
def _kl_to_exact(exact_file: str, method_file: str) -> float:
    from gp_couple.evaluation import gaussian_kl

    exact, method = np.load(exact_file), np.load(method_file)
    return gaussian_kl(exact["mean"], exact["cov"], method["mean"], method["cov"])


def _compare(result: dict[str, Any], exact: dict[str, Any]) -> None:
    """Add the ratios to the exact GP (and the KL where both have a subset distribution)."""
    if "subset_file" in exact and "subset_file" in result:
        result["kl"] = 0.0 if result is exact else _kl_to_exact(exact["subset_file"], result["subset_file"])
    result["rmse_vs_exact"] = result["test_rmse"] / exact["test_rmse"]
    result["nlpd_minus_exact"] = result["test_nlpd"] - exact["test_nlpd"]
    result["speedup_vs_exact"] = exact["total_s"] / result["total_s"]
    if "cpu_s" in exact and "cpu_s" in result:
        result["cpu_speedup_vs_exact"] = exact["cpu_s"] / result["cpu_s"]
    elif "cpu_s" in result and exact.get("exact_from"):
        # A reused exact GP has only its wall time, from a quiet machine using both cores:
        # against this run's CPU time (which bounds a quiet wall time from above) the
        # ratio is a lower bound.
        result["cpu_speedup_vs_exact"] = exact["total_s"] / result["cpu_s"]


def _write(report: dict[str, Any], path: str) -> None:
    rows = [dict(row, methods=[{k: v for k, v in m.items() if k != "subset_file"} for m in row["methods"]])
            for row in report["results"]]
    with open(path, "w") as out:
        json.dump(dict(report, results=rows), out, indent=2)
        out.write("\n")


def _saved_exact(path: str, spec: str) -> dict[str, Any] | None:
    with open(path) as source:
        report = json.load(source)
    row = next((r for r in report["results"] if r["graph"] == spec and "exact" in r), None)
    return None if row is None else dict(row["exact"], exact_from=path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if dispatch_worker(argv, globals()):
        return {}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", nargs="+", default=["bumpy"])
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS),
                        help="'exact', key=value,... configurations, or 'full' for every walker count, "
                             "coupling and direction scheme plus the gap-closing variants")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--subset", type=int, default=300, help="test nodes of the KL (0: no KL)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exact-from", default=None,
                        help="reuse the exact GP of this bench_graph_gp.py JSON where it has the problem")
    parser.add_argument("--skip-exact-kl", action="store_true",
                        help="with --exact-from: copy the saved exact GP without recomputing its subset "
                             "distribution (no KL column; saves a dense float64 solve)")
    parser.add_argument("--data-dir", default=None, help="data directory for mesh:NAME (sets $GP_COUPLE_DATA)")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    if args.data_dir:
        os.environ["GP_COUPLE_DATA"] = os.path.abspath(args.data_dir)
    methods = expand_methods(args.methods)
    for method in methods:
        parse_method(method)  # fail before hours of work
    rows: list[dict[str, Any]] = []
    if args.json_out and os.path.isfile(args.json_out):
        with open(args.json_out) as previous:  # keep problems measured by other invocations
            rows = [r for r in json.load(previous).get("results", []) if r["problem"] not in args.problems]
    report = {"benchmark": "graph_gp_accuracy", "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
              "config": vars(args) | {"methods": methods}, "results": rows}
    with tempfile.TemporaryDirectory() as out_dir:
        for spec in args.problems:
            graph, _, _, train, test = problem(spec, args.seed)
            row: dict[str, Any] = {"problem": spec, "nodes": graph.num_nodes, "train": int(train.size),
                                   "test": int(test.size), "methods": []}
            rows.append(row)
            saved = _saved_exact(args.exact_from, spec) if args.exact_from else None
            exact: dict[str, Any] | None = None
            for method in methods:
                if method == "exact" and saved is not None:
                    result = dict(saved, method="exact", config={"kernel": "exact", "exact_kernel": "dense"})
                    if not args.skip_exact_kl:
                        result.update(run_in_subprocess(__file__, run_exact_at, spec, saved["outputscale"],
                                                        saved["gamma"], saved["noise"], args.subset, args.seed,
                                                        out_dir))
                else:
                    result = run_in_subprocess(__file__, run_method, spec, method, args.iterations, args.subset,
                                               args.seed, out_dir)
                result.setdefault("method", method)
                if method in ("exact", "exact_true") and exact is None and "error" not in result:
                    exact = result  # the first exact row is the reference of the ratios
                if exact is not None and "error" not in result:
                    _compare(result, exact)
                row["methods"].append(result)
                print(json.dumps({"problem": spec, **{k: v for k, v in result.items() if k != "config"}}),
                      file=sys.stderr, flush=True)
                if args.json_out:  # after every method, so a long run that is stopped keeps its rows
                    _write(report, args.json_out)
            for result in row["methods"]:
                result.pop("subset_file", None)
    return emit_report(report, args.json_out)


if __name__ == "__main__":
    main()
