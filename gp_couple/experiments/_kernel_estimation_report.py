"""The report of ``gp-couple kernel-estimation``: summaries over splits, ratios to i.i.d., notes."""

from __future__ import annotations

from typing import Any

from ._report import summarize

__all__ = ["BASELINE", "kernel_estimation_report"]

#: The coupling every other one is compared with (the paper's normalisation).
BASELINE = "iid"


def kernel_estimation_report(per_split: dict[tuple[str, str], list[dict[str, float]]],
                             exact: dict[str, dict[str, list[float]]], *,
                             couplings: dict[str, tuple[str, ...]], frequencies: dict[str, int],
                             settings: dict[str, Any], include_noise: bool, latent_jitter: float,
                             gp_optimizer: str, standardise_targets: bool,
                             rff_lengthscale: float | None) -> dict[str, Any]:
    """Summaries over splits with standard errors, ratios to the i.i.d. coupling, and notes.

    :param per_split: Per (feature map, coupling), the metrics of every split
        (:func:`~gp_couple.experiments._coupling_draws.evaluate_coupling`).
    :param exact: Per feature map, the exact GP's values of every split.
    :param couplings: Couplings per feature map.
    :param frequencies: Frequencies per feature map.
    :param settings: The run's settings, recorded as they are.
    :param include_noise: Whether the KL compares predictive (noisy) posteriors.
    :param latent_jitter: Relative jitter of the latent posteriors.
    :param gp_optimizer: The exact-GP optimiser (for the notes).
    :param standardise_targets: Whether targets were standardised (for the notes).
    :param rff_lengthscale: The fixed RFF lengthscale, if any (for the notes).
    :return: ``settings``, ``notes``, ``exact_gp`` and ``results`` of the report.
    """
    results = []
    for (kind, name), rows in per_split.items():
        row: dict[str, Any] = {"features": kind, "coupling": name, "num_frequencies": frequencies[kind]}
        for metric in ("kernel_rmse", "kl_per_test_point", "predictive_rmse"):
            row[metric] = summarize(r[metric] for r in rows)
        if BASELINE in couplings[kind]:
            baseline = per_split[kind, BASELINE]
            for metric in ("kernel_rmse", "predictive_rmse"):
                row[f"{metric}_vs_iid"] = summarize(
                    r[metric] / b[metric] for r, b in zip(rows, baseline))
        results.append(row)
    kl_note = ("KL(exact || approximate) of the predictive posteriors (noise included), nats per test point"
               if include_noise else
               f"KL(exact || approximate) of the latent posteriors (paper, eq. (43) in Appendix B.2) with jitter "
               f"{latent_jitter:g} * outputscale on both covariances, nats per test point")
    notes = [
        "kernel_rmse: test Gram block, unit amplitude, root of the mean square over draws",
        f"kl_per_test_point: {kl_note}",
        "*_vs_iid: per-split ratio to the iid coupling; mean and se over splits",
        f"exact GP fitted by {gp_optimizer} to {'standardised' if standardise_targets else 'raw'} targets"
        + ("" if rff_lengthscale is None else f"; RFF lengthscale fixed at {rff_lengthscale:g}"),
    ]
    return {
        "settings": settings,
        "notes": notes,
        "exact_gp": {kind: {key: summarize(values) for key, values in record.items()}
                     for kind, record in exact.items()},
        "results": results,
    }
