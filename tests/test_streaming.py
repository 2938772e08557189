"""Streamed prediction (gp_couple.streaming): the in-memory posterior, whatever the chunks."""

from __future__ import annotations

import copy

import gpytorch
import numpy as np
import pytest
import torch

from gp_couple import Diffusion, GraphGP, GRFKernel, grf_gp_settings, predict
from gp_couple.features.graph_random_features import GraphRandomFeatures
from gp_couple.graphs import grid_graph
from gp_couple.kernels.sharded_grf import ShardedGRFKernel
from gp_couple.streaming import StreamedPredictor


@pytest.fixture(scope="module")
def trained() -> tuple[GraphGP, gpytorch.likelihoods.GaussianLikelihood, np.ndarray]:
    graph = grid_graph(20, 20)
    rng = np.random.default_rng(0)
    train = np.sort(rng.choice(graph.num_nodes, 120, replace=False))
    targets = torch.as_tensor(np.sin(train / 40.0) + 0.1 * rng.normal(size=train.size))
    kernel = GRFKernel(graph, kernel_family=Diffusion(2.0), seed=3).double()
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = 0.05
    model = GraphGP(train, targets, likelihood, gpytorch.kernels.ScaleKernel(kernel)).double()
    model.covar_module.outputscale = 1.3
    kernel.resample_for_prediction(32, seed=1, sigma_fit_samples=10)
    return model, likelihood, train


def test_walks_of_a_node_do_not_depend_on_the_other_nodes_sampled() -> None:
    graph = grid_graph(15, 15)
    every = GraphRandomFeatures.sample(graph, 8, 0.2, "antithetic", seed=4, directions="repelling")
    some = np.array([200, 3, 77, 64, 150])
    subset = GraphRandomFeatures.sample(graph, 8, 0.2, "antithetic", seed=4, directions="repelling", start_nodes=some)
    modulation = torch.linspace(1.0, 0.1, 40, dtype=torch.float64)
    expected = every.scipy_feature_matrix(modulation)[some]
    np.testing.assert_array_equal(subset.scipy_feature_matrix(modulation).toarray(), expected.toarray())


def test_streamed_predictions_are_the_in_memory_posterior(trained) -> None:  # type: ignore[no-untyped-def]
    model, likelihood, _ = trained
    nodes = np.arange(model.num_nodes)
    with grf_gp_settings():
        expected = predict(model, likelihood, nodes, variance="dense")
    mean, variance = StreamedPredictor(model, likelihood).predict_all(chunk_size=64)
    np.testing.assert_allclose(mean, expected.mean.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(variance, expected.variance.numpy(), rtol=1e-10)
    _, latent = StreamedPredictor(model, likelihood).predict_all(chunk_size=64, noise=False)
    np.testing.assert_allclose(variance - latent, float(likelihood.noise.detach()), rtol=1e-12)


def test_above_the_dense_size_the_training_side_is_a_sparse_factor(trained, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Large observed sets are factorised sparsely: the same exact posterior, chunk by chunk."""
    from gp_couple import streaming

    model, likelihood, train = trained
    dense = StreamedPredictor(model, likelihood)
    monkeypatch.setattr(streaming, "DENSE_VARIANCE_SIZE", train.size - 1)
    sparse = StreamedPredictor(model, likelihood)
    assert sparse.train_factor is not None and sparse.train_precision is None
    assert dense.train_factor is None and dense.train_precision is not None
    nodes = np.arange(model.num_nodes)
    for got, expected in zip(sparse.predict_all(chunk_size=37), dense.predict(nodes)):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(sparse.predict(nodes[::-1])[1], sparse.predict(nodes)[1][::-1])


@pytest.mark.parametrize("chunk_size", [1, 37, 400, 10_000])
def test_chunked_prediction_equals_unchunked(trained, chunk_size: int) -> None:  # type: ignore[no-untyped-def]
    model, likelihood, _ = trained
    predictor = StreamedPredictor(model, likelihood)
    whole = predictor.predict(np.arange(model.num_nodes))
    chunked = predictor.predict_all(chunk_size=chunk_size)
    for a, b in zip(chunked, whole):
        np.testing.assert_array_equal(a, b)


def test_predictions_of_a_node_do_not_depend_on_the_other_nodes(trained) -> None:  # type: ignore[no-untyped-def]
    model, likelihood, _ = trained
    predictor = StreamedPredictor(model, likelihood)
    nodes = np.array([399, 5, 17, 250])
    mean, variance = predictor.predict(nodes)
    all_mean, all_variance = predictor.predict(np.arange(model.num_nodes))
    np.testing.assert_array_equal(mean, all_mean[nodes])
    np.testing.assert_array_equal(variance, all_variance[nodes])


def test_the_training_side_reuses_the_kernels_rows(trained, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    model, likelihood, train = trained
    kernel = model.covar_module.base_kernel
    reference = StreamedPredictor(model, likelihood)
    calls = []
    monkeypatch.setattr(kernel, "sample_features", lambda *args, **kwargs: calls.append(args) or None)
    predictor = StreamedPredictor(model, likelihood)
    assert calls == [] and predictor.reused_rows == train.size
    # The walks are keyed by start node: the held rows are what sampling them again gives.
    monkeypatch.undo()
    features = kernel.features
    library = features.scipy_feature_matrix(kernel.kernel_family.modulation(features.num_terms).detach())
    ours = predictor._feature_matrix(features)
    np.testing.assert_array_equal(ours.indptr, library.indptr)
    np.testing.assert_array_equal(ours.indices, library.indices)
    np.testing.assert_allclose(ours.data, library.data, rtol=1e-14, atol=0)
    held, _ = predictor._training_features(train)
    sampled = predictor._features(train)
    np.testing.assert_array_equal(held.indptr, sampled.indptr)
    np.testing.assert_array_equal(held.indices, sampled.indices)
    np.testing.assert_array_equal(held.data, sampled.data)
    # A^{-1} is held packed: n (n + 1) / 2 numbers.
    assert predictor.train_precision.shape == (train.size * (train.size + 1) // 2,)
    for a, b in zip(predictor.predict(np.arange(model.num_nodes)), reference.predict(np.arange(model.num_nodes))):
        np.testing.assert_array_equal(a, b)


def test_rows_the_kernel_does_not_hold_are_sampled(trained) -> None:  # type: ignore[no-untyped-def]
    model, likelihood, train = trained
    nodes = np.arange(model.num_nodes)
    expected = StreamedPredictor(model, likelihood).predict(nodes)
    partial = copy.deepcopy(model)
    kernel = partial.covar_module.base_kernel
    # The same walk configuration and seed, held for every other training node only (in reverse order).
    kernel.resample(kernel.seed, nodes=train[::-2])
    predictor = StreamedPredictor(partial, likelihood)
    assert predictor.reused_rows == train[::-2].size
    for a, b in zip(predictor.predict(nodes), expected):
        np.testing.assert_array_equal(a, b)
    # Single-precision rows are sampled again in float64.
    single = copy.deepcopy(partial).float()
    assert StreamedPredictor(single, likelihood).reused_rows == 0


def test_an_odd_number_of_observed_nodes(trained) -> None:  # type: ignore[no-untyped-def]
    model, likelihood, train = trained
    odd = GraphGP(train[:-1], model.train_targets[:-1], likelihood, copy.deepcopy(model.covar_module)).double()
    nodes = np.arange(model.num_nodes)
    with grf_gp_settings():
        expected = predict(odd, likelihood, nodes, variance="dense")
    mean, variance = StreamedPredictor(odd, likelihood).predict(nodes)
    np.testing.assert_allclose(mean, expected.mean.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(variance, expected.variance.numpy(), rtol=1e-10)


def test_walk_blocks_do_not_change_the_predictions(trained) -> None:  # type: ignore[no-untyped-def]
    model, likelihood, _ = trained
    predictor = StreamedPredictor(model, likelihood)
    nodes = np.arange(model.num_nodes)
    whole = predictor.predict(nodes)
    assert predictor.block_size >= nodes.size
    predictor.block_size = 7
    for a, b in zip(predictor.predict(nodes), whole):
        np.testing.assert_array_equal(a, b)


def test_a_sharded_kernel_releases_its_walks_once_read() -> None:
    graph = grid_graph(12, 12)
    rng = np.random.default_rng(1)
    train = np.sort(rng.choice(graph.num_nodes, 50, replace=False))
    kernel = ShardedGRFKernel(graph, train, kernel_family=Diffusion(2.0), seed=5).double()
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = 0.05
    model = GraphGP(train, torch.as_tensor(np.cos(train / 20.0)), likelihood,
                    gpytorch.kernels.ScaleKernel(kernel)).double()
    kernel.resample_for_prediction(16, seed=2, sigma_fit_samples=10)
    nodes = np.arange(graph.num_nodes)
    expected = StreamedPredictor(model, likelihood).predict(nodes)
    held = {name: tensor.clone() for name, tensor in kernel.features.tensors().items()}
    predictor = StreamedPredictor(model, likelihood, release_kernel_walks=True)
    assert predictor.reused_rows == train.size
    assert kernel.walks_released and kernel.features.num_rows == 0
    for a, b in zip(predictor.predict(nodes), expected):
        np.testing.assert_array_equal(a, b)
    inputs = model.train_inputs[0]
    with pytest.raises(RuntimeError, match="released its walks"):
        kernel.forward(inputs, inputs)
    # The configuration and seed are kept: resampling draws the same rows again.
    kernel.resample(kernel.seed)
    assert not kernel.walks_released
    for name, tensor in kernel.features.tensors().items():
        assert torch.equal(tensor, held[name]), name


def test_written_file_holds_means_and_variances(trained, tmp_path) -> None:  # type: ignore[no-untyped-def]
    model, likelihood, _ = trained
    predictor = StreamedPredictor(model, likelihood)
    nodes = np.array([7, 3, 390])
    predictor.write(tmp_path / "predictions.npy", nodes, chunk_size=2)
    written = np.load(tmp_path / "predictions.npy", mmap_mode="r")
    mean, variance = predictor.predict(nodes)
    assert written.shape == (3, 2) and written.dtype == np.float64
    np.testing.assert_array_equal(written[:, 0], mean)
    np.testing.assert_array_equal(written[:, 1], variance)
    assert [path.name for path in tmp_path.iterdir()] == ["predictions.npy"]
    predictor.write(tmp_path / "new" / "folder" / "predictions.npy", nodes)
    np.testing.assert_array_equal(np.load(tmp_path / "new" / "folder" / "predictions.npy"), written)


def test_bad_arguments_are_refused_before_any_work(trained, tmp_path) -> None:  # type: ignore[no-untyped-def]
    model, likelihood, _ = trained
    predictor = StreamedPredictor(model, likelihood)
    with pytest.raises(ValueError, match=r"path must name a \.npy file"):
        predictor.write(tmp_path / "predictions.csv")
    (tmp_path / "folder.npy").mkdir()
    with pytest.raises(ValueError, match="is a folder, not a file"):
        predictor.write(tmp_path / "folder.npy")
    with pytest.raises(ValueError, match="chunk_size"):
        predictor.predict_all(chunk_size=0)
    with pytest.raises(ValueError, match="nodes"):
        predictor.predict([400])
    with pytest.raises(TypeError, match="noise must be a bool"):
        predictor.predict_all(noise="yes")
    with pytest.raises(TypeError, match="GaussianLikelihood"):
        StreamedPredictor(model, gpytorch.likelihoods.BernoulliLikelihood())
    with pytest.raises(TypeError, match="release_kernel_walks needs a kernel with release_walks"):
        StreamedPredictor(model, likelihood, release_kernel_walks=True)


def test_other_kernels_are_refused() -> None:
    from gp_couple import ExactGraphKernel

    graph = grid_graph(4, 4)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP([0, 5], torch.zeros(2), likelihood, ExactGraphKernel(graph, Diffusion(1.0)))
    with pytest.raises(TypeError, match="needs a model whose covar_module is a GRFKernel"):
        StreamedPredictor(model, likelihood)


def test_predictions_do_not_depend_on_the_thread_count() -> None:
    """The same seed gives the same bits whatever the BLAS pools (which the commands size by the machine's load)."""
    from gp_couple.settings import threads

    graph = grid_graph(30, 30)
    rng = np.random.default_rng(2)
    # Enough observed nodes for threaded LAPACK to factorise in blocks (it sums in another order).
    train = np.sort(rng.choice(graph.num_nodes, 500, replace=False))
    targets = torch.as_tensor(np.cos(train / 60.0) + 0.1 * rng.normal(size=train.size))
    kernel = GRFKernel(graph, kernel_family=Diffusion(1.5), num_walkers=8, seed=5).double()
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = 0.01
    model = GraphGP(train, targets, likelihood, gpytorch.kernels.ScaleKernel(kernel)).double()
    results = []
    for count in (1, 2):
        with threads(count):
            results.append(StreamedPredictor(model, likelihood).predict_all(chunk_size=300))
    for one, two in zip(*results):
        np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("kernel_class", ["MatrixFreeGraphKernel", "ExactGraphKernel"])
def test_exact_streamed_predictions_are_the_in_memory_posterior(kernel_class: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An exact graph kernel streams the float64 dense posterior, whatever the chunks and blocks."""
    import gp_couple
    from gp_couple.streaming import ExactStreamedPredictor

    graph = grid_graph(20, 20)
    rng = np.random.default_rng(1)
    train = np.sort(rng.choice(graph.num_nodes, 120, replace=False))
    targets = torch.as_tensor(np.sin(train / 40.0) + 0.1 * rng.normal(size=train.size))
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = 0.05
    kernel = getattr(gp_couple, kernel_class)(graph, Diffusion(2.0))
    model = GraphGP(train, targets, likelihood, gpytorch.kernels.ScaleKernel(kernel)).double()
    model.covar_module.outputscale = 1.3
    nodes = np.arange(graph.num_nodes)
    with grf_gp_settings():
        expected = predict(model, likelihood, nodes, variance="dense")
    predictor = ExactStreamedPredictor(model, likelihood, target_offset=2.0, target_scale=3.0)
    # Within one block: cross-covariances block by block.
    mean, variance = predictor.predict_all(chunk_size=64)
    assert predictor.node_terms is None
    np.testing.assert_allclose(mean, 2.0 + 3.0 * expected.mean.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(variance, 9.0 * expected.variance.numpy(), rtol=1e-10)
    # Many blocks: every node's terms in one pass over column blocks of L^{-T}, the same posterior.
    predictor.block_size = 7
    with monkeypatch.context() as patch:
        patch.setattr("gp_couple.streaming.CROSS_ENTRIES", 13 * graph.num_nodes)
        blocked_mean, blocked_variance = predictor.predict_all(chunk_size=50)
    assert predictor.node_terms is not None
    np.testing.assert_allclose(blocked_mean, mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(blocked_variance, variance, rtol=1e-10)
    _, latent = predictor.predict([3, 399], noise=False)
    np.testing.assert_allclose(variance[[3, 399]] - latent, 9.0 * float(likelihood.noise.detach()), rtol=1e-10)


def test_exact_streamed_predictor_refuses_grf_kernels_and_leaves_the_model_as_it_is(trained) -> None:  # type: ignore[no-untyped-def]
    from gp_couple.kernels.matrix_free import MatrixFreeGraphKernel
    from gp_couple.streaming import ExactStreamedPredictor

    model, likelihood, _ = trained
    with pytest.raises(TypeError, match="stream a GRF kernel with StreamedPredictor"):
        ExactStreamedPredictor(model, likelihood)
    graph = grid_graph(4, 4)
    single = gpytorch.likelihoods.GaussianLikelihood()
    exact = GraphGP([0, 5, 9], torch.tensor([0.1, -0.2, 0.3]), single,
                    gpytorch.kernels.ScaleKernel(MatrixFreeGraphKernel(graph, Diffusion(1.0))))
    ExactStreamedPredictor(exact, single).predict_all()
    assert exact.covar_module.outputscale.dtype == torch.float32
    with pytest.raises(TypeError, match="GaussianLikelihood"):
        ExactStreamedPredictor(exact, gpytorch.likelihoods.BernoulliLikelihood())
