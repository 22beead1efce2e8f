"""Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code").

With n samples per problem of which c are correct, pass@k = 1 - C(n-c, k) / C(n, k), evaluated in
the stable product form 1 - prod_{i=n-c+1}^{n} (1 - k/i), and 1 when n - c < k.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples is correct) from c correct out of n."""
    if not 0 <= c <= n:
        raise ValueError(f"c: {c} is outside [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k: {k} is outside [1, n={n}]; draw at least k samples per problem")
    if n - c < k:
        return 1.0
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(1.0 - np.prod(1.0 - k / i))


def pass_at_k_curve(correct: Sequence[int], n: int, ks: Iterable[int]) -> dict[int, float]:
    """Mean pass@k over problems, for each k; `correct[j]` = correct samples of problem j."""
    correct = [int(c) for c in correct]
    if not correct:
        raise ValueError("correct: no problems; pass at least one count")
    return {int(k): float(np.mean([pass_at_k(n, c, int(k)) for c in correct])) for k in ks}


def powers_of_two(max_k: int) -> list[int]:
    """1, 2, 4, ... up to and including max_k (max_k itself appended if not a power of two)."""
    ks, k = [], 1
    while k <= max_k:
        ks.append(k)
        k *= 2
    if ks[-1] != max_k:
        ks.append(max_k)
    return ks
