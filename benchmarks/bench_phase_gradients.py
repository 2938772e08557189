"""Benchmark: at the end of each ``fit_gp`` phase, the objective's gradient against central differences of its value.

A diagnosis of how L-BFGS phases end: where SciPy's line search finds no decrease while the
gradient test does not yet hold, the value may be too noisy (a float32 likelihood near its
optimum) for the sufficient-decrease test, whatever the gradient says. This runs one
``bench_convergence.py`` method on one problem in this process, and after every optimiser
call of ``gp_couple.models`` (from ``--from-phase`` on) evaluates the objective at its end
point, and at each trainable raw parameter moved by ``±h`` for every ``--steps`` entry, under
the phase's seed (the same probes as in training); it then evaluates the end point once more,
so that the kernel's last report is the phase's own. One thread, idle machine:

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
        python benchmarks/bench_phase_gradients.py --problem prior:4:grid:100x100 --seed 8 --from-phase 2 \\
        --json-out benchmarks/results/phase_gradients_grid100_seed8.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402


def instrument(records: list[dict[str, Any]], from_phase: int, steps: list[float]) -> None:
    """Record, after every optimiser call of ``gp_couple.models``, its gradient and central differences."""
    import torch

    import gp_couple.models as models
    from gp_couple._random import draw_seed, seeded_torch_rng

    minimize = models.minimize

    def checked(objective: Any, parameters: Any, **options: Any) -> Any:
        history = minimize(objective, parameters, **options)
        record: dict[str, Any] = {"phase": len(records), "evaluations": history.evaluations,
                                  "reason": history.reason, "num_data": options.get("num_data")}
        records.append(record)
        if record["phase"] < from_phase:
            return history
        seed = draw_seed(options.get("seed"))
        names = [name for name, parameter in parameters.items() if parameter.requires_grad]

        def value_and_gradient() -> tuple[float, list[float]]:
            for parameter in parameters.values():
                parameter.grad = None
            with seeded_torch_rng(seed):
                loss = objective()
                loss.backward()
            return float(loss.detach()), [float(parameters[name].grad.reshape(-1)[0]) for name in names]

        record["value"], gradient = value_and_gradient()
        record["parameters"] = {}
        for name, entry in zip(names, gradient):
            parameter = parameters[name]
            kept = parameter.detach().clone()
            differences = {}
            for step in steps:
                values = []
                for sign in (1, -1):
                    with torch.no_grad():
                        parameter.copy_(kept + sign * step)
                    values.append(value_and_gradient()[0])
                differences[str(step)] = (values[0] - values[1]) / (2 * step)
            with torch.no_grad():
                parameter.copy_(kept)
            record["parameters"][name] = {"raw": float(kept.reshape(-1)[0]), "gradient": entry,
                                          "central_differences": differences}
        value_and_gradient()
        return history

    models.minimize = checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problem", required=True, help="a bench_convergence.py problem")
    parser.add_argument("--method", default="defaults", choices=("defaults", "recipe", "auto"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--from-phase", type=int, default=0, help="first optimiser call checked (0: all)")
    parser.add_argument("--steps", type=float, nargs="+", default=[1e-2, 1e-4],
                        help="raw-parameter steps h of the central differences")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    if args.from_phase < 0 or any(not step > 0 for step in args.steps):
        parser.error("--from-phase must be non-negative and every --steps entry positive")
    from bench_convergence import run_method

    records: list[dict[str, Any]] = []
    instrument(records, args.from_phase, args.steps)
    row = run_method(args.problem, args.method, args.iterations, args.seed, 20000, None)
    emit_report({"benchmark": "phase_gradients", "machine": platform.platform(), "cpus": os.cpu_count(),
                 "load": os.getloadavg()[0], "problem": args.problem, "method": args.method, "seed": args.seed,
                 "steps": args.steps, "phases": records,
                 "row": {key: value for key, value in row.items() if not isinstance(value, (list, dict))}},
                args.json_out)


if __name__ == "__main__":
    main()
