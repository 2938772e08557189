r"""``gp-couple kernel-estimation``: coupled RFFs and RLFs on UCI data (paper, Table 1, Section 3.3
[tab:rff], Table 2, Appendix B.2 [tab:kld], Table 3, Appendix B.2 [tab:pred-rmse]).

Protocol of Appendix B.1 "Details for RFF and RLF experiments" [app:rff_rlf_expt_details]. For every
random split (20 by default) at most 256 training and 256 test points are drawn without replacement
from a 50/50 split of the shuffled dataset; inputs and targets are standardised with training
statistics.

* **RFF hyperparameters**: lengthscale :math:`\ell`, amplitude :math:`\sigma_v^2` and
  noise :math:`\sigma_n^2` of an exact GP with the Gaussian kernel, maximising the
  marginal likelihood of the training set (L-BFGS by default; the paper's Adam with
  ``--gp-optimizer adam``, see :mod:`gp_couple.experiments._exact_gp`).
  ``--lengthscale`` fixes :math:`\ell` instead (fitting the other two).
* **RLF hyperparameters**: the lengthscale rule
  :math:`\ell = \frac{2}{N^2}\sum_{i,j}\|\boldsymbol x_i + \boldsymbol x_j\|` over the
  training set (it keeps :math:`\|\boldsymbol x + \boldsymbol y\| / \ell` small, where RLFs
  concentrate), then :math:`\sigma_v^2, \sigma_n^2` fitted as above with :math:`\ell` fixed.

With :math:`m = d` frequencies for RFFs and :math:`m = 2d` for RLFs, every coupling
is drawn ``--draws`` times per split, and each draw gives

* the **kernel RMSE** over the test Gram block,
  :math:`\sqrt{\mathrm{mean}_{ij}(\widehat k(\boldsymbol x_i, \boldsymbol x_j)
  - k(\boldsymbol x_i, \boldsymbol x_j))^2}`
  (unit amplitude), averaged as a mean square over draws (Table 1, Section 3.3 [tab:rff]);
* the **KL divergence** :math:`\mathrm{KL}(p_\mathrm{exact}\,\|\,p_\mathrm{approx})` between
  the exact and approximate GP posteriors over the test points (full covariances), in
  nats per test point (Table 2, Appendix B.2 [tab:kld]). By default (``--kl-posterior predictive``)
  both are predictive posteriors of noisy test targets, i.e. the covariance of eq. (43), the
  approximate
  posterior, Appendix B.2 [eq:approx_muandc] plus :math:`\sigma_n^2 I`. The paper's equation itself
  is the latent posterior (``--kl-posterior latent``), whose approximate covariance has rank at most
  the number
  of feature columns, below the number of test points, so that KL is infinite without a
  jitter: the latent option adds ``--latent-jitter`` times :math:`\sigma_v^2` to both
  covariances and reports it;
* the **predictive RMSE** of the approximate posterior mean on the test targets
  (Table 3, Appendix B.2 [tab:pred-rmse]).

Per split, RMSEs are also divided by the i.i.d. coupling's ("``*_vs_iid``", the
paper's normalisation); means and standard errors are over splits.

The random-feature posteriors are evaluated in low-rank form (Woodbury identity,
:func:`gp_couple.evaluation.low_rank.low_rank_posterior`), a whole batch of draws at a
time, and the kernel RMSE through
:math:`\|\Phi\Phi^\top - K\|_F^2 = \|\Phi^\top\Phi\|_F^2 - 2\,\mathrm{tr}(\Phi^\top K \Phi) + \|K\|_F^2`,
so no draw builds a dense Gram matrix.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

from ..optimize import Convergence
from ._exact_gp import GP_CONVERGENCE, GPHyperparameters, fit_gp_hyperparameters, rlf_lengthscale
from ._kernel_estimation_run import (
    DEFAULT_COUPLINGS,
    FREQUENCIES_PER_DIM,
    KL_POSTERIORS,
    run_kernel_estimation,
)
from ._options import dataset_label, dataset_title
from ._report import figure_folder, log_figures
from ._splits import random_split, standardise

__all__ = [
    "DEFAULT_COUPLINGS",
    "FREQUENCIES_PER_DIM",
    "GPHyperparameters",
    "fit_gp_hyperparameters",
    "rlf_lengthscale",
    "random_split",
    "standardise",
    "run_kernel_estimation",
    "KL_POSTERIORS",
]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load the dataset named on the command line (a UCI name or a CSV file) and run the experiment."""
    from ..datasets.uci import load_regression

    folder = figure_folder(args)
    inputs, targets = load_regression(args.dataset, data_dir=args.data_dir, target=args.target)
    couplings = {"rff": args.rff_couplings, "rlf": args.rlf_couplings}
    num_frequencies = {kind: value for kind, value in
                       (("rff", args.rff_frequencies), ("rlf", args.rlf_frequencies)) if value is not None}
    start = time.perf_counter()
    with warnings.catch_warnings():
        # Jitter notices of near-singular exact covariances are expected for smooth kernels.
        warnings.simplefilter("ignore", RuntimeWarning)
        report = run_kernel_estimation(
            inputs, targets, features=args.features, couplings=couplings, splits=args.repeats,
            max_train=args.max_train, max_test=args.max_test, draws=args.draws,
            gp_iterations=args.gp_iterations, gp_lr=args.gp_lr, gp_optimizer=args.gp_optimizer,
            gp_convergence=Convergence(loss_tolerance=args.gp_loss_tolerance,
                                       parameter_tolerance=args.gp_parameter_tolerance, window=GP_CONVERGENCE.window),
            rff_lengthscale=args.rff_lengthscale,
            standardise_targets=not args.raw_targets,
            kl_posterior=args.kl_posterior, latent_jitter=args.latent_jitter,
            num_frequencies=num_frequencies, chunk=args.chunk, seed=args.seed, dataset=args.dataset,
            threads=args.threads)
    report["timing"] = {"seconds": round(time.perf_counter() - start, 2), "threads": args.threads}
    if folder is not None:
        from .plotting import plot_metric_bars

        log_figures([plot_metric_bars(
            report["results"], folder / f"kernel_estimation_{dataset_label(args.dataset)}.png", category="coupling",
            metrics=("kernel_rmse", "kl_per_test_point", "predictive_rmse"), panel=("features",),
            title=f"Coupled random features on {dataset_title(args.dataset)}")])
    return report
