"""eval_stats against brute force and known values (issue 11)."""

from __future__ import annotations

import itertools
import math

import pytest

from presto_client.orchestration.results.eval_stats import (
    accuracy,
    mcnemar,
    mcnemar_exact_p,
    mean_pass_at_k,
    pass_at_k,
    wilson_interval,
)


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_matches_enumeration(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_1_is_accuracy_and_mean() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert mean_pass_at_k([(4, 1), (4, 4), (2, 0)], 2) == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert mean_pass_at_k([(1, 1)], 2) is None
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_wilson_known_values() -> None:
    low, high = wilson_interval(5, 10)
    assert (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(81, 263)  # Wikipedia-style example: 0.308 [0.255, 0.366]
    assert (low, high) == pytest.approx((0.2553, 0.3662), abs=1e-3)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))
    acc = accuracy([True, False, True, True])
    assert (acc.correct, acc.n, acc.accuracy) == (3, 4, 0.75)
    assert acc.low < 0.75 < acc.high


def test_mcnemar_known_table() -> None:
    # b = 2, c = 8: 2 * (C(10,0)+C(10,1)+C(10,2)) / 2^10 = 112/1024
    assert mcnemar_exact_p(2, 8) == pytest.approx(0.109375)
    assert mcnemar_exact_p(1, 9) == pytest.approx(22 / 1024)
    assert mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(5, 5) == 1.0
    scipy_stats = pytest.importorskip("scipy.stats")
    for b, c in [(3, 11), (0, 6), (7, 2), (20, 35)]:
        ref = scipy_stats.binomtest(b, b + c, 0.5).pvalue
        assert mcnemar_exact_p(b, c) == pytest.approx(ref, rel=1e-9)


def test_mcnemar_table_from_pairs() -> None:
    a = [True, True, False, False, True, False]
    b = [True, False, True, False, False, False]
    m = mcnemar(a, b)
    assert (m.both, m.a_only, m.b_only, m.neither, m.n_pairs) == (1, 2, 1, 2, 6)
    assert m.p_value == pytest.approx(1.0)
    with pytest.raises(ValueError):
        mcnemar([True], [True, False])


def test_paired_bootstrap_of_the_accuracy_difference() -> None:
    """Issue 50: a paired bootstrap beside McNemar (the difference in points, with its 95 %
    percentile interval), reproducible for one run."""
    from presto_client.orchestration.results.eval_stats import paired_bootstrap

    a = [True] * 60 + [False] * 40
    b = [True] * 40 + [False] * 60  # a is right on 20 more items, wrong on none b gets
    diff, low, high = paired_bootstrap(a, b)
    assert diff == pytest.approx(0.2) and 0.1 < low < 0.2 < high < 0.3
    assert paired_bootstrap(a, b) == (diff, low, high)  # fixed seed
    same = paired_bootstrap(a, a)
    assert same == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="paired"):
        paired_bootstrap(a, b[:3])
