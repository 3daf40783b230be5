"""From normalised logprobs to :class:`~presto_client.core.engine_protocol.ScoredTokens`: the one
place where this happens for HTTP engines, for every dialect.

:class:`TokenLogprobs` is the normalised record every dialect's parser returns (the backends'
parsing toolkit builds it); the functions below turn it into scores.

Raw top-K logprobs become certified ``log q`` intervals, always through
:func:`presto_client.core.logprob_math.scores_from_topk` (the math itself); this module adds
what an engine's answers need around it: a scaled generation's exact column, exact scores from
full-vocabulary rows or from scaled normalisers, and the errors a user can act on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from presto_client.core.engine_protocol import FloatArray, IntArray, ScoredTokens, ScoreSpec
from presto_client.core.logprob_math import scores_from_topk
from presto_client.errors import ConfigError, InvalidResponseError


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """Per-token logprobs as an engine returned them, normalised (one row per token).

    ``logprobs`` is what the engine returned for each token (raw or scaled: see the adapter's
    semantics); ``top_ids``/``top_logprobs`` are the returned top-K, deduplicated by id, sorted
    by decreasing logprob, cut to K and padded with ``-1``/``-inf``.
    """

    token_ids: IntArray
    logprobs: FloatArray
    top_ids: IntArray
    top_logprobs: FloatArray

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @classmethod
    def empty(cls, k: int) -> TokenLogprobs:
        return cls(
            np.zeros(0, dtype=np.int64),
            np.zeros(0),
            np.zeros((0, k), dtype=np.int64),
            np.zeros((0, k)),
        )

    def concat(self, other: TokenLogprobs) -> TokenLogprobs:
        k = max(self.top_ids.shape[1], other.top_ids.shape[1])
        a, b = self.padded(k), other.padded(k)
        return TokenLogprobs(
            np.concatenate([a.token_ids, b.token_ids]),
            np.concatenate([a.logprobs, b.logprobs]),
            np.concatenate([a.top_ids, b.top_ids]),
            np.concatenate([a.top_logprobs, b.top_logprobs]),
        )

    @staticmethod
    def joined(parts: Sequence[TokenLogprobs]) -> TokenLogprobs:
        """The parts one after the other, as :meth:`concat` in turn gives them, in one copy
        (a whole-vocabulary row per position: concat in turn copied them quadratically)."""
        k = max(part.top_ids.shape[1] for part in parts)
        padded = [part.padded(k) for part in parts]
        return TokenLogprobs(
            np.concatenate([part.token_ids for part in padded]),
            np.concatenate([part.logprobs for part in padded]),
            np.concatenate([part.top_ids for part in padded]),
            np.concatenate([part.top_logprobs for part in padded]),
        )

    def padded(self, k: int) -> TokenLogprobs:
        have = self.top_ids.shape[1]
        if have >= k:
            return self
        n = len(self)
        return TokenLogprobs(
            self.token_ids,
            self.logprobs,
            np.concatenate([self.top_ids, np.full((n, k - have), -1, dtype=np.int64)], axis=1),
            np.concatenate([self.top_logprobs, np.full((n, k - have), -np.inf)], axis=1),
        )


ROW_TOLERANCE = 1e-3
"""How far the sampled token's own logprob may be from its row's entry for that token (or above
the row's smallest entry, when it is not among them): both come from one softmax of one
position, so only rounding separates them (fp32 ~1e-6; fp16/bf16 engines ~1e-3)."""


def check_rows_match_tokens(raw: TokenLogprobs, *, what: str = "logprobs") -> None:
    """Raise :class:`InvalidResponseError` unless every position's top-K row is the
    distribution its sampled token was drawn from: the token's returned logprob equals its entry
    in the row, or, when the token is not in the row, is no larger than the row's smallest
    entry (else it would have been among the top K). An engine or proxy whose rows are shifted
    by a position (each row the next position's) fails this at once, where its chains would
    otherwise finish with other MH decisions."""
    n = len(raw)
    if n == 0 or raw.top_ids.shape[1] == 0:
        return
    in_row = raw.top_ids == raw.token_ids[:, None]
    present = in_row.any(axis=1)
    row_value = np.where(in_row, raw.top_logprobs, -np.inf).max(axis=1)
    finite = np.isfinite(raw.logprobs)
    gap = np.abs(raw.logprobs - row_value)
    bad_present = present & finite & ~(gap <= ROW_TOLERANCE)
    valid = raw.top_ids >= 0
    full = valid.all(axis=1)
    smallest = np.where(valid, raw.top_logprobs, np.inf).min(axis=1)
    bad_absent = ~present & full & finite & (raw.logprobs > smallest + ROW_TOLERANCE)
    bad = np.flatnonzero(bad_present | bad_absent)
    if bad.size == 0:
        return
    i = int(bad[0])
    token = int(raw.token_ids[i])
    if present[i]:
        detail = f"its row gives it {row_value[i]:.6g}"
    else:
        detail = f"it is missing from its top-{raw.top_ids.shape[1]} row, whose smallest entry is "
        detail += f"{smallest[i]:.6g}"
    raise InvalidResponseError(
        f"{what}: token {token} at position {i} has logprob {raw.logprobs[i]:.6g} but {detail} "
        f"({bad.size} of {n} positions disagree): the rows do not belong to the sampled tokens "
        "(shifted by a position?). A broken server or proxy; the chain is failed rather than "
        "decided on wrong numbers"
    )


def _derive(
    logp0: FloatArray,
    top: FloatArray,
    spec: ScoreSpec,
    vocab_size: int | None,
    *,
    entropy: bool | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray | None]:
    """``scores_from_topk``'s intervals, and its entropy when ``entropy`` (default: when
    ``spec`` asks for it; skipped otherwise)."""
    want_entropy = spec.entropy if entropy is None else entropy
    try:
        derived = scores_from_topk(logp0, top, spec.temperatures, vocab_size, entropy=want_entropy)
    except ValueError as exc:
        if "vocabulary size" in str(exc):
            raise ConfigError(
                f"{exc}: set vocab_size in the engine spec to use temperatures above 1"
            ) from exc
        raise InvalidResponseError(str(exc)) from exc
    return derived.logq_lo, derived.logq_hi, derived.entropy


def scored_from_raw(
    raw: TokenLogprobs, spec: ScoreSpec, vocab_size: int | None = None
) -> ScoredTokens:
    """Scores from raw logprobs: ``log p0`` as returned, ``log q`` as certified intervals."""
    check_rows_match_tokens(raw)
    return scored_from_top_values(raw.token_ids, raw.logprobs, raw.top_logprobs, spec, vocab_size)


def scored_from_top_values(
    token_ids: IntArray,
    logprobs: FloatArray,
    top_logprobs: FloatArray,
    spec: ScoreSpec,
    vocab_size: int | None = None,
) -> ScoredTokens:
    """:func:`scored_from_raw` from the values alone (``[n, K]``, as
    :class:`TokenLogprobs` holds them): the scores read no id of a row; the rows' checks are
    the caller's."""
    lo, hi, entropy = _derive(logprobs, top_logprobs, spec, vocab_size)
    return ScoredTokens(
        token_ids=token_ids,
        logp0=logprobs,
        logq_lo=lo,
        logq_hi=hi,
        entropy=entropy if spec.entropy else None,
    )


def scored_from_scaled(
    generated: TokenLogprobs,
    temperature: float,
    raw: TokenLogprobs,
    spec: ScoreSpec,
    vocab_size: int | None = None,
) -> ScoredTokens:
    """Scores from a scaled generation plus a raw scoring of the same tokens (two-call mode).

    ``generated.logprobs`` are exact ``log q_τ`` at the request ``temperature``: they fill the
    columns of that temperature exactly. ``log p0`` comes from ``raw``; the other temperatures
    and the entropy are derived from ``raw``'s top-K. ``meta["scaled_outside_interval"]`` is the
    largest distance of an exact value from its certified interval (numeric drift between the
    two calls; 0 when consistent).
    """
    if not np.array_equal(generated.token_ids, raw.token_ids):
        raise InvalidResponseError("the scoring call did not score the generated tokens")
    # (The scaled generation's own rows are not checked: a dialect may return them raw.)
    check_rows_match_tokens(raw, what="scored logprobs")
    lo, hi, entropy = _derive(raw.logprobs, raw.top_logprobs, spec, vocab_size)
    lo = lo.copy()
    hi = hi.copy()
    drift = 0.0
    for m, tau in enumerate(spec.temperatures):
        if math.isclose(tau, temperature, rel_tol=1e-9, abs_tol=1e-12):
            exact = generated.logprobs
            outside = np.maximum(lo[:, m] - exact, exact - hi[:, m])
            if outside.size:
                drift = max(drift, float(np.max(np.where(np.isfinite(outside), outside, 0.0))))
            lo[:, m] = exact
            hi[:, m] = exact
    return ScoredTokens(
        token_ids=raw.token_ids,
        logp0=raw.logprobs,
        logq_lo=lo,
        logq_hi=hi,
        entropy=entropy if spec.entropy else None,
        meta={"scaled_outside_interval": drift},
    )


FULL_ROWS_AT_ONCE = 8
"""Positions whose whole-vocabulary tables are built together: each is ``vocab`` float64s
(49,152 for SmolLM2: 0.4 MB) times the temporaries below; all of a 128-token proposal at once
took ~750 MB at four scorings together. Every result is its row's alone, so any chunking
gives the same numbers."""


def exact_from_full_rows(
    token_ids: Sequence[int], raw: TokenLogprobs, spec: ScoreSpec, vocab_size: int
) -> ScoredTokens:
    """Exact scores from full-vocabulary raw rows (``raw.top_*`` holds every token)."""
    n = len(token_ids)
    logq = np.empty((n, len(spec.temperatures)))
    entropy = np.empty(n)
    for start in range(0, n, FULL_ROWS_AT_ONCE):
        rows = slice(start, min(n, start + FULL_ROWS_AT_ONCE))
        logq[rows], entropy[rows] = _full_row_scores(raw, rows, spec, vocab_size)
    return ScoredTokens.exact(token_ids, raw.logprobs, logq, entropy if spec.entropy else None)


def _full_row_scores(
    raw: TokenLogprobs, rows: slice, spec: ScoreSpec, vocab_size: int
) -> tuple[FloatArray, FloatArray]:
    top_ids, top_logprobs, logp0 = raw.top_ids[rows], raw.top_logprobs[rows], raw.logprobs[rows]
    n = len(logp0)
    full = np.full((n, vocab_size), -np.inf)
    for i in range(n):
        valid = top_ids[i] >= 0
        ids = top_ids[i][valid]
        if ids.size and ids.max() >= vocab_size:
            raise InvalidResponseError(
                f"token id {int(ids.max())} outside the vocabulary of {vocab_size}"
            )
        full[i, ids] = top_logprobs[i][valid]
    # Renormalise over what was returned (rounding of a float32 softmax).
    logq = np.empty((n, len(spec.temperatures)))
    for m, tau in enumerate(spec.temperatures):
        scaled = full / tau
        top = np.max(scaled, axis=1, keepdims=True)
        log_z = (top + np.log(np.sum(np.exp(scaled - top), axis=1, keepdims=True)))[:, 0]
        logq[:, m] = logp0 / tau - log_z
    p = np.exp(full)
    entropy = -np.sum(np.where(p > 0, p * np.where(np.isfinite(full), full, 0.0), 0.0), axis=1)
    return logq, entropy


def exact_from_normalisers(
    raw: TokenLogprobs,
    scaled_next: dict[float, TokenLogprobs],
    spec: ScoreSpec,
    *,
    label: str,
) -> ScoredTokens:
    """Exact scores of given tokens from a raw scoring plus scaled next-token top-K rows.

    ``scaled_next[τ]`` row ``i`` holds the temperature-``τ`` top-K at position ``i`` (same
    context as ``raw`` row ``i``). For any token ``j`` in both top sets, ``log Z_τ =
    log p0(j)/τ − log q_τ(j)`` exactly, hence ``log q_τ(x) = log p0(x)/τ − log Z_τ``.
    """
    n = len(raw)
    logq = np.empty((n, len(spec.temperatures)))
    for m, tau in enumerate(spec.temperatures):
        if math.isclose(tau, 1.0, rel_tol=0.0, abs_tol=1e-12):
            logq[:, m] = raw.logprobs
            continue
        rows = scaled_next[tau]
        for i in range(n):
            raw_row = {
                int(t): float(v)
                for t, v in zip(raw.top_ids[i], raw.top_logprobs[i], strict=True)
                if t >= 0 and np.isfinite(v)
            }
            raw_row.setdefault(int(raw.token_ids[i]), float(raw.logprobs[i]))
            common = [
                (raw_row[int(t)], int(t), float(v))
                for t, v in zip(rows.top_ids[i], rows.top_logprobs[i], strict=True)
                if int(t) in raw_row and np.isfinite(v)
            ]
            if not common:
                raise InvalidResponseError(
                    f"{label}: no token in both the raw and the scaled top-K at position {i}"
                )
            lp_raw, _, lq = max(common)
            log_z = lp_raw / tau - lq
            logq[i, m] = raw.logprobs[i] / tau - log_z
    entropy = None
    if spec.entropy:
        entropy = _derive(raw.logprobs, raw.top_logprobs, ScoreSpec((1.0,)), None, entropy=True)[2]
    return ScoredTokens.exact(raw.token_ids, raw.logprobs, logq, entropy)
