"""pass@k: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", §2.1)."""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn without replacement from ``n`` samples,
    ``c`` of them correct, is correct: ``1 - C(n-c, k) / C(n, k)``, computed as the stable product
    ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``.

    Exactly 0.0 when ``c == 0`` (for every ``k``). When ``k > n`` every sample is drawn, so the value
    is that of ``k = n``: 1.0 if ``c > 0``. ``pass_at_k(n, c, 1) == c / n`` (the pass rate).

    Raises:
        ValueError: ``n < 1``, ``k < 1`` or ``c`` outside ``[0, n]``.
    """
    if n < 1 or k < 1 or not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs n >= 1, k >= 1 and 0 <= c <= n (got n={n}, c={c}, k={k})")
    if c == 0:
        return 0.0
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
