r"""Frequency couplings for random Fourier and Laplace features (paper, Section 3 "Random Fourier
features and random Laplace features" [sec:rffs_and_rlfs]).

Random Fourier features (RFFs) and random Laplace features (RLFs) estimate the Gaussian
kernel without bias whenever every frequency is *marginally* standard Gaussian,
:math:`\boldsymbol\omega_i \sim \mathcal N(0, \mathbf I_d)`. Independence is not
needed: any joint law (a *coupling*) with these marginals keeps the estimator
unbiased, and a good one lowers its variance. Writing
:math:`\boldsymbol\omega = \omega\,\widehat{\boldsymbol\omega}`, the marginal condition
is: the direction :math:`\widehat{\boldsymbol\omega}` is uniform on the sphere and the
norm :math:`\omega` is :math:`\chi_d`-distributed, independent of it.

Built-in couplings (registered names, accepted by :func:`get_frequency_coupling`, in brackets):

* :class:`IIDFrequencyCoupling` (``iid``): independent Gaussian frequencies.
* :class:`HaltonCoupling` (``halton``), :class:`SobolCoupling` (``sobol``): scrambled
  quasi-Monte Carlo points pushed through the Gaussian inverse CDF coordinate-wise.
* :class:`OrthogonalCoupling` (``orthogonal``): ensembles of :math:`d` exactly
  orthogonal directions under a Haar-random rotation, independent :math:`\chi_d` norms.
* :class:`PairwiseNormCoupling` (``pnc``): orthogonal ensembles whose norms form
  :math:`\lfloor d/2 \rfloor` negative-monotone pairs,
  :math:`F_{\chi_d}(\omega_1) + F_{\chi_d}(\omega_2) = 1` (Definition 3.3, Section 3.1
  [def:coupled_norms_def]).
* :class:`PositiveMonotoneCoupling` (``pm``): orthogonal ensembles whose norms are all
  equal (Appendix B.3 "Norm-coupled RLFs in Performers" [app:performers]).
* :class:`GaussianCopulaCoupling` (``copula``): orthogonal ensembles whose norms follow
  a Gaussian copula with a learnable correlation matrix (Appendix A.5 "Copulas as numerical OT
  solvers" [app:copulas]).
* :class:`AntitheticFrequencyCoupling` (``antithetic`` = ``pnc+antithetic``, or
  ``<base>+antithetic``): every frequency of a base coupling together with its negative
  (Theorem 3.5, Section 3.1 [thm:antithetic]).

When more frequencies than :math:`d` are requested, orthogonal couplings draw
independent ensembles of :math:`d` and keep the first ``num_features`` frequencies.

The interface
-------------
A coupling separates *randomness* from a *deterministic map*:

* :meth:`FrequencyCoupling.sample_noise` draws everything random (rotations, norms,
  standard normals, ...) as numpy arrays from a numpy generator;
* :meth:`FrequencyCoupling.noise_to_frequencies` maps that noise to frequencies with
  torch operations, differentiably in the coupling's parameters.

Kernels store the noise in buffers and call the coupling (``coupling(noise,
num_features)``) in every forward pass, so a learnable coupling (a torch module with
parameters, like the copula) receives gradients, and a saved model reloads exactly.
:meth:`FrequencyCoupling.sample` draws frequencies in one call.

Writing your own coupling
-------------------------
Couplings of orthogonal ensembles only choose how the :math:`d` norms of an ensemble
are coupled: subclass :class:`OrthogonalNormCoupling` and implement
:meth:`~OrthogonalNormCoupling.sample_norms`. For example, norms that mirror the
quantile of the first norm of each ensemble around ``1/2`` for half of it::

    import numpy as np
    from gp_couple.couplings import OrthogonalNormCoupling, chi_ppf, chi_isf

    class HalfMirrored(OrthogonalNormCoupling):
        name = "half-mirrored"

        def sample_norms(self, shape, dim, rng):
            u = rng.random((*shape, 1))
            half = dim // 2
            return np.concatenate([np.repeat(chi_ppf(u, dim), half, -1),
                                   np.repeat(chi_isf(u, dim), dim - half, -1)], -1)

Each norm is :math:`\chi_d` (``1 - u`` is uniform), so estimates stay unbiased.
Setting ``name`` registers the class in :data:`FREQUENCY_COUPLINGS` (see
:mod:`gp_couple.registry`), so it plugs in anywhere a built-in coupling does, by
instance or by name, e.g.
``CoupledRFFKernel(num_features=16, num_dims=8, coupling="half-mirrored")``, and its
``to_dict()`` / :func:`frequency_coupling_from_dict` round-trip through JSON (a coupling
with constructor arguments returns them from ``params()``).
Couplings that also couple directions subclass :class:`FrequencyCoupling` directly.
``tests/couplings/frequency_coupling_mixin.py`` checks the marginals and the
unbiasedness of any coupling.

Modules
-------
:mod:`~gp_couple.couplings.frequency_interface` (the interface and its registry),
:mod:`~gp_couple.couplings.frequency_builtins` (the built-in couplings),
:mod:`~gp_couple.couplings.frequency_lookup` (names and JSON descriptions to couplings)
and :mod:`~gp_couple.couplings.chi` (the :math:`\chi_d` quantiles); this module gathers
their public names.
"""

from __future__ import annotations

from . import chi, frequency_builtins, frequency_interface, frequency_lookup

# This module gathers the public names of these four (their __all__, composed below).
from .chi import *  # noqa: F403
from .frequency_builtins import *  # noqa: F403
from .frequency_interface import *  # noqa: F403
from .frequency_interface import Noise  # noqa: F401 - the noise type, not in __all__
from .frequency_lookup import *  # noqa: F403

__all__ = [
    *frequency_interface.__all__,
    *frequency_builtins.__all__,
    *frequency_lookup.__all__,
    *chi.__all__,
]
