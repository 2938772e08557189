"""``gp-couple kernel-estimation``: protocol helpers, tiny end-to-end runs and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gp_couple.cli import main
from gp_couple.experiments.kernel_estimation import (
    DEFAULT_COUPLINGS,
    fit_gp_hyperparameters,
    random_split,
    rlf_lengthscale,
    run_kernel_estimation,
    standardise,
)

TINY = dict(splits=2, max_train=30, max_test=20, draws=6, gp_iterations=20, chunk=4)


def _synthetic(n: int = 120, d: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, d)) * np.arange(1, d + 1)
    return x, np.sin(x[:, 0]) + 0.5 * x[:, 1] + 0.1 * rng.standard_normal(n)


def _is_summary(value: object) -> bool:
    return isinstance(value, dict) and set(value) == {"mean", "se", "n"}


def test_random_split_is_disjoint_capped_and_seeded() -> None:
    train, test = random_split(506, 256, 256, seed=1)
    assert len(train) == 253 and len(test) == 253
    assert not set(train) & set(test)
    train_small, test_small = random_split(20_000, 256, 100, seed=1)
    assert len(train_small) == 256 and len(test_small) == 100
    assert np.array_equal(random_split(506, 256, 256, seed=1)[0], train)
    assert not np.array_equal(random_split(506, 256, 256, seed=2)[0], train)
    with pytest.raises(ValueError, match="max_train"):
        random_split(10, 0, 5)


def test_standardise_uses_training_statistics() -> None:
    train = np.array([[1.0, 5.0], [3.0, 5.0]])
    test = np.array([[5.0, 6.0]])
    scaled_train, scaled_test = standardise(train, test)
    np.testing.assert_allclose(scaled_train, [[-1.0, 0.0], [1.0, 0.0]])
    np.testing.assert_allclose(scaled_test, [[3.0, 1.0]])


def test_rlf_lengthscale_rule() -> None:
    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    # pairs: |2e1| = 2, |e1 + e2| = sqrt(2) (twice), |2e2| = 2 -> mean (4 + 2 sqrt 2) / 4
    assert rlf_lengthscale(x) == pytest.approx(2 * (4 + 2 * np.sqrt(2)) / 4)
    with pytest.raises(ValueError):
        rlf_lengthscale(np.zeros((3, 2)))


def test_gp_fit_recovers_a_sensible_lengthscale_and_fixes_it_on_request() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, size=(60, 1))
    y = np.sin(x[:, 0]) + 0.05 * rng.standard_normal(60)
    fitted = fit_gp_hyperparameters(x, y, iterations=150, lr=0.1)
    assert 0.5 < fitted.lengthscale < 3.0 and fitted.noise < 0.05
    fixed = fit_gp_hyperparameters(x, y, iterations=20, lengthscale=0.37)
    assert fixed.lengthscale == pytest.approx(0.37)


def test_report_structure_and_normalisation() -> None:
    x, y = _synthetic()
    report = run_kernel_estimation(x, y, seed=3, **TINY)
    assert report["experiment"] == "kernel-estimation"
    assert report["settings"]["num_frequencies"] == {"rff": 4, "rlf": 8}
    rows = {(row["features"], row["coupling"]): row for row in report["results"]}
    expected = {(kind, name) for kind, names in DEFAULT_COUPLINGS.items() for name in names}
    assert set(rows) == expected
    for row in rows.values():
        for metric in ("kernel_rmse", "kl_per_test_point", "predictive_rmse",
                       "kernel_rmse_vs_iid", "predictive_rmse_vs_iid"):
            assert _is_summary(row[metric]) and row[metric]["n"] == 2
            assert np.isfinite(row[metric]["mean"]) and row[metric]["mean"] >= 0
    for kind in ("rff", "rlf"):
        assert rows[kind, "iid"]["kernel_rmse_vs_iid"]["mean"] == pytest.approx(1.0)
        assert rows[kind, "iid"]["kernel_rmse_vs_iid"]["se"] == pytest.approx(0.0)
        assert _is_summary(report["exact_gp"][kind]["predictive_rmse"])
    json.dumps(report)


def test_same_seed_same_report_and_stable_streams() -> None:
    x, y = _synthetic()
    settings = dict(TINY, features=("rff",), splits=1)
    first = run_kernel_estimation(x, y, seed=5, **settings)
    # Compared as JSON: with one split the standard errors are NaN, and NaN != NaN.
    assert json.dumps(first) == json.dumps(run_kernel_estimation(x, y, seed=5, **settings))
    # A coupling's draws do not depend on which other couplings run.
    alone = run_kernel_estimation(x, y, seed=5, couplings={"rff": ("pnc",)}, **settings)
    pnc = next(row for row in first["results"] if row["coupling"] == "pnc")
    assert alone["results"][0]["kernel_rmse"]["mean"] == pnc["kernel_rmse"]["mean"]
    assert "kernel_rmse_vs_iid" not in alone["results"][0]


def test_pnc_beats_iid_on_kernel_rmse() -> None:
    x, y = _synthetic(d=5)
    report = run_kernel_estimation(x, y, features=("rff",), couplings={"rff": ("iid", "pnc")}, seed=0,
                                   **dict(TINY, draws=40, splits=3))
    pnc = next(row for row in report["results"] if row["coupling"] == "pnc")["kernel_rmse_vs_iid"]
    assert pnc["mean"] + 4 * pnc["se"] < 1.0


def test_bad_arguments() -> None:
    x, y = _synthetic()
    with pytest.raises(ValueError, match="targets"):
        run_kernel_estimation(x, y[:-1], **TINY)
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        run_kernel_estimation(bad, y, **TINY)
    with pytest.raises(ValueError, match="unknown frequency coupling"):
        run_kernel_estimation(x, y, couplings={"rff": ("iid", "qmc")}, features=("rff",), **TINY)
    with pytest.raises(ValueError, match="draws"):
        run_kernel_estimation(x, y, **dict(TINY, draws=0))


def test_cli_json_on_boston(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["kernel-estimation", "--dataset", "boston", "--data-dir", str(data_dir), "--json",
                 "--splits", "1", "--draws", "3", "--gp-iterations", "10", "--max-train", "30",
                 "--max-test", "20", "--rff-couplings", "iid", "pnc", "--rlf-couplings", "iid",
                 "pnc+antithetic"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dataset"] == "boston" and report["input_dim"] == 13
    assert report["settings"]["num_frequencies"] == {"rff": 13, "rlf": 26}
    assert len(report["results"]) == 4


def test_cli_reports_bad_dataset(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kernel-estimation", "--dataset", "mnist", "--data-dir", str(data_dir)]) == 2
    assert "unknown UCI dataset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["kernel-estimation", "--dataset", "boston", "--draws", "0"])


# --------------------------------------------------------------------------- fast protocol


def test_lbfgs_reaches_the_marginal_likelihood_optimum_that_adam_approaches() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(-3, 3, size=(50, 2))
    y = np.sin(x[:, 0]) + 0.1 * rng.standard_normal(50)
    quasi_newton = fit_gp_hyperparameters(x, y)
    assert quasi_newton.converged and quasi_newton.iterations < 200
    adam = fit_gp_hyperparameters(x, y, optimizer="adam", iterations=1000, lr=0.1)
    assert adam.converged and adam.iterations > 10 * quasi_newton.iterations
    for name in ("lengthscale", "outputscale", "noise"):
        assert getattr(adam, name) == pytest.approx(getattr(quasi_newton, name), rel=1e-3)
    with pytest.raises(ValueError, match="unknown optimizer"):
        fit_gp_hyperparameters(x, y, optimizer="sgd")


def test_low_rank_evaluation_matches_dense_gram_and_posterior() -> None:
    import torch

    from gp_couple.couplings import get_frequency_coupling
    from gp_couple.evaluation.metrics import rmse
    from gp_couple.evaluation.posterior import gp_posterior_from_blocks, posterior_kl
    from gp_couple.experiments._coupling_draws import evaluate_coupling
    from gp_couple.experiments._exact_gp import GPHyperparameters
    from gp_couple.features.fourier import feature_map, gaussian_kernel

    rng = np.random.default_rng(2)
    n_train, n_test, dim = 20, 15, 3
    scaled = torch.as_tensor(rng.standard_normal((n_train + n_test, dim)))
    y_train, y_test = rng.standard_normal(n_train), rng.standard_normal(n_test)
    hyper = GPHyperparameters(lengthscale=1.0, outputscale=1.7, noise=0.3, iterations=0)
    gram = gaussian_kernel(scaled)
    blocks = 1.7 * gram.numpy()
    exact = gp_posterior_from_blocks(blocks[:n_train, :n_train], blocks[n_train:, :n_train],
                                     blocks[n_train:, n_train:], y_train, 0.3)
    result = evaluate_coupling("pnc", "rff", scaled, gram, n_train, y_train, y_test, hyper, exact, 3, 4, 3,
                                np.random.default_rng(5))
    # The same draws (chunks of 3 then 1 from the same stream), evaluated densely.
    rng_check = np.random.default_rng(5)
    coupling = get_frequency_coupling("pnc", dim=dim)
    draws = [coupling.sample(3, dim, batch_shape=(3,), seed=rng_check, dtype=torch.float64),
             coupling.sample(3, dim, batch_shape=(1,), seed=rng_check, dtype=torch.float64)]
    features = feature_map("rff")(scaled, torch.cat(draws))
    squared, kls, errors = [], [], []
    for phi in features.numpy():
        approx_gram = phi @ phi.T
        squared.append(((approx_gram[n_train:, n_train:] - gram.numpy()[n_train:, n_train:]) ** 2).mean())
        k = 1.7 * approx_gram
        approximate = gp_posterior_from_blocks(k[:n_train, :n_train], k[n_train:, :n_train], k[n_train:, n_train:],
                                               y_train, 0.3)
        kls.append(posterior_kl(exact, approximate) / n_test)
        errors.append(rmse(approximate.mean, y_test))
    assert result["kernel_rmse"] == pytest.approx(np.sqrt(np.mean(squared)), rel=1e-9)
    assert result["kl_per_test_point"] == pytest.approx(np.mean(kls), rel=1e-8)
    assert result["predictive_rmse"] == pytest.approx(np.mean(errors), rel=1e-10)


def test_protocol_options_are_reported_and_threads_restored() -> None:
    import torch

    x, y = _synthetic()
    before = torch.get_num_threads()
    report = run_kernel_estimation(x, y, features=("rff",), couplings={"rff": ("iid", "orthogonal")},
                                   kl_posterior="latent", latent_jitter=1e-4, rff_lengthscale=2.5,
                                   standardise_targets=False, seed=1, threads=1, **dict(TINY, splits=1))
    assert torch.get_num_threads() == before
    settings = report["settings"]
    assert settings["kl_posterior"] == "latent" and settings["latent_jitter"] == 1e-4
    assert settings["rff_lengthscale"] == 2.5 and settings["standardise_targets"] is False
    assert report["exact_gp"]["rff"]["lengthscale"]["mean"] == pytest.approx(2.5)
    assert any("latent posteriors" in note for note in report["notes"])
    with pytest.raises(ValueError, match="kl_posterior"):
        run_kernel_estimation(x, y, kl_posterior="prior", **TINY)
    with pytest.raises(ValueError, match="rff_lengthscale"):
        run_kernel_estimation(x, y, rff_lengthscale=-1.0, **TINY)


def test_cli_options_for_the_paper_settings(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["kernel-estimation", "--dataset", "airfoil", "--data-dir", str(data_dir), "--json",
                 "--splits", "1", "--draws", "2", "--max-train", "20", "--max-test", "10", "--features", "rff",
                 "--rff-couplings", "iid", "--raw-targets", "--kl-posterior", "latent",
                 "--gp-optimizer", "adam", "--gp-iterations", "5", "--threads", "1"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["gp_optimizer"] == "adam" and report["settings"]["standardise_targets"] is False
    assert report["timing"]["threads"] == 1 and report["timing"]["seconds"] > 0


def test_cli_on_a_csv_file_of_your_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x, y = _synthetic(n=60, d=3)
    table = tmp_path / "my data.csv"
    rows = "\n".join(f"{a},{t},{b},{c}" for (a, b, c), t in zip(x, y))
    table.write_text(f"a,price,b,c\n{rows}\n")
    argv = ["kernel-estimation", "--dataset", str(table), "--target", "price", "--json", "--splits", "1",
            "--draws", "3", "--gp-iterations", "10", "--max-train", "20", "--max-test", "10",
            "--rff-couplings", "iid", "pnc", "--features", "rff"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dataset"] == str(table) and report["input_dim"] == 3 and report["num_points"] == 60
    assert main([*argv[:3], "--target", "nope", *argv[5:]]) == 2
    assert "has no column 'nope': its columns are a, price, b, c" in capsys.readouterr().err
