"""Bootstrap confidence intervals of per-prompt scores (``scipy.stats.bootstrap``, percentile method).

A checkpoint's score on a domain is the mean of one value per held-out prompt; two checkpoints are
compared *paired*: the prompts are resampled together, i.e. the mean of the per-prompt differences
``after[i] - before[i]`` is bootstrapped (Efron & Tibshirani 1993, §16.4). The percentile method is
used because the values are mostly 0/1 and often all equal (BCa is undefined there); all-equal
values give the degenerate interval ``[m, m]``.
"""

from __future__ import annotations

import numpy as np

RESAMPLES = 10_000


def mean_ci(values: list[float] | np.ndarray, confidence: float = 0.95, resamples: int = RESAMPLES,
            seed: int = 0) -> tuple[float, float, float]:
    """``(mean, ci_low, ci_high)`` of ``values`` (float ``[n]``, one per prompt).

    Raises:
        ValueError: ``values`` is empty, or ``confidence`` is not in (0, 1).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no values to bootstrap (0 prompts scored)")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    m = float(x.mean())
    if x.size < 2 or np.all(x == x[0]):
        return m, m, m
    from scipy.stats import bootstrap

    res = bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=resamples, method="percentile",
                    vectorized=True, rng=np.random.default_rng(seed))
    return m, float(res.confidence_interval.low), float(res.confidence_interval.high)


def paired_delta_ci(after: list[float] | np.ndarray, before: list[float] | np.ndarray, confidence: float = 0.95,
                    resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """``(delta, ci_low, ci_high)`` of ``mean(after) - mean(before)``, prompts resampled in pairs.

    Raises:
        ValueError: the two have different lengths (not the same prompts), or are empty.
    """
    a, b = np.asarray(after, dtype=np.float64), np.asarray(before, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired scores need the same prompts: {a.size} after vs {b.size} before")
    return mean_ci(a - b, confidence, resamples, seed)
