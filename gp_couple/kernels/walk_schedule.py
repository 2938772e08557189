r"""How training adapts a GRF kernel's walks to the hyperparameters it learns: :class:`WalkSchedule`.

What separates a GRF-GP from the exact GP is the noise of the kernel estimate
:math:`\widehat{\mathbf K} = \Phi\Phi^\top` (paper, Appendix C.1 "Constructing graph random
features" [app:grf_approx]). Training on a noisy estimate biases the marginal likelihood
towards short ranges and large noise: :math:`\log\det` is concave and the quadratic form
convex in :math:`\widehat{\mathbf K}`, and the estimate's noise grows with the range (the
halting inflation of :mod:`gp_couple.halting`). So the walks must follow the
hyperparameters as training moves them. A :class:`~gp_couple.kernels.grf_kernel.GRFKernel`
carries a schedule (its constructor's default), and :func:`gp_couple.models.fit_gp`

1. trains to convergence on the kernel's walks (:func:`gp_couple.optimize.minimize`);
2. then, phase after phase, lowers :math:`p_\mathrm{halt}` to what the learnt range needs
   (:meth:`~gp_couple.kernels.grf_kernel.GRFKernel.halting_for_range`) and raises the walker
   count until the estimated relative Gram error at the learnt hyperparameters
   (:meth:`~gp_couple.kernels.grf_kernel.GRFKernel.estimate_gram_error`, two independent
   draws) is within :attr:`WalkSchedule.train_tolerance`, redraws the walks and trains to
   convergence again from where it stopped, until the walks no longer change (fewer than a
   quarter more walkers, and no termination probability lower by a fifth: smaller changes
   cost a phase and move little) or :attr:`WalkSchedule.phases` phases have run;
3. fits a :math:`\sigma`-coupling (paper, definition of coupled GRFs) for the learnt kernel
   and redraws as many prediction walkers as a relative Gram error of
   :attr:`WalkSchedule.predict_tolerance` needs
   (:meth:`~gp_couple.kernels.grf_kernel.GRFKernel.resample_for_prediction`);
4. trains to convergence again on those prediction walks, and while that moves a
   hyperparameter of the kernel family by more than :attr:`WalkSchedule.refit_tolerance`
   (relative), redraws them for the new hyperparameters and trains on them again, at most
   :attr:`WalkSchedule.refits` times. The hyperparameters a model ends with are then a
   stationary point of the likelihood on walks drawn for those same hyperparameters, and
   accurate to the prediction tolerance rather than the coarser training one.
   With :attr:`WalkSchedule.bias_correction` (the default), these rounds train on the
   likelihood corrected for the estimate's second-order bias (below);
5. after the last round, checks what the prediction walks' noise does to the predictive mean
   away from the data, and draws more walkers where the relative Gram error tolerance left
   too few (below), whether training solved by a dense factor or by CG/Lanczos.

The last step is the likelihood's own stopping rule. A relative Frobenius Gram error of
a few per cent is enough to locate short ranges, but a long-range kernel's small
eigenvalues sit below the noise, where the estimate's error acts as extra noise: on
coarse walks the likelihood trades range and output scale for noise. The prediction
walks are far more accurate (:math:`\sigma`-coupled lengths, as many walkers as the
prediction tolerance needs), and a round that no longer moves the hyperparameters shows
that the walks are accurate enough for them.

**The likelihood's second-order bias.** An unbiased estimate :math:`\widehat{\mathbf K} =
\mathbf K + \mathbf E` still biases the likelihood, which is not linear in it: to second
order, with :math:`\mathbf C = s\widehat{\mathbf K} + \sigma^2\mathbf I`,
:math:`\mathbf H = s\mathbf E` and :math:`\boldsymbol\alpha = \mathbf C^{-1}\mathbf y`,
the expected negative log-likelihood exceeds the exact one by
:math:`\tfrac12\mathbb E\,\boldsymbol\alpha^\top\mathbf H\mathbf C^{-1}\mathbf H\boldsymbol\alpha
- \tfrac14\mathbb E\operatorname{tr}(\mathbf C^{-1}\mathbf H\mathbf C^{-1}\mathbf H)`, about
:math:`\tfrac14\operatorname{tr}(\mathbf C^{-1}\mathbf H\mathbf C^{-1}\mathbf H)` where the
data follow the model. It grows like :math:`(s/\sigma^2)^2` in the kernel's eigendirections
below the noise, and the likelihood pays it with a lower output scale. In the rounds on the
prediction walks the kernel therefore pairs its walks at the training nodes with a second,
independent draw of the same configuration
(:meth:`~gp_couple.kernels.grf_kernel.GRFKernel.prepare_prediction`), trains on their mean
:math:`\bar{\mathbf K}`, and subtracts the bias estimated from their difference
:math:`\mathbf D = \widehat{\mathbf K}_1 - \widehat{\mathbf K}_2`, whose second moment is
four times that of the error of :math:`\bar{\mathbf K}`
(:class:`~gp_couple.marginal_likelihood.DenseMarginalLogLikelihood`). The correction
needs a dense factor of the training covariance, so these rounds factorise it densely
also above gpytorch's ``max_cholesky_size``, where the earlier phases solved by CG/Lanczos,
as long as it fits in memory and the correction matters
(:meth:`~gp_couple.kernels.grf_kernel.GRFKernel.pairs_evaluations`): large training sets
are where one draw's error weighs most, but where one draw's whitened error (below) at the
round's start is at most :attr:`WalkSchedule.pairing_threshold`, the bias it corrects, at most
a quarter of that error's square per point, is negligible, and the round solves its one draw
by CG/Lanczos at a fraction of the dense factor's cost. The second draw is
dropped when training ends: the model predicts with the prediction walks.

The expansion holds while the estimate's error is small against the covariance in every
direction, :math:`\|\mathbf C^{-1/2}\mathbf H\mathbf C^{-1/2}\|_2 \ll 1`. The objective
estimates this whitened error from :math:`\mathbf D` (half its spectral norm, by power
iteration). A relative Gram error does not bound it: on sparse graphs a few hundred
walkers can meet the prediction tolerance and leave a whitened error of one half at a high
signal-to-noise ratio. So a round that ends above :data:`BIAS_EXPANSION_LIMIT`, on walks the
schedule chose, redraws them once with :math:`m(e/e_\star)^2` walkers (the whitened error of
independent pairs falls like :math:`m^{-1/2}`; :math:`e_\star` is
:attr:`WalkSchedule.expansion_target`, within ``max_predict_walkers`` and memory, and only for
at least :data:`WALKER_STEP` times more, and only where that count is expected to bring the
error within the limit) and trains another round. That round is kept only if
it ends with a smaller whitened error than the round before: more walkers can also carry
L-BFGS to hyperparameters (a lower noise, a larger output scale) where the error, whitened by
the smaller noise, is larger still and the expansion fails, and there
:func:`gp_couple.models.fit_gp` restores the hyperparameters the round started from
(:meth:`~gp_couple.kernels.grf_kernel.GRFKernel.round_regressed`). A round that ends above the
limit all the same warns (:class:`BiasCorrectionWarning`): there the correction can overshoot,
and more prediction walkers are the remedy. Where training ends on one draw, on the uncorrected likelihood
(training sets whose dense factor does not fit in memory, walks capped above the prediction tolerance, or
``bias_correction`` off), the kernel measures that draw's whitened error against an
independent draw when training ends (training sets of up to
:data:`~gp_couple.predictive_variance.DENSE_VARIANCE_SIZE` points, which it factors densely)
and warns above the same limit: there the likelihood's second-order bias is neither
corrected nor small, and may have shortened the learnt range.

**Prediction walkers for the predictive mean.** A relative Gram error is a poor yardstick at
high signal-to-noise ratios: the predictive mean at a node without data,
:math:`\mu_* = s\,\widehat{\mathbf k}_*^\top\mathbf C^{-1}\mathbf r`, weighs the
estimate's error by :math:`s/\sigma^2` in the directions below the noise. So when the
rounds end, the kernel predicts at up to :data:`HELD_OUT_ROWS` of its rows outside the
training set (held-out rows) from each of two independent draws (its own and the paired
rounds' second draw, or one drawn for the check where training solved by CG/Lanczos without
a pair), at the learnt hyperparameters, with exact solves (a dense or a sparse factor, as
:func:`~gp_couple.predictive_variance.posterior_variance` chooses), and estimates the
mean squared error one draw adds to the predictive mean, relative to the latent predictive
variance there (the exact GP's expected squared error),

.. math::

    \hat\rho = \frac{\tfrac12\,\overline{(\mu_*^{(1)} - \mu_*^{(2)})^2}}{\overline{v_*}}

(:meth:`~gp_couple.kernels.grf_kernel.GRFKernel.estimate_prediction_error`). An added mean
squared error :math:`\rho` times the exact GP's raises the expected test RMSE by a factor
:math:`\sqrt{1+\rho}`, but one draw's error also correlates with the exact GP's own test
errors by chance, which moves the RMSE by an amount of order :math:`\sqrt\rho`: on smooth
fields, with few independent test errors, a few per cent at :math:`\rho = 0.01`. Hence the
small default tolerance. Where :math:`\hat\rho`
exceeds :attr:`WalkSchedule.predict_error_tolerance`, the walkers are multiplied by
:math:`\hat\rho/\text{tolerance}` (the error of independent pairs falls like :math:`1/m`),
within :attr:`WalkSchedule.max_predict_walkers` and memory; walks capped there at more than
:data:`PREDICT_ERROR_WARNING_FACTOR` times the tolerance warn (:class:`GramToleranceWarning`).

**Sharded training.** A :class:`~gp_couple.kernels.sharded_grf.ShardedGRFKernel` (training rows
spread over processes) follows :data:`SHARDED_SCHEDULE`: steps 1 to 4 on the plain likelihood,
every process making the same choices. The bias correction needs a dense factor of the whole
training covariance on one process, and step 5 needs walks from nodes outside the training
set, which that kernel does not hold.

**The noise on its bound.** Where the estimate's error exceeds the observation noise, the
likelihood puts the learnt noise on its constraint's lower bound; :func:`gp_couple.models.fit_gp`
then warns (:class:`NoiseFloorWarning`, :meth:`~gp_couple.kernels.grf_kernel.GRFKernel.check_learnt_noise`).

The cost follows the range the data support: short-range kernels keep their first walks,
long-range ones get longer walks and more walkers. A kernel built with ``schedule=None``
keeps the walks it was given (the paper's experiments, which state their own settings).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from .._checks import check_even_walkers, check_fraction, check_int, check_nonnegative

if TYPE_CHECKING:
    from ..sparse_factor import SparseFactor

__all__ = ["BIAS_EXPANSION_LIMIT", "BiasCorrectionWarning", "DEFAULT_SCHEDULE", "EXPANSION_ITERATIONS",
           "NOISE_FLOOR_FACTOR", "NoiseFloorWarning", "SHARDED_SCHEDULE",
           "EXPANSION_TARGET",
           "GramToleranceWarning", "HELD_OUT_ROWS", "LikelihoodEvaluation", "MAX_PHASES", "MAX_PREDICT_WALKERS",
           "MAX_TRAIN_WALKERS", "PAIRING_THRESHOLD",
           "PREDICT_ERROR_TOLERANCE", "PREDICT_ERROR_WARNING_FACTOR", "PREDICT_GRAM_TOLERANCE",
           "REFITS", "REFIT_TOLERANCE", "TRAIN_GRAM_TOLERANCE", "WALKER_STEP", "WalkSchedule", "hyperparameter_change",
           "sparse_whitened_norm", "warn_if_short", "whitened_norm"]

#: Estimated relative Gram error the training walks aim for.
TRAIN_GRAM_TOLERANCE = 0.03
#: Most walkers per node in training.
MAX_TRAIN_WALKERS = 1024
#: Most training phases (the walks are redrawn between phases).
MAX_PHASES = 4
#: Estimated relative Gram error the prediction walks aim for.
PREDICT_GRAM_TOLERANCE = 0.01
#: Largest estimated mean squared error the prediction walks add to the predictive mean at held-out
#: rows, relative to the latent predictive variance there (module docstring).
PREDICT_ERROR_TOLERANCE = 0.002
#: Multiple of ``predict_error_tolerance`` above which prediction walks capped by
#: ``max_predict_walkers`` or memory warn: there one draw can move the test RMSE by several per cent.
PREDICT_ERROR_WARNING_FACTOR = 10
#: Most held-out rows at which the prediction walks' error in the predictive mean is estimated.
HELD_OUT_ROWS = 256
#: Most prediction walkers per node when they are chosen for a tolerance.
MAX_PREDICT_WALKERS = 8192
#: Walks per node and bin when fitting the prediction walks' sigma-coupling.
SIGMA_FIT_SAMPLES = 100
#: The walks are redrawn for a lower termination probability only below this fraction of the current one.
P_HALT_STEP = 0.8
#: The walks are redrawn for more walkers only from this multiple of the current count (the
#: Gram error falls like the inverse square root of the count: a tenth lower at 1.25x).
WALKER_STEP = 1.25
#: Most training rounds on the prediction walks.
REFITS = 2
#: Relative change of a kernel-family hyperparameter that makes a training round on the prediction walks redraw them.
REFIT_TOLERANCE = 0.05
#: Smallest whitened error of one prediction draw, :math:`\|\mathbf C^{-1/2}\mathbf H\mathbf C^{-1/2}\|_2` with
#: :math:`\mathbf H = s(\widehat{\mathbf K} - \mathbf K)`, measured when a training round on the prediction walks
#: starts, at which the round pairs its draws on a dense factor above gpytorch's ``max_cholesky_size``
#: (:attr:`WalkSchedule.pairing_threshold`): the likelihood's second-order bias per point is at most a
#: quarter of its square.
PAIRING_THRESHOLD = 0.1
#: Largest whitened error of the estimate trained on, :math:`\|\mathbf C^{-1/2}\mathbf H\mathbf C^{-1/2}\|_2` with
#: :math:`\mathbf H = s(\bar{\mathbf K} - \mathbf K)` (the mean of a bias-corrected round; one draw's
#: :math:`s(\widehat{\mathbf K} - \mathbf K)` otherwise), at which training ends without a warning.
BIAS_EXPANSION_LIMIT = 0.3
#: Whitened error (:data:`BIAS_EXPANSION_LIMIT`) for which a bias-corrected round that ended above the limit
#: redraws its walkers once (:attr:`WalkSchedule.expansion_target`): two thirds of the limit, so that a count
#: sized by the :math:`m^{-1/2}` law from a noisy estimate still ends within it.
EXPANSION_TARGET = 0.2


@dataclass(frozen=True)
class LikelihoodEvaluation:
    r"""What an evaluation of the likelihood reports to its GRF kernel (one kernel, optionally scaled).

    :param expansion_error: In a bias-corrected evaluation, the whitened error of the mean
        estimate, :math:`\tfrac12\|\mathbf L^{-1}\mathbf H\mathbf L^{-\top}\|_2`
        (:data:`BIAS_EXPANSION_LIMIT`); ``None`` for an evaluation on one draw (CG/Lanczos,
        or a round that is not corrected).
    :param outputscale: The output scale :math:`s` around the kernel (1 without a ``ScaleKernel``).
    :param residual: The targets less the prior mean at the training inputs, detached, ``(n,)``.
    :param noise: The observation noise variances at the training inputs, detached, ``(n,)``;
        ``None`` when the likelihood's covariance is not a diagonal added to the kernel's.
    """

    expansion_error: float | None
    outputscale: float
    residual: Tensor
    noise: Tensor | None


#: Power iterations that estimate the estimate's whitened error (:data:`BIAS_EXPANSION_LIMIT`).
EXPANSION_ITERATIONS = 20


def whitened_norm(factor: Tensor, perturbation: Tensor, start: Tensor) -> Tensor:
    r""":math:`\|\mathbf L^{-1}\mathbf H\mathbf L^{-\top}\|_2`, by :data:`EXPANSION_ITERATIONS` power iterations.

    :param factor: Lower Cholesky factor :math:`\mathbf L` of the covariance, ``(n, n)``.
    :param perturbation: Symmetric :math:`\mathbf H`, ``(n, n)``.
    :param start: Start vector, ``(n, 1)``.
    """
    # A floor on the divisor instead of a test for zero: no host synchronisation per step.
    tiny = torch.finfo(factor.dtype).tiny
    vector = start / start.norm().clamp_min(tiny)
    norm = start.new_zeros(())
    for _ in range(EXPANSION_ITERATIONS):
        image = torch.linalg.solve_triangular(factor.mT, vector, upper=True)
        image = torch.linalg.solve_triangular(factor, perturbation @ image, upper=False)
        norm = image.norm()
        vector = image / norm.clamp_min(tiny)
    return norm


def sparse_whitened_norm(factor: SparseFactor, covariance: sp.spmatrix, perturbation: sp.spmatrix,
                         start: np.ndarray) -> float:
    r""":func:`whitened_norm` for a sparse factor of the covariance :math:`\mathbf C = \mathbf W\mathbf W^\top`.

    The same :data:`EXPANSION_ITERATIONS` power iterations on :math:`\mathbf W^{-1}\mathbf H
    \mathbf W^{-\top}`, carried in :math:`\mathbf u = \mathbf W^{-\top}\mathbf v`, which
    needs only whole solves: :math:`\mathbf u \leftarrow \mathbf C^{-1}\mathbf H\mathbf u`,
    with :math:`\|\mathbf v\| = (\mathbf u^\top\mathbf C\mathbf u)^{1/2}`. The start is
    :math:`\mathbf v = \mathbf W^{-1}` ``start``.

    :param factor: The sparse factor of :math:`\mathbf C`.
    :param covariance: :math:`\mathbf C`, ``(n, n)``.
    :param perturbation: Symmetric :math:`\mathbf H`, ``(n, n)``.
    :param start: Start vector, ``(n,)``.
    """
    tiny = np.finfo(np.float64).tiny
    vector = factor.solve(start)
    vector /= max(float(np.sqrt(vector @ (covariance @ vector))), tiny)
    norm = 0.0
    for _ in range(EXPANSION_ITERATIONS):
        image = factor.solve(perturbation @ vector)
        norm = float(np.sqrt(max(float(image @ (covariance @ image)), 0.0)))
        vector = image / max(norm, tiny)
    return norm


class GramToleranceWarning(RuntimeWarning):
    """The walks stayed noisier than the schedule's tolerance: its walker cap was reached first."""


class BiasCorrectionWarning(RuntimeWarning):
    """The likelihood's bias correction was not applied, or the estimate's error is too large where training ended.

    Either the correction's second-order expansion is inaccurate there, or training ended on one
    draw, uncorrected, whose error is too large for the likelihood's bias to be negligible.
    """


class NoiseFloorWarning(RuntimeWarning):
    """Training a GRF-GP ended with the observation noise at its lower bound.

    The GRF estimate's diagonal is biased upwards, and its error acts as extra noise: where it
    exceeds the observation noise, the likelihood drives the learnt noise to its bound, and the
    predictive variances of noisy observations come out too small.
    """


#: A learnt noise within this factor of its constraint's lower bound counts as on the bound.
NOISE_FLOOR_FACTOR = 1.1


def warn_if_short(stage: str, error: float, tolerance: float, walkers: int, cap: int) -> None:
    """Warn that ``stage``'s walks miss ``tolerance`` at the walker cap (nothing if they meet it).

    :param stage: ``"training"`` or ``"prediction"``.
    :param error: Estimated relative Gram error of the walks drawn.
    :param tolerance: The schedule's tolerance for that stage.
    :param walkers: Walkers per node drawn.
    :param cap: The schedule's most walkers per node for that stage.
    """
    if error > tolerance and walkers >= cap:
        warnings.warn(f"the {stage} walks reach an estimated relative Gram error of {error:.3g} with {walkers} "
                      f"walkers per node, above the schedule's {stage} tolerance {tolerance:g}: raise "
                      f"max_{'train' if stage == 'training' else 'predict'}_walkers in the WalkSchedule, or use an "
                      "exact kernel (ExactGraphKernel, MatrixFreeGraphKernel) at this range",
                      GramToleranceWarning, stacklevel=4)


def hyperparameter_change(before: dict[str, Any], after: dict[str, Any]) -> float:
    r"""The largest relative change between two reports of a kernel family's hyperparameters.

    .. math::

        \max_h \frac{\|\theta_h' - \theta_h\|_2}{\|\theta_h\|_2}

    over the hyperparameters :math:`h` (floats, or lists for batched and vector-valued
    ones such as power-series coefficients), as reported by
    :meth:`~gp_couple.kernel_families.KernelFamily.hyperparameters`.

    :param before: The report the walks were drawn for.
    :param after: The report now.
    :return: The change (infinite if the two name different hyperparameters or shapes, or a
        hyperparameter was zero and moved).
    """
    if before.keys() != after.keys():
        return math.inf
    change = 0.0
    for name, old in before.items():
        old_value, new_value = np.asarray(old, dtype=float), np.asarray(after[name], dtype=float)
        if old_value.shape != new_value.shape:
            return math.inf
        moved = float(np.linalg.norm(new_value - old_value))
        scale = float(np.linalg.norm(old_value))
        if moved:
            change = max(change, moved / scale if scale else math.inf)
    return change


@dataclass(frozen=True)
class WalkSchedule:
    r"""How :func:`gp_couple.models.fit_gp` redraws a GRF kernel's walks (see the module docstring).

    :param train_tolerance: Estimated relative Gram error the training walks aim for.
    :param max_train_walkers: Most walkers per node in training (even).
    :param phases: Most training phases (1: train once on the kernel's walks).
    :param predict: Draw prediction walks when training ends (``False``: keep the training
        walks, e.g. to resume training later; call
        :meth:`~gp_couple.kernels.grf_kernel.GRFKernel.resample_for_prediction` before predicting).
    :param predict_walkers: Prediction walkers per node (even); ``None`` chooses them for
        ``predict_tolerance``.
    :param predict_tolerance: Estimated relative Gram error the prediction walks aim for.
    :param max_predict_walkers: Most prediction walkers per node when choosing (even).
    :param sigma_fit_samples: Walks per node and bin when fitting the
        :math:`\sigma`-coupling of the prediction walks.
    :param refits: Most training rounds on the prediction walks (0: they are drawn when
        training ends and not trained on; ignored without ``predict``).
    :param refit_tolerance: Relative change of a kernel-family hyperparameter
        (:func:`hyperparameter_change`) in a round on the prediction walks above which they
        are redrawn for the new hyperparameters (and trained on again while rounds remain).
    :param bias_correction: Train the rounds on the prediction walks on the likelihood
        corrected for the estimate's second-order bias (module docstring), from a second,
        independent draw at the training nodes; ``False`` trains them on the plain likelihood
        of the prediction walks.
    :param predict_error_tolerance: Largest estimated mean squared error the prediction walks
        add to the predictive mean at held-out rows, relative to the latent predictive
        variance there, when training ends on the prediction walks (module docstring);
        more walkers are drawn above it, unless ``predict_walkers`` is given.
    :param pairing_threshold: Above gpytorch's ``max_cholesky_size``, a bias-corrected round
        pairs its draws on a dense factor only where one draw's whitened error
        :math:`\|\mathbf C^{-1/2}\mathbf H\mathbf C^{-1/2}\|_2`, measured when the round
        starts, exceeds this (0 pairs wherever the factor fits in memory); below the threshold
        the round trains on one draw by CG/Lanczos. Training sets up to ``max_cholesky_size``
        points, which factorise densely anyway, are always paired.
    :param expansion_target: Whitened error for which a bias-corrected round that ended above
        :data:`BIAS_EXPANSION_LIMIT` redraws the prediction walkers once and trains again
        (module docstring; kept only if that round ends with a smaller whitened error);
        ``None`` never redraws for it. Ignored where ``predict_walkers`` is given.
    :raises TypeError: If a count is not an int or a tolerance not a number.
    :raises ValueError: If a walker count is odd or below 2, a tolerance is not in (0, 1),
        a count is below 1, ``refits`` is negative, ``pairing_threshold`` is negative or not finite,
        or ``expansion_target`` is not in (0, 1).
    """

    train_tolerance: float = TRAIN_GRAM_TOLERANCE
    max_train_walkers: int = MAX_TRAIN_WALKERS
    phases: int = MAX_PHASES
    predict: bool = True
    predict_walkers: int | None = None
    predict_tolerance: float = PREDICT_GRAM_TOLERANCE
    max_predict_walkers: int = MAX_PREDICT_WALKERS
    sigma_fit_samples: int = SIGMA_FIT_SAMPLES
    refits: int = REFITS
    refit_tolerance: float = REFIT_TOLERANCE
    bias_correction: bool = True
    predict_error_tolerance: float = PREDICT_ERROR_TOLERANCE
    pairing_threshold: float = PAIRING_THRESHOLD
    expansion_target: float | None = EXPANSION_TARGET

    def __post_init__(self) -> None:
        set_field = object.__setattr__
        set_field(self, "train_tolerance", check_fraction("train_tolerance", self.train_tolerance))
        set_field(self, "max_train_walkers", check_even_walkers("max_train_walkers", self.max_train_walkers))
        set_field(self, "phases", check_int("phases", self.phases, 1))
        if self.predict_walkers is not None:
            set_field(self, "predict_walkers", check_even_walkers("predict_walkers", self.predict_walkers))
        set_field(self, "predict_tolerance", check_fraction("predict_tolerance", self.predict_tolerance))
        set_field(self, "max_predict_walkers", check_even_walkers("max_predict_walkers", self.max_predict_walkers))
        set_field(self, "sigma_fit_samples", check_int("sigma_fit_samples", self.sigma_fit_samples, 1))
        set_field(self, "refits", check_int("refits", self.refits, 0))
        set_field(self, "refit_tolerance", check_fraction("refit_tolerance", self.refit_tolerance))
        set_field(self, "predict_error_tolerance",
                  check_fraction("predict_error_tolerance", self.predict_error_tolerance))
        set_field(self, "pairing_threshold", check_nonnegative("pairing_threshold", self.pairing_threshold))
        if self.expansion_target is not None:
            set_field(self, "expansion_target", check_fraction("expansion_target", self.expansion_target))
        for name in ("predict", "bias_correction"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (:meth:`from_dict` restores it)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, state: Any) -> WalkSchedule | None:
        """The schedule saved by :meth:`to_dict` (``None`` for a kernel without one).

        :raises TypeError: If ``state`` is neither ``None`` nor a dict.
        :raises ValueError: For unknown keys or invalid values.
        """
        if state is None:
            return None
        if not isinstance(state, dict):
            raise TypeError(f"a walk schedule must be saved as a dict or None, got {type(state).__name__}")
        unknown = sorted(set(state) - {field.name for field in fields(cls)})
        if unknown:
            raise ValueError(f"unknown walk-schedule entries {unknown}")
        return cls(**state)

    def needs_redraw(self, walkers: int, current_walkers: int, p_halt: float, current_p_halt: float) -> bool:
        """Whether a training phase's proposed walks differ enough from the current ones to redraw.

        :param walkers: Proposed walkers per node.
        :param current_walkers: The kernel's walkers per node.
        :param p_halt: Proposed termination probability.
        :param current_p_halt: The kernel's termination probability.
        """
        return walkers >= WALKER_STEP * current_walkers or p_halt <= P_HALT_STEP * current_p_halt


#: The schedule a :class:`~gp_couple.kernels.grf_kernel.GRFKernel` gets by default (the recommended GRF-GP).
DEFAULT_SCHEDULE = WalkSchedule()
#: The schedule a :class:`~gp_couple.kernels.sharded_grf.ShardedGRFKernel` gets by default: the training
#: phases and the rounds on the prediction walks, on the plain likelihood (the bias correction needs a
#: dense factor of the whole training covariance on one process).
SHARDED_SCHEDULE = WalkSchedule(bias_correction=False)
