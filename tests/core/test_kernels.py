"""Kernel-level checks: certified decisions, the MultiTryMH rule, cut laws, interval math."""

from __future__ import annotations

import math

import numpy as np
import pytest

from presto_client.core.engine_protocol import ScoredTokens
from presto_client.core.kernels import EntropyCut, MultiTryMH, PowerMH, race_times
from presto_client.core.logprob_math import exact_scores, log_softmax, scores_from_topk
from presto_client.core.rng import TransitionDraws
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.state import ChainState
from presto_client.errors import InvalidResponseError


def _random_scores(
    rng: np.random.Generator, n: int, temps: tuple[float, ...], vocab: int, top_k: int | None
) -> tuple[ScoredTokens, ScoredTokens]:
    """The same random tokens scored exactly and as top-K intervals."""
    rows = log_softmax(rng.normal(scale=2.0, size=(n, vocab)))
    ids = rng.integers(0, vocab, size=n)
    logp0, logq, entropy = exact_scores(ids, rows, temps)
    exact = ScoredTokens.exact(ids, logp0, logq, entropy)
    if top_k is None:
        return exact, exact
    top = -np.sort(-rows, axis=1)[:, :top_k]
    d = scores_from_topk(logp0, top, temps, vocab)
    return exact, ScoredTokens(exact.token_ids, logp0, d.logq_lo, d.logq_hi, entropy)


@pytest.mark.parametrize("temps", [(0.25,), (0.5,), (1.0,), (2.0,)])
def test_topk_interval_contains_the_exact_logq(temps: tuple[float, ...]) -> None:
    rng = np.random.default_rng(0)
    for top_k in (1, 3, 10, 31):
        exact, interval = _random_scores(rng, 200, temps, 32, top_k)
        assert (interval.logq_lo <= exact.logq_lo + 1e-12).all()
        assert (interval.logq_hi >= exact.logq_lo - 1e-12).all()
    exact, full = _random_scores(rng, 50, temps, 32, 32)
    np.testing.assert_allclose(full.logq_lo, exact.logq_lo, atol=1e-12)
    np.testing.assert_allclose(full.logq_hi, exact.logq_lo, atol=1e-12)


def test_topk_entropy_estimate_is_a_lower_bound_and_exact_on_full_rows() -> None:
    rng = np.random.default_rng(1)
    rows = log_softmax(rng.normal(size=(40, 16)))
    ids = rows.argmax(axis=1)
    _, _, entropy = exact_scores(ids, rows, (1.0,))
    top = -np.sort(-rows, axis=1)
    est5 = scores_from_topk(rows[np.arange(40), ids], top[:, :5], (0.25,)).entropy
    est16 = scores_from_topk(rows[np.arange(40), ids], top, (0.25,)).entropy
    assert est5 is not None and est16 is not None
    assert (est5 <= entropy + 1e-12).all()
    np.testing.assert_allclose(est16, entropy, atol=1e-12)


def test_topk_without_entropy_gives_the_same_intervals_bit_for_bit() -> None:
    """``entropy=False`` (issue 8) skips the estimate and changes nothing else."""
    rng = np.random.default_rng(2)
    rows = log_softmax(rng.normal(scale=3.0, size=(30, 40)))
    top = -np.sort(-rows, axis=1)[:, :20]
    top[::7, 15:] = -np.inf
    sampled = rows[:, 3]
    temps = (1.0, 0.25, 2.0, 1 / 500)
    full = scores_from_topk(sampled, top, temps, 40)
    lean = scores_from_topk(sampled, top, temps, 40, entropy=False)
    assert lean.entropy is None and full.entropy is not None
    for name in ("logq_lo", "logq_hi", "log_z_lo", "log_z_hi"):
        np.testing.assert_array_equal(getattr(lean, name), getattr(full, name))


def test_nan_logprobs_are_refused() -> None:
    with pytest.raises(ValueError, match="NaN"):
        scores_from_topk(np.array([np.nan]), np.array([[-0.1]]), (0.25,))
    kernel = PowerMH(SamplerConfig(block_size=2))
    state = ChainState((0,), ScoredTokens.exact([1, 2], [-1.0, -1.0], np.full((2, 1), -0.5)))
    bad = ScoredTokens.exact([1], [np.nan], np.full((1, 1), -0.5))
    draws = TransitionDraws(0.9, (0,), (0,), 0.5, 0.5)
    with pytest.raises(InvalidResponseError, match="NaN"):
        kernel.evaluate(state, 1, [bad], draws)


def test_minus_infinity_on_both_sides_is_named_not_called_a_nan_logprob() -> None:
    """A token scored -inf in the current sequence and another in the proposal make log A
    -inf minus -inf: the error says so (it said "a proposal came back with NaN logprobs",
    which the parser never lets through)."""
    kernel = PowerMH(SamplerConfig(block_size=2))
    state = ChainState((0,), ScoredTokens.exact([1, 2], [-1.0, -np.inf], np.full((2, 1), -0.5)))
    draws = TransitionDraws(0.9, (0,), (0,), 0.5, 0.5)
    zero = ScoredTokens.exact([3], [-np.inf], np.full((1, 1), -0.5))
    with pytest.raises(InvalidResponseError, match=r"both hold a token scored -inf"):
        kernel.evaluate(state, 1, [zero], draws)
    # On one side only, log A is infinite and decides: a proposal of probability zero is
    # rejected, and one that leaves such a token behind accepted.
    fine = ChainState((0,), ScoredTokens.exact([1, 2], [-1.0, -1.0], np.full((2, 1), -0.5)))
    verdict = kernel.evaluate(fine, 1, [zero], draws)
    assert verdict.decided and not verdict.accepted
    finite = ScoredTokens.exact([3], [-1.0], np.full((1, 1), -0.5))
    verdict = kernel.evaluate(state, 1, [finite], draws)
    assert verdict.decided and verdict.accepted


@pytest.mark.parametrize("sampler", ["power_mh", "entropy_cut", "multi_try_mh"])
def test_certified_verdicts_agree_with_exact_verdicts(sampler: str) -> None:
    """Whenever interval scores decide, the decision is the one exact scores give."""
    rng = np.random.default_rng(2)
    config = SamplerConfig(sampler=sampler, block_size=6, k_try=3)
    kernel = {"power_mh": PowerMH, "entropy_cut": EntropyCut, "multi_try_mh": MultiTryMH}[sampler](
        config
    )
    temps = kernel.score_spec.temperatures
    decided = ambiguous = 0
    for trial in range(400):
        x_exact, x_int = _random_scores(rng, 6, temps, 8, 3)
        cut = kernel.cut(ChainState((0,), x_exact), float(rng.random()))
        pairs = [
            _random_scores(rng, 6 - cut, temps, 8, 3) for _ in range(kernel.sequences_per_proposal)
        ]
        draws = TransitionDraws(
            0.5, (0,) * 3, (0,) * 3, float(rng.random()), float(1 - rng.random())
        )
        exact = kernel.evaluate(ChainState((0,), x_exact), cut, [p[0] for p in pairs], draws)
        certified = kernel.evaluate(ChainState((0,), x_int), cut, [p[1] for p in pairs], draws)
        assert exact.decided, trial
        if certified.decided:
            decided += 1
            assert (certified.accepted, certified.selected) == (exact.accepted, exact.selected)
        else:
            ambiguous += 1
    assert decided > 100 and ambiguous > 0  # both branches were exercised


def test_multi_try_decision_follows_the_textbook_rule() -> None:
    rng = np.random.default_rng(3)
    config = SamplerConfig(sampler="multi_try_mh", block_size=5, k_try=4)
    kernel = MultiTryMH(config)
    temps = kernel.score_spec.temperatures
    for _ in range(300):
        x, _ = _random_scores(rng, 5, temps, 6, None)
        state = ChainState((0,), x)
        cut = int(rng.integers(0, 5))
        candidates = [_random_scores(rng, 5 - cut, temps, 6, None)[0] for _ in range(4)]
        u_sel, u_acc = float(rng.random()), float(1 - rng.random())
        verdict = kernel.evaluate(
            state, cut, candidates, TransitionDraws(0.1, (0,) * 4, (0,) * 4, u_sel, u_acc)
        )
        log_w, _ = kernel.log_weight_bounds(state, cut, candidates)
        w = np.exp(log_w)
        total = w.sum()
        j = int(np.searchsorted(np.cumsum(w), u_sel * total, side="right"))
        accept = u_acc < min(1.0, total / (total - w[j] + 1.0))
        assert verdict.decided
        assert verdict.selected == j
        assert verdict.accepted == accept


def test_multi_try_weights_use_the_mixture_density() -> None:
    config = SamplerConfig(sampler="multi_try_mh", block_size=2, k_try=1, temperatures=(0.5, 1.0))
    kernel = MultiTryMH(config)
    x = ScoredTokens.exact([0, 1], [-1.0, -2.0], np.array([[-0.5, -1.0], [-1.5, -2.0]]))
    y = ScoredTokens.exact([1], [-0.5], np.array([[-0.2, -0.5]]))
    lo, hi = kernel.log_weight_bounds(ChainState((0,), x), 1, [y])
    mix_u = math.log(0.5 * (math.exp(-1.5) + math.exp(-2.0)))
    mix_y = math.log(0.5 * (math.exp(-0.2) + math.exp(-0.5)))
    expected = 4.0 * (-0.5 - (-2.0)) + mix_u - mix_y
    assert lo[0] == pytest.approx(expected) and hi[0] == pytest.approx(expected)


def test_entropy_cut_law_follows_entropy_jumps() -> None:
    kernel = EntropyCut(SamplerConfig(sampler="entropy_cut", block_size=4, beta=2.0))
    entropy = np.array([0.5, 0.2, 1.0, 0.9])
    scores = ScoredTokens.exact([0, 0, 0, 0], np.zeros(4), np.zeros((4, 1)), entropy)
    state = ChainState((0,), scores)
    # Jumps: H1 - 0 = 0.5, 0, 0.8, 0 -> weights 0.25, 0, 0.64, 0.
    weights = kernel.cut_weights(state)
    np.testing.assert_allclose(weights, np.array([0.25, 0, 0.64, 0]) / 0.89)
    draws = np.random.default_rng(0).random(20_000)
    cuts = np.array([kernel.cut(state, float(u)) for u in draws])
    assert set(cuts.tolist()) == {0, 2}  # a position without a jump is never cut
    assert float(np.mean(cuts == 0)) == pytest.approx(0.25 / 0.89, abs=0.015)
    assert kernel.log_cut_probability(state, 1) == -math.inf
    flat = ChainState((0,), ScoredTokens.exact([0, 0], np.zeros(2), np.zeros((2, 1)), np.zeros(2)))
    np.testing.assert_allclose(kernel.cut_weights(flat), [0.5, 0.5])


def test_entropy_cut_race_keeps_the_cut_where_two_states_share_their_weights() -> None:
    """The race couples states: two responses that share their first positions agree on every
    draw whose cut lies among those positions in both. An inverse CDF does not (the totals
    differ), which is what made a speculated EntropyCut cut seldom survive an accept."""
    kernel = EntropyCut(SamplerConfig(sampler="entropy_cut", block_size=12))
    rng = np.random.default_rng(3)
    shared = rng.uniform(0.0, 3.0, size=6)

    def state(tail: np.ndarray) -> ChainState:
        entropy = np.concatenate([shared, tail])
        n = len(entropy)
        return ChainState((0,), ScoredTokens.exact([0] * n, np.zeros(n), np.zeros((n, 1)), entropy))

    x, y = state(rng.uniform(0.0, 3.0, size=6)), state(rng.uniform(0.0, 6.0, size=6))
    both = 0
    for u in rng.random(4_000):
        cut_x, cut_y = kernel.cut(x, float(u)), kernel.cut(y, float(u))
        if cut_x < 6 and cut_y < 6:
            both += 1
            assert cut_x == cut_y
    assert both > 200  # the property was exercised
    # A response that grows keeps its earlier positions' race times.
    np.testing.assert_array_equal(race_times(0.37, 12)[:5], race_times(0.37, 5))
    # A guess from a response that is all in is the cut itself.
    assert kernel.speculative_cut(x, 12, 0.37) == kernel.cut(x, 0.37)


def test_power_mh_log_accept_is_the_suffix_ratio() -> None:
    kernel = PowerMH(SamplerConfig(alpha=2.0, tau=0.5, block_size=3))
    x = ScoredTokens.exact([0, 1, 2], [-1.0, -2.0, -3.0], np.array([[-0.1], [-0.2], [-0.3]]))
    y = ScoredTokens.exact([2, 2], [-0.5, -0.5], np.array([[-0.4], [-0.6]]))
    lo, hi = kernel.log_accept_bounds(ChainState((9,), x), 1, y)
    expected = 2.0 * (-1.0 - (-5.0)) + (-0.5) - (-1.0)
    assert lo == pytest.approx(expected) and hi == pytest.approx(expected)


def test_eps_certainty_classification() -> None:
    kernel = PowerMH(SamplerConfig(block_size=1, epsilon=0.01))
    x = ScoredTokens.exact([0], [-1.0], np.array([[-0.5]]))
    draws = TransitionDraws(0.0, (0,), (0,), 0.5, 0.5)
    state = ChainState((0,), x)
    sure_accept = ScoredTokens.exact([1], [-0.1], np.array([[-0.5]]))
    sure_reject = ScoredTokens.exact([1], [-5.0], np.array([[-0.5]]))
    unsure = ScoredTokens.exact([1], [-1.1], np.array([[-0.5]]))
    assert kernel.evaluate(state, 0, [sure_accept], draws).eps_certain
    assert kernel.evaluate(state, 0, [sure_reject], draws).eps_certain
    assert not kernel.evaluate(state, 0, [unsure], draws).eps_certain


def test_multi_try_ratio_statistics_survive_underflowing_weights() -> None:
    """Weights spread over thousands of nats: the low corner underflows to 0 after the shift.

    The statistics used ``math.log`` of the scaled sum and raised a domain error (found in the
    MultiTryMH streaming benchmark); in log space they stay finite and ordered.
    """
    config = SamplerConfig(sampler="multi_try_mh", block_size=2, k_try=3, alpha=4.0)
    kernel = MultiTryMH(config)
    temps = kernel.score_spec.temperatures
    m = len(temps)
    x = ScoredTokens.exact([0, 1], [-900.0, -900.0], np.full((2, m), -900.0))
    # Candidate scores far above the current state.
    ys = [
        ScoredTokens.exact([2], [-0.1 * (i + 1)], np.full((1, m), -0.1 * (i + 1))) for i in range(3)
    ]
    lo, hi = kernel.log_weight_bounds(ChainState((0,), x), 1, ys)
    lo = lo - 5000.0  # an uncertain box thousands of nats wide: exp(lo - shift) == 0.0
    r_lo, r_hi = MultiTryMH._ratio_bounds(lo, hi, 0)
    assert math.isfinite(r_lo) and math.isfinite(r_hi)
    assert r_lo <= r_hi <= 0.0
    # The same formula as the textbook ratio where nothing underflows.
    w = np.exp(hi - hi.max())
    one = math.exp(-hi.max())
    expected = min(0.0, math.log(w.sum()) - math.log(w.sum() - w[0] + one))
    assert r_hi == pytest.approx(expected) or r_lo == pytest.approx(expected)


def test_multi_try_selects_among_weights_far_below_the_current_state() -> None:
    """Every candidate ~1,000 nats below the current state: scaled by the current state's
    weight they all underflowed to 0 and no candidate was selected, even with exact scores."""
    config = SamplerConfig(sampler="multi_try_mh", block_size=2, k_try=3, alpha=4.0)
    kernel = MultiTryMH(config)
    m = len(kernel.score_spec.temperatures)
    x = ScoredTokens.exact([0, 1], [-0.1, -0.1], np.full((2, m), -0.1))
    ys = [
        ScoredTokens.exact([2], [-300.0 - i], np.full((1, m), -0.1)) for i in range(3)
    ]  # alpha * (log p0(y) - log p0(x)) ~ -1,200 nats
    state = ChainState((0,), x)
    log_w, _ = kernel.log_weight_bounds(state, 1, ys)
    assert log_w.max() < -1000
    w = np.exp(log_w - log_w.max())
    for u_sel in (0.1, 0.5, 0.97):
        verdict = kernel.evaluate(
            state, 1, ys, TransitionDraws(0.1, (0,) * 3, (0,) * 3, u_sel, 0.5)
        )
        j = int(np.searchsorted(np.cumsum(w), u_sel * w.sum(), side="right"))
        assert verdict.decided and verdict.selected == j
        assert not verdict.accepted  # A = W/(W - w_J + 1) ~ e^-1200


def test_the_multi_try_rejection_bound_survives_a_dominant_weight() -> None:
    """``upper()`` in log space: with one weight ~e^800 the linear form's ``1`` underflowed and
    ``log(W − w_J + 1)`` was a log of 0 (a crash of a MultiTryMH stream chain); on ordinary
    weights it is the linear formula."""
    from presto_client.core.kernels import _MultiTryBound

    bound = object.__new__(_MultiTryBound)
    for values in ([800.0, -5.0, -5.0, -5.0], [-900.0, -800.0]):
        weights = np.array(values)
        bound._log_weight_upper = lambda w=weights: w  # type: ignore[method-assign]
        assert math.isfinite(bound.upper()) and bound.upper() <= 0.0
    log_b = [-3.0, -4.0, -2.0]
    bound._log_weight_upper = lambda: np.array(log_b)  # type: ignore[method-assign]
    total = sum(math.exp(x) for x in log_b)
    linear = max(min(0.0, math.log(total) - math.log(total - math.exp(x) + 1)) for x in log_b)
    assert bound.upper() == pytest.approx(linear, abs=1e-12)
