"""GRFKernel and ExactGraphKernel: correctness, statistics, gpytorch/Pyro integration, state."""

from __future__ import annotations

import io
import math

import gpytorch
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from linear_operator.operators import RootLinearOperator

from gp_couple.couplings.walk_lengths import SigmaCoupling, get_walk_length_coupling
from gp_couple.features.graph_random_features import GraphRandomFeatures
from gp_couple.graphs import Graph, grid_graph
from gp_couple.kernel_families import Diffusion, RegularisedLaplacian
from gp_couple.kernels import ExactGraphKernel, GRFKernel, grf_kernel as grf_kernel_module
from gp_couple.models import GraphGP, fit_gp, predict
from gp_couple.operators import GRFGramLinearOperator, SparseFeatureLinearOperator
from tests.stats import assert_unbiased

GRID = grid_graph(4, 5)  # 20 nodes
ALL = torch.arange(GRID.num_nodes, dtype=torch.float32).unsqueeze(-1)


def dense_features(features: GraphRandomFeatures, gamma: float) -> torch.Tensor:
    """Phi of a walk decomposition for the diffusion kernel (float64), built independently of the kernel."""
    tensors = features.tensors()
    tensors["weights"] = tensors["weights"].double()
    features = GraphRandomFeatures.from_tensors(tensors, features.num_nodes)
    modulation = Diffusion(gamma=gamma).modulation(features.num_terms).detach().double()
    return torch.from_numpy(features.scipy_feature_matrix(modulation).toarray())


def regression_data(graph: Graph, columns: int, seed: int = 0) -> torch.Tensor:
    """A smooth function of the position on a grid graph plus noise, standardised."""
    generator = torch.Generator().manual_seed(seed)
    node = torch.arange(graph.num_nodes, dtype=torch.float64)
    row, column = node // columns, node % columns
    values = torch.sin(row / 2.0) + torch.cos(column / 2.5)
    values = values + 0.1 * torch.randn(graph.num_nodes, generator=generator, dtype=torch.float64)
    return ((values - values.mean()) / values.std()).float()


def make_model(graph: Graph, train: torch.Tensor, targets: torch.Tensor, **kernel_args) -> GraphGP:
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    kernel = gpytorch.kernels.ScaleKernel(GRFKernel(graph, **kernel_args))
    return GraphGP(train, targets, likelihood, kernel)


# ------------------------------------------------------------------ values
def test_kernel_matches_feature_products():
    kernel = GRFKernel(GRID, num_walkers=8, p_halt=0.4, seed=3, kernel_family=Diffusion(gamma=1.3)).double()
    phi = dense_features(kernel.features, 1.3)
    x1 = torch.tensor([[0.0], [7.0], [7.0], [19.0]], dtype=torch.float64)
    x2 = torch.tensor([[3.0], [0.0], [12.0]], dtype=torch.float64)
    rows1, rows2 = x1[:, 0].long(), x2[:, 0].long()
    cross = kernel(x1, x2).to_dense()
    torch.testing.assert_close(cross, phi[rows1] @ phi[rows2].T)
    symmetric = kernel(x1)
    assert isinstance(symmetric.evaluate_kernel(), GRFGramLinearOperator)
    torch.testing.assert_close(symmetric.to_dense(), phi[rows1] @ phi[rows1].T)
    torch.testing.assert_close(kernel(x1, diag=True), (phi[rows1] ** 2).sum(-1))
    # Integer inputs give the same kernel.
    torch.testing.assert_close(kernel(x1.long(), x2.long()).to_dense(), cross)


def test_same_seed_gives_identical_kernels_and_default_matches_features():
    first = GRFKernel(GRID, num_walkers=6, p_halt=0.3, seed=11, coupling="iid", directions="independent")
    second = GRFKernel(GRID, num_walkers=6, p_halt=0.3, seed=11, coupling="iid", directions="independent")
    for name, buffer in first.named_buffers():
        assert torch.equal(buffer, dict(second.named_buffers())[name]), name
    reference = GraphRandomFeatures.sample(GRID, 6, 0.3, "iid", seed=11)
    assert torch.equal(first.features_columns, reference.columns)
    other = GRFKernel(GRID, num_walkers=6, p_halt=0.3, seed=12)
    assert not torch.equal(first(ALL).to_dense(), other(ALL).to_dense())
    # Generators resolve to a stored int that reproduces the kernel.
    drawn = GRFKernel(GRID, seed=np.random.default_rng(5))
    again = GRFKernel(GRID, seed=drawn.seed)
    assert torch.equal(drawn.features_weights, again.features_weights)


@pytest.mark.parametrize("coupling", ["iid", "antithetic"])
def test_mean_over_seeds_matches_exact_kernel_off_diagonal(coupling):
    # Walks from different start nodes are independent, so a graph made of identical
    # disconnected copies yields one independent kernel estimate per copy and seed.
    block, copies, seeds = grid_graph(3, 4), 15, 20
    size = block.num_nodes
    graph = Graph(sp.block_diag([block.adjacency] * copies, format="csr"))
    nodes = torch.arange(graph.num_nodes, dtype=torch.float64).unsqueeze(-1)
    exact = ExactGraphKernel(block, RegularisedLaplacian(sigma=1.0, degree=2)).double()
    expected = exact(nodes[:size]).to_dense().detach().numpy()
    kernel = GRFKernel(graph, num_walkers=4, p_halt=0.4, coupling=coupling, seed=0,
                       kernel_family=RegularisedLaplacian(sigma=1.0, degree=2)).double()
    samples = []
    with torch.no_grad():
        for seed in range(seeds):
            full = kernel.resample(seed=seed)(nodes).to_dense().numpy()
            samples += [full[c * size:(c + 1) * size, c * size:(c + 1) * size] for c in range(copies)]
    off_diagonal = ~np.eye(size, dtype=bool)
    estimates = np.stack(samples)[:, off_diagonal]
    # 132 simultaneous comparisons: z = 5 keeps the family-wise false alarm below 1e-4.
    assert_unbiased(estimates, expected[off_diagonal], z=5.0)


def test_nodes_subset_samples_only_requested_rows():
    nodes = [12, 3, 17]
    kernel = GRFKernel(GRID, num_walkers=8, seed=2, nodes=nodes).double()
    reference = GraphRandomFeatures.sample(GRID, 8, 0.1, "antithetic", seed=2, start_nodes=nodes,
                                           directions="repelling")
    phi = dense_features(reference, 1.0)
    x = torch.tensor([[17.0], [12.0]], dtype=torch.float64)
    torch.testing.assert_close(kernel(x).to_dense(), phi[[2, 0]] @ phi[[2, 0]].T)
    with pytest.raises(ValueError, match="without GRF features"):
        kernel(torch.tensor([[5.0]], dtype=torch.float64)).to_dense()
    kernel.resample(seed=4, nodes=[5])
    assert kernel(torch.tensor([[5.0]], dtype=torch.float64)).to_dense().shape == (1, 1)
    kernel.resample(seed=4, nodes=None)
    assert kernel.features_start_nodes.numel() == GRID.num_nodes


@pytest.mark.parametrize("rows", [[3, 17], list(range(0, 20, 2)) + [1]])
def test_feature_rows_without_gradients_equal_the_differentiable_ones(rows):
    # Without gradients a large selection gathers its values from all rows at once; a
    # small one (and any selection with gradients) computes only its own rows.
    kernel = GRFKernel(GRID, num_walkers=8, seed=5, kernel_family=Diffusion(1.3)).double()
    nodes = torch.tensor(rows)
    differentiable = kernel.feature_operator(nodes).to_dense()
    assert differentiable.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(kernel.feature_operator(nodes).to_dense(), differentiable.detach(),
                                   rtol=0, atol=1e-15)


def test_a_kernel_deep_copies_after_its_step_matrices_were_built():
    import copy

    kernel = GRFKernel(GRID, num_walkers=8, seed=5).double()
    values = kernel.feature_values()  # builds the step matrix of every slot (a sparse CSR tensor)
    values.sum().backward()  # and its transpose
    copied = copy.deepcopy(kernel)
    nodes = torch.arange(20, dtype=torch.float64).unsqueeze(-1)
    torch.testing.assert_close(copied(nodes).to_dense(), kernel(nodes).to_dense(), rtol=0, atol=0)


def test_failed_resample_leaves_the_kernel_unchanged():
    kernel = GRFKernel(GRID, num_walkers=4, seed=0, coupling="iid")
    before = {name: buffer.clone() for name, buffer in kernel.named_buffers()}
    with pytest.raises(ValueError, match="even"):
        kernel.resample(seed=1, num_walkers=3, coupling="antithetic")
    assert (kernel.num_walkers, kernel.coupling, kernel.seed) == (4, get_walk_length_coupling("iid"), 0)
    assert all(torch.equal(buffer, before[name]) for name, buffer in kernel.named_buffers())


def test_double_converts_feature_weights():
    kernel = GRFKernel(GRID, seed=0)
    assert kernel.features_weights.dtype == torch.float32
    kernel.double()
    assert kernel.features_weights.dtype == torch.float64
    assert kernel.features_columns.dtype in (torch.int32, torch.int64)
    assert kernel(ALL.double()).to_dense().dtype == torch.float64


# ------------------------------------------------------------------ batches and Pyro
def test_batch_hyperparameters_match_unbatched_kernels():
    gammas = torch.tensor([[0.7], [1.6]])
    batched = GRFKernel(GRID, seed=1, batch_shape=torch.Size([2]),
                        kernel_family=Diffusion(batch_shape=torch.Size([2])))
    batched.kernel_family.gamma = gammas
    x = ALL[:6]
    result = batched(x).to_dense()
    assert result.shape == (2, 6, 6)
    for index, gamma in enumerate(gammas[:, 0].tolist()):
        single = GRFKernel(GRID, seed=1, kernel_family=Diffusion(gamma=gamma))
        torch.testing.assert_close(result[index], single(x).to_dense())
    assert batched(x, diag=True).shape == (2, 6)
    # Batched inputs may hold different nodes in every entry.
    stacked = batched(torch.stack([x, x.flip(0)])).to_dense()
    torch.testing.assert_close(stacked[0], result[0])
    torch.testing.assert_close(stacked[1], result[1].flip(0).flip(1))
    # node_indices itself only accepts them when asked to.
    with pytest.raises(ValueError, match="same nodes in every batch"):
        batched.node_indices(torch.stack([x, x.flip(0)]))


def test_pyro_sample_from_prior_and_load_from_samples():
    pyro = pytest.importorskip("pyro")
    graph = grid_graph(3, 3)
    train = torch.tensor([0, 2, 4, 6, 8])
    targets = torch.tensor([0.5, -0.2, 0.1, 0.3, -0.4])
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_prior=gpytorch.priors.GammaPrior(2.0, 10.0))
    kernel = gpytorch.kernels.ScaleKernel(
        GRFKernel(graph, num_walkers=8, seed=0,
                  kernel_family=Diffusion(gamma_prior=gpytorch.priors.GammaPrior(3.0, 2.0))),
        outputscale_prior=gpytorch.priors.GammaPrior(2.0, 2.0))
    model = GraphGP(train, targets, likelihood, kernel)

    def pyro_model(x, y):
        with gpytorch.settings.fast_computations(False, False, False):
            sampled = model.pyro_sample_from_prior()
            output = sampled.likelihood(sampled(x))
            pyro.sample("obs", output, obs=y)

    pyro.set_rng_seed(0)
    trace = pyro.poutine.trace(pyro_model).get_trace(model.train_inputs[0], model.train_targets)
    sites = {name for name, site in trace.nodes.items() if site["type"] == "sample"}
    assert "covar_module.base_kernel.kernel_family.gamma_prior" in sites
    assert math.isfinite(float(trace.log_prob_sum()))

    num_samples = 3
    samples = {
        "covar_module.base_kernel.kernel_family.gamma_prior": torch.tensor([[0.5], [1.0], [2.0]]),
        "covar_module.outputscale_prior": torch.tensor([0.5, 1.0, 1.5]),
        "likelihood.noise_covar.noise_prior": torch.full((num_samples, 1), 0.1),
    }
    model.pyro_load_from_samples(samples)
    model.eval()
    test = model.node_inputs([1, 3, 5, 7]).unsqueeze(0).repeat(num_samples, 1, 1)
    with torch.no_grad():
        output = model(test)
    assert output.mean.shape == (num_samples, 4)
    assert torch.all(output.variance > 0)


# ------------------------------------------------------------------ training and gradients
def test_mll_gradient_wrt_gamma_matches_finite_differences():
    torch.manual_seed(0)
    graph = grid_graph(4, 4)
    targets = regression_data(graph, 4).double()
    train = torch.arange(0, 16, 2)
    model = make_model(graph, train, targets[train], num_walkers=16, seed=0).double()
    likelihood = model.likelihood
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()
    family = model.covar_module.base_kernel.kernel_family

    def loss_at(gamma: float) -> torch.Tensor:
        family.gamma = gamma
        return -mll(model(*model.train_inputs), model.train_targets)

    with gpytorch.settings.max_cholesky_size(10_000):
        loss = loss_at(1.2)
        (gradient,) = torch.autograd.grad(loss, family.raw_gamma)
        step = 1e-5
        with torch.no_grad():
            raw = family.raw_gamma.detach().clone()
            values = []
            for sign in (1.0, -1.0):
                family.raw_gamma.copy_(raw + sign * step)
                values.append(-mll(model(*model.train_inputs), model.train_targets))
        numeric = (values[0] - values[1]) / (2 * step)
    torch.testing.assert_close(gradient.reshape(()), numeric.reshape(()), rtol=1e-6, atol=1e-9)


def _train_and_predict(max_cholesky_size: int):
    graph = grid_graph(6, 6)
    targets = regression_data(graph, 6)
    generator = torch.Generator().manual_seed(1)
    order = torch.randperm(graph.num_nodes, generator=generator)
    train, test = order[:28], order[28:]
    model = make_model(graph, train, targets[train], num_walkers=16, p_halt=0.4, seed=0)
    # CG training draws Hutchinson probes from torch's global generator: fix it here.
    with torch.random.fork_rng(), gpytorch.settings.max_cholesky_size(max_cholesky_size), \
            gpytorch.settings.cg_tolerance(0.01):
        torch.manual_seed(0)
        history = fit_gp(model, model.likelihood, iterations=25, lr=0.1)
        mean, variance = predict(model, model.likelihood, test)
        fast_mean, fast_variance = predict(model, model.likelihood, test)
    return model, history, mean, variance, fast_mean, fast_variance


def _exact_loss(model) -> float:
    """Negative marginal log likelihood per datum, by Cholesky (no stochastic estimates)."""
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(10_000):
        return float(-mll(model(*model.train_inputs), model.train_targets))


def test_training_decreases_loss_and_predicts_with_cholesky():
    _, history, mean, variance, fast_mean, fast_variance = _train_and_predict(10_000)
    assert history[-1] < history[0] - 0.05
    assert mean.shape == variance.shape == (8,)
    assert torch.all(variance > 0)
    torch.testing.assert_close(fast_mean, mean, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fast_variance, variance, rtol=1e-3, atol=1e-4)


def test_cg_training_never_densifies(monkeypatch):
    calls = []

    def forbidden(self):
        calls.append(type(self).__name__)
        raise AssertionError(f"to_dense called on {type(self).__name__} during CG training")

    allowed = {"gram": GRFGramLinearOperator.to_dense, "features": SparseFeatureLinearOperator.to_dense}
    monkeypatch.setattr(GRFGramLinearOperator, "to_dense", forbidden)
    monkeypatch.setattr(SparseFeatureLinearOperator, "to_dense", forbidden)
    # The checks when training ends solve exactly, as predict's variances do (a dense or a sparse
    # factor up to DENSE_VARIANCE_SIZE points): outside training, so the operators may densify there.
    checks = []

    def exact(check):
        def checked(self, *args, **kwargs):
            checks.append(check.__name__)
            with monkeypatch.context() as inside:
                inside.setattr(GRFGramLinearOperator, "to_dense", allowed["gram"])
                inside.setattr(SparseFeatureLinearOperator, "to_dense", allowed["features"])
                return check(self, *args, **kwargs)
        return checked

    for name in ("_prediction_error", "_one_draw_error"):
        monkeypatch.setattr(GRFKernel, name, exact(getattr(GRFKernel, name)))
    # The bias-corrected rounds factorise densely wherever the factor fits: here it does not.
    monkeypatch.setattr(grf_kernel_module, "paired_factor_fits", lambda rows, itemsize: False)
    entry_reads = []
    pivoted_cholesky = GRFGramLinearOperator.pivoted_cholesky
    monkeypatch.setattr(GRFGramLinearOperator, "pivoted_cholesky",
                        lambda self, *args, **kwargs: entry_reads.append(1) or pivoted_cholesky(self, *args, **kwargs))
    graph = grid_graph(6, 6)
    targets = regression_data(graph, 6)
    train = torch.arange(0, 36, 1)[:30]
    model = make_model(graph, train, targets[train], num_walkers=16, seed=0)
    # A tiny preconditioning threshold exercises the pivoted Cholesky preconditioner,
    # which reads the operator's diagonal and rows. gpytorch densifies joint train/test
    # kernels below max_eager_kernel_size on purpose: turn that off to test the lazy path.
    with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.min_preconditioning_size(10), \
            gpytorch.settings.max_preconditioner_size(5), gpytorch.settings.cg_tolerance(0.01), \
            gpytorch.settings.max_eager_kernel_size(0):
        history = fit_gp(model, model.likelihood, iterations=15, lr=0.1)
        mean, variance = predict(model, model.likelihood, [30, 31, 32], variance="lanczos")
    assert not calls and set(checks) == {"_prediction_error", "_one_draw_error"}
    assert entry_reads, "the pivoted-Cholesky preconditioner was not exercised"
    assert history[-1] < history[0]
    assert torch.all(torch.isfinite(mean)) and torch.all(variance > 0)


def test_cg_and_cholesky_training_agree():
    # CG training follows stochastic (Hutchinson / Lanczos) log-determinant gradients, so
    # it ends at nearby but different hyperparameters: compare the exact loss there.
    model_cg, *_ = _train_and_predict(0)
    model_chol, history_chol, *_ = _train_and_predict(10_000)
    assert history_chol[-1] < history_chol[0] - 0.05
    assert abs(_exact_loss(model_cg) - _exact_loss(model_chol)) < 0.01


def test_cg_prediction_matches_cholesky_at_fixed_hyperparameters():
    graph = grid_graph(6, 6)
    targets = regression_data(graph, 6)
    train, test = torch.arange(0, 36, 2), torch.arange(1, 36, 2)
    model = make_model(graph, train, targets[train], num_walkers=16, p_halt=0.4, seed=0)
    model.covar_module.base_kernel.kernel_family.gamma = 1.3
    model.likelihood.noise = 0.05
    with gpytorch.settings.max_cholesky_size(10_000):
        mean_chol, _ = predict(model, model.likelihood, test)
    model.prediction_strategy = None
    with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.eval_cg_tolerance(1e-4), \
            gpytorch.settings.max_cg_iterations(200):
        mean_cg, _ = predict(model, model.likelihood, test)
    torch.testing.assert_close(mean_cg, mean_chol, rtol=1e-3, atol=1e-4)


def test_root_decomposition_of_training_covariance_is_the_features():
    kernel = gpytorch.kernels.ScaleKernel(GRFKernel(GRID, seed=0))
    kernel.outputscale = 2.0
    covariance = kernel(ALL[:7]).evaluate_kernel()
    root = covariance.root_decomposition()
    assert isinstance(root, RootLinearOperator)
    assert isinstance(root.root, SparseFeatureLinearOperator)
    torch.testing.assert_close(root.to_dense(), covariance.to_dense())


# ------------------------------------------------------------------ state dicts
def _fresh_model(graph, train, targets):
    return make_model(graph, train, targets, num_walkers=8, p_halt=0.5, seed=0)


def _predictions(model):
    return predict(model, model.likelihood, [1, 5, 9, 13])


def test_state_dict_round_trip_reproduces_predictions_after_resample():
    graph = grid_graph(4, 4)
    targets = regression_data(graph, 4)
    train = torch.arange(0, 16, 3)
    model = _fresh_model(graph, train, targets[train])
    coupling = SigmaCoupling.identity(8, p_halt=0.5)
    model.covar_module.base_kernel.resample(seed=123, num_walkers=12, coupling=coupling)
    model.covar_module.base_kernel.kernel_family.gamma = 1.7
    model.likelihood.noise = 0.05
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)

    restored = _fresh_model(graph, train, targets[train])
    assert restored.covar_module.base_kernel.features_weights.shape != \
        model.covar_module.base_kernel.features_weights.shape
    restored.load_state_dict(torch.load(buffer))  # weights_only: the extra state is plain data
    base = restored.covar_module.base_kernel
    assert (base.num_walkers, base.seed, base.coupling) == (12, 123, coupling)
    for got, expected in zip(_predictions(restored), _predictions(model)):
        assert torch.equal(got, expected)


def _weighted_grid() -> Graph:
    adjacency = grid_graph(4, 4).adjacency.tocoo()
    upper = adjacency.row < adjacency.col
    weights = np.random.default_rng(3).lognormal(0.0, 1.0, upper.sum())
    rows, cols = adjacency.row[upper], adjacency.col[upper]
    return Graph.from_edges(np.stack([rows, cols], axis=1), weights=weights, num_nodes=16)


def test_state_dict_round_trip_keeps_proposal_and_directions():
    graph = _weighted_grid()
    kernel = GRFKernel(graph, num_walkers=6, p_halt=0.3, seed=4, proposal="uniform", directions="repelling")
    kernel.resample(seed=5, proposal="weighted")
    expected = GraphRandomFeatures.sample(graph, 6, 0.3, "antithetic", seed=5, proposal="weighted",
                                          directions="repelling",
                                          dtype=kernel.features.dtype)
    assert all(torch.equal(a, b) for a, b in zip(kernel.features.tensors().values(),
                                                 expected.tensors().values()))
    buffer = io.BytesIO()
    torch.save(kernel.state_dict(), buffer)
    buffer.seek(0)
    restored = GRFKernel(graph, num_walkers=2, p_halt=0.5, seed=0)
    restored.load_state_dict(torch.load(buffer))
    assert (restored.proposal.name, restored.directions.name) == ("weighted", "repelling")
    assert all(torch.equal(a, b) for a, b in zip(restored.features.tensors().values(),
                                                 kernel.features.tensors().values()))
    # A state saved before proposals existed was walked uniformly and independently.
    legacy = kernel.state_dict()
    del legacy["_extra_state"]["proposal"], legacy["_extra_state"]["directions"]
    restored.load_state_dict(legacy)
    assert (restored.proposal.name, restored.directions.name) == ("uniform", "independent")


def test_the_kernel_multiplies_on_the_pattern_its_features_carry():
    kernel = GRFKernel(GRID, num_walkers=4, p_halt=0.4, seed=1)
    assert kernel._pattern() is kernel.features.pattern
    kernel.resample(2)
    assert kernel._pattern() is kernel.features.pattern
    kernel.double()  # a rebuild from the buffers (validated) carries its own pattern too
    assert kernel._pattern() is kernel.features.pattern


@pytest.mark.parametrize("corrupt, message", [
    (lambda state: state.update(features_columns=state["features_columns"] + 1000), "outside"),
    (lambda state: state.update(features_row_pointer=state["features_row_pointer"].flip(0)), "row_pointer"),
])
def test_corrupt_feature_state_is_rejected_and_leaves_the_kernel_intact(corrupt, message):
    kernel = GRFKernel(GRID, num_walkers=4, p_halt=0.4, seed=1)
    state = {key: value.clone() if isinstance(value, torch.Tensor) else value
             for key, value in kernel.state_dict().items()}
    corrupt(state)
    before = {name: tensor.clone() for name, tensor in kernel.features.tensors().items()}
    with pytest.raises(ValueError, match=f"inconsistent.*{message}"):
        kernel.load_state_dict(state)
    assert all(torch.equal(before[name], tensor) for name, tensor in kernel.features.tensors().items())


def test_state_dict_from_another_graph_is_rejected():
    graph = grid_graph(4, 4)
    targets = regression_data(graph, 4)
    train = torch.arange(0, 16, 3)
    model = _fresh_model(graph, train, targets[train])
    other_graph = grid_graph(2, 8)
    other = _fresh_model(other_graph, train, targets[train])
    before = [tensor.clone() for tensor in other.state_dict().values() if isinstance(tensor, torch.Tensor)]
    with pytest.raises(ValueError, match="different graph"):
        other.load_state_dict(model.state_dict())
    after = [tensor for tensor in other.state_dict().values() if isinstance(tensor, torch.Tensor)]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_hyperparameters_transfer_between_exact_and_grf_kernels():
    exact = gpytorch.kernels.ScaleKernel(ExactGraphKernel(GRID))
    exact.base_kernel.kernel_family.gamma = 2.2
    exact.outputscale = 0.7
    grf = gpytorch.kernels.ScaleKernel(GRFKernel(GRID, seed=0))
    result = grf.load_state_dict(exact.state_dict(), strict=False)
    assert all(key.startswith("base_kernel.features_") for key in result.missing_keys)
    assert grf.base_kernel.kernel_family.gamma.item() == pytest.approx(2.2)
    assert grf.outputscale.item() == pytest.approx(0.7)
    back = gpytorch.kernels.ScaleKernel(ExactGraphKernel(GRID))
    back.load_state_dict(grf.state_dict(), strict=False)
    assert back.base_kernel.kernel_family.gamma.item() == pytest.approx(2.2)


def test_exact_graph_kernel_matches_dense_reference():
    from gp_couple.exact import exact_kernel_matrix

    family = Diffusion(gamma=1.4).double()
    kernel = ExactGraphKernel(GRID, family).double()
    full = exact_kernel_matrix(family, GRID)
    x1 = torch.tensor([[3.0], [0.0], [19.0]], dtype=torch.float64)
    x2 = torch.tensor([[5.0], [3.0]], dtype=torch.float64)
    torch.testing.assert_close(kernel(x1, x2).to_dense(), full[[3, 0, 19]][:, [5, 3]])
    torch.testing.assert_close(kernel(x1, diag=True), full.diagonal()[[3, 0, 19]])


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("x, error, message", [
    (torch.tensor([[0.0, 1.0]]), ValueError, "shape"),
    (torch.tensor([[1.5]]), ValueError, "non-integer"),
    (torch.tensor([[20.0]]), ValueError, "outside"),
    (torch.tensor([[-1]]), ValueError, "outside"),
    (torch.tensor([[float("nan")]]), ValueError, "NaN"),
    (torch.tensor([[True]]), TypeError, "dtype"),
])
def test_bad_inputs_raise_clear_errors(x, error, message):
    kernel = GRFKernel(GRID, seed=0)
    with pytest.raises(error, match=message):
        kernel(x).to_dense()
    with pytest.raises(error, match=message):
        ExactGraphKernel(GRID)(x).to_dense()


@pytest.mark.parametrize("kwargs, error, message", [
    ({"num_walkers": 0}, ValueError, "num_walkers"),
    ({"num_walkers": 2.5}, TypeError, "num_walkers"),
    ({"p_halt": 1.0}, ValueError, "p_halt"),
    ({"coupling": "bogus"}, ValueError, "coupling"),
    ({"kernel_family": "diffusion"}, TypeError, "kernel_family"),
    ({"kernel_family": Diffusion(), "batch_shape": torch.Size([2])}, ValueError, "batch_shape"),
    ({"nodes": [1, 1]}, ValueError, "duplicate"),
    ({"nodes": [0, 99]}, ValueError, "outside"),
    ({"nodes": [0.5]}, TypeError, "integer"),
    ({"seed": -1}, ValueError, "seed"),
    ({"proposal": "greedy"}, ValueError, "unknown neighbour proposal 'greedy'"),
    ({"directions": "sideways"}, ValueError, "unknown direction coupling 'sideways'"),
    ({"num_walkers": 10**12}, ValueError, "GiB for the walk lengths"),
])
def test_bad_constructor_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        GRFKernel(GRID, **kwargs)


def test_graph_argument_is_checked():
    with pytest.raises(TypeError, match="graph"):
        GRFKernel(np.eye(3))
    with pytest.raises(TypeError, match="graph"):
        ExactGraphKernel("not a graph")
