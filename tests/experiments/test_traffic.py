"""``gp-couple traffic``: report fields, the exact-GP baselines, the kernel option and p_halt (tiny settings)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gp_couple.cli import main
from gp_couple.experiments.exact_baseline import exact_predictions, fit_exact_gp, kernel_family_at
from gp_couple.graphs import grid_graph
from gp_couple.halting import halting_inflation, suggest_p_halt

TINY = ["--train-iterations", "3", "--walkers", "2", "--repeats", "2", "--order", "6", "--fit-samples", "5",
        "--json"]


def run_traffic(capsys, data_dir, *extra: str) -> dict:
    assert main(["traffic", "--data-dir", str(data_dir), *TINY, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_traffic_reports_both_exact_baselines_nlpd_and_the_auto_p_halt(capsys, data_dir) -> None:
    # Walks seeded apart from the split: the paper's default split (seed 0) gives the numbers below.
    report = run_traffic(capsys, data_dir, "--couplings", "iid", "sigma", "--exact-starts", "8",
                         "--seed", "3", "--split-seed", "0")
    assert report["nodes"] == 1016 and report["train"] == 250 and report["test"] == 75
    # The exact GP fitted by its own likelihood (deterministic: L-BFGS on a dense kernel).
    exact_ml = report["exact_ml"]
    assert exact_ml["family_name"] == "diffusion" and len(exact_ml["restarts"]) == 1
    assert exact_ml["hyperparameters"]["gamma"] == pytest.approx(8.06, abs=0.01)
    assert exact_ml["test_rmse"] == pytest.approx(13.60, abs=0.01)
    # NLPD in mph units = standardised NLPD (1.19) + log of the training standard deviation.
    assert exact_ml["test_nlpd"] - math.log(report["target_scale"]) == pytest.approx(1.191, abs=0.002)
    # ...reported apart from the exact kernel at the (here barely trained) GRF hyperparameters.
    at_trained = report["exact_at_trained"]
    assert set(at_trained) == {"test_rmse", "test_nlpd"} and at_trained["test_rmse"] > exact_ml["test_rmse"]
    assert "exact_test_rmse" not in report
    # --p-halt auto: the rule at the exact-ML kernel, within the halting-inflation budget.
    p_halt = report["p_halt"]
    assert p_halt["choice"] == "auto" and p_halt["used"] == p_halt["suggested_for_exact_ml"]
    assert p_halt["used"] == pytest.approx(0.021, abs=0.001) and report["protocol"]["p_halt"] == p_halt["used"]
    assert p_halt["halting_inflation_at_exact_ml"] == pytest.approx(p_halt["max_inflation"], rel=1e-3)
    # Every length coupling with independent and repelling directions, with NLPD.
    assert {(row["coupling"], row["directions"]) for row in report["results"]} == {
        (c, d) for c in ("iid", "sigma") for d in ("independent", "repelling")}
    for row in report["results"]:
        assert np.isfinite(row["test_nlpd"]["mean"]) and row["test_nlpd"]["n"] == 2


def test_traffic_kernel_option_and_a_given_p_halt(capsys, data_dir) -> None:
    report = run_traffic(capsys, data_dir, "--kernel", "regularised-laplacian", "--p-halt", "0.1",
                         "--couplings", "iid", "--directions", "independent", "--exact-starts", "4")
    assert report["trained"]["family_name"] == "regularised-laplacian" == report["exact_ml"]["family_name"]
    assert set(report["trained"]["hyperparameters"]) == {"sigma", "degree"}
    assert report["protocol"]["family_name"] == "regularised-laplacian"
    assert report["p_halt"]["choice"] == "given" and report["p_halt"]["used"] == 0.1
    assert len(report["results"]) == 1


def test_p_halt_auto_is_refused_by_commands_without_an_exact_fit(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["mesh", "--p-halt", "auto"])
    assert exit_info.value.code == 2
    assert "expected a number, got 'auto'" in capsys.readouterr().err


def test_exact_fit_maximises_the_likelihood_from_every_start() -> None:
    graph = grid_graph(7, 7)
    rng = np.random.default_rng(0)
    truth = kernel_family_at("diffusion", {"gamma": 2.0})
    from gp_couple.exact import exact_kernel_matrix

    gram = exact_kernel_matrix(truth, graph).detach().numpy()
    signal = np.linalg.cholesky(gram + 1e-9 * np.eye(49)) @ rng.standard_normal(49)
    observed = signal + 0.1 * rng.standard_normal(49)
    train, test = np.arange(0, 49, 2), np.arange(1, 49, 2)
    fit = fit_exact_gp(graph, "diffusion", train, observed[train], initial_values=[0.7, 3.0])
    ends = [restart["negative_log_likelihood"] for restart in fit.restarts]
    assert fit.negative_log_likelihood == min(ends)
    assert max(ends) - min(ends) < 1e-4  # both starts reach the same optimum
    predictions = exact_predictions(graph, kernel_family_at("diffusion", fit.hyperparameters), fit.outputscale,
                                    fit.noise, train, test, observed, 0.0, 1.0)
    assert predictions["test_rmse"] < np.std(observed[test])
    with pytest.raises(ValueError, match="family_name must be one of"):
        fit_exact_gp(graph, "inverse-cosine", train, observed[train])


def test_rule_and_inflation_agree_for_the_traffic_kernel() -> None:
    family = kernel_family_at("diffusion", {"gamma": 8.06})
    assert halting_inflation(family, suggest_p_halt(family)) == pytest.approx(2.0, rel=1e-4)
