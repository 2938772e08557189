"""Every model path on every available device: the CPU always, CUDA where present.

Each test builds the same object on the CPU and on ``device`` (same seeds) and checks
that the device version lives on the device and gives the CPU's results, so on a
CPU-only machine the paths run (and compare with themselves) and on a GPU machine the
same tests compare the two devices.
"""

from __future__ import annotations

import io
import pickle

import gpytorch
import numpy as np
import pytest
import torch

import gp_couple._nodes as nodes_module
from gp_couple.cli import main
from gp_couple.couplings import get_frequency_coupling, normal_to_chi
from gp_couple.devices import resolve_device
from gp_couple.exact import exact_kernel_matrix, normalized_adjacency_eigh
from gp_couple.graphs import grid_graph
from gp_couple.kernel_families import Diffusion
from gp_couple.kernels import CoupledRFFKernel, CoupledRLFKernel, ExactGraphKernel, GRFKernel
from gp_couple.models import GraphGP, fit_gp, predict

GRAPH = grid_graph(6, 6)
TRAIN = np.arange(0, 36, 3)
TEST = np.array([1, 7, 20, 35])
TARGETS = np.sin(TRAIN / 5.0)
FREQUENCY_COUPLINGS = ("iid", "halton", "sobol", "orthogonal", "pnc", "pm", "copula", "pnc+antithetic")


def _grf_model(device: torch.device, *, move_after: bool = False) -> GraphGP:
    """A float64 GRF-GP built on ``device`` (or built on the CPU and moved with ``.to``)."""
    kernel = gpytorch.kernels.ScaleKernel(GRFKernel(
        GRAPH, num_walkers=8, p_halt=0.3, seed=0, nodes=np.union1d(TRAIN, TEST))).double()
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    if not move_after:
        kernel, likelihood = kernel.to(device), likelihood.to(device)
    model = GraphGP(TRAIN, TARGETS, likelihood, kernel)
    return model.to(device) if move_after else model


def _fit_and_predict(model: GraphGP) -> tuple[torch.Tensor, torch.Tensor]:
    fit_gp(model, model.likelihood, iterations=3, lr=0.1, seed=0)
    return predict(model, model.likelihood, TEST, seed=0)


@pytest.mark.parametrize("move_after", [False, True])
def test_grf_gp_trains_and_predicts_on_the_device(device: torch.device, move_after: bool) -> None:
    model = _grf_model(device, move_after=move_after)
    assert model.train_inputs[0].device.type == device.type
    assert model.train_targets.device.type == device.type
    assert model.node_inputs(TEST).device.type == device.type
    mean, variance = _fit_and_predict(model)
    assert mean.device.type == device.type and variance.device.type == device.type
    reference_mean, reference_variance = _fit_and_predict(_grf_model(torch.device("cpu")))
    torch.testing.assert_close(mean.cpu(), reference_mean, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(variance.cpu(), reference_variance, rtol=1e-6, atol=1e-9)


def test_node_inputs_are_validated_once_at_the_edge(device: torch.device,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    checked = nodes_module.check_node_values
    monkeypatch.setattr(nodes_module, "check_node_values", lambda *args, **kwargs: calls.append(args[1]) or checked(
        *args, **kwargs))
    model = _grf_model(device)
    assert calls.count("train_nodes") == 1  # GraphGP checked train_nodes (the kernel checked its `nodes`)
    calls.clear()
    fit_gp(model, model.likelihood, iterations=3, lr=0.1, seed=0)
    # The kernel trusted the model's inputs on every training step, also after the walk
    # schedule redrew its walks (which checks only the walks' own start nodes).
    assert set(calls) <= {"start_nodes"}


def test_repeated_inputs_hit_the_kernel_caches_without_synchronising(device: torch.device) -> None:
    kernel = GRFKernel(GRAPH, num_walkers=4, p_halt=0.3, seed=0).double().to(device)
    x = torch.tensor([[3.0], [5.0], [8.0]], dtype=torch.float64, device=device)
    nodes = kernel.node_indices(x)
    selection = kernel._selection(nodes, "x")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.set_sync_debug_mode("error")  # any host synchronisation below raises
    try:
        assert kernel.node_indices(x) is nodes
        assert kernel._selection(nodes, "x") is selection
    finally:
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    x.add_(1.0)  # an in-place change must not be served from the cache
    assert torch.equal(kernel.node_indices(x).cpu(), torch.tensor([4, 6, 9]))


def test_freed_inputs_are_never_confused_with_new_ones(device: torch.device) -> None:
    kernel = GRFKernel(GRAPH, num_walkers=4, p_halt=0.3, seed=0).to(device)
    for value in (3.0, 99.0, 5.0):  # a new tensor may reuse the freed one's memory
        x = torch.full((4, 1), value, dtype=torch.float64, device=device)
        if value > GRAPH.num_nodes:
            with pytest.raises(ValueError, match="node index 99 outside"):
                kernel.node_indices(x)
        else:
            assert kernel.node_indices(x).tolist() == [int(value)] * 4
        del x
    # Copies and pickles start with empty caches (they refer to live tensors).
    copy = pickle.loads(pickle.dumps(kernel))
    assert len(copy._node_cache) == 0 and len(kernel._node_cache) > 0


def test_rows_take_node_indices_from_another_device(device: torch.device) -> None:
    kernel = GRFKernel(GRAPH, num_walkers=4, p_halt=0.3, seed=0, nodes=[2, 9, 30]).to(device)
    rows = kernel.rows(torch.tensor([30, 2]))  # CPU indices for a kernel on the device
    assert rows.device.type == device.type and rows.tolist() == [2, 0]
    with pytest.raises(ValueError, match="without GRF features"):
        kernel.rows(torch.tensor([4]))


def test_exact_graph_kernel_copies_its_eigenvectors_once(device: torch.device) -> None:
    family = Diffusion(gamma=1.3).double()
    kernel = ExactGraphKernel(GRAPH, family).double().to(device)
    x1 = torch.tensor([[3.0], [0.0], [19.0]], dtype=torch.float64, device=device)
    x2 = torch.tensor([[5.0], [3.0]], dtype=torch.float64, device=device)
    full = exact_kernel_matrix(family, GRAPH)
    for _ in range(2):
        result = kernel(x1, x2).to_dense()
        assert result.device.type == device.type
        torch.testing.assert_close(result.cpu(), full[[3, 0, 19]][:, [5, 3]])
    eigenvectors = kernel._eigh(x1.device)[1]
    assert kernel._eigh(x1.device)[1] is eigenvectors
    if device.type == "cpu":
        assert eigenvectors is normalized_adjacency_eigh(GRAPH)[1]  # no copy at all
    else:
        assert len(kernel._eigh_cache) == 1
    # The float64 reference accepts hyperparameters on the device and stays on the CPU.
    torch.testing.assert_close(exact_kernel_matrix(kernel.kernel_family, GRAPH), full)


@pytest.mark.parametrize("kernel_class", [CoupledRFFKernel, CoupledRLFKernel])
@pytest.mark.parametrize("coupling", FREQUENCY_COUPLINGS)
def test_random_feature_kernels_with_every_coupling(device: torch.device, kernel_class: type,
                                                    coupling: str) -> None:
    def build() -> CoupledRFFKernel:
        chosen = get_frequency_coupling(coupling, dim=3)
        if coupling == "copula":  # a correlated copula, so that its parameters matter
            chosen = type(chosen)(3, theta=[0.4, -0.3, 0.2])
        kernel = kernel_class(num_features=6, num_dims=3, coupling=chosen, seed=1).double()
        kernel.lengthscale = 1.7
        return kernel

    x = torch.linspace(-1.0, 1.0, 15, dtype=torch.float64).reshape(5, 3)
    results = {}
    for where in (torch.device("cpu"), device):
        kernel = build().to(where)
        gram = kernel(x.to(where)).to_dense()
        assert gram.device.type == where.type
        parameters = [p for p in kernel.parameters() if p.requires_grad]
        gradients = torch.autograd.grad(gram.sum(), parameters)
        assert all(g.device.type == where.type for g in gradients)
        kernel.resample(seed=5, num_features=9)
        assert all(buffer.device.type == where.type for buffer in kernel.noise.values())
        resampled = kernel(x.to(where)).to_dense()
        results[where.type] = [t.detach().cpu() for t in (gram, resampled, *gradients)]
    for on_device, on_cpu in zip(results[device.type], results["cpu"]):
        torch.testing.assert_close(on_device, on_cpu, rtol=1e-9, atol=1e-12)


def test_chi_quantiles_and_gradients_stay_on_the_device(device: torch.device) -> None:
    g = torch.linspace(-6.0, 6.0, 13, dtype=torch.float64, device=device, requires_grad=True)
    w = normal_to_chi(g, 5)
    (gradient,) = torch.autograd.grad(w.sum(), g)
    assert w.device.type == device.type and gradient.device.type == device.type
    cpu = g.detach().cpu().requires_grad_(True)
    w_cpu = normal_to_chi(cpu, 5)
    (gradient_cpu,) = torch.autograd.grad(w_cpu.sum(), cpu)
    torch.testing.assert_close(w.detach().cpu(), w_cpu.detach(), rtol=1e-12, atol=0.0)
    torch.testing.assert_close(gradient.cpu(), gradient_cpu, rtol=1e-12, atol=0.0)


def test_resample_and_batched_hyperparameters_on_the_device(device: torch.device) -> None:
    x = torch.tensor([[1.0], [4.0], [9.0]], dtype=torch.float64)
    batched = torch.stack([x, x.flip(0)])  # different nodes per batch entry: the padded path
    results = {}
    for where in (torch.device("cpu"), device):
        kernel = GRFKernel(GRAPH, num_walkers=4, p_halt=0.3, seed=0, batch_shape=torch.Size([2]),
                           kernel_family=Diffusion(batch_shape=torch.Size([2]))).double().to(where)
        kernel.kernel_family.gamma = torch.tensor([[0.8], [1.6]], dtype=torch.float64)
        kernel.resample(seed=3, num_walkers=6)
        assert all(buffer.device.type == where.type for buffer in kernel.buffers())
        shared = kernel(x.to(where)).to_dense()
        padded = kernel(batched.to(where)).to_dense()
        assert shared.shape == padded.shape == (2, 3, 3)
        results[where.type] = (shared.cpu(), padded.cpu())
    for on_device, on_cpu in zip(results[device.type], results["cpu"]):
        torch.testing.assert_close(on_device, on_cpu)


@pytest.mark.parametrize("direction", ["save on device, load on CPU", "save on CPU, load on device"])
def test_state_dict_round_trips_across_devices(device: torch.device, direction: str) -> None:
    source_device, target_device = (device, torch.device("cpu"))
    if direction.startswith("save on CPU"):
        source_device, target_device = target_device, source_device
    source = _grf_model(source_device)
    fit_gp(source, source.likelihood, iterations=2, lr=0.1, seed=0)
    source.covar_module.base_kernel.resample(seed=7, num_walkers=12)  # buffers change shape
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    target = _grf_model(target_device)
    target.load_state_dict(torch.load(buffer, map_location=target_device))
    assert all(tensor.device.type == target_device.type for tensor in target.state_dict().values()
               if isinstance(tensor, torch.Tensor))
    expected = predict(source, source.likelihood, TEST, seed=0)
    loaded = predict(target, target.likelihood, TEST, seed=0)
    for a, b in zip(loaded, expected):
        assert a.device.type == target_device.type
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-9, atol=1e-12)


def test_scipy_feature_matrix_of_features_on_the_device(device: torch.device) -> None:
    kernel = GRFKernel(GRAPH, num_walkers=4, p_halt=0.3, seed=0).double()
    modulation = kernel.kernel_family.modulation(kernel.features.num_terms).detach()
    expected = kernel.features.scipy_feature_matrix(modulation)
    kernel.to(device)
    matrix = kernel.features.scipy_feature_matrix(modulation.to(device))
    assert (matrix != expected).nnz == 0


def test_device_requests_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device must be one of cpu, cuda, cuda:N, got 'tpu'"):
        resolve_device("tpu")
    with pytest.raises(TypeError, match="device must be a string"):
        resolve_device(3)
    with pytest.raises(ValueError, match="device 'cuda:99' was requested"):
        resolve_device("cuda:99")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
        with pytest.raises(SystemExit) as exit_info:
            main(["demo", "--device", "cuda"])
        assert exit_info.value.code == 2
        assert "argument --device: --device 'cuda' was requested but CUDA is not available" in capsys.readouterr().err
    else:
        assert resolve_device("cuda").type == "cuda"
