"""Seeded blocks of torch's global generator: reproducible, restoring, and safe across threads."""

from __future__ import annotations

import threading
import time
import warnings

import gpytorch
import numpy as np
import pytest
import torch

from gp_couple._random import seeded_torch_rng


def _draws(seed: int, results: dict, key: str, pause: float = 0.0) -> None:
    with seeded_torch_rng(seed):
        values = []
        for _ in range(20):
            values.append(torch.randn(3))
            time.sleep(pause)  # let another thread run between draws
        results[key] = torch.stack(values)


def _in_threads(*calls) -> None:  # type: ignore[no-untyped-def]
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive()


def test_seeded_blocks_in_two_threads_draw_what_they_draw_alone() -> None:
    alone: dict = {}
    _draws(0, alone, "a")
    _draws(1, alone, "b")
    outside = torch.get_rng_state()
    together: dict = {}
    _in_threads(lambda: _draws(0, together, "a", 1e-3), lambda: _draws(1, together, "b", 1e-3))
    assert torch.equal(together["a"], alone["a"]) and torch.equal(together["b"], alone["b"])
    assert torch.equal(torch.get_rng_state(), outside)  # neither block restored the other's state


def test_seeded_blocks_nest_in_one_thread() -> None:
    with seeded_torch_rng(3):
        first = torch.randn(2)
        with seeded_torch_rng(4):
            inner = torch.randn(2)
        second = torch.randn(2)
    with seeded_torch_rng(3):
        assert torch.equal(torch.randn(2), first) and torch.equal(torch.randn(2), second)
    with seeded_torch_rng(4):
        assert torch.equal(torch.randn(2), inner)


def test_a_seeded_block_seeds_only_the_generators_it_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch.manual_seed would also seed (or, before CUDA starts, queue the seeding of) the
    # generators of other devices, which the block does not restore.
    def untouched(*args: object, **kwargs: object) -> None:
        raise AssertionError("a seeded block seeded a generator it does not restore")

    for name in ("cuda", "xpu", "mtia"):
        if hasattr(getattr(torch, name, None), "manual_seed_all"):
            monkeypatch.setattr(getattr(torch, name), "manual_seed_all", untouched)
    with seeded_torch_rng(5):
        first = torch.randn(4)
    with seeded_torch_rng(5):
        assert torch.equal(torch.randn(4), first)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_a_seeded_block_seeds_and_restores_the_cuda_generators() -> None:
    torch.cuda.init()
    outside = torch.cuda.get_rng_state_all()
    with seeded_torch_rng(5):
        first = torch.randn(4, device="cuda")
    with seeded_torch_rng(5):
        assert torch.equal(torch.randn(4, device="cuda"), first)
    assert all(torch.equal(before, after) for before, after in zip(outside, torch.cuda.get_rng_state_all()))


def test_fit_gp_with_a_seed_in_two_threads_matches_the_sequential_runs() -> None:
    from gp_couple.graphs import grid_graph
    from gp_couple.kernels import GRFKernel
    from gp_couple.models import GraphGP, fit_gp

    graph = grid_graph(6, 6)
    train = np.arange(0, 36, 2)

    def model(shift: float) -> GraphGP:
        kernel = gpytorch.kernels.ScaleKernel(GRFKernel(graph, num_walkers=8, p_halt=0.3, seed=0, coupling="iid"))
        return GraphGP(train, np.sin(train / 5.0 + shift), gpytorch.likelihoods.GaussianLikelihood(), kernel).double()

    def fit(shift: float, results: dict) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gp = model(shift)
            results[shift] = fit_gp(gp, gp.likelihood, iterations=4, lr=0.05, seed=0)

    # CG and stochastic trace estimates: the losses depend on torch's global generator.
    with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.num_trace_samples(3):
        alone: dict = {}
        fit(0.0, alone)
        fit(1.0, alone)
        together: dict = {}
        _in_threads(lambda: fit(0.0, together), lambda: fit(1.0, together))
    assert together == alone


def test_bad_seeds_are_refused_before_the_block() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        with seeded_torch_rng(-1):
            pass
    with pytest.raises(TypeError, match="seed must be"):
        with seeded_torch_rng("0"):  # type: ignore[arg-type]
            pass


# ------------------------------------------------------------------ seed=None: torch's global generator
def test_none_draws_from_torchs_global_generator() -> None:
    from gp_couple._random import as_numpy_generator, draw_seed

    torch.manual_seed(0)
    first = (draw_seed(None), as_numpy_generator(None).random())
    torch.manual_seed(0)
    assert (draw_seed(None), as_numpy_generator(None).random()) == first
    assert draw_seed(None) != first[0]  # the global generator advanced
    with seeded_torch_rng(3):  # inside a seeded block, None draws that block's numbers
        inside = draw_seed(None)
    with seeded_torch_rng(3):
        assert draw_seed(None) == inside


def test_int_seeds_give_the_streams_they_always_gave() -> None:
    from gp_couple._random import as_numpy_generator, draw_seed

    assert draw_seed(0) == 7896617691693857887 and draw_seed(123) == 6385012903588405883
    assert as_numpy_generator(7).random() == 0.625095466604667
