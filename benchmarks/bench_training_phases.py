"""Benchmark: where one ``bench_convergence.py`` training run spends its evaluations and CPU time, phase by phase.

A GRF kernel's walk schedule trains in phases (:func:`gp_couple.models.fit_gp`): on the
first walks, on walks redrawn for the learnt range, then rounds on the prediction walks
(for training sets a dense factor holds, on the bias-corrected likelihood of two draws).
This runs one method of ``bench_convergence.py`` on one problem in this process and records,
for every call of the optimiser (:func:`gp_couple.optimize.minimize`, as ``gp_couple.models``
calls it), its iterations, evaluations, process CPU seconds, how it ended, its steepest
gradient entry and its end point, and for every walk redraw
(:meth:`~gp_couple.kernels.GRFKernel.refine_walks`,
:meth:`~gp_couple.kernels.GRFKernel.prepare_prediction`) its CPU seconds and the walkers
drawn; with ``--evaluations``, also each evaluation of each phase (its loss, raw parameters and
gradient: where a line search spends its evaluations). It wraps those functions from outside,
so it runs on older checkouts too (``PYTHONPATH=CHECKOUT``); run it on an otherwise idle
machine with one thread per library (two runs side by side inflated the same run's CPU
seconds 1.6×):

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
        python benchmarks/bench_training_phases.py --problem prior:3:icosphere:5 --seed 9 \\
        --json-out benchmarks/results/training_phases_icosphere5_seed9.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402


def _first_entries(parameters: dict[str, Any]) -> dict[str, float]:
    """The first entry of each parameter, by name."""
    return {name: float(value.detach().flatten()[0]) for name, value in parameters.items()}


def traced(objective: Any, parameters: dict[str, Any], trace: list[dict[str, Any]]) -> tuple[Any, list[Any]]:
    """``objective``, recording each evaluation's loss and raw parameters into ``trace``, and the hooks
    (to remove afterwards) that add each gradient to its evaluation as the optimiser's backward pass
    accumulates it (the first entry of each parameter's)."""
    def record(name: str) -> Any:
        def hook(parameter: Any) -> None:
            if trace:
                trace[-1].setdefault("gradient", {})[name] = float(parameter.grad.detach().flatten()[0])
        return hook

    hooks = [value.register_post_accumulate_grad_hook(record(name)) for name, value in parameters.items()]

    def evaluate() -> Any:
        loss = objective()
        trace.append({"loss": float(loss.detach()), "raw_parameters": _first_entries(parameters)})
        return loss

    return evaluate, hooks


def instrument(events: list[dict[str, Any]], evaluations: bool = False) -> None:
    """Record every optimiser call and walk redraw of ``gp_couple.models`` into ``events``; with
    ``evaluations``, every evaluation of each call's objective too (:func:`traced`)."""
    import gp_couple.models as models
    from gp_couple.kernels.grf_kernel import GRFKernel

    minimize = models.minimize
    walks: dict[str, Any] = {}

    def timed_minimize(objective: Any, parameters: Any, **options: Any) -> Any:
        trace: list[dict[str, Any]] = []
        hooks: list[Any] = []
        if evaluations:
            objective, hooks = traced(objective, parameters, trace)
        start = time.process_time()
        history = minimize(objective, parameters, **options)
        cpu_s = time.process_time() - start
        for hook in hooks:
            hook.remove()
        events.append({"event": "phase", "iterations": len(history), "evaluations": history.evaluations,
                       "cpu_s": cpu_s, "reason": history.reason,
                       "steepest": history.steepest, "num_data": options.get("num_data"),
                       "final_loss": history[-1] if len(history) else None,
                       "raw_parameters": _first_entries(parameters), **walks,
                       **({"trace": trace} if evaluations else {})})
        return history

    models.minimize = timed_minimize

    def timed(method: Any, name: str) -> Any:
        def call(self: GRFKernel, *args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            redrawn = method(self, *args, **kwargs)
            walks.update(walkers=int(self.num_walkers), p_halt=float(self.p_halt))
            events.append({"event": name, "redrawn": bool(redrawn), "cpu_s": time.process_time() - start, **walks})
            return redrawn
        return call

    for name in ("refine_walks", "prepare_prediction"):
        setattr(GRFKernel, name, timed(getattr(GRFKernel, name), name))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", required=True, help="a bench_convergence.py problem")
    parser.add_argument("--method", default="defaults", choices=("defaults", "recipe", "auto"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--evaluations", action="store_true",
                        help="record every evaluation of each phase: its loss, raw parameters and gradient "
                             "(the first entry of each parameter)")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    import bench_convergence

    events: list[dict[str, Any]] = []
    instrument(events, evaluations=args.evaluations)
    start = time.process_time()
    row = bench_convergence.run_method(args.problem, args.method, args.iterations, args.seed, 6000, None,
                                       dtype=args.dtype)
    phases = [event for event in events if event["event"] == "phase"]
    return emit_report({"benchmark": "training_phases", "machine": platform.platform(), "cpus": os.cpu_count(),
                        "load": os.getloadavg()[0], "problem": args.problem, "method": args.method,
                        "seed": args.seed, "cpu_s": time.process_time() - start,
                        "phase_evaluations": [phase["evaluations"] for phase in phases],
                        "phase_cpu_s": [phase["cpu_s"] for phase in phases], "events": events, "row": row},
                       args.json_out)


if __name__ == "__main__":
    main()
