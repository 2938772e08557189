"""The models hand their nodes to graph kernels through one hook, whatever the kernel's class."""

from __future__ import annotations

from typing import Any

import gpytorch
import numpy as np
import pytest
import torch
from torch import Tensor

import gp_couple._nodes as nodes_module
from gp_couple.graphs import grid_graph
from gp_couple.kernels import ExactGraphKernel, GRFKernel
from gp_couple.models import GraphGP, predict
from gp_couple.variational import GraphVariationalGP

GRAPH = grid_graph(4, 4)
PATCH = [0, 1, 4, 5, 6]


class PatchKernel(ExactGraphKernel):
    """An exact kernel that declares itself defined on a few nodes only and records the hook's calls."""

    def __init__(self, nodes: list[int]) -> None:
        super().__init__(GRAPH)
        self.patch = torch.tensor(nodes)
        self.prepared: list[tuple[str, list[int]]] = []

    def covered_nodes(self) -> Tensor | None:
        return self.patch

    def prepare_inputs(self, index: Tensor, inputs: Tensor, name: str = "nodes") -> None:
        self.prepared.append((name, index.tolist()))
        super().prepare_inputs(index, inputs, name)


def _model(kernel: PatchKernel, train: Any = (0, 4, 5)) -> GraphGP:
    return GraphGP(list(train), np.zeros(len(train)), gpytorch.likelihoods.GaussianLikelihood(),
                   gpytorch.kernels.ScaleKernel(kernel))


def test_exact_gp_hands_train_and_test_nodes_to_the_hook() -> None:
    kernel = PatchKernel(PATCH)
    model = _model(kernel)
    assert kernel.prepared == [("train_nodes", [0, 4, 5])]
    predict(model, model.likelihood, [6, 1])
    assert kernel.prepared[-1] == ("nodes", [6, 1])


def test_the_default_hook_refuses_nodes_outside_the_covered_ones() -> None:
    message = r"contains node 7 \(and 1 more\) outside the 5 nodes this PatchKernel is defined on"
    with pytest.raises(ValueError, match="train_nodes " + message):
        _model(PatchKernel(PATCH), train=(0, 7, 9))
    model = _model(PatchKernel(PATCH))
    with pytest.raises(ValueError, match="nodes " + message):
        predict(model, model.likelihood, [1, 7, 9])


def test_the_kernel_trusts_the_inputs_the_hook_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(PatchKernel(PATCH))
    checked = nodes_module.check_node_values
    calls: list[str] = []
    monkeypatch.setattr(nodes_module, "check_node_values",
                        lambda *args, **kwargs: calls.append(args[1]) or checked(*args, **kwargs))
    model.train()
    model(*model.train_inputs)
    assert calls == []


def test_variational_gp_chooses_and_hands_inducing_nodes_through_the_hook() -> None:
    kernel = PatchKernel(PATCH)
    model = GraphVariationalGP(gpytorch.kernels.ScaleKernel(kernel), 3)
    assert set(model.inducing_nodes.tolist()) <= set(PATCH)
    assert kernel.prepared[0][0] == "inducing_nodes" and set(kernel.prepared[0][1]) <= set(PATCH)
    model.node_inputs([5, 6], "train_nodes")
    assert kernel.prepared[-1] == ("train_nodes", [5, 6])
    with pytest.raises(ValueError, match="inducing_nodes contains node 15"):
        GraphVariationalGP(gpytorch.kernels.ScaleKernel(PatchKernel(PATCH)), [0, 15])


def test_kernels_on_every_node_cover_every_node() -> None:
    assert ExactGraphKernel(GRAPH).covered_nodes() is None
    assert GRFKernel(GRAPH, 4, 0.5, seed=0).covered_nodes() is None
    subset = GRFKernel(GRAPH, 4, 0.5, seed=0, nodes=[9, 2])
    assert sorted(subset.covered_nodes().tolist()) == [2, 9]
    subset.check_covered(torch.tensor([2, 9]))
    with pytest.raises(ValueError, match="test_nodes contains node 3 .* without GRF features"):
        subset.check_covered(torch.tensor([3]), "test_nodes")
