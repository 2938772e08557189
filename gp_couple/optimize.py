r"""The one training loop: Adam or L-BFGS on a scalar objective, with a stated stopping rule.

Every fitter of gp_couple minimises through :func:`minimize`: the GP marginal likelihood
(:func:`gp_couple.models.fit_gp`, hence :func:`gp_couple.recipes.fit_grf_gp`), the
variational ELBO, the learnable frequency couplings (:func:`gp_couple.kernels.random_features.fit_coupling`)
and the exact-GP baselines of the experiments.

Optimisers (``optimizer=``):

* ``"adam"``: Adam with learning rate ``lr`` (the paper's optimiser, Appendix F.2
  "Scalable GPs on graphs", paragraph "Training GRF-GPs: technical details"
  [app:grf_gp_details]); suits stochastic objectives (CG/Lanczos losses with fresh probe
  vectors).
* ``"lbfgs"``: SciPy's L-BFGS-B on the flattened parameters, within box bounds (a line
  search cannot step to a vanishing noise or lengthscale). A parameter under a
  softplus-transformed lower bound (gpytorch's :class:`~gpytorch.constraints.Positive`
  and :class:`~gpytorch.constraints.GreaterThan`, passed as ``constraints``) is optimised
  in the logarithm of its distance to that bound,
  :math:`z = \log(\theta - \theta_\mathrm{lower})`, rather than in gpytorch's raw
  coordinate :math:`\operatorname{softplus}^{-1}(\theta - \theta_\mathrm{lower})`, which
  is logarithmic below 1 but linear above: a step of the same size then changes an output
  scale of 20 and a noise of 0.01 by the same factor, and the long, curved ridges of the
  marginal likelihood along the output scale take a few iterations instead of dozens.
  Other parameters keep their raw values. L-BFGS needs a deterministic objective: every
  evaluation runs under the same seed (:func:`gp_couple._random.seeded_torch_rng`), so
  CG/Lanczos objectives use the same probe vectors each time, and Cholesky ones are exact;
  a point is evaluated once as the parameters store it (the last :data:`_STORED_POINTS`
  are kept), since near a float32 optimum a line search shortens its steps below the
  parameters' resolution. A line search may probe hyperparameters where the model breaks
  down (a covariance that is not positive definite in floating point, a non-finite loss):
  such a point counts as worse than the last accepted one, and the search steps back. So
  does, unevaluated, a trial point that changes a parameter in logarithmic coordinates by more than
  :attr:`Convergence.step_factor` (a factor of 10) from the last accepted point: a trust
  region on the quasi-Newton step. Logarithmic coordinates have one trap: a parameter
  that a step has taken to within a small distance of a positive lower bound (a
  Gaussian likelihood's noise on gpytorch's floor of :math:`10^{-4}`) sees a gradient of
  that distance times the loss's slope, so the loss is flat there in :math:`z` and every
  test of the stopping rule holds, however much lower the loss is a little above the floor
  (the "noise-floor basin" of GP training on few or sparse observations). A run that ends
  with a parameter closer to its positive bound than the bound itself therefore probes it
  at distances of 1, 10, 100, ... times the bound (the others held) while the loss falls,
  and, where that lowers the loss by more than ``loss_tolerance``, goes on from the lowest
  point (at most :data:`FLOOR_ESCAPES` times; a loss that rises above the floor costs two
  evaluations).

The stopping rule (:class:`Convergence`) is stated in terms of the loss and the parameters:
training has converged when the loss changed by at most ``loss_tolerance`` (relative to
:math:`\max(1, |\text{loss}|)`) and no parameter moved by more than ``parameter_tolerance``
— between consecutive L-BFGS iterations (where, in addition, no gradient entry may exceed
``gradient_tolerance``, nor, for a loss that is a mean over ``num_data`` terms such as a
GP's negative log-likelihood per observation, may the total's exceed
``total_gradient_tolerance``: a statistical objective fixes its parameters more tightly the
more data it averages), or between the means of two consecutive windows of ``window`` Adam
steps (whose losses are noisy). SciPy's relative-reduction test (``ftol``) is off: it
compares two consecutive losses only, and L-BFGS-B's first step on a boxed problem is the
raw gradient, which in an ill-conditioned valley (a GP's range against its noise, on
thousands of observations) the line search shortens to a negligible loss reduction far from
the optimum. L-BFGS also stops when SciPy's projected-gradient test is met where the
gradient projected on the bounds meets the gradient test, and at a trial point of a line
search that meets the whole rule against the last accepted point (loss and parameter tests,
and the gradient test at the trial point): SciPy accepts a trial point only on a sufficient
decrease of the value, which near a float32 objective's optimum can be smaller than the
value's rounding noise, so that the line search would otherwise spend its evaluations around
a point that already passes. Any other end SciPy reports before the rule holds (an abnormal
line search, or no decrease at all: usually a value whose slope disagrees with the gradient,
as a CG/Lanczos estimate's can, or a float32 loss whose rounding hides the last decrease) is
not convergence. Training then goes on from the gradient alone: quasi-Newton iterations on
the last curvature pairs (differences of accepted points and of their gradients, so the
value never entered them), whose line searches bracket the sign change of the directional
derivative and interpolate it by secants, stopping where it has shrunk to half its size at
the start (a strong Wolfe curvature condition without the sufficient decrease, which needs
the value; Kafka and Wilke, 2019, "Gradient-only line searches"). They end when the gradient
test holds. If they cannot (no step moves downhill, or the budget is spent), a run whose
last iteration met the loss and parameter tests, or whose point meets the gradient test, has
converged at the objective's rounding noise; any other run ends with a warning from
:func:`minimize`.

A run may start from the curvature pairs of an earlier run on a related objective
(:func:`minimize`'s ``curvature``, :attr:`TrainingHistory.curvature`; :func:`gp_couple.models.fit_gp`
passes them from phase to phase, whose objectives differ only by redrawn walks). SciPy then
works in coordinates in which those pairs' inverse Hessian is the identity, so that its first
step is their quasi-Newton step rather than the raw gradient, and a phase that starts near its
optimum ends in a few evaluations. A run passes on only the pairs of steps longer than
``parameter_tolerance``: shorter ones, near a float32 objective's optimum, measure the
gradient's rounding noise rather than the curvature.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gpytorch.constraints import Interval
from linear_operator.utils.errors import NotPSDError
from torch import Tensor

from ._random import SeedLike, draw_seed, seeded_torch_rng
from .progress import progress

__all__ = ["Convergence", "FLOOR_ESCAPES", "OPTIMIZERS", "TrainingHistory", "TrainingWarning", "check_ending",
           "check_schedule", "check_training", "minimize", "parameter_constraints"]

#: The optimisers :func:`minimize` knows.
OPTIMIZERS = ("adam", "lbfgs")
#: Box on every raw parameter entry for L-BFGS-B: gpytorch's raw parameters from
#: softplus(-15) = 3e-7 (noise keeps gpytorch's floor of 1e-4 above it) to 1e4. A parameter
#: optimised in logarithmic coordinates has the same box on its value above the lower bound.
LBFGS_BOUNDS = (-15.0, 1e4)
#: Most times one L-BFGS run restarts from a point that lifts a parameter off its floor.
FLOOR_ESCAPES = 3
#: Most probes above a floor per escape: distances to the bound of 1, 10, 100, ... times the bound.
_FLOOR_PROBES = 5
#: A run is reported when its last loss exceeds its first by this fraction of max(1, |first|)
#: (plus three standard deviations of the step-to-step noise of stochastic losses).
_DIVERGENCE_TOLERANCE = 0.01


class TrainingWarning(RuntimeWarning):
    """Training ended worse than it started, its loss never moved, or it did not converge."""


@dataclass(frozen=True)
class Convergence:
    r"""When training stops before its iteration budget.

    :ivar loss_tolerance: Largest change of the loss, relative to
        :math:`\max(1, |\text{loss}|)`, that counts as converged.
    :ivar parameter_tolerance: Largest change of any parameter entry that counts as converged,
        in the optimiser's coordinates (for L-BFGS, the logarithm of a positive
        hyperparameter: a relative change).
    :ivar window: Adam steps per window (the means of two consecutive windows are compared).
    :ivar gradient_tolerance: L-BFGS only: largest gradient entry, relative to
        :math:`\max(1, |\text{loss}|)`, that counts as converged (a short line-search step
        alone is not convergence).
    :ivar line_search_evaluations: L-BFGS only: most evaluations of one line search
        (SciPy's ``maxls``); a line search that finds no decrease within them after an
        iteration that met the loss and parameter tests, or from a point that meets the
        gradient test, ends training as converged.
    :ivar step_factor: L-BFGS only: largest factor by which one trial point may change a
        parameter optimised in logarithmic coordinates, from the last accepted point (a trust
        region on the quasi-Newton step). A trial point beyond it is refused unevaluated, as
        worse than the last accepted point, and the line search steps back (``math.inf``: no
        limit).
    :ivar total_gradient_tolerance: L-BFGS on a loss that is a mean over ``num_data`` terms
        (:func:`minimize`'s ``num_data``; a GP's negative log-likelihood per observation) only:
        largest gradient entry of the total, ``num_data`` times the loss, that counts as
        converged, besides ``gradient_tolerance``. For a negative log-likelihood it is in nats per
        unit of the optimiser's coordinate (the logarithm of a positive hyperparameter): near the
        optimum, a hyperparameter whose logarithm has Laplace standard deviation :math:`s` has a
        gradient of :math:`\delta/s^2` at a distance :math:`\delta` from it, so the test leaves it
        within :math:`t s^2` of the optimum (:math:`t` this tolerance) whatever the number of
        data. A per-term tolerance alone does not: the data fix the hyperparameters ever more
        tightly as they grow, while the same per-term gradient allows ``num_data`` times more
        nats, and on thousands of observations it stops where the likelihood is flat but
        several standard deviations from its optimum (a noise far below it, on a sparse design).
    """

    loss_tolerance: float = 1e-4
    parameter_tolerance: float = 1e-2
    window: int = 20
    gradient_tolerance: float = 1e-3
    line_search_evaluations: int = 8
    step_factor: float = 10.0
    total_gradient_tolerance: float = 1.0

    def __post_init__(self) -> None:
        for name in ("loss_tolerance", "parameter_tolerance", "gradient_tolerance", "total_gradient_tolerance"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive finite float, got {value!r}")
        for name in ("window", "line_search_evaluations"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(self.step_factor, bool) or not isinstance(self.step_factor, (int, float)) \
                or not self.step_factor > 1:
            raise ValueError(f"step_factor must be a float above 1 (math.inf: no limit), got {self.step_factor!r}")

    def reached(self, loss_change: float, loss: float, parameter_change: float) -> bool:
        """Whether a loss change and a parameter change are within the tolerances."""
        return (abs(loss_change) <= self.loss_tolerance * max(1.0, abs(loss))
                and parameter_change <= self.parameter_tolerance)

    def stationary(self, steepest: float, loss: float, num_data: int | None) -> bool:
        """Whether the largest gradient entry ``steepest`` of a loss is within the gradient tolerances:
        ``gradient_tolerance``, and for a mean over ``num_data`` terms (``None``: not a mean),
        ``total_gradient_tolerance`` on the total."""
        return (steepest <= self.gradient_tolerance * max(1.0, abs(loss))
                and (num_data is None or steepest * num_data <= self.total_gradient_tolerance))


class TrainingHistory(list):
    r"""The loss before each step (a list of floats), and how training ended.

    :ivar converged: Whether the :class:`Convergence` rule (or L-BFGS's own tests) stopped it.
    :ivar reason: Why it stopped: ``"converged"``, ``"iterations"`` (budget spent),
        ``"callback"`` or L-BFGS's message.
    :ivar evaluations: Objective evaluations (L-BFGS line searches evaluate more than once per iteration).
    :ivar phases: Training phases run (:func:`gp_couple.models.fit_gp` trains again after a
        kernel redraws its walks; the losses of all phases follow one another).
    :ivar undone_phases: Phases among them whose parameters ``fit_gp`` restored
        (:meth:`~gp_couple.kernels.graph_node.GraphNodeKernel.round_regressed`): they count
        in ``phases`` and ``evaluations``, but their losses are dropped and how training ended
        is the phase's before them.
    :ivar steepest: L-BFGS only: the largest gradient entry at the last accepted point
        (``None`` for Adam).
    :ivar curvature: L-BFGS only: the last ten curvature pairs :math:`(\mathbf s_i, \mathbf y_i)`
        of steps longer than the parameter tolerance (steps between accepted points and their
        gradient changes, in the optimiser's coordinates, oldest first, after the pairs the run
        was given), from which a later run on a related objective may start its quasi-Newton
        model (:func:`minimize`'s ``curvature``); empty for Adam.
    """

    converged: bool = False
    reason: str = "iterations"
    evaluations: int = 0
    phases: int = 1
    undone_phases: int = 0
    steepest: float | None = None
    curvature: tuple[tuple[np.ndarray, np.ndarray], ...] = ()

    def ending(self) -> tuple[bool, str, float | None, tuple[tuple[np.ndarray, np.ndarray], ...]]:
        """How training ended so far, as :meth:`undo_phase` restores it."""
        return self.converged, self.reason, self.steepest, self.curvature

    def extend_phase(self, phase: TrainingHistory) -> None:
        """Append the losses of the next phase; how training ended is the last phase's.

        :param phase: The next phase's history.
        """
        self.extend(phase)
        self.converged, self.reason, self.steepest, self.curvature = phase.ending()
        self.evaluations += phase.evaluations

    def undo_phase(self, losses: int,
                   ending: tuple[bool, str, float | None, tuple[tuple[np.ndarray, np.ndarray], ...]]) -> None:
        """Forget the losses and the ending of the last phase, whose parameters were restored.

        :param losses: How many losses the history held before that phase.
        :param ending: :meth:`ending` before that phase.
        """
        del self[losses:]
        self.converged, self.reason, self.steepest, self.curvature = ending
        self.undone_phases += 1


def check_schedule(iterations: Any, lr: Any) -> None:
    """Validate a schedule: ``iterations`` a non-negative int, ``lr`` a positive finite float.

    :raises ValueError: Naming the argument.
    """
    if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) or iterations < 0:
        raise ValueError(f"iterations must be a non-negative int, got {iterations!r}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive float, got {lr!r}")


def _loss_summary(history: list[float]) -> str:
    best = int(np.argmin(history))
    return (f"loss {history[0]:.6g} at step 0, best {history[best]:.6g} at step {best}, "
            f"last {history[-1]:.6g} at step {len(history) - 1}")


def check_training(history: list[float], lr: float, stacklevel: int = 3) -> None:
    r"""Warn (:class:`TrainingWarning`) when a loss history shows diverged or stalled training.

    Diverged: the last loss exceeds the first by more than 1 % of
    :math:`\max(1, |\text{first}|)` plus three standard deviations of the loss noise
    (estimated from the differences of the last ten losses, which are random under
    CG/Lanczos). Stalled: the loss did not change at all over two or more steps (e.g.
    after a step so large that every gradient vanished). An L-BFGS run that converged
    with a non-zero gradient (:attr:`TrainingHistory.steepest`) and an unchanged loss
    started at a stationary point (e.g. a training phase on redrawn walks that agree with
    the last ones): that is not a stall.

    :param history: Losses, one per step (a :class:`TrainingHistory` says how it ended).
    :param lr: The learning rate used (named in the message).
    :param stacklevel: Of the warning, counted from this function (3: the caller's caller).
    """
    if len(history) < 2:
        return
    values = np.asarray(history, dtype=np.float64)
    first, last = values[0], values[-1]
    tail = np.diff(values[-10:])
    noise = float(np.std(tail) / math.sqrt(2)) if tail.size > 1 else 0.0
    if last > first + _DIVERGENCE_TOLERANCE * max(1.0, abs(first)) + 3 * noise:
        warnings.warn(f"training diverged: {_loss_summary(history)}; the model keeps its last "
                      f"parameters. Try a smaller lr than {lr:g}", TrainingWarning, stacklevel=stacklevel)
    elif np.ptp(values) == 0 and not (getattr(history, "converged", False)
                                      and (getattr(history, "steepest", None) or 0.0) > 0.0):
        warnings.warn(f"training stalled: the loss stayed at {first:.6g} for {len(history)} steps "
                      f"(zero gradients?); check lr={lr:g} and which parameters require grad",
                      TrainingWarning, stacklevel=stacklevel)


def _flat(parameters: list[torch.nn.Parameter]) -> Tensor:
    return torch.cat([parameter.detach().reshape(-1).double().cpu() for parameter in parameters])


def _adam(objective: Callable[[], Tensor], parameters: list[torch.nn.Parameter], iterations: int, lr: float,
          convergence: Convergence | None, callback: Callable[[int, float], bool | None] | None,
          history: TrainingHistory, description: str) -> None:
    optimizer = torch.optim.Adam(parameters, lr=float(lr))
    snapshots: list[Tensor] = []
    for step in progress(range(int(iterations)), description=description, unit="step"):
        optimizer.zero_grad()
        loss = objective()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"the training loss became {value} at step {step}")
        loss.backward()
        optimizer.step()
        history.append(value)
        history.evaluations += 1
        if callback is not None and callback(step, value) is True:
            history.reason = "callback"
            return
        if convergence is None:
            continue
        window = convergence.window
        if (step + 1) % window == 0:
            snapshots.append(_flat(parameters))
            if len(snapshots) >= 2 and len(history) >= 2 * window:
                current = float(np.mean(history[-window:]))
                change = current - float(np.mean(history[-2 * window:-window]))
                moved = float((snapshots[-1] - snapshots[-2]).abs().max()) if snapshots[-1].numel() else 0.0
                if convergence.reached(change, current, moved):
                    history.converged, history.reason = True, "converged"
                    return


def parameter_constraints(module: torch.nn.Module) -> dict[str, Any]:
    """The gpytorch constraint of each parameter of ``module`` that has one, by parameter name.

    :param module: A gpytorch module (a plain :class:`torch.nn.Module` has none).
    :return: ``{name: constraint}``, names as in ``module.named_parameters()``.
    """
    named = getattr(module, "named_parameters_and_constraints", None)
    if named is None:
        return {}
    return {name: constraint for name, _, constraint in named() if constraint is not None}


def _log_coordinate(constraint: Any) -> bool:
    r"""Whether L-BFGS optimises a parameter under ``constraint`` in logarithmic coordinates.

    Only a softplus (:math:`\beta = 1`) onto a finite lower bound with no upper one
    qualifies: :class:`~gpytorch.constraints.Positive` and :class:`~gpytorch.constraints.GreaterThan`.
    """
    transform = getattr(constraint, "_transform", None)
    is_softplus = (isinstance(transform, torch.nn.Softplus) and float(transform.beta) == 1.0) \
        or transform is torch.nn.functional.softplus
    if not (is_softplus and getattr(constraint, "enforced", False)):
        return False
    lower, upper = torch.as_tensor(constraint.lower_bound), torch.as_tensor(constraint.upper_bound)
    return bool(torch.isfinite(lower).all()) and not bool(torch.isfinite(upper).any())


#: Curvature pairs (of the last accepted iterates) of the quasi-Newton iterations that follow the gradient alone
#: (as many as SciPy's L-BFGS-B keeps).
_CURVATURE_PAIRS = 10
#: Their line searches end where the directional derivative has shrunk by this factor (a strong
#: Wolfe curvature condition, without the sufficient decrease that needs the value).
_CURVATURE = 0.5
#: Most points of one L-BFGS run whose value and gradient are kept, by their parameters as stored
#: (a trial point that rounds to one of them is not evaluated again).
_STORED_POINTS = 64
#: Most parameter entries whose curvature pairs from an earlier run (``minimize``'s ``curvature``)
#: start a run's quasi-Newton model (a dense basis of this size per run).
_BASIS_SIZE = 100
#: SciPy's box on the coordinates of that basis: wide enough never to bind (the optimiser's own
#: box is kept by refusing points outside it), finite so that SciPy takes the model's first step whole.
_BASIS_BOX = 1e12


def _inverse_hessian_product(gradient: np.ndarray, pairs: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    r"""L-BFGS's two-loop recursion: the inverse-Hessian approximation of the curvature ``pairs``
    :math:`(\mathbf s_i, \mathbf y_i)` times ``gradient``; without pairs, a step of 0.1 along
    the gradient's largest entry (a tenfold change of a logarithmic coordinate is the trust region)."""
    if not pairs:
        return gradient * (0.1 / max(float(np.abs(gradient).max(initial=0.0)), 1e-300))
    result = gradient.copy()
    weights = []
    for s, y in reversed(pairs):
        weight = float(s @ result) / float(y @ s)
        result -= weight * y
        weights.append(weight)
    s, y = pairs[-1]
    result *= float(s @ y) / float(y @ y)
    for (s, y), weight in zip(pairs, reversed(weights)):
        result += s * (weight - float(y @ result) / float(y @ s))
    return result


def _quasi_newton_basis(pairs: list[tuple[np.ndarray, np.ndarray]], size: int) -> np.ndarray | None:
    r"""A matrix :math:`\mathbf M` with :math:`\mathbf M\mathbf M^\top` the inverse Hessian of
    L-BFGS's model on ``pairs`` (its two-loop recursion applied to the unit vectors), or
    ``None`` without pairs, above :data:`_BASIS_SIZE` entries, or where that model is not
    positive definite in floating point."""
    if not pairs or size > _BASIS_SIZE:
        return None
    inverse = np.stack([_inverse_hessian_product(unit, pairs) for unit in np.eye(size)], axis=1)
    try:
        basis = np.linalg.cholesky((inverse + inverse.T) / 2)
    except np.linalg.LinAlgError:
        return None
    return basis if np.isfinite(basis).all() else None


class _AtRoundingNoise(Exception):
    """A line search after a settled L-BFGS iteration spent its evaluations without a decrease."""


class _ConvergedAtTrial(Exception):
    """A line search's trial point met the stopping rule against the last accepted point."""


class _Coordinates:
    r"""The optimiser's coordinates :math:`z` of the flattened raw parameters :math:`r`.

    Entries marked logarithmic have :math:`z = \log\operatorname{softplus}(r)` (the logarithm
    of the value's distance to its lower bound); the others have :math:`z = r`.
    """

    def __init__(self, parameters: list[torch.nn.Parameter], logarithmic: list[bool]) -> None:
        self.mask = np.concatenate([np.full(parameter.numel(), flag, dtype=bool)
                                    for parameter, flag in zip(parameters, logarithmic)]) \
            if parameters else np.zeros(0, dtype=bool)
        raw_lower, raw_upper = LBFGS_BOUNDS
        bound = [(raw_lower, raw_upper), (float(np.log(np.logaddexp(0.0, raw_lower))), float(np.log(raw_upper)))]
        self.bounds = [bound[int(flag)] for flag in self.mask]

    def from_raw(self, raw: np.ndarray) -> np.ndarray:
        z = raw.copy()
        z[self.mask] = np.log(np.logaddexp(0.0, raw[self.mask]))
        return z

    def to_raw(self, z: np.ndarray) -> np.ndarray:
        # The inverse softplus of x = exp(z), as x + log(1 - exp(-x)): no overflow for large x.
        raw = z.copy()
        x = np.exp(z[self.mask])
        raw[self.mask] = x + np.log(-np.expm1(-x))
        return raw

    def raw_derivative(self, z: np.ndarray) -> np.ndarray:
        r""":math:`\mathrm d r / \mathrm d z` entry by entry (the coordinates act entry-wise)."""
        derivative = np.ones_like(z)
        x = np.exp(z[self.mask])
        derivative[self.mask] = x / -np.expm1(-x)
        return derivative


def _lbfgs(objective: Callable[[], Tensor], parameters: list[torch.nn.Parameter], floors: list[Tensor | None],
           iterations: int, convergence: Convergence, callback: Callable[[int, float], bool | None] | None,
           history: TrainingHistory, seed: int, num_data: int | None,
           curvature: list[tuple[np.ndarray, np.ndarray]]) -> None:
    from scipy import optimize

    sizes = [parameter.numel() for parameter in parameters]
    splits = np.cumsum(sizes)[:-1]
    coordinates = _Coordinates(parameters, [floor is not None for floor in floors])
    # Each logarithmic entry's lower bound (0 elsewhere): where it is positive, the floor can hold L-BFGS.
    floor = np.concatenate([np.zeros(size) if bound is None
                            else bound.detach().double().cpu().expand(parameter.shape).reshape(-1).numpy()
                            for bound, parameter, size in zip(floors, parameters, sizes)]) \
        if parameters else np.zeros(0)

    def assign(z: np.ndarray) -> None:
        with torch.no_grad():
            for parameter, chunk in zip(parameters, np.split(coordinates.to_raw(z), splits)):
                parameter.copy_(torch.as_tensor(chunk, dtype=parameter.dtype).view_as(parameter))

    evaluated: dict[str, Any] = {}
    # "pairs": the last curvature pairs of this run (its gradient-only iterations use them); "passed": those
    # of steps beyond the parameter tolerance, with the given ones before them (what a later run starts from).
    state: dict[str, Any] = {"settled": False, "searching": 0, "refused": False, "pairs": [],
                             "passed": list(curvature)}
    lower = np.array([low for low, _ in coordinates.bounds], dtype=np.float64)
    upper = np.array([high for _, high in coordinates.bounds], dtype=np.float64)

    step_limit = math.log(convergence.step_factor)

    def worse() -> tuple[float, np.ndarray]:
        # A trial point refused: reported as worse than the last accepted point, with that
        # point's gradient, so that the line search steps back. (An infinite value would let
        # SciPy's relative-reduction test stop there as converged.)
        return state["value"] + max(1.0, abs(state["value"])), state["gradient"]

    def refused(error: Exception) -> tuple[float, np.ndarray]:
        # A trial point where the model breaks down (a covariance that is not positive definite
        # in floating point, a non-finite loss) lies outside its domain. At the starting point
        # there is nothing to step back to.
        if "x" not in state:
            raise error
        state["refused"] = True
        return worse()

    # Values and raw gradients by the parameters as stored: the objective is deterministic in them, and
    # near a float32 optimum a line search shortens its steps below their resolution.
    stored: dict[bytes, tuple[float, np.ndarray]] = {}

    def evaluate(z: np.ndarray) -> tuple[float, np.ndarray]:
        state["refused"] = False
        assign(z)
        key = b"".join(parameter.detach().reshape(-1).cpu().view(torch.uint8).numpy().tobytes()
                       for parameter in parameters)
        if key in stored:
            value, raw_gradient = stored[key]
        else:
            for parameter in parameters:
                parameter.grad = None
            with seeded_torch_rng(seed):    # the same probes at every evaluation: a deterministic objective
                history.evaluations += 1
                try:
                    loss = objective()
                    value = float(loss.detach())
                    if math.isfinite(value):
                        loss.backward()
                except (NotPSDError, torch.linalg.LinAlgError) as error:
                    return refused(error)
                if not math.isfinite(value):
                    return refused(FloatingPointError(f"the loss is {value} at the starting parameters"))
            raw_gradient = torch.cat([(parameter.grad if parameter.grad is not None
                                       else torch.zeros_like(parameter)).reshape(-1)
                                      for parameter in parameters]).detach().double().cpu().numpy()
            if len(stored) >= _STORED_POINTS:
                del stored[next(iter(stored))]
            stored[key] = (value, raw_gradient)
        evaluated["z"] = z.copy()
        evaluated["value"] = value
        evaluated["gradient"] = raw_gradient * coordinates.raw_derivative(z)
        return value, evaluated["gradient"]

    def value_and_gradient(z: np.ndarray) -> tuple[float, np.ndarray]:
        if np.any(z < lower) or np.any(z > upper):
            # Outside the box, which SciPy's own coordinates keep but a quasi-Newton basis does not.
            return worse()
        if "z" in evaluated and np.array_equal(z, evaluated["z"]):
            # SciPy evaluates its starting point again.
            assign(z)
            return evaluated["value"], evaluated["gradient"]
        state["searching"] += 1
        if state["settled"] and state["searching"] > convergence.line_search_evaluations:
            raise _AtRoundingNoise
        if "x" in state and float(np.abs(z - state["x"])[coordinates.mask].max(initial=0.0)) > step_limit:
            # Beyond the trust region, unevaluated: far from the points it was built on, the
            # quasi-Newton model extrapolates (L-BFGS-B's first step along the raw gradient, a
            # step that sends the output scale and the noise to their bounds at once), and there
            # the covariance can be so ill-conditioned that one evaluation costs more than training.
            return worse()
        value, gradient = evaluate(z)
        if not state["refused"] and "x" in state:
            accept_if_converged(z, value, gradient)
        return value, gradient

    def accept_if_converged(point: np.ndarray, value: float, gradient: np.ndarray) -> None:
        """End the run at a trial point that meets the stopping rule against the last accepted point.

        SciPy accepts a trial point only on a sufficient decrease of the value; near a float32
        objective's optimum the value's rounding noise exceeds the decrease left, and the line
        search would spend its evaluations around a point that already passes the rule's tests
        (the loss within ``loss_tolerance`` of the last accepted one, no parameter moved by more
        than ``parameter_tolerance``, the gradient test at the point itself)."""
        moved = float(np.abs(point - state["x"]).max(initial=0.0))
        if not (convergence.reached(value - state["value"], value, moved)
                and stationary_at(point, gradient, value)):
            return
        history.append(value)
        keep_pair(point - state["x"], gradient - state["gradient"])
        state.update(x=point.copy(), value=value, gradient=gradient, settled=True, searching=0)
        if callback is not None and callback(len(history) - 2, value) is True:
            history.reason = "callback"
        else:
            history.converged = True
            history.reason = "converged (a line search's trial point met the stopping rule)"
        raise _ConvergedAtTrial

    def after_iteration(point: np.ndarray, value: float) -> None:
        step = len(history) - 1
        history.append(value)
        moved = float(np.abs(point - state["x"]).max()) if start.size else 0.0
        settled = convergence.reached(value - state["value"], value, moved)
        keep_pair(point - state["x"], evaluated["gradient"] - state["gradient"])
        state.update(x=point.copy(), value=value, gradient=evaluated["gradient"], settled=settled, searching=0)
        if callback is not None and callback(step, value) is True:
            history.reason = "callback"
            raise StopIteration
        steepest = float(np.abs(evaluated["gradient"]).max()) if start.size else 0.0
        if settled and convergence.stationary(steepest, value, num_data):
            history.converged, history.reason = True, "converged"
            raise StopIteration

    def keep_pair(step: np.ndarray, change: np.ndarray) -> None:
        """Keep the curvature pair of an accepted step (its gradient change), if its curvature is positive."""
        if float(step @ change) > 1e-12 * float(np.linalg.norm(step) * np.linalg.norm(change)):
            state["pairs"] = (state["pairs"] + [(step.copy(), change.copy())])[-_CURVATURE_PAIRS:]
            if float(np.abs(step).max()) >= convergence.parameter_tolerance:
                # Shorter steps, within what the stopping rule calls converged, measure the gradient's
                # rounding noise more than the curvature (float32 objectives near their optimum).
                state["passed"] = (state["passed"] + [(step.copy(), change.copy())])[-_CURVATURE_PAIRS:]

    def run(budget: int, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """One SciPy run from ``state``'s point, its first quasi-Newton model from ``pairs``; sets how it ended."""
        origin = state["x"].copy()
        basis = _quasi_newton_basis(pairs, origin.size)
        state["pairs"] = []
        if basis is None:
            def to_z(w: np.ndarray) -> np.ndarray:
                return w
            fun, first, bounds = value_and_gradient, origin, coordinates.bounds
        else:
            # SciPy starts from the identity as its Hessian model: in w, with z = origin + basis w and
            # basis basis^T the pairs' inverse Hessian, that is the pairs' model, and the first step
            # their quasi-Newton step. The box is kept by value_and_gradient, SciPy's is wider.
            def to_z(w: np.ndarray) -> np.ndarray:
                return origin + basis @ w

            def fun(w: np.ndarray) -> tuple[float, np.ndarray]:
                value, gradient = value_and_gradient(to_z(w))
                return value, basis.T @ gradient
            first, bounds = np.zeros_like(origin), [(-_BASIS_BOX, _BASIS_BOX)] * origin.size

        def report(intermediate_result: optimize.OptimizeResult) -> None:
            # SciPy passes the OptimizeResult to a callback whose argument has this name.
            after_iteration(to_z(intermediate_result.x), float(intermediate_result.fun))

        try:
            result = optimize.minimize(fun, first, jac=True, method="L-BFGS-B", bounds=bounds, callback=report,
                                       options={"maxiter": budget, "ftol": 0.0,
                                                "gtol": 1e-8, "maxls": convergence.line_search_evaluations})
            status, message, final = result.status, str(result.message), to_z(result.x)
        except _AtRoundingNoise:
            status, message, final = 2, "no decrease beyond the objective's rounding noise", state["x"]
        except _ConvergedAtTrial:
            status, message, final = 0, history.reason, state["x"]
        # SciPy returns the last point it accepted, not the last one evaluated.
        assign(final)
        history.steepest = float(np.abs(state["gradient"]).max(initial=0.0))
        if history.reason != "iterations":
            return
        stationary = at_stationary_point()
        if status == 0 and stationary:
            history.converged, history.reason = True, message
        elif status == 2 and stationary:
            # A line search found no decrease from a point that meets the gradient test (e.g. a
            # phase that starts where the last one converged): the loss is at its rounding noise there.
            history.converged = True
            history.reason = "converged (no decrease beyond the objective's rounding noise)"
        elif status != 1 and len(history) - 1 < iterations:
            # SciPy's own ends where the gradient test is not met (an abnormal line search, or no
            # decrease after an iteration that met the loss and parameter tests) are no convergence:
            # the gradient alone takes over.
            history.reason = message
            finish_on_gradient()
            if not history.converged and state["settled"]:
                # The gradient cannot reach the test either, after an iteration that met the loss and
                # parameter tests: the objective is at its rounding noise.
                history.converged = True
                history.reason = "converged (no decrease beyond the objective's rounding noise)"

    def at_stationary_point() -> bool:
        """The gradient test at the last accepted point (:func:`stationary_at`)."""
        return stationary_at(state["x"], state["gradient"], state["value"])

    def stationary_at(at: np.ndarray, gradient: np.ndarray, value: float) -> bool:
        """The gradient test at ``at``, projected on the bounds (an entry at a bound whose gradient
        points out of the box is stationary there)."""
        gradient = gradient.copy()
        gradient[((at <= lower) & (gradient > 0)) | ((at >= upper) & (gradient < 0))] = 0.0
        return convergence.stationary(float(np.abs(gradient).max(initial=0.0)), value, num_data)

    def descent(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, float]:
        """The quasi-Newton direction at the last accepted point, held at the bounds it would leave
        the box through, and the gradient's slope along it."""
        at, gradient = state["x"], state["gradient"]
        direction = -_inverse_hessian_product(gradient, pairs)
        direction[((at <= lower) & (direction < 0)) | ((at >= upper) & (direction > 0))] = 0.0
        return direction, float(gradient @ direction)

    def finish_on_gradient() -> None:
        """Quasi-Newton iterations on the kept curvature pairs from the last accepted point, whose line
        searches follow the gradient alone, until the gradient test holds or the budget is spent (module
        docstring)."""
        while len(history) - 1 < iterations:
            at, gradient = state["x"], state["gradient"]
            direction, slope = descent(state["pairs"])
            if not slope < 0:
                # The curvature pairs describe another region: restart from the steepest descent.
                state["pairs"] = []
                direction, slope = descent(state["pairs"])
                if not slope < 0:
                    break
            accepted = search_on_gradient(at, direction, slope)
            if accepted is None:
                break
            point, value, new_gradient = accepted
            keep_pair(point - at, new_gradient - gradient)
            state.update(x=point, value=value, gradient=new_gradient)
            history.append(value)
            if callback is not None and callback(len(history) - 2, value) is True:
                history.reason = "callback"
                break
            if at_stationary_point():
                history.converged = True
                history.reason = f"converged (gradient-only line searches after SciPy's end: {history.reason})"
                break
        assign(state["x"])
        history.steepest = float(np.abs(state["gradient"]).max(initial=0.0))

    def search_on_gradient(at: np.ndarray, direction: np.ndarray, slope: float
                           ) -> tuple[np.ndarray, float, np.ndarray] | None:
        r"""A step along ``direction`` where the directional derivative :math:`\phi'(t)` has shrunk to
        ``_CURVATURE`` times its size at the start (brackets its sign change and interpolates
        by secants; a refused point halves the step); ``None`` if no evaluation moved downhill."""
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = np.where(direction > 0, (upper - at) / direction,
                              np.where(direction < 0, (lower - at) / direction, np.inf))
        longest = float(ratios.min(initial=np.inf))
        reach = float(np.abs(direction[coordinates.mask]).max(initial=0.0))
        if reach > 0:
            longest = min(longest, step_limit / reach)
        low, low_slope, high, high_slope = 0.0, slope, math.inf, math.nan
        best: tuple[np.ndarray, float, np.ndarray] | None = None
        trial = min(1.0, longest)
        for _ in range(convergence.line_search_evaluations):
            point = np.clip(at + trial * direction, lower, upper)
            value, gradient = evaluate(point)
            if state["refused"]:
                high, high_slope = trial, math.nan
                trial = (low + trial) / 2
                continue
            trial_slope = float(gradient @ direction)
            if abs(trial_slope) <= _CURVATURE * abs(slope):
                return point, value, gradient
            if trial_slope < 0:
                low, low_slope, best = trial, trial_slope, (point, value, gradient)
                if math.isinf(high):
                    if trial >= longest:
                        return best
                    # Extrapolate the secant of phi' from 0 through here, by a factor of 2 to 4.
                    root = trial * slope / (slope - trial_slope) if trial_slope > slope else math.inf
                    trial = min(max(root, 2 * trial), 4 * trial, longest)
                    continue
            else:
                high, high_slope = trial, trial_slope
            width = high - low
            root = low - low_slope * width / (high_slope - low_slope) if math.isfinite(high_slope) else low + width / 2
            trial = min(max(root, low + 0.1 * width), high - 0.1 * width)
        return best

    def lift_off_floor() -> bool:
        r"""Move entries that ended on their floor to where the loss is lower, if there is such a point.

        In :math:`z = \log(\theta - \theta_\mathrm{lower})` the gradient of an entry is its
        distance to the bound times :math:`\partial\,\text{loss}/\partial\theta`: once a step
        has taken a noise to its floor, the loss is flat in :math:`z` however much it would fall
        a little above the floor, and every test of the stopping rule holds. So each such entry
        (distance below its bound) is probed at distances of 1, 10, 100, ... times its bound,
        the others held, while the loss falls; the lowest point is kept if it lowers the loss
        by more than the loss tolerance.
        """
        at = state["x"]
        best = {"value": state["value"] - convergence.loss_tolerance * max(1.0, abs(state["value"]))}
        for entry in np.flatnonzero(coordinates.mask & (floor > 0) & (at < np.log(np.maximum(floor, 1e-300)))):
            z = best.get("z", at).copy()
            previous = math.inf
            for decade in range(_FLOOR_PROBES):
                z[entry] = math.log(floor[entry]) + decade * math.log(10.0)
                value, gradient = evaluate(z)
                if not value < previous:
                    break
                previous = value
                if value < best["value"]:
                    best.update(value=value, gradient=gradient, z=z.copy())
        if "z" not in best:
            assign(at)
            return False
        evaluated.update(z=best["z"], value=best["value"], gradient=best["gradient"])
        assign(best["z"])
        return True

    start = coordinates.from_raw(_flat(parameters).numpy())
    evaluate(start)
    for escape in range(FLOOR_ESCAPES + 1):
        history.append(evaluated["value"])
        state.update(x=evaluated["z"], value=evaluated["value"], gradient=evaluated["gradient"], searching=0,
                     settled=False)
        run(iterations - (len(history) - 1), curvature if escape == 0 else [])
        if history.reason == "callback" or len(history) - 1 >= iterations or escape == FLOOR_ESCAPES \
                or not lift_off_floor():
            break
        history.converged, history.reason = False, "iterations"
    history.curvature = tuple(state["passed"])


def minimize(objective: Callable[[], Tensor], parameters: dict[str, torch.nn.Parameter], *, iterations: int,
             lr: float = 0.01, optimizer: str = "adam", convergence: Convergence | None = None,
             seed: SeedLike = None, callback: Callable[[int, float], bool | None] | None = None,
             description: str = "training", warn: bool = True,
             constraints: Mapping[str, Any] | None = None, num_data: int | None = None,
             curvature: Sequence[tuple[np.ndarray, np.ndarray]] = ()) -> TrainingHistory:
    r"""Minimise ``objective()`` over ``parameters``: the training loop of every fitter.

    :param objective: Returns the loss (a scalar tensor) of the current parameters.
    :param parameters: The parameters to train, by name (names appear in errors).
    :param iterations: Most Adam steps or L-BFGS iterations.
    :param lr: Adam learning rate (L-BFGS takes the steps its line search finds).
    :param optimizer: ``"adam"`` or ``"lbfgs"`` (see the module docstring).
    :param convergence: The stopping rule; ``None`` runs all Adam ``iterations``
        (L-BFGS always uses one: the default :class:`Convergence`).
    :param seed: Seeds torch's global generator inside the loop (restored afterwards);
        L-BFGS evaluates every point under the same seed, takes the objective to be a function
        of the parameters, and evaluates it once per point as the parameters store it (a line
        search's steps below a float32 parameter's resolution evaluate nothing new).
    :param callback: Called as ``callback(step, loss)``; returning ``True`` stops early.
    :param description: Progress-bar label.
    :param warn: Warn (:class:`TrainingWarning`) about diverged, stalled or unconverged
        training, including L-BFGS runs that SciPy ended before the stopping rule held.
    :param constraints: gpytorch constraints of some ``parameters``, by the same names
        (:func:`parameter_constraints`): L-BFGS optimises those under a softplus lower
        bound in logarithmic coordinates (see the module docstring). Adam ignores them.
    :param num_data: How many terms ``objective()`` averages (a GP's mean negative
        log-likelihood: the number of observations). L-BFGS then also holds the gradient of
        the total to :attr:`Convergence.total_gradient_tolerance`; ``None`` (the default) for a
        loss that is not a mean.
    :param curvature: L-BFGS only: curvature pairs of an earlier run on a related objective over
        the same parameters (its :attr:`TrainingHistory.curvature`, e.g. the phase before on
        redrawn walks). The first quasi-Newton model is theirs instead of the identity: SciPy
        runs in the coordinates :math:`\mathbf w` of :math:`\mathbf z = \mathbf z_0 + \mathbf M
        \mathbf w`, where :math:`\mathbf M\mathbf M^\top` is their inverse Hessian, so that its
        first step is their quasi-Newton step rather than the raw gradient (up to
        :data:`_BASIS_SIZE` entries; ignored above, or where their model is not positive definite).
    :return: The loss before each step, with how training ended (:class:`TrainingHistory`).
    :raises ValueError: For an unknown optimiser or a bad schedule.
    :raises FloatingPointError: If the loss (Adam) or a parameter becomes NaN or infinite.
    """
    check_schedule(iterations, lr)
    if num_data is not None and (isinstance(num_data, bool) or not isinstance(num_data, (int, np.integer))
                                 or num_data < 1):
        raise ValueError(f"num_data must be a positive int or None, got {num_data!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {optimizer!r}")
    if convergence is not None and not isinstance(convergence, Convergence):
        raise TypeError(f"convergence must be a gp_couple.optimize.Convergence or None, got "
                        f"{type(convergence).__name__}")
    constraints = {} if constraints is None else constraints
    if not isinstance(constraints, Mapping):
        raise TypeError(f"constraints must be a mapping from parameter names to constraints, got "
                        f"{type(constraints).__name__}")
    unknown = sorted(set(constraints) - set(parameters))
    if unknown:
        raise ValueError(f"constraints name parameters that are not in parameters: {unknown}")
    for name, constraint in constraints.items():
        if constraint is not None and not isinstance(constraint, Interval):
            raise TypeError(f"constraints[{name!r}] must be a gpytorch constraint (gpytorch.constraints.Interval) "
                            f"or None, got {type(constraint).__name__}")
    trainable = [(name, parameter) for name, parameter in parameters.items() if parameter.requires_grad]
    pairs = _check_curvature(curvature, sum(parameter.numel() for _, parameter in trainable))
    history = TrainingHistory()
    if optimizer == "lbfgs":
        if iterations > 0:
            _lbfgs(objective, [parameter for _, parameter in trainable],
                   [torch.as_tensor(constraints[name].lower_bound) if _log_coordinate(constraints.get(name)) else None
                    for name, _ in trainable], int(iterations), convergence or Convergence(), callback, history,
                   draw_seed(seed), None if num_data is None else int(num_data), pairs)
    else:
        with seeded_torch_rng(seed):
            _adam(objective, [parameter for _, parameter in trainable], int(iterations), lr, convergence, callback,
                  history, description)
    for name, parameter in parameters.items():
        if not bool(torch.isfinite(parameter).all()):
            raise FloatingPointError(f"parameter {name} became NaN or infinite during training "
                                     f"({_loss_summary(history)}); try a smaller lr than {lr:g}")
    if warn:
        check_ending(history, optimizer, iterations, float(lr), convergence is not None or optimizer == "lbfgs")
    return history


def _check_curvature(curvature: Any, size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``minimize``'s ``curvature`` as float64 pairs of ``size`` entries each, with positive curvature."""
    if isinstance(curvature, (str, bytes)) or not isinstance(curvature, Sequence):
        raise TypeError(f"curvature must be a sequence of (step, gradient change) pairs, got "
                        f"{type(curvature).__name__}")
    pairs = []
    for index, pair in enumerate(curvature):
        if not (isinstance(pair, Sequence) and len(pair) == 2):
            raise TypeError(f"curvature[{index}] must be a (step, gradient change) pair")
        try:
            step, change = (np.asarray(entry, dtype=np.float64).reshape(-1) for entry in pair)
        except (TypeError, ValueError) as error:
            raise TypeError(f"curvature[{index}] must hold two arrays of numbers ({error})") from None
        if step.size != size or change.size != size:
            raise ValueError(f"curvature[{index}] has {step.size} and {change.size} entries, but the parameters "
                             f"have {size}")
        if not (np.isfinite(step).all() and np.isfinite(change).all() and float(step @ change) > 0):
            raise ValueError(f"curvature[{index}] must be finite with a positive step . change (a convex pair)")
        pairs.append((step, change))
    return pairs


def check_ending(history: TrainingHistory, optimizer: str, iterations: int, lr: float, rule: bool,
                 stacklevel: int = 3) -> None:
    """Warn (:class:`TrainingWarning`) about a finished training run that diverged, stalled or did not converge.

    :func:`minimize` calls it (``warn=True``); a fitter that trains in several phases
    (:func:`gp_couple.models.fit_gp`) calls it once on the whole history, whose ending is its last phase's.

    :param history: The losses and how training ended.
    :param optimizer: ``"adam"`` or ``"lbfgs"``.
    :param iterations: The iteration budget (of the last phase).
    :param lr: The learning rate used (named in the messages).
    :param rule: Whether a stopping rule applied (L-BFGS always; Adam with a ``convergence``).
    :param stacklevel: Of the warnings, counted from this function (3: the caller's caller).
    """
    check_training(history, lr, stacklevel=stacklevel + 1)
    if rule and not history.converged and history.reason == "iterations" and len(history) > 1:
        warnings.warn(f"training did not converge in {iterations} {optimizer} iterations "
                      f"({_loss_summary(history)}); raise iterations", TrainingWarning, stacklevel=stacklevel)
    elif optimizer == "lbfgs" and not history.converged and history.reason not in ("iterations", "callback"):
        # SciPy gave up (most often a line search that found no decrease along a direction
        # its gradient called descending), or met its own tests, before the stopping rule held.
        warnings.warn(f"L-BFGS stopped before the stopping rule held, and line searches on the gradient alone did "
                      f"not reach it either: {history.reason} "
                      f"({_loss_summary(history)}; largest gradient entry {history.steepest:.3g}). The "
                      "objective's value and gradient may disagree: CG/Lanczos estimates above gpytorch's "
                      "max_cholesky_size (raise it, or num_trace_samples), a float32 model whose rounding hides "
                      "the last decrease near the optimum (train in float64: model.double(), likelihood.double()), "
                      "or an objective that is not differentiable there", TrainingWarning, stacklevel=stacklevel)
