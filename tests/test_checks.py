"""The shared argument checks, and the public edges that call them with the users' messages."""

from __future__ import annotations

import numpy as np
import pytest

from gp_couple._checks import check_batch_shape, check_int, check_p_halt, check_positive_int, is_int
from gp_couple.couplings.walk_lengths import (
    AntitheticWalkLengthCoupling,
    IIDWalkLengthCoupling,
    SigmaCoupling,
    geometric_quantile,
)
from gp_couple.datasets import split_test_nodes, traffic_split
from gp_couple.experiments.graph_gp import GraphGPProtocol
from gp_couple.features.graph_random_features import GraphRandomFeatures
from gp_couple.features.sigma_fit import fit_sigma_coupling
from gp_couple.features.walks import sample_walk_endpoints, sample_walk_lengths, sample_walks, walk_with_lengths
from gp_couple.graphs import erdos_renyi_graph, grid_graph
from gp_couple.halting import halting_inflation
from gp_couple.kernel_families import Diffusion, PStepRandomWalk
from gp_couple.kernels import GRFKernel
from gp_couple.operators.chebyshev_series import check_tolerance
from gp_couple.pagerank import exact_pagerank

GRAPH = grid_graph(3, 3)
P_HALT_RANGE = "p_halt must lie strictly between 0 and 1"


def test_is_int() -> None:
    assert is_int(3) and is_int(np.int32(3)) and is_int(np.int64(-1))
    assert not is_int(True) and not is_int(3.0) and not is_int("3") and not is_int(None)


def test_check_p_halt() -> None:
    assert check_p_halt(0.25) == 0.25 and isinstance(check_p_halt(np.float32(0.5)), float)
    for bad in (0.0, 1.0, -0.1, 1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=P_HALT_RANGE):
            check_p_halt(bad)
    for bad in ("0.5", None, True, [0.5]):
        with pytest.raises(TypeError, match="p_halt must be a float"):
            check_p_halt(bad)


def test_check_int() -> None:
    assert check_int("n", np.int64(4)) == 4 and type(check_int("n", np.int64(4))) is int
    assert check_int("n", 0, 0) == 0
    with pytest.raises(ValueError, match=r"^n must be >= 2, got 1$"):
        check_int("n", 1, 2)
    for bad in (2.0, True, "2", None):
        with pytest.raises(TypeError, match=r"^n must be an int, got "):
            check_int("n", bad)


def test_check_positive_int_and_batch_shape() -> None:
    assert check_positive_int("m", np.int16(2)) == 2
    with pytest.raises(ValueError, match="m must be a positive int, got 0"):
        check_positive_int("m", 0)
    with pytest.raises(TypeError, match="m must be a positive int, got float"):
        check_positive_int("m", 1.0)
    assert check_batch_shape(3) == (3,) and check_batch_shape((2, np.int64(0))) == (2, 0)
    with pytest.raises(ValueError, match="batch_shape must hold non-negative ints"):
        check_batch_shape((2, -1))
    with pytest.raises(TypeError, match="batch_shape must be a sequence of ints"):
        check_batch_shape(2.5)


#: Every public edge that takes p_halt, called with a value outside (0, 1).
P_HALT_EDGES = {
    "GRFKernel": lambda p: GRFKernel(GRAPH, num_walkers=2, p_halt=p),
    "GRFKernel.resample": lambda p: GRFKernel(GRAPH, num_walkers=2, p_halt=0.5).resample(0, p_halt=p),
    "GraphRandomFeatures.sample": lambda p: GraphRandomFeatures.sample(GRAPH, 2, p),
    "sample_walks": lambda p: sample_walks(GRAPH, 2, p),
    "sample_walk_lengths": lambda p: sample_walk_lengths(GRAPH, 2, p),
    "sample_walk_endpoints": lambda p: sample_walk_endpoints(GRAPH, 2, p),
    "walk_with_lengths": lambda p: walk_with_lengths(GRAPH, np.ones((9, 2), dtype=np.int64), p),
    "sample_lengths": lambda p: IIDWalkLengthCoupling().sample_lengths(2, 2, p),
    "paired sample_lengths": lambda p: AntitheticWalkLengthCoupling().sample_lengths(2, 2, p),
    "geometric_quantile": lambda p: geometric_quantile(0.5, p),
    "SigmaCoupling": lambda p: SigmaCoupling([1, 0], p_halt=p),
    "fit_sigma_coupling": lambda p: fit_sigma_coupling(Diffusion(), p, 2, samples_per_bin=1),
    "halting_inflation": lambda p: halting_inflation(Diffusion(), p),
    "exact_pagerank": lambda p: exact_pagerank(GRAPH, p),
}


@pytest.mark.parametrize("edge", sorted(P_HALT_EDGES))
def test_public_edges_reject_bad_p_halt(edge: str) -> None:
    call = P_HALT_EDGES[edge]
    for bad in (0.0, 1.0, float("nan")):
        with pytest.raises(ValueError, match=P_HALT_RANGE):
            call(bad)
    with pytest.raises(TypeError, match="p_halt must be a float"):
        call("0.5")


def test_the_protocol_checks_p_halt_with_the_same_message() -> None:
    with pytest.raises(ValueError, match=P_HALT_RANGE):
        GraphGPProtocol(p_halt=1.0).validate()


@pytest.mark.parametrize("call, name, minimum", [
    (lambda n: GRFKernel(GRAPH, num_walkers=n), "num_walkers", 1),
    (lambda n: GRFKernel(GRAPH, num_walkers=2, max_length=n), "max_length", 0),
    (lambda n: sample_walks(GRAPH, n, 0.5), "num_walkers", 1),
    (lambda n: IIDWalkLengthCoupling().sample_lengths(2, n, 0.5), "num_walkers", 1),
    (lambda n: IIDWalkLengthCoupling().sample_lengths(n, 2, 0.5), "num_starts", 0),
    (lambda n: SigmaCoupling.identity(n), "order", 1),
    (lambda n: fit_sigma_coupling(Diffusion(), 0.5, n, samples_per_bin=1), "order", 2),
    (lambda n: fit_sigma_coupling(Diffusion(), 0.5, 2, samples_per_bin=n), "samples_per_bin", 1),
    (lambda n: erdos_renyi_graph(n, 0.5), "num_nodes", 1),
    (lambda n: split_test_nodes(n, seed=0), "num_nodes", 1),
    (lambda n: traffic_split(num_observed=n, seed=0), "num_observed", 2),
    (lambda n: check_tolerance(1e-3, n), "max_degree", 1),
    (lambda n: PStepRandomWalk(steps=n), "steps", 1),
    (lambda n: Diffusion().modulation(n), "num_terms", 1),
    (lambda n: GraphGPProtocol(repeats=n).validate(), "repeats", 1),
])
def test_public_edges_reject_bad_integers(call, name: str, minimum: int) -> None:
    with pytest.raises(ValueError, match=rf"{name} must be >= {minimum}, got {minimum - 1}"):
        call(minimum - 1)
    with pytest.raises(TypeError, match=rf"{name} must be an int, got float"):
        call(float(minimum + 2))


def test_memory_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    from gp_couple import _checks

    assert _checks.format_bytes(512) == "512 B" and _checks.format_bytes(1.5 * 2 ** 30) == "1.5 GiB"
    assert _checks.format_bytes(3 * 2 ** 60) == "3.07e+03 PiB"
    available = _checks.available_memory()
    assert available is None or available > 0
    monkeypatch.setattr(_checks, "available_memory", lambda: 2 ** 30)
    _checks.check_memory("a small thing", 2 ** 29)
    monkeypatch.setattr(_checks, "available_memory", lambda: 0)
    _checks.check_memory("a tiny thing", _checks.ALWAYS_FITS_BYTES)  # not even compared
    monkeypatch.setattr(_checks, "available_memory", lambda: 2 ** 30)
    with pytest.raises(_checks.TooLargeError, match=r"^a big thing needs about 2 GiB of memory, more than the "
                                                    r"1 GiB available; make it smaller$"):
        _checks.check_memory("a big thing", 2 ** 31, "; make it smaller")
    assert issubclass(_checks.TooLargeError, ValueError)
    monkeypatch.setattr(_checks, "available_memory", lambda: None)
    _checks.check_memory("anything", 1e30)  # unknown memory: nothing is refused


def test_check_fraction_and_check_even_walkers():
    from gp_couple._checks import check_even_walkers, check_fraction

    assert check_fraction("tolerance", 0.25) == 0.25
    for bad in (0.0, 1.0, float("nan"), -0.5):
        with pytest.raises(ValueError, match="tolerance must lie strictly between 0 and 1"):
            check_fraction("tolerance", bad)
    with pytest.raises(TypeError, match="tolerance must be a float"):
        check_fraction("tolerance", "0.5")
    assert check_even_walkers("walkers", 8) == 8
    for bad in (0, 3):
        with pytest.raises(ValueError, match="walkers must be"):
            check_even_walkers("walkers", bad)
    with pytest.raises(TypeError, match="walkers must be an int"):
        check_even_walkers("walkers", 4.0)
