"""The one rule for node indices (gp_couple._nodes): what it accepts, what it refuses and what it says."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch

from gp_couple._nodes import check_node_values, node_index_array, node_index_tensor


@pytest.mark.parametrize("nodes", [
    [3, 0, 4], (3, 0, 4), range(3, 6), np.array([3, 0, 4], dtype=np.int32), np.array([3, 0, 4], dtype=np.uint8),
    torch.tensor([3, 0, 4]), torch.tensor([3, 0, 4], dtype=torch.int16), [np.int64(3), np.int64(0)],
])
def test_integers_of_every_kind_become_int64(nodes: Any) -> None:
    expected = np.asarray(list(nodes), dtype=np.int64)
    array = node_index_array(nodes, "nodes", 10)
    assert array.dtype == np.int64 and array.shape == expected.shape
    np.testing.assert_array_equal(array, expected)
    tensor = node_index_tensor(nodes, "nodes", 10)
    assert tensor.dtype == torch.int64 and tensor.tolist() == expected.tolist()


def test_the_array_never_aliases_the_callers_array() -> None:
    given = np.array([1, 2], dtype=np.int64)
    node_index_array(given, "nodes", 5)[0] = 4
    assert given.tolist() == [1, 2]


def test_device_of_the_tensor() -> None:
    assert node_index_tensor([1], "nodes", 2, device="cpu").device.type == "cpu"


@pytest.mark.parametrize("nodes, dtype", [
    ([True, False], "bool"), (np.array([1, 0], dtype=bool), "bool"), (torch.tensor([True]), "torch.bool"),
])
def test_bool_is_refused(nodes: Any, dtype: str) -> None:
    with pytest.raises(TypeError, match=f"^flags must hold node indices as integers, got dtype {dtype}$"):
        node_index_array(nodes, "flags", 5)
    # Not even where gpytorch's float inputs are accepted: a mask is not a set of nodes.
    with pytest.raises(TypeError, match=f"flags must hold node indices as integers or integer-valued floats, "
                                        f"got dtype {dtype}"):
        node_index_array(nodes, "flags", 5, gpytorch_inputs=True)


@pytest.mark.parametrize("nodes, dtype", [
    ([1.0, 2.0], "float64"), (np.array([1.0], dtype=np.float32), "float32"), (torch.tensor([1.0]), "torch.float32"),
])
def test_floats_are_refused_outside_gpytorch_inputs(nodes: Any, dtype: str) -> None:
    with pytest.raises(TypeError, match=f"^nodes must hold node indices as integers, got dtype {dtype}$"):
        node_index_array(nodes, "nodes", 5)


@pytest.mark.parametrize("nodes", [[1.0, 4.0], torch.tensor([1.0, 4.0], dtype=torch.float64),
                                   torch.tensor([[1.0], [4.0]]), np.array([[1.0], [4.0]], dtype=np.float32)])
def test_gpytorch_inputs_accept_integer_valued_floats_and_columns(nodes: Any) -> None:
    assert node_index_array(nodes, "train_nodes", 5, gpytorch_inputs=True).tolist() == [1, 4]


@pytest.mark.parametrize("nodes, message", [
    ([0.5], "train_nodes contains non-integer node index 0.5"),
    ([1.0, float("nan")], "train_nodes contains NaN or infinite node indices"),
    ([float("inf")], "train_nodes contains NaN or infinite node indices"),
    (torch.tensor([2.0**25], dtype=torch.float32),
     r"train_nodes has dtype torch.float32, which cannot represent node indices above 2\*\*24 exactly"),
])
def test_gpytorch_inputs_refuse_floats_that_are_not_exact_integers(nodes: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        node_index_array(nodes, "train_nodes", 2**30, gpytorch_inputs=True)


@pytest.mark.parametrize("nodes, bad", [([0, 5], 5), ([7, -1, 2], -1), (torch.tensor([9, 4]), 9)])
def test_out_of_range_names_the_argument_and_the_index(nodes: Any, bad: int) -> None:
    with pytest.raises(ValueError, match=rf"^test_nodes contains node index {bad} outside \[0, 5\)$"):
        node_index_array(nodes, "test_nodes", 5)


def test_without_a_size_only_negative_indices_are_out_of_range() -> None:
    assert node_index_array([10**12], "nodes").tolist() == [10**12]
    with pytest.raises(ValueError, match=r"^nodes contains node index -3 outside \[0, inf\)$"):
        node_index_array([1, -3], "nodes")


def test_duplicates_are_refused_only_when_asked() -> None:
    assert node_index_array([2, 1, 2], "nodes", 5).tolist() == [2, 1, 2]
    with pytest.raises(ValueError, match="^nodes contains duplicate node index 2$"):
        node_index_array([2, 1, 2], "nodes", 5, unique=True)
    with pytest.raises(ValueError, match="^nodes contains duplicate node index 1$"):
        node_index_tensor(torch.tensor([[1.0], [1.0]]), "nodes", 5, unique=True, gpytorch_inputs=True)
    assert node_index_array([4], "nodes", 5, unique=True).tolist() == [4]


@pytest.mark.parametrize("nodes", [[], np.array([], dtype=np.int32), torch.tensor([], dtype=torch.long)])
def test_empty_sets_need_allow_empty(nodes: Any) -> None:
    with pytest.raises(ValueError, match="^nodes is empty; pass at least one node index$"):
        node_index_array(nodes, "nodes", 5)
    empty = node_index_array(nodes, "nodes", 5, allow_empty=True, unique=True)
    assert empty.dtype == np.int64 and empty.shape == (0,)


@pytest.mark.parametrize("nodes, shape", [
    ([[0, 1], [2, 3]], (2, 2)), (3, ()), (np.zeros((1, 1, 1), dtype=int), (1, 1, 1)),
])
def test_anything_but_1_d_is_refused(nodes: Any, shape: tuple[int, ...]) -> None:
    expected = f"nodes must be a 1-D sequence of node indices, got shape {shape}"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        node_index_array(nodes, "nodes", 5)


def test_columns_are_gpytorch_inputs_only() -> None:
    column = np.array([[1], [2]])
    with pytest.raises(ValueError, match=r"nodes must be a 1-D sequence of node indices, got shape \(2, 1\)"):
        node_index_array(column, "nodes", 5)
    assert node_index_array(column, "nodes", 5, gpytorch_inputs=True).tolist() == [1, 2]
    with pytest.raises(ValueError, match=r"\(or a column of shape \(n, 1\)\), got shape \(2, 2\)"):
        node_index_array(np.zeros((2, 2)), "nodes", 5, gpytorch_inputs=True)


@pytest.mark.parametrize("nodes, message", [
    (["a", "b"], "got dtype <U1"), ([1 + 2j], "got dtype complex128"), ([object()], "got dtype object"),
    ([[0, 1], [2]], "got list"), (None, "got dtype object"),
])
def test_non_integers_are_refused(nodes: Any, message: str) -> None:
    with pytest.raises(TypeError, match=rf"^nodes must .*{message}$"):
        node_index_array(nodes, "nodes", 5)


def test_values_of_any_shape() -> None:
    # What the graph kernels read from their (..., n, 1) inputs.
    values = check_node_values(torch.tensor([[[1.0], [2.0]], [[0.0], [3.0]]]), "x1", 4, gpytorch_inputs=True)
    assert values.dtype == torch.int64 and values.shape == (2, 2, 1)
    with pytest.raises(ValueError, match=r"^x1 contains node index 4 outside \[0, 4\)$"):
        check_node_values(torch.tensor([[4]]), "x1", 4)
