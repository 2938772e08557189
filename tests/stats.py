"""Statistical helpers for tests: every tolerance is a number of standard errors."""

from __future__ import annotations

import numpy as np
from scipy import stats


def mean_and_standard_error(samples: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sample mean and its standard error along ``axis``."""
    samples = np.asarray(samples, dtype=np.float64)
    count = samples.shape[axis]
    return samples.mean(axis=axis), samples.std(axis=axis, ddof=1) / np.sqrt(count)


def assert_unbiased(samples: np.ndarray, expected: np.ndarray, *, z: float = 5.0,
                    axis: int = 0, floor: float = 1e-12) -> None:
    """Assert that the mean of ``samples`` matches ``expected`` within ``z`` standard errors.

    ``z`` should be chosen for the number of simultaneous comparisons (with K
    entries, z = 5 gives a family-wise false-alarm rate below K * 6e-7). Entries whose
    standard error is below ``floor`` must match to ``floor`` (deterministic entries).
    """
    mean, se = mean_and_standard_error(samples, axis=axis)
    expected = np.broadcast_to(np.asarray(expected, dtype=np.float64), mean.shape)
    tolerance = z * np.maximum(se, floor)
    bad = np.abs(mean - expected) > tolerance
    if np.any(bad):
        worst = np.argmax(np.abs(mean - expected) / tolerance)
        raise AssertionError(
            f"{bad.sum()} of {bad.size} entries differ by more than {z} standard errors; "
            f"worst: mean={mean.flat[worst]:.6g}, expected={expected.flat[worst]:.6g}, "
            f"se={se.flat[worst]:.3g}")


def assert_geometric(lengths: np.ndarray, p_halt: float, *, alpha: float = 1e-3) -> None:
    """Chi-square goodness-of-fit test of lengths against Geom(p) on {0, 1, ...}."""
    lengths = np.asarray(lengths).ravel()
    n = lengths.size
    # Merge the tail so that every expected count is at least 5.
    k_max = 0
    while n * (1 - p_halt) ** (k_max + 1) >= 5 and k_max < 10_000:
        k_max += 1
    observed = np.bincount(np.minimum(lengths, k_max), minlength=k_max + 1)
    probs = p_halt * (1 - p_halt) ** np.arange(k_max + 1)
    probs[-1] = (1 - p_halt) ** k_max
    result = stats.chisquare(observed, n * probs)
    assert result.pvalue > alpha, f"lengths are not Geom({p_halt}): chi2 p-value {result.pvalue:.2e}"
