r"""Variational GPs on graph nodes: non-Gaussian likelihoods (classification, counts).

Graph GPs with a non-Gaussian likelihood, e.g. node classification with a Bernoulli
likelihood, need gpytorch's :class:`~gpytorch.models.ApproximateGP`: the posterior over
the latent function is a Gaussian :math:`q(\mathbf u)` at :math:`M` *inducing
inputs*, fitted by maximising the evidence lower bound

.. math::

    \mathcal L = \sum_{i=1}^{n} \mathbb E_{q(g_i)}[\log p(y_i \mid g_i)]
                 - \mathrm{KL}\big(q(\mathbf u)\,\|\,p(\mathbf u)\big)

(Hensman et al., 2015). With :class:`~gp_couple.kernels.GRFKernel` every kernel
evaluation is the sparse random-walk estimate of the paper's graph random features
(section on graph random features; appendix on the GRF approximation), so
:math:`\mathbf K_{\mathbf u\mathbf u}` and :math:`\mathbf K_{\mathbf u\mathbf x}` cost
sparse products.

Inducing inputs on a graph are **nodes**: discrete indices, which gradients cannot move.
gpytorch's default ``learn_inducing_locations=True`` would silently never update them
(their gradient is ``None``), so :class:`GraphVariationalGP` keeps them fixed and
refuses ``learn_inducing_locations=True`` with a :class:`ValueError`; graph kernels also
refuse inputs that require grad. Choose the inducing nodes with
:func:`select_inducing_nodes`:

* ``"k-center"`` (default): greedy farthest-point sampling on the hop distance
  (Gonzalez's 2-approximation of the :math:`k`-center problem). It starts at the node
  of highest degree and adds, each time, the candidate farthest (in hops) from every
  node chosen so far, ties broken by higher degree then lower index. Every node is
  then within a few hops of an inducing node, which is what a kernel that decays with
  graph distance (diffusion, regularised Laplacian) needs; unreachable components are
  covered first. Deterministic.
* ``"degree"``: degree-stratified random sampling: candidates sorted by degree are
  cut into :math:`M` strata of (nearly) equal size and one node is drawn from each, so
  hubs and the periphery are both represented.
* ``"random"``: uniform without replacement.

Inducing nodes are stored as a float ``(M, 1)`` tensor (gpytorch's Cholesky jitter is
defined for floating dtypes only; float64 above :math:`2^{24}` nodes so that indices stay
exact). :func:`fit_variational_gp` maximises the ELBO with Adam and reports diverged or
stalled training like :func:`gp_couple.models.fit_gp`; :func:`predict_variational`
returns the predictive distribution at nodes.
"""

from __future__ import annotations

from typing import Any, Literal

import gpytorch
import numpy as np
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.likelihoods import Likelihood
from gpytorch.means import Mean, ZeroMean
from gpytorch.variational import CholeskyVariationalDistribution, VariationalStrategy, _VariationalDistribution
from torch import Tensor

from ._checks import is_int
from ._nodes import node_index_array
from ._random import SeedLike, as_numpy_generator, seeded_torch_rng
from .graphs import Graph
from .kernels.graph_node import graph_kernels
from .models import _checked_modules, _module_dtype, _node_inputs, check_targets
from .optimize import check_schedule, minimize

__all__ = ["GraphVariationalGP", "INDUCING_METHODS", "fit_variational_gp", "predict_variational",
           "select_inducing_nodes"]

InducingMethod = Literal["k-center", "degree", "random"]
#: The inducing-node selection methods of :func:`select_inducing_nodes`.
INDUCING_METHODS: tuple[str, ...] = ("k-center", "degree", "random")

_LEARN_ERROR = ("inducing locations on a graph are node indices, which gradients cannot move "
                "(gpytorch would silently leave them where they are); pass "
                "learn_inducing_locations=False and choose the nodes with "
                "gp_couple.variational.select_inducing_nodes")


def select_inducing_nodes(graph: Graph, num_inducing: int, *, method: InducingMethod = "k-center",
                          candidates: Any = None, seed: SeedLike = 0) -> np.ndarray:
    """Choose ``num_inducing`` distinct inducing nodes (see the module docstring for the methods).

    :param graph: The graph.
    :param num_inducing: Number of inducing nodes :math:`M`, at most the number of candidates.
    :param method: ``"k-center"`` (farthest-point on hop distance, deterministic),
        ``"degree"`` (degree-stratified random) or ``"random"``.
    :param candidates: Nodes that may be chosen (default all), e.g. the nodes a
        :class:`~gp_couple.kernels.GRFKernel` sampled features for.
    :param seed: Seed of the random methods (unused by ``"k-center"``).
    :return: int64 node indices, shape ``(num_inducing,)``, in the order chosen.
    :raises TypeError: If ``graph`` is not a :class:`~gp_couple.graphs.Graph` or
        ``num_inducing`` is not an int.
    :raises ValueError: For an unknown method, ``num_inducing < 1``, more inducing nodes
        than candidates, or invalid candidates.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a gp_couple.Graph, got {type(graph).__name__}")
    if not is_int(num_inducing):
        raise TypeError(f"num_inducing must be an int, got {type(num_inducing).__name__}")
    if method not in INDUCING_METHODS:
        raise ValueError(f"method must be one of {INDUCING_METHODS}, got {method!r}")
    if candidates is None:
        pool = np.arange(graph.num_nodes, dtype=np.int64)
    else:
        pool = np.unique(node_index_array(candidates, "candidates", graph.num_nodes))
    if not 1 <= num_inducing <= pool.size:
        raise ValueError(f"num_inducing must lie in [1, {pool.size}] (the number of candidate nodes), "
                         f"got {num_inducing}")
    count = int(num_inducing)
    if method == "k-center":
        return _farthest_point_nodes(graph, pool, count)
    rng = as_numpy_generator(seed)
    if method == "random":
        return np.sort(rng.choice(pool, size=count, replace=False))
    by_degree = pool[np.argsort(graph.degrees[pool], kind="stable")]
    strata = np.array_split(by_degree, count)
    return np.sort(np.array([rng.choice(stratum) for stratum in strata], dtype=np.int64))


def _farthest_point_nodes(graph: Graph, pool: np.ndarray, count: int) -> np.ndarray:
    from scipy.sparse.csgraph import shortest_path

    adjacency = graph.adjacency
    degrees = graph.degrees[pool]
    # Lexicographic preference among equally far candidates: higher degree, then lower index.
    preference = np.lexsort((pool, -degrees))
    rank = np.empty(pool.size, dtype=np.int64)
    rank[preference] = np.arange(pool.size)
    distance = np.full(pool.size, np.inf)
    chosen: list[int] = []
    available = np.ones(pool.size, dtype=bool)
    for _ in range(count):
        # Farthest first (unreached components count as infinitely far), then preference.
        score = np.where(available, distance, -1.0)
        best = score.max()
        ties = np.flatnonzero(score == best)
        position = int(ties[np.argmin(rank[ties])])
        chosen.append(int(pool[position]))
        available[position] = False
        hops = shortest_path(adjacency, unweighted=True, indices=int(pool[position]), method="D")
        distance = np.minimum(distance, hops[pool])
    return np.asarray(chosen, dtype=np.int64)


class GraphVariationalGP(gpytorch.models.ApproximateGP):
    r"""A variational GP on graph nodes with fixed inducing nodes (SVGP, Hensman et al. 2015).

    :math:`q(\mathbf u) = \mathcal N(\mathbf m, \mathbf S)` at the inducing nodes
    (gpytorch's :class:`~gpytorch.variational.CholeskyVariationalDistribution` by
    default) and gpytorch's whitened
    :class:`~gpytorch.variational.VariationalStrategy`. Inputs are node indices as
    ``(n, 1)`` floating tensors, as for :class:`~gp_couple.models.GraphGP`:
    :meth:`node_inputs` builds them; :func:`fit_variational_gp` and
    :func:`predict_variational` take node indices directly.

    :param covar_module: The covariance, e.g. ``ScaleKernel(GRFKernel(graph, ...))`` or
        ``ScaleKernel(ExactGraphKernel(graph))``; it must contain a graph kernel.
    :param inducing_nodes: Node indices of the inducing points, or an int :math:`M`
        to choose them with :func:`select_inducing_nodes` (``k-center`` among the nodes
        the kernel can evaluate).
    :param mean_module: The prior mean (default ``ZeroMean()``).
    :param variational_distribution: A gpytorch variational distribution over the
        :math:`M` inducing values (default Cholesky).
    :param learn_inducing_locations: Must be ``False``: node indices cannot be learned.
    :raises ValueError: If ``learn_inducing_locations`` is true, inducing nodes are
        duplicated, out of range or have no GRF features, or the covariance has no graph
        kernel or graph kernels on different graphs.
    :raises TypeError: For arguments of the wrong type.
    """

    def __init__(self, covar_module: gpytorch.kernels.Kernel, inducing_nodes: Any, *,
                 mean_module: Mean | None = None,
                 variational_distribution: _VariationalDistribution | None = None,
                 learn_inducing_locations: bool = False) -> None:
        if learn_inducing_locations:
            raise ValueError(f"learn_inducing_locations=True: {_LEARN_ERROR}")
        graph_kernels = _checked_modules(covar_module, mean_module)
        graphs = {kernel.graph.fingerprint(): kernel.graph for kernel in graph_kernels}
        if len(graphs) != 1:
            raise ValueError("covar_module must contain graph kernels on exactly one graph "
                             f"(found {len(graphs)})")
        graph = next(iter(graphs.values()))
        if isinstance(inducing_nodes, (int, np.integer)) and not isinstance(inducing_nodes, bool):
            inducing_nodes = select_inducing_nodes(graph, int(inducing_nodes),
                                                   candidates=_covered_nodes(graph_kernels))
        # Distinct: a repeated inducing node would make their covariance singular.
        inducing = _node_inputs(inducing_nodes, "inducing_nodes", graph.num_nodes, graph_kernels, unique=True)
        if inducing.dtype != torch.float64:
            inducing = inducing.to(_module_dtype(covar_module))
        if variational_distribution is None:
            variational_distribution = CholeskyVariationalDistribution(inducing.shape[0])
        elif not isinstance(variational_distribution, _VariationalDistribution):
            raise TypeError("variational_distribution must be a gpytorch variational distribution, got "
                            f"{type(variational_distribution).__name__}")
        strategy = VariationalStrategy(self, inducing, variational_distribution,
                                       learn_inducing_locations=False)
        super().__init__(strategy)
        self._graph = graph
        self.mean_module = ZeroMean() if mean_module is None else mean_module
        self.covar_module = covar_module

    @property
    def graph(self) -> Graph:
        """The graph of the covariance's graph kernels."""
        return self._graph

    @property
    def inducing_nodes(self) -> Tensor:
        """The inducing node indices (int64, ``(M,)``)."""
        return self.variational_strategy.inducing_points[..., 0].to(torch.int64)

    def node_inputs(self, nodes: Any, name: str = "nodes") -> Tensor:
        """Validated GP inputs ``(n, 1)`` for node indices (in the inducing inputs' dtype)."""
        inputs = _node_inputs(nodes, name, self._graph.num_nodes, graph_kernels(self.covar_module))
        return inputs.to(self.variational_strategy.inducing_points.dtype)

    def forward(self, x: Tensor) -> MultivariateNormal:
        covariance = self.covar_module(x)
        mean = self.mean_module(x).to(covariance.dtype)
        return MultivariateNormal(mean, covariance)


def _covered_nodes(graph_kernels: list[Any]) -> np.ndarray | None:
    """Nodes every graph kernel can be evaluated at (``None``: all nodes).

    :param graph_kernels: The graph kernels of the covariance
        (:meth:`~gp_couple.kernels.graph_node.GraphNodeKernel.covered_nodes`).
    """
    allowed: np.ndarray | None = None
    for kernel in graph_kernels:
        covered = kernel.covered_nodes()
        if covered is not None:
            nodes = covered.cpu().numpy()
            allowed = nodes if allowed is None else np.intersect1d(allowed, nodes)
    return allowed


def _check_model(model: GraphVariationalGP, likelihood: Likelihood) -> None:
    if not isinstance(model, GraphVariationalGP):
        raise TypeError(f"model must be a GraphVariationalGP, got {type(model).__name__}")
    if not isinstance(likelihood, Likelihood):
        raise TypeError(f"likelihood must be a gpytorch Likelihood, got {type(likelihood).__name__}")


def fit_variational_gp(model: GraphVariationalGP, likelihood: Likelihood, train_nodes: Any,
                       train_targets: Any, *, iterations: int, lr: float = 0.05,
                       seed: SeedLike = None) -> list[float]:
    r"""Maximise the ELBO (gpytorch's :class:`~gpytorch.mlls.VariationalELBO`) with Adam, full batch.

    Every step evaluates :math:`-\mathcal L / n` on all training nodes and updates the
    variational parameters, the kernel hyperparameters and the likelihood's parameters.
    Train/eval modes are restored.

    :param model: The variational GP.
    :param likelihood: Its likelihood (e.g. :class:`~gpytorch.likelihoods.BernoulliLikelihood`).
    :param train_nodes: Observed node indices, shape ``(n,)``.
    :param train_targets: Observations, shape ``(n,)`` (0/1 labels for a Bernoulli likelihood).
    :param iterations: Number of Adam steps.
    :param lr: Adam learning rate.
    :param seed: Seeds the Monte Carlo / CG randomness drawn from torch's global
        generator (which is restored afterwards); ``None`` uses it as it is.
    :return: The negative ELBO per data point before each step.
    :raises TypeError: For a model or likelihood of the wrong type.
    :raises ValueError: For bad nodes, targets, ``iterations`` or ``lr``.
    :raises FloatingPointError: If the loss or a parameter becomes NaN or infinite.
    :warns gp_couple.optimize.TrainingWarning: If training diverged or stalled.
    """
    _check_model(model, likelihood)
    inputs = model.node_inputs(train_nodes, "train_nodes")
    targets = check_targets(train_targets, inputs.shape[0], inputs.dtype, allow_bool=True)
    check_schedule(iterations, lr)
    elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=targets.numel())
    # The model's and the likelihood's parameters, each once (the likelihood may be a submodule).
    parameters = {**{f"likelihood.{name}": p for name, p in likelihood.named_parameters()},
                  **dict(model.named_parameters())}
    unique = {id(p): (name, p) for name, p in parameters.items()}
    modes = (model.training, likelihood.training)
    model.train()
    likelihood.train()
    try:
        return minimize(lambda: -elbo(model(inputs), targets), dict(unique.values()),
                        iterations=iterations, lr=lr, seed=seed)
    finally:
        model.train(modes[0])
        likelihood.train(modes[1])


def predict_variational(model: GraphVariationalGP, likelihood: Likelihood, nodes: Any, *,
                        seed: SeedLike = None) -> tuple[MultivariateNormal, Any]:
    r"""The latent posterior :math:`q(g_*)` and the predictive distribution at ``nodes`` (no gradients).

    :param model: A fitted :class:`GraphVariationalGP`.
    :param likelihood: Its likelihood.
    :param nodes: Node indices, shape ``(n,)``.
    :param seed: Seeds randomness drawn from torch's global generator (restored afterwards).
    :return: ``(latent, predictive)``: the latent :class:`~gpytorch.distributions.MultivariateNormal`
        and ``likelihood(latent)`` (for a Bernoulli likelihood, ``predictive.probs`` are
        the class-1 probabilities :math:`\int \Phi(g)\, q(g)\, dg`).
    """
    _check_model(model, likelihood)
    inputs = model.node_inputs(nodes)
    modes = (model.training, likelihood.training)
    model.eval()
    likelihood.eval()
    try:
        with torch.no_grad(), seeded_torch_rng(seed):
            latent = model(inputs)
            predictive = likelihood(latent)
    finally:
        model.train(modes[0])
        likelihood.train(modes[1])
    return latent, predictive
