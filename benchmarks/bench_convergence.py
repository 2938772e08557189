"""Benchmark: the recommended GRF-GP against the exact GP, both trained to convergence.

Every model is trained by L-BFGS on a deterministic objective until the stopping rule of
:class:`gp_couple.optimize.Convergence` holds (defaults: loss change at most 1e-4 relative,
no parameter moving more than 1e-2 between iterations in the optimiser's coordinates, i.e.
1 % for the positive hyperparameters, which L-BFGS moves in logarithmic coordinates; at most ``--iterations``
iterations per run), and predicts the held-out nodes with variances to a stated accuracy
(:func:`gp_couple.models.predict`: dense float64 Cholesky up to 10,000 training points,
block Krylov with a residual bound above). Methods, each in a fresh subprocess:

* ``recipe``: :func:`gp_couple.recipes.fit_grf_gp` with its defaults (walks that follow the
  learnt range, prediction walkers for a relative Gram error of 0.01);
* ``exact``: the exact GP with the dense :class:`~gp_couple.kernels.ExactGraphKernel`
  up to ``--dense-limit`` nodes and the matrix-free :class:`~gp_couple.kernels.MatrixFreeGraphKernel`
  above, trained to convergence from two starts, gpytorch's default hyperparameters
  (γ = 1) and the recipe's learnt ones (the ``defaults`` model's when the recipe did not
  run before it), keeping the one with the lower training loss
  (from the default start alone, L-BFGS can end in a basin with the noise at its floor
  and a worse likelihood: both losses are reported); ``--exact-starts given`` keeps only
  the second start, for graphs where one exact training run takes hours, and
  ``--exact-means-only`` predicts its means only (test RMSE, no NLPD), where its exact
  variances would take hours matrix-free; ``--exact-cpu-limit`` stops each exact run after
  that many CPU seconds (recording its loss against CPU time), a lower bound on its cost;
* ``recipe_at_exact`` (diagnosis): the recipe's prediction walks at the exact GP's
  hyperparameters, without training (prediction error alone);
* ``exact_at_recipe`` (diagnosis): the exact kernel at the recipe's learnt hyperparameters
  (training drift alone);
* ``defaults``: what a user gets from the constructor (issue 19, section 4):
  ``ScaleKernel(GRFKernel(graph, nodes=train ∪ test, seed=seed))`` with every other argument
  at its default (hence its default walk schedule), trained by :func:`gp_couple.models.fit_gp`
  to convergence (L-BFGS, its stopping rule) and predicted by
  :func:`gp_couple.models.predict` on the walks ``fit_gp`` leaves, all under
  ``grf_gp_settings()`` (every method; ``--max-cholesky-size`` changes that setting);
  ``--predict-tolerance`` and ``--max-predict-walkers`` change those two fields of its
  schedule (the prediction walks' accuracy), ``--no-bias-correction`` trains its rounds on
  the prediction walks on the plain likelihood;
* ``exact_at_defaults`` (diagnosis): the exact kernel at the ``defaults`` model's learnt
  hyperparameters (its training drift alone);
  both ``exact_at_…`` rows also record the exact training loss at those hyperparameters and,
  against the exact GP's converged loss, ``likelihood_gap_nats``: how many nats of exact
  log marginal likelihood the learnt hyperparameters give up (about 1.92 is the edge of the
  exact GP's own 95 % likelihood-ratio interval for one parameter; a small gap with a large
  hyperparameter ratio means the data do not identify that hyperparameter). Only where the
  training loss is a dense factor (at most ``max_cholesky_size`` training points);
* ``auto``: :func:`gp_couple.recipes.fit_graph_gp` with its defaults (the kernel chosen by
  the graph's size, :func:`gp_couple.recipes.choose_graph_kernel`; the row names it);
* ``adam300`` (the schedule this replaced, for its wall time): 48 antithetic repelling
  walkers at p_halt 0.1 with ``schedule=None``, 300 Adam steps (lr 0.05), then 512
  σ-coupled prediction walkers at the same p_halt.

Every model's kernel is the diffusion kernel from γ = 1, or ``--kernel-family NAME``'s
registered family (:func:`gp_couple.get_kernel_family`) from its constructor's initial
hyperparameters; the rows report its trained hyperparameters by name.

Problems are those of ``bench_graph_gp_accuracy.py`` (``bumpy``, ``grid:RxC``,
``icosphere:K``, ``mesh:NAME``, ``prior:GAMMA:GRAPH[@OBSERVED]``, ``traffic``). ``mesh:NAME``,
``traffic`` and ``prior:GAMMA:traffic`` (a prior draw on the weighted road graph) read
``--data-dir`` (or ``$GP_COUPLE_DATA``); without the data they are skipped with the reason.

Run: ``python benchmarks/bench_convergence.py --problems bumpy prior:3:grid:50x50
--json-out benchmarks/results/convergence.json``; held-out problems:
``python benchmarks/bench_convergence.py --data-dir ../shared/datasets --problems traffic
prior:3:traffic mesh:torus --methods recipe exact recipe_at_exact exact_at_recipe defaults``.
``--exact-from FILE ...`` reuses the exact GP rows of earlier runs (same problem and seed)
instead of retraining them (marked ``"exact_from"``), e.g. to add ``defaults`` to
``convergence.json``'s problems: from the default start alone the exact GP can end in a
worse basin (see ``exact``); ``--defaults-from FILE ...`` reuses ``defaults`` rows likewise
(marked ``"defaults_from"``), e.g. to run ``exact_at_defaults`` alone with a larger
``--max-cholesky-size``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import dispatch_worker, emit_report, run_in_subprocess  # noqa: E402
from bench_graph_gp_accuracy import problem  # noqa: E402

METHODS = ("recipe", "exact", "recipe_at_exact", "exact_at_recipe", "defaults", "exact_at_defaults", "adam300", "auto")
#: Problems that read the data directory.
DATA_PROBLEMS = ("mesh:", "traffic", "prior:")


def _model(graph: Any, train: np.ndarray, observed: np.ndarray, base: Any) -> tuple[Any, Any]:
    import gpytorch
    import torch

    from gp_couple import GraphGP

    kernel = gpytorch.kernels.ScaleKernel(base)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    targets = torch.as_tensor(observed[train], dtype=torch.get_default_dtype())
    return GraphGP(train, targets, likelihood, kernel), likelihood


def _exact_kernel(graph: Any, family: str, dense_limit: int) -> Any:
    from gp_couple import ExactGraphKernel, get_kernel_family
    from gp_couple.kernels.matrix_free import MatrixFreeGraphKernel

    if graph.num_nodes <= dense_limit:
        return ExactGraphKernel(graph, get_kernel_family(family))
    return MatrixFreeGraphKernel(graph, get_kernel_family(family))


def _family_hyper(family: Any) -> dict[str, float]:
    """The kernel family's trained hyperparameters (those held by a raw parameter), by name."""
    return {name[len("raw_"):]: float(getattr(family, name[len("raw_"):]).detach())
            for name, _ in family.named_parameters(recurse=False) if name.startswith("raw_")}


def _set(model: Any, likelihood: Any, hyper: dict[str, float]) -> None:
    model.covar_module.outputscale = hyper["outputscale"]
    likelihood.noise = hyper["noise"]
    family = model.covar_module.base_kernel.kernel_family
    for name in _family_hyper(family):
        setattr(family, name, hyper[name])


def _hyper(model: Any, likelihood: Any) -> dict[str, float]:
    return {"outputscale": float(model.covar_module.outputscale.detach()),
            **_family_hyper(model.covar_module.base_kernel.kernel_family),
            "noise": float(likelihood.noise.detach())}


def hyperparameter_names(row: dict[str, Any]) -> list[str]:
    """The trained hyperparameters of a result row (rows written before ``--kernel-family``: the diffusion's)."""
    return row.get("hyperparameter_names", ["outputscale", "gamma", "noise"])


def _dense_training_loss(model: Any, likelihood: Any) -> float | None:
    """``fit_gp``'s training loss (negative log marginal likelihood per point) at the model's hyperparameters,
    where it is a dense Cholesky factor (deterministic: comparable with a converged run's last loss);
    ``None`` above gpytorch's ``max_cholesky_size``, where training estimates it by CG/Lanczos."""
    import gpytorch
    import torch

    from gp_couple.marginal_likelihood import DenseMarginalLogLikelihood

    if len(model.train_targets) > gpytorch.settings.max_cholesky_size.value():
        return None
    model.train()
    with torch.no_grad():
        loss = -DenseMarginalLogLikelihood(likelihood, model)(model(*model.train_inputs), model.train_targets)
    model.eval()
    return float(loss)


def _cpu_limited_log(trajectory: list[tuple[float, float]],
                     cpu_limit: float | None) -> Callable[[int, float], bool]:
    """A ``fit_gp`` callback that logs the loss against CPU time into ``trajectory`` and stops after ``cpu_limit``."""
    began = time.process_time()

    def record(step: int, loss: float) -> bool:
        trajectory.append((time.process_time() - began, loss))
        return cpu_limit is not None and trajectory[-1][0] > cpu_limit

    return record


def run_method(spec: str, method: str, iterations: int, seed: int, dense_limit: int,
               hyper: dict[str, float] | None, exact_starts: str = "both",
               exact_variances: bool = True, schedule_options: dict[str, Any] | None = None,
               settings: dict[str, Any] | None = None, exact_cpu_limit: float | None = None,
               kernel_family: str = "diffusion", dtype: str = "float32") -> dict[str, Any]:
    """Train (or set) and predict with one method; return accuracy, hyperparameters and times.

    :param schedule_options: ``WalkSchedule`` fields that the ``defaults`` method changes
        (``None``: the constructor's schedule).
    :param settings: ``grf_gp_settings`` overrides of every method (``None``: the recommended ones).
    :param exact_cpu_limit: CPU seconds after which each exact training run is stopped
        unconverged (``None``: no limit); every exact run records its loss against CPU time.
    :param kernel_family: Registered name of every model's kernel family
        (:func:`gp_couple.get_kernel_family`, at its constructor's initial hyperparameters).
    :param dtype: ``"float32"`` (the library's default) or ``"float64"``: every model's parameters,
        walks and targets (the default dtype of this method's subprocess).
    """
    import warnings

    import gpytorch
    import torch

    torch.set_default_dtype(getattr(torch, dtype))

    from gp_couple import GRFKernel, WalkSchedule, fit_gp, get_kernel_family, grf_gp_settings, predict
    from gp_couple.evaluation import nlpd, rmse
    from gp_couple.recipes import fit_graph_gp, fit_grf_gp

    graph, signal, observed, train, test = problem(spec, seed)
    walk_nodes = np.union1d(train, test)
    settings = settings or {}
    start = time.perf_counter()
    cpu = time.process_time()
    result: dict[str, Any] = {"method": method}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if method == "auto":
            model, likelihood = fit_graph_gp(graph, train, observed[train], predict_nodes=test, iterations=iterations,
                                             kernel_family=get_kernel_family(kernel_family), seed=seed)
            result.update(kernel=type(model.covar_module.base_kernel).__name__)
        elif method == "recipe":
            model, likelihood = fit_grf_gp(graph, train, observed[train], predict_nodes=test, iterations=iterations,
                                           kernel_family=get_kernel_family(kernel_family), seed=seed)
        elif method == "recipe_at_exact":
            base = GRFKernel(graph, kernel_family=get_kernel_family(kernel_family), nodes=walk_nodes, seed=seed)
            model, likelihood = _model(graph, train, observed, base)
            _set(model, likelihood, hyper)
            base.resample_for_prediction(seed=seed)
        elif method == "defaults":
            schedule = {} if schedule_options is None else {"schedule": WalkSchedule(**schedule_options)}
            defaults = GRFKernel(graph, kernel_family=get_kernel_family(kernel_family), nodes=walk_nodes, seed=seed,
                                 **schedule)
            model, likelihood = _model(graph, train, observed, defaults)
            with grf_gp_settings(**settings):
                history = fit_gp(model, likelihood, iterations=iterations, optimizer="lbfgs", seed=seed)
            result.update(iterations=len(history), evaluations=history.evaluations, converged=history.converged,
                          final_loss=history[-1], phases=history.phases, undone_phases=history.undone_phases)
        elif method == "adam300":
            fixed = GRFKernel(graph, kernel_family=get_kernel_family(kernel_family), nodes=walk_nodes, seed=seed,
                              schedule=None)
            model, likelihood = _model(graph, train, observed, fixed)
            with grf_gp_settings(**settings):
                history = fit_gp(model, likelihood, iterations=300, lr=0.05, seed=seed)
                fixed.resample_for_prediction(512, follow_range=False, seed=seed)
            result.update(iterations=len(history), final_loss=history[-1])
        elif method in ("exact_at_recipe", "exact_at_defaults"):
            model, likelihood = _model(graph, train, observed, _exact_kernel(graph, kernel_family, dense_limit))
            _set(model, likelihood, hyper)
            with grf_gp_settings(**settings):
                result.update(training_loss=_dense_training_loss(model, likelihood), training_points=len(train))
        else:
            best = None
            starts: tuple[dict[str, float] | None, ...] = (
                (None,) if hyper is None else (hyper,) if exact_starts == "given" else (None, hyper))
            for start_at in starts:
                began = time.perf_counter()
                trajectory: list[tuple[float, float]] = []
                record = _cpu_limited_log(trajectory, exact_cpu_limit)
                model, likelihood = _model(graph, train, observed, _exact_kernel(graph, kernel_family, dense_limit))
                if start_at is not None:
                    _set(model, likelihood, start_at)
                with grf_gp_settings(**settings):
                    history = fit_gp(model, likelihood, iterations=iterations, optimizer="lbfgs", seed=seed,
                                     callback=record)
                name = "default" if start_at is None else "recipe"
                result[f"loss_from_{name}_start"] = history[-1]
                result[f"trajectory_from_{name}_start"] = trajectory
                result[f"stopped_by_cpu_limit_from_{name}_start"] = history.reason == "callback"
                result[f"train_s_from_{name}_start"] = time.perf_counter() - began
                if best is None or history[-1] < best[2][-1]:
                    best = (model, likelihood, history, name)
            model, likelihood, history, name = best
            result.update(iterations=len(history), evaluations=history.evaluations, converged=history.converged,
                          start=name, final_loss=history[-1])
            # The time of the start kept, not of both: what one training run of the exact GP costs.
            start = time.perf_counter() - result[f"train_s_from_{name}_start"]
        train_s = time.perf_counter() - start
        prediction = None
        if method.startswith("exact") and not exact_variances:
            # Means only: one CG solve and one cross-covariance product (exact variances at
            # 10^4 training points need every column of the training covariance).
            model.eval()
            with (grf_gp_settings(**settings), torch.no_grad(),
                  gpytorch.settings.skip_posterior_variances(True)):
                mean = model(model.node_inputs(test)).mean.double().numpy()
        else:
            with grf_gp_settings(**settings):
                prediction = predict(model, likelihood, test, seed=seed)
            mean = prediction.mean.double().numpy()
    base = model.covar_module.base_kernel
    if isinstance(base, GRFKernel):
        result.update(predict_walkers=base.num_walkers, predict_p_halt=base.p_halt,
                      gram_error_estimate=base.gram_error_estimate,
                      prediction_error_estimate=base.prediction_error_estimate,
                      bias_expansion_error=base.bias_expansion_error, bias_corrected=base.bias_corrected)
    hyper_now = _hyper(model, likelihood)
    result.update(hyper_now, kernel_family=kernel_family, hyperparameter_names=list(hyper_now))
    result.update(test_rmse=rmse(mean, signal[test]),
                  test_nlpd=None if prediction is None else nlpd(mean, prediction.variance.double().numpy(),
                                                                 observed[test]),
                  variance_method=None if prediction is None else prediction.estimate.method,
                  variance_error=None if prediction is None else prediction.estimate.relative_error,
                  train_s=train_s, total_s=time.perf_counter() - start, cpu_s=time.process_time() - cpu)
    result.update(warnings=sorted({f"{type(w.message).__name__}: {str(w.message)[:160]}" for w in caught}))
    return result

def _saved_rows(paths: list[str], method: str, kernel_family: str) -> list[dict[str, Any]]:
    """The ``method`` rows of earlier JSONs of this benchmark with ``kernel_family``, marked ``"<method>_from"``."""
    rows = []
    for path in paths:
        with open(path) as source:
            rows += [{**row, f"{method}_from": path} for row in json.load(source)["rows"]
                     if row.get("method") == method and "error" not in row
                     and row.get("kernel_family", "diffusion") == kernel_family]
    return rows


def missing_data(spec: str) -> str | None:
    """Why the data of ``spec`` cannot be read (``None`` if they can, or it needs none)."""
    graph_spec = spec.partition("@")[0]
    if not spec.startswith(DATA_PROBLEMS) or (spec.startswith("prior:") and not graph_spec.endswith(":traffic")):
        return None
    try:
        problem(spec, 0)
    except (FileNotFoundError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", nargs="+", default=["bumpy"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--iterations", type=int, default=200, help="most L-BFGS iterations per training run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dense-limit", type=int, default=6000)
    parser.add_argument("--data-dir", default=None,
                        help="data directory of mesh:NAME and traffic problems (sets $GP_COUPLE_DATA)")
    parser.add_argument("--exact-from", nargs="+", default=[],
                        help="reuse the exact GP rows (same problem and seed) of earlier JSONs of this benchmark")
    parser.add_argument("--defaults-from", nargs="+", default=[],
                        help="reuse the defaults rows (same problem and seed) of earlier JSONs of this benchmark, "
                             "e.g. for exact_at_defaults alone")
    parser.add_argument("--exact-starts", choices=("both", "given"), default="both",
                        help="train the exact GP from gpytorch's default start and the recipe's (or defaults') "
                             "hyperparameters, or from the latter only (graphs where one exact training run "
                             "takes hours)")
    parser.add_argument("--exact-means-only", action="store_true",
                        help="the exact GP rows predict means only (test RMSE, no NLPD): exact variances at "
                             "10^4 training points of a 10^6-node graph take hours matrix-free")
    parser.add_argument("--predict-tolerance", type=float, default=None,
                        help="the defaults model's WalkSchedule.predict_tolerance (default: the schedule's)")
    parser.add_argument("--max-predict-walkers", type=int, default=None,
                        help="the defaults model's WalkSchedule.max_predict_walkers (default: the schedule's)")
    parser.add_argument("--predict-error-tolerance", type=float, default=None,
                        help="the defaults model's WalkSchedule.predict_error_tolerance (default: the schedule's)")
    parser.add_argument("--no-expansion-redraw", action="store_true",
                        help="the defaults model's WalkSchedule.expansion_target None (no round redrawn for the "
                             "whitened error)")
    parser.add_argument("--no-bias-correction", action="store_true",
                        help="the defaults model's WalkSchedule.bias_correction off (the plain likelihood)")
    parser.add_argument("--max-cholesky-size", type=int, default=None,
                        help="grf_gp_settings' max_cholesky_size for every method (default: the recommended 8192)")
    parser.add_argument("--exact-cpu-limit", type=float, default=None,
                        help="CPU seconds after which each exact training run stops unconverged (its loss "
                             "against CPU time is recorded), for a lower bound on its cost")
    parser.add_argument("--kernel-family", default="diffusion",
                        help="registered kernel family of every model (gp_couple.get_kernel_family), at its "
                             "constructor's initial hyperparameters")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="dtype of every model (float32: the library's default)")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    settings = None if args.max_cholesky_size is None else {"max_cholesky_size": args.max_cholesky_size}
    schedule_options = {name: value for name, value in (("predict_tolerance", args.predict_tolerance),
                                                        ("max_predict_walkers", args.max_predict_walkers),
                                                        ("predict_error_tolerance", args.predict_error_tolerance),
                                                        ("bias_correction", False if args.no_bias_correction else None))
                        if value is not None} or None
    if args.no_expansion_redraw:
        schedule_options = {**(schedule_options or {}), "expansion_target": None}
    saved = {method: _saved_rows(paths, method, args.kernel_family)
             for method, paths in (("exact", args.exact_from), ("defaults", args.defaults_from))}
    if args.data_dir:
        os.environ["GP_COUPLE_DATA"] = os.path.abspath(args.data_dir)
    rows: list[dict[str, Any]] = []
    for spec in args.problems:
        reason = missing_data(spec)
        if reason is not None:
            rows.append({"problem": spec, "skipped": reason})
            print(f"{spec}: skipped ({reason})", file=sys.stderr, flush=True)
            continue
        found: dict[str, dict[str, Any]] = {}
        reused = {method: row for method, rows_of in saved.items() for row in rows_of
                  if row["problem"] == spec and row["seed"] == args.seed}
        for method, row in reused.items():
            if method not in args.methods:
                found[method] = row   # a reference (of the ratios, or of exact_at_defaults), not a row of this run
        for method in args.methods:
            # The exact GP's second start: the recipe's hyperparameters, else the defaults' (whichever ran before).
            reference = (found.get("exact") if method == "recipe_at_exact"
                         else found.get("defaults") if method == "exact_at_defaults"
                         else found.get("recipe", found.get("defaults")))
            hyper = None if reference is None else {key: reference[key] for key in hyperparameter_names(reference)}
            if method in ("recipe_at_exact", "exact_at_recipe", "exact_at_defaults") and hyper is None:
                continue
            if method in reused:
                row = reused[method]
            else:
                row = run_in_subprocess(__file__, run_method, spec, method, args.iterations, args.seed,
                                        args.dense_limit, hyper, args.exact_starts, not args.exact_means_only,
                                        schedule_options if method == "defaults" else None, settings,
                                        args.exact_cpu_limit, args.kernel_family, args.dtype)
                row.update(problem=spec, seed=args.seed, load=os.getloadavg()[0], dtype=args.dtype)
                if settings is not None:
                    row.update(settings=settings)
                if method == "defaults" and schedule_options is not None:
                    row.update(schedule_options=schedule_options)
            if "error" in row:
                rows.append(row)
                print(f"{spec} {method}: {row['error']}", file=sys.stderr, flush=True)
                continue
            found[method] = row
            rows.append(row)
            print(f"{spec} {method}: {({k: row[k] for k in row if k != 'warnings'})}", file=sys.stderr, flush=True)
        exact = found.get("exact")
        for method, row in found.items():
            if exact is not None and method != "exact" and "error" not in row and "error" not in exact:
                row.update(rmse_ratio=row["test_rmse"] / exact["test_rmse"],
                           nlpd_difference=(None if None in (row["test_nlpd"], exact["test_nlpd"])
                                            else row["test_nlpd"] - exact["test_nlpd"]),
                           speedup=exact["total_s"] / row["total_s"],
                           **{f"{name}_ratio": row[name] / exact[name] for name in hyperparameter_names(exact)})
                if row.get("training_loss") is not None and exact.get("final_loss") is not None:
                    # How much less likely the exact model finds these hyperparameters than its own optimum.
                    row.update(likelihood_gap_nats=(row["training_loss"] - exact["final_loss"])
                               * row["training_points"])
    return emit_report({"benchmark": "convergence", "machine": platform.platform(), "cpus": os.cpu_count(),
                        "rows": rows}, args.json_out)


if __name__ == "__main__":
    if not dispatch_worker(sys.argv[1:], globals()):
        main()
