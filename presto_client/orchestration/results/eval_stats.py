"""Statistics of graded runs: accuracy with a Wilson interval, the exact McNemar test
of two paired arms, and the unbiased pass@k estimator of Chen et al. (2021)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Z95 = 1.959963984540054  # the 97.5 % quantile of the standard normal


@dataclass(frozen=True, slots=True)
class Accuracy:
    """``correct`` of ``n`` graded answers, with its Wilson interval at ``confidence``."""

    correct: int
    n: int
    low: float
    high: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else math.nan

    def as_dict(self) -> dict[str, Any]:
        return {
            "correct": self.correct,
            "n": self.n,
            "accuracy": self.accuracy if self.n else None,
            "ci95_low": self.low if self.n else None,
            "ci95_high": self.high if self.n else None,
        }


def wilson_interval(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95 % by default); (nan, nan) if n = 0."""
    if not 0 <= correct <= n:
        raise ValueError(f"need 0 <= correct <= n, got correct={correct}, n={n}")
    if n == 0:
        return (math.nan, math.nan)
    p = correct / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = (z / denom) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    low = 0.0 if correct == 0 else max(0.0, center - half)
    high = 1.0 if correct == n else min(1.0, center + half)
    return (low, high)


def accuracy(grades: Iterable[bool]) -> Accuracy:
    """Accuracy of a sequence of right/wrong grades with its 95 % Wilson interval."""
    values = list(grades)
    k, n = sum(1 for g in values if g), len(values)
    low, high = wilson_interval(k, n)
    return Accuracy(k, n, low, high)


@dataclass(frozen=True, slots=True)
class McNemar:
    """Paired comparison of arm A against arm B: ``a_only`` pairs right under A only, ``b_only``
    right under B only; ``p_value`` is the exact two-sided McNemar test (binomial(b+c, 1/2))."""

    n_pairs: int
    both: int
    a_only: int
    b_only: int
    neither: int
    p_value: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "n_pairs": self.n_pairs,
            "both": self.both,
            "a_only": self.a_only,
            "b_only": self.b_only,
            "neither": self.neither,
            "p_value": self.p_value,
        }


def mcnemar_exact_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for ``b`` and ``c`` discordant pairs: twice the smaller
    binomial(b + c, 1/2) tail, capped at 1 (1.0 when there is no discordant pair)."""
    if b < 0 or c < 0:
        raise ValueError("discordant counts must be non-negative")
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2.0 * tail / 2.0**n)


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> McNemar:
    """The exact McNemar test of two paired grade sequences (same items, same order)."""
    if len(a) != len(b):
        raise ValueError(f"paired sequences differ in length: {len(a)} vs {len(b)}")
    both = sum(1 for x, y in zip(a, b, strict=True) if x and y)
    a_only = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    b_only = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    neither = len(a) - both - a_only - b_only
    return McNemar(len(a), both, a_only, b_only, neither, mcnemar_exact_p(a_only, b_only))


def paired_bootstrap(
    a: Sequence[bool], b: Sequence[bool], *, draws: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """The accuracy difference ``a − b`` of paired grades and its 95 % percentile interval
    from ``draws`` resamples of the pairs (fixed ``seed``: the same run reports the same)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need paired, non-empty sequences, got {len(a)} and {len(b)}")
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), (draws, len(diff)))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(diff.mean()), float(low), float(high)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: 1 - C(n-c, k) / C(n, k)
    (Chen et al. 2021), computed as a stable product."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(per_item: Iterable[tuple[int, int]], k: int) -> float | None:
    """Mean pass@k over items given as (n samples, c correct); items with n < k are skipped
    (None when none is left)."""
    values = [pass_at_k(n, c, k) for n, c in per_item if n >= k]
    return sum(values) / len(values) if values else None
