"""The commands' options are declared without torch: the names and defaults they show are the library's."""

from __future__ import annotations

import pytest

from gp_couple.experiments import _options


def _builtin(registry) -> tuple[str, ...]:
    return tuple(name for name in registry.names() if registry.get(name).__module__.startswith("gp_couple."))


def test_builtin_registry_names_are_the_registries() -> None:
    from gp_couple.couplings import DIRECTION_COUPLINGS, FREQUENCY_COUPLINGS, NEIGHBOUR_PROPOSALS, WALK_LENGTH_COUPLINGS

    registries = {"WALK_LENGTH_COUPLINGS": WALK_LENGTH_COUPLINGS, "NEIGHBOUR_PROPOSALS": NEIGHBOUR_PROPOSALS,
                  "DIRECTION_COUPLINGS": DIRECTION_COUPLINGS, "FREQUENCY_COUPLINGS": FREQUENCY_COUPLINGS}
    for (_, registry), names in _options._BUILTIN_NAMES.items():
        assert names == _builtin(registries[registry]), registry


def test_a_users_coupling_is_a_choice_once_its_registry_is_imported() -> None:
    from gp_couple.couplings.walk_lengths import WALK_LENGTH_COUPLINGS, IIDWalkLengthCoupling

    class Mine(IIDWalkLengthCoupling):
        name = "options-test-coupling"

    try:
        assert "options-test-coupling" in _options.registered_names("walk_lengths", "WALK_LENGTH_COUPLINGS")
    finally:
        WALK_LENGTH_COUPLINGS.unregister("options-test-coupling")


def test_defaults_shown_by_the_options_are_the_librarys() -> None:
    from gp_couple.datasets.graph_specs import PROCEDURAL_HELP
    from gp_couple.experiments.exact_baseline import RANGE_HYPERPARAMETERS
    from gp_couple.experiments.graph_gp import GraphGPProtocol
    from gp_couple.halting import DEFAULT_MAX_INFLATION
    from gp_couple.kernels.grf_kernel import TRAIN_WALKERS as GRF_TRAIN_WALKERS
    from gp_couple.kernels.walk_schedule import SHARDED_SCHEDULE
    from gp_couple.optimize import OPTIMIZERS

    protocol = GraphGPProtocol()
    assert (_options.TRAIN_WALKERS, _options.TRAIN_LR) == (protocol.train_walkers, protocol.learning_rate)
    assert _options.COUPLINGS == protocol.couplings and _options.DIRECTIONS == protocol.directions
    assert _options.GRAPH_KERNEL_FAMILIES == tuple(RANGE_HYPERPARAMETERS)
    assert _options.DEFAULT_MAX_INFLATION == DEFAULT_MAX_INFLATION
    assert set(_options.GP_OPTIMIZERS) == set(OPTIMIZERS)
    assert _options._PROCEDURAL_HELP == PROCEDURAL_HELP
    assert (_options.RECIPE_TRAIN_WALKERS, _options.RECIPE_MAX_TRAIN_WALKERS, _options.RECIPE_PHASES) == (
        GRF_TRAIN_WALKERS, SHARDED_SCHEDULE.max_train_walkers, SHARDED_SCHEDULE.phases)


def test_predict_graph_help_states_the_librarys_kernel_choice() -> None:
    import argparse

    from gp_couple.predictive_variance import DENSE_VARIANCE_SIZE
    from gp_couple.recipes import (
        GRAPH_KERNELS,
        MATRIX_FREE_MIN_NODES,
        MATRIX_FREE_NODES_PER_OBSERVED,
        MATRIX_FREE_NODES_PER_OBSERVED_KEPT,
        matrix_free_nodes_per_observed,
    )

    assert set(_options.PREDICT_GRAPH_KERNELS) <= set(GRAPH_KERNELS)
    parser = argparse.ArgumentParser()
    _options.COMMAND_OPTIONS["predict-graph"](parser)
    (kernel,) = [action for action in parser._actions if action.dest == "kernel"]
    kept = max(n for n in range(1, 5000)
               if matrix_free_nodes_per_observed(n, predict_all_nodes=True) == MATRIX_FREE_NODES_PER_OBSERVED_KEPT)
    assert (f"at most {MATRIX_FREE_MIN_NODES:,} nodes or {MATRIX_FREE_NODES_PER_OBSERVED} nodes per observed node "
            f"({MATRIX_FREE_NODES_PER_OBSERVED_KEPT} with at most {kept:,} observed), with at most "
            f"{DENSE_VARIANCE_SIZE:,} observed") in " ".join(kernel.help.split())


@pytest.mark.parametrize("dataset, label, title", [("boston", "boston", "UCI boston"),
                                                   ("./data/my.csv", "my", "my.csv"), ("my.csv", "my", "my.csv")])
def test_dataset_labels(dataset: str, label: str, title: str) -> None:
    assert _options.dataset_label(dataset) == label and _options.dataset_title(dataset) == title
