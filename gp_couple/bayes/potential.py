r"""The Pyro model of a gpytorch GP's hyperparameter posterior, with a deterministic potential.

NUTS integrates Hamiltonian dynamics on the potential
:math:`U(\theta) = -\log p(\mathbf y \mid \theta) - \log p(\theta)` and accepts or rejects
by its energy error, so :math:`U` must be a deterministic function of :math:`\theta`:
gpytorch's stochastic estimates (CG solves, Hutchinson trace and stochastic Lanczos
log-determinants, which gp_couple uses above a few hundred points, see
:mod:`gp_couple.settings`) would make every evaluation a different random function
and break detailed balance.

:func:`exact_potential_settings` therefore forces Cholesky for every solve and
log-determinant, **at every size**: ``fast_computations(covar_root_decomposition=False,
log_prob=False, solves=False)`` makes linear_operator take its Cholesky path whatever
the size, and ``max_cholesky_size`` is raised to the training-set size as well so that
no size threshold can switch it back. What that costs per evaluation:

* GRF kernels (:class:`~gp_couple.kernels.GRFKernel`) and exact graph kernels: the
  :math:`n \times n` Gram matrix is densified and factorised, :math:`O(n^3)` time and
  :math:`O(n^2)` memory;
* coupled random-feature kernels (low rank :math:`\Phi\Phi^\top + \sigma^2 I`): the
  Woodbury identity with a Cholesky factor of the :math:`m \times m` capacitance
  matrix, :math:`O(n m^2)`, equally deterministic.

Sizes where a dense Cholesky per leapfrog step would not fit are refused:
:func:`check_train_size` raises above ``max_train_size`` (default
:data:`MAX_NUTS_TRAIN_SIZE` points: a float64 Gram matrix, its factor and their
gradients stay below a gigabyte). Cholesky failures (a Gram matrix that is not
positive definite even after gpytorch's deterministic jitter) make the potential
:math:`+\infty` there, which NUTS treats as a divergence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import gpytorch
import pyro
import torch
from gpytorch.models import ExactGP
from linear_operator.utils.errors import NotPSDError
from torch import Tensor

from .priors import PriorSite, prior_sites

__all__ = ["MAX_NUTS_TRAIN_SIZE", "exact_potential_settings", "check_train_size", "HyperparameterModel"]

#: Default largest training set for NUTS (a dense Cholesky in every potential evaluation).
MAX_NUTS_TRAIN_SIZE = 4096


@contextlib.contextmanager
def exact_potential_settings(num_points: int) -> Iterator[None]:
    """Force deterministic Cholesky solves and log-determinants inside the block.

    :param num_points: The largest matrix size solved inside (training, or training
        plus test points for prediction).
    """
    with gpytorch.settings.fast_computations(covar_root_decomposition=False, log_prob=False, solves=False), \
            gpytorch.settings.max_cholesky_size(max(int(num_points), 1)):
        yield


def check_train_size(num_train: int, max_train_size: int) -> None:
    """Refuse training sets too large for a dense Cholesky in every NUTS step.

    :raises ValueError: If ``num_train > max_train_size``.
    """
    if num_train > max_train_size:
        raise ValueError(
            f"the model has {num_train} training points, above max_train_size={max_train_size}: NUTS "
            "evaluates an exact (dense Cholesky) marginal likelihood in every leapfrog step, because "
            "stochastic CG/Lanczos estimates would make the potential random. Subsample the data, or raise "
            "max_train_size if the O(n^3) Cholesky fits your time and memory")


def _expanded(site: PriorSite) -> Any:
    """The site's prior with the batch shape of its hyperparameter (Pyro samples whole values)."""
    prior = site.prior
    if tuple(prior.batch_shape) + tuple(prior.event_shape) == tuple(site.shape):
        return prior
    try:
        return prior.expand(site.shape)
    except NotImplementedError:
        raise TypeError(
            f"prior {site.name} ({type(prior).__name__}) does not implement expand(), which NUTS needs to "
            f"sample it with the shape {tuple(site.shape)} of its hyperparameter; give it a prior that "
            "implements expand() (e.g. GammaPrior, LogNormalPrior, NormalPrior) or one of that shape "
            "already") from None


class HyperparameterModel:
    r"""The Pyro model of the hyperparameter posterior (priors, then the GP marginal likelihood).

    .. math::

        \theta \sim p(\theta), \qquad
        \mathbf y \mid \theta \sim \mathcal N(\mathbf m, \mathbf K_\theta + \sigma^2 \mathbf I)

    Samples every hyperparameter that carries a prior (:func:`~gp_couple.bayes.priors.prior_sites`)
    and adds the log marginal likelihood of the training targets as a factor, computed
    inside :func:`exact_potential_settings`; hyperparameters without priors stay fixed at
    their current values. A draw the model cannot store (a value its setter rejects) or a
    Gram matrix that is not positive definite gives a log density of :math:`-\infty`.
    The model is copied once into gpytorch's "random module" form, whose
    hyperparameters are plain tensors that the sampled values replace (gradients flow
    to the Pyro sites); the copy shares no state with ``model``.

    :param model: A gpytorch :class:`~gpytorch.models.ExactGP` with a Gaussian-type likelihood.
    :param max_train_size: See :func:`check_train_size`.
    :raises TypeError: If ``model`` is not an ExactGP.
    :raises ValueError: See :func:`~gp_couple.bayes.priors.prior_sites` and :func:`check_train_size`.
    """

    def __init__(self, model: ExactGP, max_train_size: int = MAX_NUTS_TRAIN_SIZE) -> None:
        if not isinstance(model, ExactGP):
            raise TypeError(f"model must be a gpytorch ExactGP, got {type(model).__name__}")
        if model.train_inputs is None or model.train_targets is None:
            raise ValueError("model has no training data (train_inputs/train_targets are None)")
        self.sites: list[PriorSite] = prior_sites(model)
        self.num_train = int(model.train_targets.shape[-1])
        check_train_size(self.num_train, max_train_size)
        self._inputs = tuple(model.train_inputs)
        self._targets = model.train_targets
        self._random_model = model.to_pyro_random_module().train()
        paths = {id(module): path for path, module in model.named_modules()}
        copies = dict(self._random_model.named_modules())
        self._site_modules = [copies[paths[id(site.module)]] for site in self.sites]
        self._priors = [_expanded(site) for site in self.sites]

    def initial_values(self) -> dict[str, Tensor]:
        """The model's current hyperparameters, keyed by site (a starting point for NUTS)."""
        return {site.name: site.current_value() for site in self.sites}

    def __call__(self) -> None:
        """The Pyro model (no arguments: the training data are fixed)."""
        model = self._random_model
        try:
            for site, module, prior in zip(self.sites, self._site_modules, self._priors):
                site.setting_closure(module, pyro.sample(site.name, prior))
        except ValueError:
            # A sampled value the parameter cannot store (e.g. underflow to 0 under Positive()).
            pyro.factor("log_likelihood", torch.tensor(float("-inf")))
            return
        # The log-likelihood is computed here, inside the settings, and entered as a
        # factor: an observed sample site would have its log_prob computed later by
        # Pyro, outside this block, where gpytorch may choose CG/Lanczos again.
        with exact_potential_settings(self.num_train):
            try:
                output = model.likelihood(model(*self._inputs))
                log_likelihood = output.log_prob(self._targets)
            except NotPSDError:
                log_likelihood = torch.tensor(float("-inf"))
        pyro.factor("log_likelihood", log_likelihood)

    def potential(self, values: dict[str, Tensor]) -> Tensor:
        r"""The potential :math:`U(\theta)` at constrained hyperparameter values (for checks)."""
        conditioned: Callable[..., Any] = pyro.poutine.condition(self, data=values)
        trace = pyro.poutine.trace(conditioned).get_trace()
        return -trace.log_prob_sum()
