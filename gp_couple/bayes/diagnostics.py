r"""Convergence diagnostics of MCMC hyperparameter samples: split R-hat and effective sample size.

Both come from :mod:`pyro.ops.stats` (Stan's definitions, Stan Reference Manual 2.18):

* split :math:`\hat R` (:func:`pyro.ops.stats.split_gelman_rubin`): every chain is cut
  in halves and the between- and within-half variances are compared, so a *single*
  chain already gives a meaningful value (it detects a chain whose first and second
  halves disagree, e.g. an unfinished warm-up); with several chains it also compares
  chains. Values near 1 (below 1.05, say) indicate convergence.
* effective sample size (:func:`pyro.ops.stats.effective_sample_size`), from the
  autocorrelations of all chains (Geyer's initial monotone sequence).

Both are computed per scalar element of every site (a vector of ARD lengthscales gets
one value per dimension). They need a few tens of draws to mean anything: with a handful
(a smoke test) Pyro's ESS estimate can even be negative, and with fewer than
:data:`MIN_DRAWS_FOR_R_HAT` draws per chain both are reported as NaN.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from pyro.ops.stats import effective_sample_size, split_gelman_rubin
from torch import Tensor

__all__ = ["SiteSummary", "MCMCDiagnostics", "summarize_site", "MIN_DRAWS_FOR_R_HAT"]

#: Split R-hat cuts every chain in halves of at least two draws.
MIN_DRAWS_FOR_R_HAT = 4


def _floats(tensor: Tensor) -> list[float]:
    return [float(value) for value in tensor.detach().double().reshape(-1)]


@dataclass(frozen=True)
class SiteSummary:
    """Posterior summary of one sample site, one entry per scalar element.

    :ivar name: The site (prior) name.
    :ivar shape: Shape of one sample.
    :ivar mean: Posterior means.
    :ivar std: Posterior standard deviations.
    :ivar r_hat: Split R-hat (NaN with fewer than :data:`MIN_DRAWS_FOR_R_HAT` draws per chain).
    :ivar ess: Effective sample sizes (over all chains).
    """

    name: str
    shape: tuple[int, ...]
    mean: list[float]
    std: list[float]
    r_hat: list[float]
    ess: list[float]


def summarize_site(name: str, chains: Tensor) -> SiteSummary:
    """Summary of one site's draws.

    :param name: Site name.
    :param chains: Draws ``(num_chains, num_draws, *shape)``.
    :raises ValueError: If ``chains`` has fewer than two dimensions or no draws.
    """
    if chains.dim() < 2 or chains.shape[1] == 0:
        raise ValueError(f"draws of {name} must have shape (num_chains, num_draws, ...), got {tuple(chains.shape)}")
    flat = chains.detach().double().reshape(chains.shape[0], chains.shape[1], -1)
    pooled = flat.reshape(-1, flat.shape[-1])
    if flat.shape[1] >= MIN_DRAWS_FOR_R_HAT:
        r_hat = split_gelman_rubin(flat, chain_dim=0, sample_dim=1)
        ess = effective_sample_size(flat, chain_dim=0, sample_dim=1)
    else:
        r_hat = ess = torch.full((flat.shape[-1],), math.nan, dtype=torch.float64)
    std = pooled.std(0) if pooled.shape[0] > 1 else torch.zeros(flat.shape[-1], dtype=torch.float64)
    return SiteSummary(name, tuple(chains.shape[2:]), _floats(pooled.mean(0)), _floats(std),
                       _floats(r_hat.reshape(-1)), _floats(ess.reshape(-1)))


@dataclass(frozen=True)
class MCMCDiagnostics:
    """Diagnostics of a NUTS run.

    :ivar sites: Per-site summaries (:class:`SiteSummary`).
    :ivar num_chains: Chains run (one after another).
    :ivar num_samples: Kept draws per chain.
    :ivar warmup_steps: Warm-up (adaptation) iterations per chain.
    :ivar divergences: Divergent transitions among the kept draws, per chain.
    :ivar acceptance_rate: Mean acceptance probability per chain.
    :ivar step_size: Adapted step size per chain.
    :ivar wall_time: Seconds per chain (warm-up and sampling).
    :ivar r_hat_method: How R-hat was computed (split R-hat over how many chains).
    """

    sites: list[SiteSummary]
    num_chains: int
    num_samples: int
    warmup_steps: int
    divergences: list[int]
    acceptance_rate: list[float]
    step_size: list[float]
    wall_time: list[float]
    r_hat_method: str = field(default="")

    @property
    def max_r_hat(self) -> float:
        """Largest split R-hat over every element of every site (NaN if undefined)."""
        values = [value for site in self.sites for value in site.r_hat]
        return max(values) if values and not any(math.isnan(v) for v in values) else math.nan

    @property
    def min_ess(self) -> float:
        """Smallest effective sample size over every element of every site."""
        values = [value for site in self.sites for value in site.ess]
        return min(values) if values and not any(math.isnan(v) for v in values) else math.nan

    @property
    def total_wall_time(self) -> float:
        """Seconds over all chains."""
        return float(sum(self.wall_time))

    def site(self, name: str) -> SiteSummary:
        """The summary of site ``name``.

        :raises KeyError: If there is no such site.
        """
        for summary in self.sites:
            if summary.name == name:
                return summary
        raise KeyError(f"no site {name!r}; sites are {[s.name for s in self.sites]}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (NaN becomes ``None``), with the summary values."""
        def clean(value: Any) -> Any:
            if isinstance(value, float) and not math.isfinite(value):
                return None
            if isinstance(value, list):
                return [clean(item) for item in value]
            if isinstance(value, dict):
                return {key: clean(item) for key, item in value.items()}
            return value

        report = asdict(self)
        report.update(max_r_hat=self.max_r_hat, min_ess=self.min_ess, total_wall_time=self.total_wall_time,
                      total_divergences=int(sum(self.divergences)))
        return clean(report)
