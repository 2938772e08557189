"""Streamed prediction (gp_couple.streaming): the in-memory posterior, whatever the chunks."""

from __future__ import annotations

import gpytorch
import numpy as np
import pytest
import torch

from gp_couple import Diffusion, GraphGP, GRFKernel, grf_gp_settings, predict
from gp_couple.features.graph_random_features import GraphRandomFeatures
from gp_couple.graphs import grid_graph
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


def test_other_kernels_are_refused() -> None:
    from gp_couple import ExactGraphKernel

    graph = grid_graph(4, 4)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP([0, 5], torch.zeros(2), likelihood, ExactGraphKernel(graph, Diffusion(1.0)))
    with pytest.raises(TypeError, match="needs a model whose covar_module is a GRFKernel"):
        StreamedPredictor(model, likelihood)
