"""ChebyshevKernelLinearOperator and the Chebyshev expansion: peer suites plus our own checks."""

from __future__ import annotations

import math
import unittest

import numpy as np
import pytest
import torch
from linear_operator.test.linear_operator_test_case import (
    LinearOperatorTestCase,
    RectangularLinearOperatorTestCase,
)
from torch import Tensor

from gp_couple.exact import exact_kernel_matrix
from gp_couple.graphs import grid_graph
from gp_couple.kernel_families import (
    Diffusion,
    InverseCosine,
    PowerSeries,
    PStepRandomWalk,
    RegularisedLaplacian,
)
from gp_couple.operators import ChebyshevBasis, ChebyshevKernelLinearOperator, chebyshev_basis, chebyshev_expansion
from gp_couple.settings import kept_chebyshev_terms

GRAPH = grid_graph(4, 5)
BASIS = ChebyshevBasis(GRAPH.normalized_adjacency())


def chebyshev_matrices(degree: int, graph=GRAPH) -> torch.Tensor:
    """Dense :math:`T_0, \\dots, T_J` of ``graph``'s normalised adjacency, ``(J + 1, N, N)`` float64."""
    adjacency = torch.from_numpy(graph.normalized_adjacency().toarray())
    matrices = [torch.eye(graph.num_nodes, dtype=torch.float64), adjacency]
    while len(matrices) <= degree:
        matrices.append(2 * adjacency @ matrices[-1] - matrices[-2])
    return torch.stack(matrices[:degree + 1])


def dense_reference(op: ChebyshevKernelLinearOperator) -> torch.Tensor:
    """The block from dense Chebyshev matrices (independent of the operator's recurrences)."""
    full = torch.einsum("...j,jmn->...mn", op.coefficients, chebyshev_matrices(op.degree).to(op.dtype))
    batch = op.batch_shape
    rows = op.row_nodes.expand(*batch, op.row_nodes.shape[-1])
    columns = op.column_nodes.expand(*batch, op.column_nodes.shape[-1])
    full = full.expand(*batch, *full.shape[-2:])
    picked = full.gather(-2, rows.unsqueeze(-1).expand(*batch, rows.shape[-1], full.shape[-1]))
    return picked.gather(-1, columns.unsqueeze(-2).expand(*batch, rows.shape[-1], columns.shape[-1]))


def diffusion_coefficients(batch_shape: torch.Size = torch.Size()) -> torch.Tensor:
    gammas = torch.linspace(0.6, 0.9, max(1, batch_shape.numel()), dtype=torch.float64)
    family = Diffusion(batch_shape=batch_shape)
    family.gamma = gammas.reshape(*batch_shape, 1)
    return chebyshev_expansion(family, 1e-12).coefficients.detach()


class SymmetricChebyshevMixin:
    """``K_AA`` on 7 distinct nodes of a 4 x 5 grid, diffusion with gamma <= 0.9 (well conditioned)."""

    seed = 0
    batch_shape = torch.Size()
    nodes = torch.tensor([0, 3, 7, 8, 12, 16, 19])

    def create_linear_op(self) -> ChebyshevKernelLinearOperator:
        return ChebyshevKernelLinearOperator(diffusion_coefficients(self.batch_shape).to(torch.get_default_dtype()),
                                             basis=BASIS, row_nodes=self.nodes, column_nodes=self.nodes)

    def evaluate_linear_op(self, linear_op: ChebyshevKernelLinearOperator) -> torch.Tensor:
        return dense_reference(linear_op)


class CrossChebyshevMixin:
    """``K_AB`` with repeated nodes, 5 x 6."""

    seed = 0
    batch_shape = torch.Size()

    def create_linear_op(self) -> ChebyshevKernelLinearOperator:
        return ChebyshevKernelLinearOperator(diffusion_coefficients(self.batch_shape).to(torch.get_default_dtype()),
                                             basis=BASIS, row_nodes=torch.tensor([1, 4, 4, 10, 18]),
                                             column_nodes=torch.tensor([0, 2, 4, 9, 13, 19]))

    def evaluate_linear_op(self, linear_op: ChebyshevKernelLinearOperator) -> torch.Tensor:
        return dense_reference(linear_op)


class TestChebyshevKernelLinearOperator(SymmetricChebyshevMixin, LinearOperatorTestCase, unittest.TestCase):
    pass


class TestBatchChebyshevKernelLinearOperator(SymmetricChebyshevMixin, LinearOperatorTestCase, unittest.TestCase):
    batch_shape = torch.Size([2, 3])


class TestCrossChebyshevKernelLinearOperator(CrossChebyshevMixin, RectangularLinearOperatorTestCase,
                                             unittest.TestCase):
    pass



# ------------------------------------------------------------------ expansion
FAMILIES = [
    pytest.param(lambda: Diffusion(2.5), id="diffusion"),
    pytest.param(lambda: RegularisedLaplacian(3.0, 2), id="regularised-laplacian"),
    pytest.param(lambda: PStepRandomWalk(2.3, 3), id="p-step"),
    pytest.param(lambda: InverseCosine(0.7), id="inverse-cosine"),
    pytest.param(lambda: PowerSeries([1.0, 0.4, -0.1, 0.05]), id="power-series"),
]


@pytest.mark.parametrize("make", FAMILIES)
@pytest.mark.parametrize("tolerance", [1e-4, 1e-10])
def test_truncation_error_is_within_the_reported_bound(make, tolerance):
    family = make().double()
    expansion = chebyshev_expansion(family, tolerance)
    assert float(expansion.relative_bound.max()) <= tolerance
    truncated = torch.einsum("j,jmn->mn", expansion.coefficients.detach(), chebyshev_matrices(expansion.degree))
    exact = exact_kernel_matrix(family, GRAPH).detach()
    error = torch.linalg.matrix_norm(truncated - exact, ord=2)
    # The bound holds up to the float64 rounding of the dense references.
    assert float(error) <= float(expansion.tail_bound) + 1e-12


def test_polynomials_are_reproduced_at_their_degree():
    assert chebyshev_expansion(PStepRandomWalk(2.5, 4).double(), 1e-12).degree == 4
    assert chebyshev_expansion(PowerSeries([1.0, 0.5, 0.25]).double(), 1e-12).degree == 2


def test_degree_grows_with_the_lengthscale_and_is_the_largest_over_a_batch():
    family = Diffusion(batch_shape=torch.Size([2])).double()
    family.gamma = torch.tensor([[0.5], [3.0]], dtype=torch.float64)
    batched = chebyshev_expansion(family, 1e-8)
    assert batched.degree == chebyshev_expansion(Diffusion(3.0).double(), 1e-8).degree
    assert batched.degree > chebyshev_expansion(Diffusion(0.5).double(), 1e-8).degree
    assert batched.tail_bound.shape == (2,)


def test_coefficients_are_differentiable_in_the_hyperparameters():
    family = Diffusion(1.3).double()
    coefficients = chebyshev_expansion(family, 1e-12).coefficients
    (gradient,) = torch.autograd.grad(coefficients.sum(), family.raw_gamma, retain_graph=True)
    # sum_j c_j = g(1) = 1 for every gamma: the coefficients move, their sum does not.
    assert abs(float(coefficients.detach().sum()) - 1.0) < 1e-12
    assert abs(float(gradient)) < 1e-10
    (gradient,) = torch.autograd.grad(coefficients[1], family.raw_gamma)
    assert float(gradient) != 0.0


def test_bad_settings_and_too_high_degrees_raise_clear_errors():
    with pytest.raises(ValueError, match="tolerance"):
        chebyshev_expansion(Diffusion(), 0.0)
    with pytest.raises(ValueError, match="tolerance"):
        chebyshev_expansion(Diffusion(), 1.5)
    with pytest.raises(TypeError, match="tolerance"):
        chebyshev_expansion(Diffusion(), "small")
    with pytest.raises(ValueError, match="max_degree"):
        chebyshev_expansion(Diffusion(), 1e-6, 0)
    with pytest.raises(TypeError, match="max_degree"):
        chebyshev_expansion(Diffusion(), 1e-6, 2.5)
    # sigma^2 = 1e6 puts the pole of (1 + s^2 (1 - x))^-2 at 1 + 1e-6: far too many terms.
    with pytest.raises(ValueError, match="max_degree=100"):
        chebyshev_expansion(RegularisedLaplacian(1e3, 2).double(), 1e-8, 100)
    with pytest.raises(ValueError, match="max_degree=10"):
        chebyshev_expansion(Diffusion(4.0).double(), 1e-8, 10)


# ------------------------------------------------------------------ operator specifics
def _operator(rows, columns, family=None, tolerance=1e-12):
    family = Diffusion(1.8).double() if family is None else family
    coefficients = chebyshev_expansion(family, tolerance).coefficients
    return ChebyshevKernelLinearOperator(coefficients, basis=ChebyshevBasis(GRAPH.normalized_adjacency()),
                                         row_nodes=rows, column_nodes=columns), family


def test_diagonal_uses_the_cached_table_and_matches_the_dense_kernel(monkeypatch):
    nodes = torch.tensor([3, 0, 19, 3, 11])
    op, family = _operator(nodes, nodes)
    exact = exact_kernel_matrix(family, GRAPH).detach()
    torch.testing.assert_close(op._diagonal(), exact[nodes, nodes], rtol=0, atol=1e-11)
    # Second call (and a subset of nodes): served from the table, no recurrence.
    monkeypatch.setattr(ChebyshevBasis, "_one_hot_diagonals", lambda *args: pytest.fail("recomputed"))
    torch.testing.assert_close(op[1:3, 1:3]._diagonal(), exact[nodes[1:3], nodes[1:3]], rtol=0, atol=1e-11)


@pytest.mark.parametrize("rows, columns, scattered", [(4, 5, False), (12, 12, False), (12, 12, True)])
def test_diagonal_in_small_local_blocks_matches(monkeypatch, rows, columns, scattered):
    """Blocks of two nodes (compact METIS parts of a dense request, or cut from a reverse Cuthill-McKee
    order for scattered nodes), each recurrence on the rows its steps reach: the exact diagonals."""
    graph = grid_graph(rows, columns)
    monkeypatch.setattr(chebyshev_basis, "_LOCAL_BLOCK", 2)
    monkeypatch.setattr(chebyshev_basis, "_SCATTERED_BLOCK", 2)
    monkeypatch.setattr(chebyshev_basis, "BLOCK_ENTRIES", 3 * graph.num_nodes * 2)  # two nodes per block
    reached, blocks = [], []
    layers, local_blocks = ChebyshevBasis._layers, ChebyshevBasis._local_blocks
    monkeypatch.setattr(ChebyshevBasis, "_layers",
                        lambda self, nodes, hops: reached.append(layers(self, nodes, hops)) or reached[-1])
    monkeypatch.setattr(ChebyshevBasis, "_local_blocks",
                        lambda self, nodes, *sizes, **hops: blocks.append(local_blocks(self, nodes, *sizes, **hops))
                        or blocks[-1])
    nodes = torch.arange(graph.num_nodes).flip(0)
    if scattered:
        nodes = nodes[::7]
    for degree in (0, 1, 5, 8):
        table = ChebyshevBasis(graph.normalized_adjacency()).diagonal(nodes, degree)
        expected = chebyshev_matrices(degree, graph).diagonal(dim1=-2, dim2=-1).T[nodes]
        torch.testing.assert_close(table, expected, rtol=0, atol=1e-13)
    # Every node once, in blocks of at most two.
    for request in blocks:
        assert sorted(torch.cat(request).tolist()) == sorted(nodes.tolist())
        assert max(block.numel() for block in request) <= 2
    # Step m reached only the nodes within m hops: on the larger grid, never the whole graph.
    if rows == 12:
        assert max(int(ends[-1]) for _, ends in reached) < graph.num_nodes
        assert all(ends[0] <= 2 and all(later >= earlier for earlier, later in zip(ends, ends[1:]))
                   for _, ends in reached)


def test_diagonal_table_computes_a_node_to_the_degree_asked_and_grows_with_headroom(monkeypatch):
    """A node is computed to the (even) degree first asked for; asked again higher, it is recomputed
    with 25 % headroom; requests within what is kept compute nothing; every lookup is exact."""
    graph = grid_graph(6, 7)
    basis = ChebyshevBasis(graph.normalized_adjacency())
    matrices = chebyshev_matrices(20, graph)
    computed = []
    one_hot = ChebyshevBasis._one_hot_diagonals
    monkeypatch.setattr(ChebyshevBasis, "_one_hot_diagonals",
                        lambda self, nodes, degree: computed.append((sorted(nodes.tolist()), degree))
                        or one_hot(self, nodes, degree))
    first, every = torch.tensor([3, 17, 30]), torch.arange(graph.num_nodes)
    for nodes, degree, expected_calls in [
        (first, 9, [(10, [3, 17, 30])]),           # first time: the even degree at or above 9
        (first, 10, []),                           # within what is kept
        (every, 7, [(8, None)]),                   # the other nodes, to degree 8; the first three kept
        (first, 12, [(16, [3, 17, 30])]),          # asked again higher: 25 % headroom, rounded up to even
        (every, 16, [(20, None)]),                 # every node but the three kept to 16
    ]:
        computed.clear()
        table = basis.diagonal(nodes, degree)
        expected = matrices[:degree + 1].diagonal(dim1=-2, dim2=-1).T[nodes]
        torch.testing.assert_close(table, expected, rtol=0, atol=1e-12)
        assert {d for _, d in computed} == {d for d, _ in expected_calls}
        for d, which in expected_calls:
            done = sorted(node for block, degree_of in computed if degree_of == d for node in block)
            assert done == (which if which is not None else sorted(set(every.tolist()) - {3, 17, 30}))
    assert basis._diagonal_values.shape == (graph.num_nodes, 21)
    assert not basis._diagonal_values[basis._diagonal_slot[first], :17].isnan().any()


def _autograd_nodes(node) -> set[str]:
    names, stack = set(), [node]
    while stack:
        node = stack.pop()
        if node is not None and type(node).__name__ not in names:
            names.add(type(node).__name__)
            try:
                parents = node.next_functions
            except RuntimeError:
                # torch 2.11 refuses the legacy attribute on some custom-Function nodes (torch 2.13 allows it).
                parents = ()
            stack.extend(parent for parent, _ in parents)
    return names


def test_gradients_need_no_autograd_tape_through_the_recurrence():
    nodes = torch.tensor([1, 5, 9, 14])
    op, family = _operator(nodes, nodes)
    rhs = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    # The autograd graph holds one node for all J sparse products (its backward reruns
    # the recurrence); linear_operator's matmul goes through _bilinear_derivative instead.
    names = _autograd_nodes(op._matmul(rhs).grad_fn)
    assert "_ChebyshevProductBackward" in names and not any("Addmm" in name for name in names)
    product = op.matmul(rhs)
    (gradient,) = torch.autograd.grad((product * rhs).sum(), family.raw_gamma)
    exact = exact_kernel_matrix(family, GRAPH)[nodes][:, nodes]
    (expected,) = torch.autograd.grad((exact @ rhs * rhs).sum(), family.raw_gamma)
    torch.testing.assert_close(gradient, expected, rtol=1e-8, atol=1e-10)
    # _bilinear_derivative: d(u^T K v)/dc_j = u^T T_j v.
    (grad_c, *rest) = op._bilinear_derivative(rhs, rhs)
    assert rest == [None, None]
    dense = chebyshev_matrices(op.degree)[:, nodes][:, :, nodes]
    torch.testing.assert_close(grad_c, torch.einsum("mt,jmn,nt->j", rhs, dense, rhs))


@pytest.mark.parametrize("path", ["kept blocks", "local recurrences"])
def test_dense_block_gradients_on_every_path(monkeypatch, path):
    """to_dense and its backward: from the basis's kept blocks, or (above the memory bound) summed as the
    local recurrences run and rerun for the backward; each the exact kernel's gradient, and neither runs
    a recurrence on the whole graph."""
    if path == "local recurrences":
        monkeypatch.setattr(kept_chebyshev_terms, "_global_value", 0)
    monkeypatch.setattr(chebyshev_basis, "_COLUMN_BLOCK", 2)  # two columns per block
    monkeypatch.setattr(chebyshev_basis, "_LOCAL_BLOCK", 2)
    monkeypatch.setattr(ChebyshevBasis, "terms", lambda *args: pytest.fail("a recurrence on the whole graph"))
    rows, columns = torch.tensor([3, 0, 19, 3, 11]), torch.tensor([7, 2, 2, 16])
    op, family = _operator(rows, columns)
    reruns = []
    original = ChebyshevBasis.block_moments
    monkeypatch.setattr(ChebyshevBasis, "block_moments",
                        lambda self, *args: reruns.append(1) or original(self, *args))
    weights = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (gradient,) = torch.autograd.grad((op.to_dense() * weights).sum(), family.raw_gamma)
    exact = exact_kernel_matrix(family, GRAPH)[rows][:, columns]
    (expected,) = torch.autograd.grad((exact * weights).sum(), family.raw_gamma)
    torch.testing.assert_close(gradient, expected, rtol=1e-8, atol=1e-10)
    assert len(reruns) == (path == "local recurrences")
    assert (op.basis.kept_entries == 0) == (path == "local recurrences")


def _record_local_steps(monkeypatch, steps: list) -> None:
    """Record every local recurrence's work: ``("terms", J)`` from scratch, ``("continued", count)``."""
    terms = chebyshev_basis._LocalRecurrence.terms

    def recorded(self, degree):
        steps.append(("terms", degree) if self.degree < 0 else ("continued", degree - self.degree))
        return terms(self, degree)

    monkeypatch.setattr(chebyshev_basis._LocalRecurrence, "terms", recorded)


@pytest.mark.parametrize("chunks", [1, 2])
def test_block_terms_are_kept_for_one_pair_of_node_sets_with_headroom(monkeypatch, chunks):
    """Blocks sum_j c_j T_j(W~)_AB from the kept terms are exact; asked again on the same nodes
    within their degree they run no recurrence; a higher degree continues the recurrence from the
    kept last terms (25 % headroom, within the bound), or recomputes where those were not kept (to
    twice the degree); another pair releases them, a request beyond the bound does not."""
    graph = grid_graph(5, 6)
    if chunks == 2:  # three columns in blocks of two and one
        monkeypatch.setattr(chebyshev_basis, "_COLUMN_BLOCK", 2)
        monkeypatch.setattr(chebyshev_basis, "_LOCAL_BLOCK", 2)
    basis = ChebyshevBasis(graph.normalized_adjacency())
    matrices = chebyshev_matrices(30, graph)
    steps = []
    _record_local_steps(monkeypatch, steps)
    rows, columns = torch.tensor([3, 0, 19, 3, 11]), torch.tensor([7, 2, 16])
    size = rows.numel() * columns.numel()

    def block(first: Tensor, second: Tensor, degree: int, max_entries: int) -> Tensor | None:
        coefficients = torch.randn(2, degree + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(degree))
        result = basis.block(coefficients, first, second, max_entries)
        if result is not None:
            expected = torch.einsum("...j,jab->...ab", coefficients, matrices[:degree + 1][:, first][:, :, second])
            torch.testing.assert_close(result, expected, rtol=0, atol=1e-12)
        return result

    def check(degree: int, max_entries: int, expected: list) -> None:
        steps.clear()
        assert block(rows, columns, degree, max_entries) is not None
        assert steps == [step for step in expected for _ in range(chunks)]

    check(8, 10**6, [("terms", 10)])          # first: 25 % headroom, rounded up to even
    check(10, 10**6, [])                      # within what is kept
    check(3, 10**6, [])
    check(11, 10**6, [("continued", 4)])      # on to degree 14 from the kept last two terms
    check(14, 10**6, [])
    check(20, 21 * size, [("continued", 6)])  # headroom only within the bound
    assert basis._kept_blocks.degree == 20
    # Beyond the bound: no block, and what is kept stays kept (a trial point of training out there
    # does not cost the next evaluation its terms).
    assert block(rows, columns, 21, 21 * size) is None and basis._kept_blocks.degree == 20
    check(20, 21 * size, [])
    # Another pair of node sets replaces the kept one.
    steps.clear()
    assert block(columns, rows, 4, 10**6) is not None
    assert set(steps) == {("terms", 6)} and torch.equal(basis._kept_blocks.rows, columns)
    # Where the last terms on the reached nodes (here the whole graph: 2 N |B| = 180 numbers)
    # exceed the bound, they are not kept (and the first terms go to twice the degree, within the
    # bound): a higher degree recomputes the terms, with 25 % headroom where the new recurrences'
    # last terms fit.
    check(8, 179, [("terms", 10)])
    assert basis._kept_blocks.recurrences is None
    check(11, 10**6, [("terms", 14)])
    assert basis._kept_blocks.recurrences is not None


@pytest.mark.parametrize("columns", [[40, 41, 52, 53, 40], [3, 140, 77, 3, 20, 131, 64]])
def test_block_terms_run_on_the_nodes_each_block_of_columns_reaches(monkeypatch, columns):
    """On a graph wider than the degree, each block of nearby columns runs its recurrence on the nodes
    within the degree's hops only (never the whole graph), including when a higher degree extends that
    reach; repeated and unsorted columns keep their order; every block is exact."""
    graph = grid_graph(12, 12)
    monkeypatch.setattr(chebyshev_basis, "_COLUMN_BLOCK", 2)
    monkeypatch.setattr(chebyshev_basis, "_LOCAL_BLOCK", 2)
    basis = ChebyshevBasis(graph.normalized_adjacency())
    matrices = chebyshev_matrices(13, graph)
    reached = []
    layers = ChebyshevBasis._layers
    monkeypatch.setattr(ChebyshevBasis, "_layers",
                        lambda self, nodes, hops: reached.append((hops, layers(self, nodes, hops))) or reached[-1][1])
    rows, columns = torch.tensor([0, 40, 77, 143, 53, 3]), torch.tensor(columns)
    for degree in (4, 9, 13):
        coefficients = torch.randn(degree + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(degree))
        expected = torch.einsum("j,jab->ab", coefficients, matrices[:degree + 1][:, rows][:, :, columns])
        torch.testing.assert_close(basis.block(coefficients, rows, columns, 10**6), expected, rtol=0, atol=1e-12)
    assert {hops for hops, _ in reached} == {6, 12, 18}  # degree 4 -> 6, 9 -> 12 (headroom), 13 -> 18
    from scipy.sparse.csgraph import shortest_path

    distance = shortest_path(basis._matrix_scipy(), unweighted=True)
    for hops, (local, ends) in reached:  # exactly the nodes within the hops, by distance
        sources = local[:ends[0]]
        assert ends[0] <= 2 and np.all(np.diff(ends) >= 0) and ends[-1] == local.size
        assert set(local.tolist()) == set(np.flatnonzero(distance[sources].min(0) <= hops).tolist())
    assert all(local.size < graph.num_nodes for hops, (local, _) in reached if hops == 6)


def test_block_terms_interrupted_while_growing_are_released(monkeypatch):
    """An exception part of the way through continuing the recurrence (whose end terms are overwritten
    in place) leaves nothing kept, and the next request is exact."""
    graph = grid_graph(5, 6)
    basis = ChebyshevBasis(graph.normalized_adjacency())
    matrices = chebyshev_matrices(30, graph)
    rows, columns = torch.tensor([3, 0, 19, 11]), torch.tensor([7, 2, 16])
    coefficients = torch.randn(15, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    basis.block(coefficients[:9], rows, columns, 10**6)
    terms = chebyshev_basis._LocalRecurrence.terms

    def failing(self, degree):
        generator = terms(self, degree)
        yield next(generator)
        raise MemoryError("out of memory")

    monkeypatch.setattr(chebyshev_basis._LocalRecurrence, "terms", failing)
    with pytest.raises(MemoryError):
        basis.block(coefficients, rows, columns, 10**6)
    assert basis.kept_entries == 0
    monkeypatch.setattr(chebyshev_basis._LocalRecurrence, "terms", terms)
    expected = torch.einsum("j,jab->ab", coefficients, matrices[:15][:, rows][:, :, columns])
    torch.testing.assert_close(basis.block(coefficients, rows, columns, 10**6), expected, rtol=0, atol=1e-12)


def test_dense_evaluations_on_the_same_nodes_run_one_recurrence(monkeypatch):
    """As in training: blocks on the same nodes at new hyperparameters are sums over the kept stack,
    exact with their gradients, and no further recurrence runs."""
    nodes = torch.tensor([1, 5, 9, 14, 18])
    basis = ChebyshevBasis(GRAPH.normalized_adjacency())
    for step, gamma in enumerate((1.2, 1.5, 1.0)):
        family = Diffusion(gamma).double()
        coefficients = chebyshev_expansion(family, 1e-12).coefficients
        op = ChebyshevKernelLinearOperator(coefficients, basis=basis, row_nodes=nodes, column_nodes=nodes)
        if step == 1:
            monkeypatch.setattr(ChebyshevBasis, "terms", lambda *args: pytest.fail("recurrence"))
        block = op.to_dense()
        exact = exact_kernel_matrix(family, GRAPH)[nodes][:, nodes]
        torch.testing.assert_close(block, exact.detach(), rtol=0, atol=1e-11)
        (gradient,) = torch.autograd.grad(block.sum(), family.raw_gamma)
        (expected,) = torch.autograd.grad(exact.sum(), family.raw_gamma)
        torch.testing.assert_close(gradient, expected, rtol=1e-8, atol=1e-10)


def test_rows_for_pivoted_cholesky_use_one_column_recurrence():
    nodes = torch.arange(12)
    op, family = _operator(nodes, nodes)
    exact = exact_kernel_matrix(family, GRAPH).detach()[:12, :12]
    rows = torch.tensor([4, 4, 4]).unsqueeze(-1).expand(3, 12)
    torch.testing.assert_close(op[torch.tensor([4]), :].to_dense(), exact[4:5])
    torch.testing.assert_close(op._get_indices(rows, torch.arange(12).expand(3, 12)), exact[rows, torch.arange(12)])
    factor = op.pivoted_cholesky(rank=4)
    assert factor.shape == (12, 4)


def test_scaling_keeps_the_operator_type_and_gradients():
    nodes = torch.tensor([2, 6, 7])
    op, _ = _operator(nodes, nodes)
    scale = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    scaled = op * scale
    assert isinstance(scaled, ChebyshevKernelLinearOperator)
    torch.testing.assert_close(scaled.to_dense(), 2.5 * op.to_dense().detach())
    (gradient,) = torch.autograd.grad(scaled.to_dense().sum(), scale)
    torch.testing.assert_close(gradient, op.to_dense().detach().sum())


def test_float32_and_dtype_conversion_keep_integer_nodes():
    nodes = torch.tensor([0, 5, 10])
    op, family = _operator(nodes, nodes, tolerance=1e-7)
    single = op.to(torch.float32)
    assert single.row_nodes.dtype == torch.int64 and single.dtype == torch.float32
    exact = exact_kernel_matrix(family, GRAPH).detach()[nodes][:, nodes].float()
    torch.testing.assert_close(single.to_dense(), exact, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(single._diagonal(), exact.diagonal(), rtol=1e-5, atol=1e-6)


def test_constant_kernel_of_degree_zero():
    op, _ = _operator(torch.tensor([1, 2]), torch.tensor([2]), family=PowerSeries([0.75]).double())
    assert op.degree == 0
    torch.testing.assert_close(op.to_dense(), torch.tensor([[0.0], [0.75]], dtype=torch.float64))
    assert float(op.matmul(torch.ones(1, 1, dtype=torch.float64))[1, 0]) == 0.75


@pytest.mark.parametrize("bound", [0, None])
def test_dense_blocks_above_the_bound_are_summed_on_the_reached_nodes(monkeypatch, bound):
    """A batch of blocks whose terms do not fit the bound is summed as its local recurrences run (no
    recurrence on the whole graph, nothing kept); within the bound it comes from the kept terms. Either
    way the blocks and their gradients equal the exact kernel's, with repeated nodes."""
    graph = grid_graph(9, 10)
    monkeypatch.setattr(chebyshev_basis, "_COLUMN_BLOCK", 2)
    monkeypatch.setattr(chebyshev_basis, "_LOCAL_BLOCK", 2)
    monkeypatch.setattr(ChebyshevBasis, "terms", lambda *args: pytest.fail("a recurrence on the whole graph"))
    family = Diffusion(batch_shape=torch.Size([2])).double()
    family.gamma = torch.tensor([[0.7], [2.1]], dtype=torch.float64)
    rows, columns = torch.tensor([3, 88, 40, 3, 61, 17]), torch.tensor([50, 2, 88, 2, 73])
    basis = ChebyshevBasis(graph.normalized_adjacency())
    op = ChebyshevKernelLinearOperator(chebyshev_expansion(family, 1e-12).coefficients, basis=basis,
                                       row_nodes=rows, column_nodes=columns)
    weights = torch.randn(2, 6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with kept_chebyshev_terms(10**7 if bound is None else bound):
        block = op.to_dense()
        (gradient,) = torch.autograd.grad((block * weights).sum(), family.raw_gamma)
    exact = exact_kernel_matrix(family, graph)[:, rows][:, :, columns]
    (expected,) = torch.autograd.grad((exact * weights).sum(), family.raw_gamma)
    torch.testing.assert_close(block, exact.detach(), rtol=0, atol=1e-11)
    torch.testing.assert_close(gradient, expected, rtol=1e-8, atol=1e-10)
    assert (basis.kept_entries == 0) == (bound == 0)


def test_local_blocks_are_smaller_for_scattered_nodes():
    """A dense request (a chunk of the mesh) is split into compact parts of the block size; scattered
    nodes, whose neighbourhoods overlap less, into blocks of the scattered size; each node once."""
    graph = grid_graph(20, 20)
    basis = ChebyshevBasis(graph.normalized_adjacency())
    dense, scattered = torch.arange(200), torch.arange(0, 400, 13)
    for nodes, size in [(dense, 40), (scattered, 4), (scattered[:3], 4)]:
        blocks = basis._local_blocks(nodes, 40, 4)
        assert sorted(torch.cat(blocks).tolist()) == sorted(nodes.tolist())
        assert max(block.numel() for block in blocks) <= size
        assert len(blocks) <= math.ceil(nodes.numel() / size) + (size == 40)  # METIS balances to a few per cent


def test_a_symmetric_block_keeps_half_its_terms_and_is_exact(monkeypatch):
    """Rows that are the same node set as the columns (unsorted, repeated, as a training set may be): the
    kept terms are the symmetric half (each block of columns with the rows of its own and the earlier
    blocks), within a bound the full terms would exceed; the block, its continuation to a higher degree
    and its gradient equal the exact kernel's."""
    graph = grid_graph(7, 8)
    monkeypatch.setattr(chebyshev_basis, "_COLUMN_BLOCK", 2)
    monkeypatch.setattr(chebyshev_basis, "_LOCAL_BLOCK", 2)
    basis = ChebyshevBasis(graph.normalized_adjacency())
    rows, columns = torch.tensor([40, 3, 17, 3, 55, 9, 28]), torch.tensor([3, 9, 17, 28, 40, 55])
    half = chebyshev_basis.symmetric_entries([2, 2, 2])
    assert half == 2 * 2 + 4 * 2 + 6 * 2 < rows.numel() * columns.numel()
    matrices = chebyshev_matrices(20, graph)
    for degree in (6, 14):
        _assert_kept_block_exact(basis, matrices, rows, columns, degree, (degree + 1) * half)
        assert basis._kept_blocks.entries() <= (basis._kept_blocks.degree + 1) * half
    assert chebyshev_basis.kept_terms_entries(5, 3) == 4 * chebyshev_basis.symmetric_entries([2, 2, 1])


def test_kept_terms_hold_only_the_rows_each_block_reaches(monkeypatch):
    """Scattered nodes on a larger graph: :math:`T_j(\\widetilde{\\mathbf W})_{ab}` is zero beyond
    :math:`j` hops, so each block of columns keeps only the rows its recurrence reaches. Within a bound
    that the symmetric half of the dense terms would exceed, the block, its continuation to a higher
    degree (the reach grows), its gradient and a non-symmetric block equal the exact kernel's; a degree
    beyond the bound is refused and leaves the kept terms."""
    graph = grid_graph(25, 25)
    monkeypatch.setattr(chebyshev_basis, "_COLUMN_BLOCK", 4)
    basis = ChebyshevBasis(graph.normalized_adjacency())
    nodes = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(0))[:40]
    half = chebyshev_basis.symmetric_entries([4] * 10)
    bound = 8 * half
    matrices = chebyshev_matrices(20, graph)
    for degree in (4, 10):
        _assert_kept_block_exact(basis, matrices, nodes, nodes, degree, bound)
        kept = basis._kept_blocks
        assert kept.entries() <= bound < (kept.degree + 1) * half
    kept_degree = basis._kept_blocks.degree
    assert basis.block(torch.ones(41, dtype=torch.float64), nodes, nodes, bound) is None
    assert basis._kept_blocks is kept and kept.degree == kept_degree
    _assert_kept_block_exact(basis, matrices, nodes[:13].flip(0), nodes, 6, bound)
    assert basis._kept_blocks.row_order is None


@pytest.mark.parametrize("symmetric", [True, False])
def test_kept_block_with_repeated_unsorted_nodes_and_batches_is_exact_with_its_gradient(monkeypatch, symmetric):
    """The block summed from kept terms, and its gradient (the kept terms' moments), for repeated and
    unsorted rows and columns and a batch of coefficients: symmetric storage (rows and columns the same
    node set, in different orders and with repeats) and a block of other rows."""
    graph = grid_graph(9, 9)
    monkeypatch.setattr(chebyshev_basis, "_COLUMN_BLOCK", 3)
    basis = ChebyshevBasis(graph.normalized_adjacency())
    matrices = chebyshev_matrices(12, graph)
    nodes = torch.tensor([40, 3, 77, 12, 41, 60, 8, 33])
    columns = torch.cat([nodes, nodes[[1, 5]]])
    rows = torch.cat([nodes.flip(0), nodes[[0, 0, 6]]]) if symmetric else torch.tensor([5, 80, 5, 41, 0])
    for degree in (5, 9):
        _assert_kept_block_exact(basis, matrices, rows, columns, degree, 10**6, batch=(2, 3))
        assert (basis._kept_blocks.row_order is not None) == symmetric


def test_kept_terms_are_kept_in_the_coefficients_dtype(monkeypatch):
    """Float32 coefficients keep float32 terms: the block and its gradient equal the float64 sums to float32
    rounding; a float64 request computes them again, exactly. The operator's bound counts float64 numbers'
    memory, so a float32 kernel may keep twice as many numbers."""
    graph = grid_graph(9, 9)
    basis = ChebyshevBasis(graph.normalized_adjacency())
    matrices = chebyshev_matrices(12, graph)
    nodes = torch.tensor([40, 3, 77, 12, 41, 60, 8, 33])
    exact = torch.randn(10, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    single = exact.detach().float().requires_grad_()
    block = basis.block(single, nodes, nodes, 10**6)
    assert block.dtype == torch.float32 and basis._kept_blocks.dtype == torch.float32
    assert {values.dtype for segments in basis._kept_blocks.segments for _, _, values in segments} == {torch.float32}
    expected = torch.einsum("j,jab->ab", exact, matrices[:10][:, nodes][:, :, nodes])
    torch.testing.assert_close(block, expected.float(), rtol=1e-5, atol=1e-6)
    weights = torch.randn(8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (gradient,) = torch.autograd.grad((block * weights.float()).sum(), single)
    (reference,) = torch.autograd.grad((expected * weights).sum(), exact)
    torch.testing.assert_close(gradient, reference.float(), rtol=1e-5, atol=1e-5)
    _assert_kept_block_exact(basis, matrices, nodes, nodes, 9, 10**6)
    assert basis._kept_blocks.dtype == torch.float64

    bounds = []
    block_of = ChebyshevBasis.block
    monkeypatch.setattr(ChebyshevBasis, "block", lambda self, coefficients, rows, columns, max_entries:
                        bounds.append(max_entries) or block_of(self, coefficients, rows, columns, max_entries))
    with kept_chebyshev_terms(1000):
        for dtype in (torch.float32, torch.float64):
            ChebyshevKernelLinearOperator(exact.detach().to(dtype), basis=basis, row_nodes=nodes,
                                          column_nodes=nodes).to_dense()
    assert bounds == [2000, 1000]


def _assert_kept_block_exact(basis: ChebyshevBasis, matrices: Tensor, rows: Tensor, columns: Tensor, degree: int,
                             bound: int, batch: tuple[int, ...] = ()) -> None:
    """The basis's block of ``rows`` and ``columns`` from kept terms within ``bound``, and its gradient with
    respect to random coefficients (of shape ``(*batch, degree + 1)``), equal the sums over the dense
    Chebyshev ``matrices``."""
    coefficients = torch.randn(*batch, degree + 1, dtype=torch.float64,
                               generator=torch.Generator().manual_seed(degree), requires_grad=True)
    block = basis.block(coefficients, rows, columns, bound)
    assert block is not None
    expected = torch.einsum("...j,jab->...ab", coefficients, matrices[:degree + 1][:, rows][:, :, columns])
    torch.testing.assert_close(block, expected, rtol=0, atol=1e-12)
    weights = torch.randn(*batch, rows.numel(), columns.numel(), dtype=torch.float64,
                          generator=torch.Generator().manual_seed(degree))
    (gradient,) = torch.autograd.grad((block * weights).sum(), coefficients)
    (exact,) = torch.autograd.grad((expected * weights).sum(), coefficients)
    torch.testing.assert_close(gradient, exact, rtol=0, atol=1e-12)


def test_scattered_nodes_whose_recurrences_cover_the_graph_get_the_larger_blocks():
    """Where a first block of scattered nodes reaches, on average over the steps, more than half of the
    graph (a range as wide as the graph), every block costs the whole graph per step anyway: the larger
    blocks are used; at a short range, the scattered size."""
    graph = grid_graph(30, 30)
    basis = ChebyshevBasis(graph.normalized_adjacency())
    scattered = torch.arange(0, 900, 37)
    short = basis._local_blocks(scattered, 12, 4, hops=2)
    wide = basis._local_blocks(scattered, 12, 4, hops=200)
    for blocks in (short, wide):
        assert sorted(torch.cat(blocks).tolist()) == scattered.tolist()
    assert max(block.numel() for block in short) == 4
    assert max(block.numel() for block in wide) == 12
