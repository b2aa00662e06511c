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


def _mean_of_means_ci(samples: list[np.ndarray], confidence: float, resamples: int,
                      seed: int) -> tuple[float, float, float]:
    """``(m, ci_low, ci_high)`` of the mean of the samples' means, each sample resampled on its own."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    m = float(np.mean([x.mean() for x in samples]))
    if all(x.size < 2 or np.all(x == x[0]) for x in samples):
        return m, m, m
    from scipy.stats import bootstrap

    def statistic(*xs: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.mean([x.mean(axis=axis) for x in xs], axis=0)

    res = bootstrap(tuple(samples), statistic, confidence_level=confidence, n_resamples=resamples,
                    method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    return m, float(res.confidence_interval.low), float(res.confidence_interval.high)


def mean_ci(values: list[float] | np.ndarray, confidence: float = 0.95, resamples: int = RESAMPLES,
            seed: int = 0) -> tuple[float, float, float]:
    """``(mean, ci_low, ci_high)`` of ``values`` (float ``[n]``, one per prompt).

    Raises:
        ValueError: ``values`` is empty, or ``confidence`` is not in (0, 1).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no values to bootstrap (0 prompts scored)")
    return _mean_of_means_ci([x], confidence, resamples, seed)


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


def domain_mean_delta_ci(pairs: list[tuple[list[float], list[float]]], confidence: float = 0.95,
                         resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """``(delta, ci_low, ci_high)`` of the mean over domains of ``mean(after) - mean(before)``: one
    ``(after, before)`` pair of per-prompt scores per domain, each domain's prompts resampled in pairs
    and independently of the other domains' (a stratified bootstrap: ``scipy.stats.bootstrap`` with one
    sample of differences per domain).

    Raises:
        ValueError: no domain, or a pair of different lengths.
    """
    if not pairs:
        raise ValueError("no domain to average")
    diffs = []
    for after, before in pairs:
        a, b = np.asarray(after, dtype=np.float64), np.asarray(before, dtype=np.float64)
        if a.shape != b.shape or a.size == 0:
            raise ValueError(f"paired scores need the same, non-empty prompts: {a.size} after vs {b.size} before")
        diffs.append(a - b)
    return _mean_of_means_ci(diffs, confidence, resamples, seed)


Values = tuple[list[str], list[float]]
"""``(uuids, per-prompt values)``: one checkpoint's scores on one set of prompts."""


def interval(values: list[float], confidence: float = 0.95) -> dict[str, float]:
    """``{"mean", "ci_low", "ci_high", "n"}`` of ``values`` (:func:`mean_ci`); the form reports and results store."""
    m, lo, hi = mean_ci(values, confidence)
    return {"mean": m, "ci_low": lo, "ci_high": hi, "n": len(values)}


def paired(after: Values, before: Values) -> tuple[list[float], list[float]]:
    """The two checkpoints' values on the prompts (uuids) both scored, in ``after``'s order."""
    b = dict(zip(*before, strict=True))
    common = [(v, b[u]) for u, v in zip(*after, strict=True) if u in b]
    return [c[0] for c in common], [c[1] for c in common]


def paired_delta(after: Values | None, before: Values | None, confidence: float = 0.95) -> dict[str, float] | None:
    """``{"delta", "ci_low", "ci_high", "n"}`` of ``after - before`` on the prompts both scored
    (:func:`paired`, :func:`paired_delta_ci`), or ``None`` when either is missing or they share no prompt."""
    if after is None or before is None:
        return None
    a, b = paired(after, before)
    if not a:
        return None
    d, lo, hi = paired_delta_ci(a, b, confidence)
    return {"delta": d, "ci_low": lo, "ci_high": hi, "n": len(a)}
