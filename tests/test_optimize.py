"""The shared training loop: optimisers, the stopping rule and deterministic objectives."""

from __future__ import annotations

import math
import warnings

import gpytorch
import numpy as np
import pytest
import torch
from linear_operator.utils.errors import NotPSDError

from gp_couple import Convergence, GraphGP, GRFKernel, fit_gp
from gp_couple.graphs import grid_graph
from gp_couple.optimize import (
    LBFGS_BOUNDS,
    TrainingHistory,
    TrainingWarning,
    _Coordinates,
    minimize,
    parameter_constraints,
)

OPTIMUM = torch.tensor([3.0, -2.0], dtype=torch.float64)


def _quadratic() -> tuple[dict[str, torch.nn.Parameter], callable]:
    x = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    scales = torch.tensor([1.0, 4.0], dtype=torch.float64)
    return {"x": x}, lambda: (scales * (x - OPTIMUM) ** 2).sum() + 1.5


@pytest.mark.parametrize("optimizer, lr", [("lbfgs", 0.01), ("adam", 0.05)])
def test_convergence_rule_stops_at_a_known_optimum(optimizer, lr):
    parameters, objective = _quadratic()
    rule = Convergence(loss_tolerance=1e-9, parameter_tolerance=1e-4, window=25)
    history = minimize(objective, parameters, iterations=5000, lr=lr, optimizer=optimizer, convergence=rule)
    assert isinstance(history, TrainingHistory) and history.converged
    assert len(history) < 5000
    torch.testing.assert_close(parameters["x"].detach(), OPTIMUM, atol=1e-3, rtol=0)
    assert history[-1] == pytest.approx(1.5, abs=1e-5)


def test_lbfgs_needs_far_fewer_iterations_than_adam():
    parameters, objective = _quadratic()
    lbfgs = minimize(objective, parameters, iterations=200, optimizer="lbfgs")
    assert lbfgs.converged and len(lbfgs) <= 20


def test_budget_without_convergence_warns():
    parameters, objective = _quadratic()
    with pytest.warns(TrainingWarning, match="did not converge"):
        history = minimize(objective, parameters, iterations=3, lr=0.01, convergence=Convergence())
    assert not history.converged and history.reason == "iterations" and len(history) == 3


def test_without_a_rule_adam_runs_its_whole_budget():
    parameters, objective = _quadratic()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        history = minimize(objective, parameters, iterations=40, lr=0.05)
    assert len(history) == 40 and not history.converged


@pytest.mark.parametrize("kwargs, error", [
    ({"optimizer": "sgd"}, ValueError), ({"convergence": 0.1}, TypeError), ({"iterations": -1}, ValueError),
])
def test_minimize_validates_arguments(kwargs, error):
    parameters, objective = _quadratic()
    with pytest.raises(error):
        minimize(objective, parameters, **{"iterations": 2, **kwargs})


@pytest.mark.parametrize("constraints, error, match", [
    ([("x", gpytorch.constraints.Positive())], TypeError, "mapping"),
    ({"y": gpytorch.constraints.Positive()}, ValueError, r"\['y'\]"),
    ({"x": "positive"}, TypeError, r"constraints\['x'\] must be a gpytorch constraint"),
])
def test_minimize_validates_constraints(constraints, error, match):
    parameters, objective = _quadratic()
    with pytest.raises(error, match=match):
        minimize(objective, parameters, iterations=2, constraints=constraints)


def test_logarithmic_coordinates_invert_and_differentiate():
    parameters = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    coordinates = _Coordinates(parameters, [True, False])
    raw = np.array([-14.0, 0.3, 900.0, -2.0, 5.0])
    z = coordinates.from_raw(raw)
    np.testing.assert_allclose(z[:3], np.log(np.logaddexp(0.0, raw[:3])), rtol=1e-12)
    np.testing.assert_array_equal(z[3:], raw[3:])
    np.testing.assert_allclose(coordinates.to_raw(z), raw, rtol=1e-10, atol=1e-10)
    step = 1e-6
    numeric = (coordinates.to_raw(z + step) - coordinates.to_raw(z - step)) / (2 * step)
    np.testing.assert_allclose(coordinates.raw_derivative(z), numeric, rtol=1e-6)
    # The box of a logarithmic coordinate is that of the raw value, mapped.
    assert coordinates.bounds[0] == pytest.approx((np.log(np.logaddexp(0.0, LBFGS_BOUNDS[0])),
                                                   np.log(LBFGS_BOUNDS[1])))
    assert coordinates.bounds[4] == LBFGS_BOUNDS


def test_positive_hyperparameters_are_optimised_in_log_coordinates():
    """A loss quadratic in log(value) is solved in a few L-BFGS iterations for a large and a small optimum.

    In gpytorch's raw coordinate (linear above 1, logarithmic below) the same loss is far from
    quadratic; with the constraints the optimiser sees the quadratic.
    """
    module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    module.double()
    targets = torch.tensor([40.0, 0.02], dtype=torch.float64)

    def objective():
        values = torch.stack([module.outputscale, module.base_kernel.lengthscale.reshape(())])
        return ((values.log() - targets.log()) ** 2).sum()

    rule = Convergence(loss_tolerance=1e-12, parameter_tolerance=1e-6, gradient_tolerance=1e-8)
    history = minimize(objective, dict(module.named_parameters()), iterations=100, optimizer="lbfgs",
                       convergence=rule, constraints=parameter_constraints(module))
    assert history.converged and len(history) - 1 <= 4
    torch.testing.assert_close(module.outputscale.detach(), targets[0], rtol=1e-5, atol=0)
    torch.testing.assert_close(module.base_kernel.lengthscale.detach().reshape(()), targets[1], rtol=1e-5, atol=0)
    module.initialize(outputscale=0.6931, **{"base_kernel.lengthscale": 0.6931})
    raw = minimize(objective, dict(module.named_parameters()), iterations=100, optimizer="lbfgs", convergence=rule)
    assert len(raw) > len(history)


def test_lbfgs_never_evaluates_a_trial_point_beyond_its_trust_region():
    """No trial point changes a positive hyperparameter by more than ``step_factor`` from the last accepted point.

    The loss is quadratic in log(value) with its optimum at 1000 from 0.6931, with a steep
    gradient: L-BFGS-B's first step along the gradient alone would multiply the value by
    about e^29. Trial points that far are refused unevaluated; the optimum is still reached.
    """
    module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    module.double()
    target = math.log(1e3)
    accepted = [float(module.outputscale.detach())]
    ratios = []

    def objective():
        value = module.outputscale
        ratios.append(abs(math.log(float(value.detach()) / accepted[-1])))
        return 2.0 * (value.log() - target) ** 2

    def record(step, loss):
        accepted.append(float(module.outputscale.detach()))

    rule = Convergence(loss_tolerance=1e-12, parameter_tolerance=1e-6, gradient_tolerance=1e-8)
    parameters = {"raw_outputscale": module.raw_outputscale}
    constraints = {"raw_outputscale": module.raw_outputscale_constraint}
    history = minimize(objective, parameters, iterations=100, optimizer="lbfgs", convergence=rule,
                       constraints=constraints, callback=record)
    assert history.converged
    assert float(module.outputscale.detach()) == pytest.approx(1e3, rel=1e-5)
    assert max(ratios) <= math.log(rule.step_factor) + 1e-9
    assert len(history) - 1 >= math.ceil((target - math.log(0.6931)) / math.log(rule.step_factor))
    module.initialize(outputscale=0.6931)
    ratios.clear()
    accepted[:] = [0.6931]
    unlimited = Convergence(loss_tolerance=1e-12, parameter_tolerance=1e-6, gradient_tolerance=1e-8,
                            step_factor=math.inf)
    minimize(objective, parameters, iterations=100, optimizer="lbfgs", convergence=unlimited,
             constraints=constraints, callback=record)
    assert max(ratios) > math.log(rule.step_factor)


def test_parameter_constraints_names_every_constrained_parameter():
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(torch.arange(4), torch.zeros(4), likelihood,
                    gpytorch.kernels.ScaleKernel(GRFKernel(grid_graph(3, 3), seed=0)))
    constraints = parameter_constraints(model)
    assert set(constraints) == {name for name, _ in model.named_parameters()}
    assert parameter_constraints(torch.nn.Linear(2, 2)) == {}


def test_a_line_search_at_the_rounding_noise_ends_training_as_converged():
    """Near its optimum a float32-like objective has no decrease left to find; L-BFGS stops there.

    The loss is a quadratic plus a deterministic ripple of 1e-6 (the rounding noise of a
    float32 objective), and its gradient is off by 1e-3 towards the optimum's other side (that
    of CG or of a float32 factorisation): the gradient test (1e-7) can never be met, and
    within 1e-3 of the optimum the ripple hides every decrease.
    """
    x = torch.nn.Parameter(torch.tensor([0.0], dtype=torch.float64))

    def objective():
        ripple = 1e-6 * torch.sin(1e7 * x.detach()).sum()
        gradient_error = 1e-3 * (torch.sign(x.detach() - 3.0) * (x - x.detach())).sum()
        return ((x - 3.0) ** 2).sum() + ripple + gradient_error

    rule = Convergence(loss_tolerance=1e-4, parameter_tolerance=1e-2, gradient_tolerance=1e-7)
    history = minimize(objective, {"x": x}, iterations=200, optimizer="lbfgs", convergence=rule)
    assert history.converged and "rounding noise" in history.reason
    assert history.steepest > rule.gradient_tolerance
    assert float(x.detach()) == pytest.approx(3.0, abs=1e-3)


def test_a_settled_run_whose_value_hides_the_last_decrease_is_finished_on_an_accurate_gradient(monkeypatch):
    """Settled loss and parameters, and a line search that finds no decrease, are not convergence
    while the gradient test fails and the gradient alone can still meet it.

    The value is rounded to multiples of 1e-4 (a float32 likelihood's rounding on thousands of
    observations), which hides every decrease of this quartic near its optimum; the gradient is
    exact. Every iteration counts as settled (the loss and parameter tests patched to hold), so a
    line search that finds no decrease used to end the run at about 1e-3 from the gradient test's
    1e-6; the gradient-only line searches reach it.
    """
    monkeypatch.setattr(Convergence, "reached", lambda self, *changes: True)
    x = torch.nn.Parameter(torch.tensor([4.0, -3.0], dtype=torch.float64))
    optimum = torch.tensor([1.0, 2.0], dtype=torch.float64)

    def objective():
        loss = (torch.tensor([1.0, 10.0], dtype=torch.float64) * (x - optimum) ** 4).sum()
        return loss + (torch.round(loss.detach() / 1e-4) * 1e-4 - loss.detach())

    rule = Convergence(gradient_tolerance=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        history = minimize(objective, {"x": x}, iterations=200, optimizer="lbfgs", convergence=rule)
    assert history.converged and "gradient-only" in history.reason
    assert history.steepest <= rule.gradient_tolerance
    # |4 w d^3| <= 1e-6 entry by entry: within 0.0063 of the optimum.
    torch.testing.assert_close(x.detach(), optimum, rtol=0.0, atol=0.0063)


def test_a_mean_over_many_data_is_held_to_the_gradient_of_its_total():
    """The per-term gradient test alone stops a mean over many terms standard deviations from its optimum.

    The loss is a mean negative log-likelihood over :math:`N = 10^6` observations whose
    total has curvature 10 about its optimum at 3 (Laplace standard deviation 0.32). From
    0, L-BFGS-B's first step (a unit step along the gradient) lands at 1, where the loss
    changed by 2.5e-5 and the gradient per term is 2e-5: every per-term test holds, six
    standard deviations from the optimum. With ``num_data`` the total's gradient (20 nats)
    is held to ``total_gradient_tolerance`` (1), which leaves at most 0.1.
    """
    num_data, curvature = 10**6, 10.0
    rule = Convergence(parameter_tolerance=10.0)
    ends = {}
    for given in (None, num_data):
        x = torch.nn.Parameter(torch.tensor([0.0], dtype=torch.float64))
        history = minimize(lambda x=x: 0.5 * curvature / num_data * ((x - 3.0) ** 2).sum(), {"x": x}, iterations=50,
                           optimizer="lbfgs", convergence=rule, num_data=given)
        assert history.converged
        ends[given] = float(x.detach())
    assert abs(ends[None] - 3.0) * math.sqrt(curvature) > 5
    assert abs(ends[num_data] - 3.0) <= rule.total_gradient_tolerance / curvature
    assert rule.stationary(2e-5, 1.0, None) and not rule.stationary(2e-5, 1.0, num_data)


@pytest.mark.parametrize("num_data", [0, -3, 2.5, True, "10"])
def test_minimize_rejects_a_bad_num_data(num_data):
    x = torch.nn.Parameter(torch.tensor([0.0]))
    with pytest.raises(ValueError, match="num_data"):
        minimize(lambda: (x ** 2).sum(), {"x": x}, iterations=1, optimizer="lbfgs", num_data=num_data)


@pytest.mark.parametrize("kwargs", [{"loss_tolerance": 0.0}, {"parameter_tolerance": float("inf")},
                                    {"window": 0}, {"window": 2.5}, {"line_search_evaluations": 0},
                                    {"line_search_evaluations": True}, {"step_factor": 1.0},
                                    {"step_factor": float("nan")}, {"step_factor": True},
                                    {"total_gradient_tolerance": 0.0}])
def test_convergence_validates_its_tolerances(kwargs):
    with pytest.raises(ValueError):
        Convergence(**kwargs)


def test_lbfgs_gp_training_on_cg_is_deterministic_and_converges():
    graph = grid_graph(6, 6)
    train = torch.arange(0, 36, 2)
    targets = torch.sin(train.float() / 3.0)

    def run() -> tuple[TrainingHistory, torch.Tensor]:
        kernel = gpytorch.kernels.ScaleKernel(GRFKernel(graph, num_walkers=8, seed=0))
        model = GraphGP(train, targets, gpytorch.likelihoods.GaussianLikelihood(), kernel)
        with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.cg_tolerance(1e-4):
            history = fit_gp(model, model.likelihood, iterations=100, optimizer="lbfgs", seed=1)
        return history, torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    first, parameters = run()
    second, again = run()
    assert first.converged and list(first) == list(second) and torch.equal(parameters, again)
    assert first[-1] < first[0]


@pytest.mark.parametrize("breakdown", ["not positive definite", "nan"])
def test_lbfgs_steps_back_from_points_where_the_model_breaks_down(breakdown):
    """A line search that probes outside the model's domain steps back and still reaches the optimum.

    The loss is flat far from its optimum (3), so the quasi-Newton steps overshoot into
    x > 6, where the objective raises :class:`NotPSDError` (a Cholesky factor failing at
    extreme hyperparameters) or returns NaN. Reporting such a point as infinite made SciPy
    stop at x = -14 as "converged".
    """
    x = torch.nn.Parameter(torch.tensor([-20.0], dtype=torch.float64))
    probed_outside = []

    def objective():
        if float(x.detach()) > 6.0:
            probed_outside.append(float(x.detach()))
            if breakdown == "nan":
                return (x * float("nan")).sum()
            raise NotPSDError("Matrix not positive definite after repeatedly adding jitter up to 1.0e-04.")
        return torch.sqrt(1 + (x - 3.0) ** 2).sum()

    history = minimize(objective, {"x": x}, iterations=100, optimizer="lbfgs")
    assert probed_outside
    assert history.converged
    assert float(x.detach()) == pytest.approx(3.0, abs=1e-3)


def test_lbfgs_refuses_a_start_where_the_model_breaks_down():
    x = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))

    def not_positive_definite():
        raise NotPSDError("Matrix not positive definite")

    with pytest.raises(NotPSDError):
        minimize(not_positive_definite, {"x": x}, iterations=5, optimizer="lbfgs")
    with pytest.raises(FloatingPointError, match="starting parameters"):
        minimize(lambda: (x * float("nan")).sum(), {"x": x}, iterations=5, optimizer="lbfgs")


def test_a_value_whose_slope_disagrees_with_the_gradient_is_finished_on_the_gradient_alone():
    """A value with a slope error (as a CG/Lanczos estimate's can have) defeats SciPy's line searches.

    Here the value is the loss plus ``2 x`` (its minimum at 2), the gradient the loss's (its
    root at 3). SciPy ends before the gradient test holds; the gradient-only line searches
    then take the run to the gradient's root, and it converges without a warning.
    """
    x = torch.nn.Parameter(torch.tensor([0.0], dtype=torch.float64))

    def objective():
        return ((x - 3.0) ** 2).sum() + 2 * x.detach().sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        history = minimize(objective, {"x": x}, iterations=50, optimizer="lbfgs")
    assert history.converged and "gradient-only" in history.reason
    # The gradient test: |2 (x - 3)| <= gradient_tolerance * max(1, |loss|).
    assert abs(2 * (float(x.detach()) - 3.0)) <= Convergence().gradient_tolerance * max(1.0, history[-1])


def test_lbfgs_that_neither_scipy_nor_the_gradient_alone_can_finish_warns():
    """The gradient points into a region where the model breaks down, and the value never falls.

    SciPy's line searches find no decrease; the gradient-only ones only halve their steps
    towards the breakdown. The run is reported as not converged, and a warning names the reason.
    """
    x = torch.nn.Parameter(torch.tensor([0.0], dtype=torch.float64))

    def objective():
        if float(x.detach()) > 0.5:
            raise NotPSDError("simulated breakdown")
        loss = ((x - 3.0) ** 2).sum()
        return loss - loss.detach() + 9.0 + 1e-3 * x.detach().sum()  # value rising to the right, gradient of the loss

    with pytest.warns(TrainingWarning, match="stopped before the stopping rule held"):
        history = minimize(objective, {"x": x}, iterations=20, optimizer="lbfgs")
    assert not history.converged and history.reason not in ("iterations", "converged")
    assert 0.0 < float(x.detach()) <= 0.5


def test_a_start_that_meets_the_gradient_test_and_cannot_decrease_is_converged():
    """A phase that starts where the last one converged: no decrease to find, the gradient within tolerance."""
    x = torch.nn.Parameter(torch.tensor([2.0], dtype=torch.float64))

    def flat():
        return 1.0 + 1e-5 * (x - x.detach()).sum()  # the value cannot fall; the gradient is 1e-5

    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        history = minimize(flat, {"x": x}, iterations=50, optimizer="lbfgs")
    # SciPy's first trial point meets the rule against the start: the run ends there.
    assert history.converged and "trial point" in history.reason
    assert history.evaluations == 2 and len(history) == 2


def test_scipys_relative_reduction_test_is_no_convergence_where_the_gradient_is_large(monkeypatch):
    """SciPy may end on its relative-reduction test while the gradient test fails: training goes on.

    Its ``ftol`` test compares consecutive losses only, so tiny steps (a badly scaled inverse
    Hessian, a flat direction) end a run far from a stationary point. The gradient-only line
    searches then go on to the optimum; a stationary point at a bound (gradient pointing out of
    the box) counts as converged where SciPy stopped.
    """
    from scipy import optimize

    def stops_at_once(fun, x0, **kwargs):
        fun(x0)
        return optimize.OptimizeResult(x=x0, status=0, message="CONVERGENCE: RELATIVE REDUCTION OF F <= FACTR*EPSMCH")

    monkeypatch.setattr(optimize, "minimize", stops_at_once)
    x = torch.nn.Parameter(torch.tensor([0.0], dtype=torch.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        history = minimize(lambda: ((x - 3.0) ** 2).sum(), {"x": x}, iterations=20, optimizer="lbfgs")
    assert history.converged and "RELATIVE REDUCTION" in history.reason and "gradient-only" in history.reason
    assert float(x.detach()) == pytest.approx(3.0, abs=1e-3)
    upper = torch.nn.Parameter(torch.tensor([LBFGS_BOUNDS[1]], dtype=torch.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        at_bound = minimize(lambda: (-upper).sum(), {"upper": upper}, iterations=20, optimizer="lbfgs")
    assert at_bound.converged and "gradient-only" not in at_bound.reason


def test_lbfgs_does_not_stop_on_its_short_first_step_in_an_ill_conditioned_valley():
    """L-BFGS-B's first step on a boxed problem is the raw gradient; in a valley whose curvatures
    differ by 10^5 (the range against the noise of a GP on 10^4 nodes) the line search shortens
    it to a loss reduction of 10^-7. SciPy's relative-reduction test must not end the run there:
    the stopping rule (loss, parameters and gradient) decides, and the soft coordinate reaches
    its optimum, 1.4 away, instead of staying where it started."""
    x = torch.nn.Parameter(torch.tensor([2.5e-5, 0.0], dtype=torch.float64))

    def valley():
        return 1.0 + 0.5 * 100.0 * x[0] ** 2 + 0.5 * 1.6e-3 * (x[1] - 1.4) ** 2

    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        history = minimize(valley, {"x": x}, iterations=100, optimizer="lbfgs")
    assert history.converged
    assert abs(float(x.detach()[1]) - 1.4) < 1e-3 and history[-1] - 1.0 < 1e-8


def _noise_on_its_floor() -> gpytorch.likelihoods.GaussianLikelihood:
    """A likelihood whose noise (floor 1e-4) sits 1e-7 above its floor: z = log(noise - floor) = -16."""
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = 1e-4 + 1e-7
    return likelihood


def test_lbfgs_lifts_a_noise_off_its_floor_when_the_loss_falls_above_it():
    """In z = log(noise - floor) a noise that a step took to its floor sees a gradient of its
    distance to the floor (1e-7) times the loss's slope: every test of the stopping rule holds
    there, however much lower the loss is at a noise of 0.01. The run probes above the floor
    and goes on from the lower point to the optimum (the noise-floor basin of GP training)."""
    likelihood = _noise_on_its_floor()

    def objective():
        return 1.0 + 100.0 * (likelihood.noise.reshape(()) - 0.01) ** 2

    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        history = minimize(objective, dict(likelihood.named_parameters()), iterations=100, optimizer="lbfgs",
                           constraints=parameter_constraints(likelihood))
    assert history.converged
    # Within the default rule's tolerances of the optimum: 1 % in the noise, 1e-4 in the loss.
    assert float(likelihood.noise.detach()) == pytest.approx(0.01, rel=1e-2)
    assert history[0] - history[-1] > 9e-3 and history[-1] - 1.0 < Convergence().loss_tolerance


def test_lbfgs_leaves_a_noise_on_its_floor_where_the_loss_rises_above_it():
    """Where the loss rises off the floor (a noise-free signal), the probes cost two evaluations
    and the noise stays where it was."""
    likelihood = _noise_on_its_floor()

    def objective():
        return 1.0 + likelihood.noise.reshape(())

    history = minimize(objective, dict(likelihood.named_parameters()), iterations=100, optimizer="lbfgs",
                       constraints=parameter_constraints(likelihood))
    assert history.converged and len(history) == 1
    assert float(likelihood.noise.detach()) == pytest.approx(1e-4 + 1e-7, rel=1e-6)
    assert history.evaluations <= 1 + 2 + 1   # the start, two probes, SciPy's own first step at most


def _correlated_valley(shift: torch.Tensor) -> tuple[dict[str, torch.nn.Parameter], callable]:
    """A 3-D quadratic whose curvatures differ by 10^4, along correlated directions, with its optimum at ``shift``."""
    x = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    rotation, _ = torch.linalg.qr(torch.tensor([[1.0, 0.3, -0.2], [0.5, 1.0, 0.4], [-0.3, 0.2, 1.0]],
                                               dtype=torch.float64))
    hessian = rotation @ torch.diag(torch.tensor([100.0, 1.0, 0.01], dtype=torch.float64)) @ rotation.T
    return {"x": x}, lambda: 0.5 * (x - shift) @ hessian @ (x - shift) + 2.0


def test_a_run_that_starts_from_an_earlier_runs_curvature_needs_fewer_evaluations():
    """The second of two related runs (the optimum moved, as between training phases on redrawn
    walks) starts its quasi-Newton model from the first run's curvature pairs: its first step is
    their quasi-Newton step, so it reaches the same optimum in fewer evaluations than from the
    identity."""
    rule = Convergence(loss_tolerance=1e-12, parameter_tolerance=1e-6, gradient_tolerance=1e-7)
    first_parameters, first = _correlated_valley(torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64))
    earlier = minimize(first, first_parameters, iterations=500, optimizer="lbfgs", convergence=rule)
    assert earlier.converged and len(earlier.curvature) > 0
    moved = torch.tensor([1.05, -0.9, 2.2], dtype=torch.float64)
    runs = {}
    for name, curvature in (("identity", ()), ("warm", earlier.curvature)):
        parameters, objective = _correlated_valley(moved)
        with torch.no_grad():
            parameters["x"].copy_(first_parameters["x"])
        runs[name] = minimize(objective, parameters, iterations=500, optimizer="lbfgs", convergence=rule,
                              curvature=curvature)
        assert runs[name].converged
        torch.testing.assert_close(parameters["x"].detach(), moved, atol=1e-4, rtol=0)
    assert runs["warm"].evaluations < runs["identity"].evaluations


def test_a_warm_started_run_keeps_the_box():
    """Curvature pairs that point beyond the box do not take a parameter out of it: the box holds
    in the basis's coordinates too, where SciPy's own bounds are wider."""
    x = torch.nn.Parameter(torch.tensor([0.0], dtype=torch.float64))
    steep = [(np.array([1e6]), np.array([1e-3]))]     # an inverse Hessian of 1e9: a step far beyond the box
    history = minimize(lambda: (x - 5.0) ** 2, {"x": x}, iterations=100, optimizer="lbfgs", curvature=steep)
    low, high = LBFGS_BOUNDS
    assert low <= float(x.detach()) <= high
    assert history.converged and float(x.detach()) == pytest.approx(5.0, abs=1e-4)


@pytest.mark.parametrize("curvature, error, match", [
    (np.zeros((1, 2, 2)), TypeError, "sequence"),
    ([(np.ones(3), np.ones(3))], ValueError, "3 and 3 entries, but the parameters have 2"),
    ([(np.ones(2), -np.ones(2))], ValueError, "positive"),
    ([(np.ones(2), np.array([np.nan, 1.0]))], ValueError, "finite"),
    ([np.ones(2)], TypeError, r"curvature\[0\]"),
    ([("ab", "cd")], TypeError, r"curvature\[0\] must hold two arrays of numbers"),
])
def test_minimize_validates_curvature(curvature, error, match):
    parameters, objective = _quadratic()
    with pytest.raises(error, match=match):
        minimize(objective, parameters, iterations=2, optimizer="lbfgs", curvature=curvature)


def test_a_trial_point_that_meets_the_rule_ends_a_run_whose_value_is_rounding_noise():
    """Near the optimum of an objective whose value carries rounding noise above the decrease left (a float32
    likelihood), SciPy's sufficient-decrease test fails on noise; a trial point that meets the whole stopping rule
    against the last accepted point ends the run there instead of the line search spending its evaluations
    (12 evaluations before, on this problem)."""
    scales = torch.tensor([3.0, 0.5], dtype=torch.float64)
    optimum = torch.tensor([1.0, -2.0], dtype=torch.float64)
    x = torch.nn.Parameter(optimum + torch.tensor([3e-4, -3e-4], dtype=torch.float64))

    def noisy():
        loss = torch.log(torch.cosh(scales * (x - optimum))).sum()
        # Value noise of 1e-6, deterministic in x and invisible to the gradient.
        return loss + 1e-6 * math.sin(1e7 * float(x.detach().sum()))

    convergence = Convergence(gradient_tolerance=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        history = minimize(noisy, {"x": x}, iterations=50, optimizer="lbfgs", convergence=convergence)
    assert history.converged and "trial point" in history.reason
    gradient = scales * torch.tanh(scales * (x.detach() - optimum))
    assert float(gradient.abs().max()) <= convergence.gradient_tolerance
    assert history.steepest == pytest.approx(float(gradient.abs().max()))
    assert history.evaluations <= 4


def test_lbfgs_evaluates_each_point_of_float32_parameters_once():
    """Near a float32 optimum SciPy's line searches shorten their steps below the parameters' resolution: points
    that round to one already evaluated take its value and gradient (7 of 18 evaluations on this problem before),
    and the run ends where it did."""
    scales = torch.tensor([3.0, 0.5])
    optimum = torch.tensor([1.0, -2.0])
    x = torch.nn.Parameter(optimum + torch.tensor([3e-2, -3e-2]))
    points = []

    def noisy():
        points.append(x.detach().clone())
        loss = torch.log(torch.cosh(scales * (x - optimum))).sum()
        return loss + 1e-5 * math.sin(1e7 * float(x.detach().sum()))

    # Gradient tolerances out of float32's reach: the run ends on SciPy's line searches at the value's noise.
    convergence = Convergence(gradient_tolerance=1e-7, total_gradient_tolerance=1e-7)
    history = minimize(noisy, {"x": x}, iterations=50, optimizer="lbfgs", convergence=convergence, num_data=1)
    assert history.evaluations == len(points) > 2
    distinct = {tuple(point.tolist()) for point in points}
    assert len(distinct) == len(points)
    assert float((x.detach() - optimum).abs().max()) < 1e-3
