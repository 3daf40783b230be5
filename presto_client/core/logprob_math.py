"""Turning raw top-K logprobs into certified ``log q_τ`` intervals and entropy estimates.

With ``a = 1/τ``, ``log q_τ(x) = a·log p0(x) − log Z`` where ``Z = Σ_v p0(v)^a``. From the top-K
raw logprobs of a position (returned set ``S``, tail mass ``M = 1 − Σ_S p0``, smallest returned
probability ``p_K``) every tail token has ``p ≤ p_K``, so:

* ``a > 1``: ``Σ_S p^a ≤ Z ≤ Σ_S p^a + M·p_K^(a−1)``;
* ``a = 1``: ``Z = 1`` exactly;
* ``a < 1``: ``Σ_S p^a + M·p_K^(a−1) ≤ Z ≤ Σ_S p^a + n^(1−a)·M^a`` (``n`` tail tokens, by
  concavity), which needs the vocabulary size.

Every engine adapter derives its intervals here, so the bound is written once. The entropy
estimate ``−Σ_S p log p − M·log p_K`` is the top-K-with-tail lower bound of ``H``: a
deterministic function of what the engine returned, as EntropyCut's cut law requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from presto_client.core.engine_protocol import FloatArray


@dataclass(frozen=True, slots=True)
class PositionScores:
    """Scores derived for a run of positions (one row per position)."""

    logq_lo: FloatArray  # [n, M]
    logq_hi: FloatArray  # [n, M]
    entropy: FloatArray | None  # [n]; None when not asked for
    log_z_lo: FloatArray  # [n, M]
    log_z_hi: FloatArray  # [n, M]


def scores_from_topk(
    sampled_logp0: FloatArray,
    top_logp0: FloatArray,
    temperatures: Sequence[float],
    vocab_size: int | None = None,
    *,
    entropy: bool = True,
) -> PositionScores:
    """Certified ``log q`` intervals of the sampled tokens from raw top-K logprobs.

    ``sampled_logp0``: ``[n]`` raw logprob of each sampled token. ``top_logp0``: ``[n, K]`` raw
    top-K logprobs per position, deduplicated by token id, padded with ``-inf``. The sampled token
    may or may not be among them. With the full vocabulary in ``top_logp0`` the interval is exact
    up to rounding. ``entropy=False`` skips the entropy estimate (``None`` in the result): most
    requests do not ask for it, and it is a third of the work.
    """
    sampled = np.asarray(sampled_logp0, dtype=np.float64)
    top = np.asarray(top_logp0, dtype=np.float64)
    if top.ndim != 2 or top.shape[0] != sampled.shape[0]:
        raise ValueError(f"top_logp0 must be [n, K] with n={sampled.shape[0]}, got {top.shape}")
    if np.isnan(sampled).any() or np.isnan(top).any():
        raise ValueError("NaN logprob: the engine failed on this proposal")
    # (Fewer, fused numpy calls than the formulas read: every value is computed by
    # the same operations on the same operands, so the results are bit-identical; one errstate
    # for the whole body, as entering one costs more than a small array's arithmetic.)
    finite = np.isfinite(top)
    top0 = np.where(finite, top, 0.0)
    probs = np.where(finite, np.exp(top0), 0.0)
    mass = probs.sum(axis=1)
    tail = np.maximum(1.0 - mass, 0.0)  # what np.clip(x, 0.0, None) computes
    # In log space (exp(a·log p) underflows to 0 for large a = 1/τ, e.g. α = 500: log Z = −inf).
    log_pk = np.where(finite, top, np.inf).min(axis=1)
    log_pk[~np.isfinite(log_pk)] = 0.0
    n = sampled.shape[0]
    n_temps = len(temperatures)
    log_z_lo = np.empty((n, n_temps))
    log_z_hi = np.empty((n, n_temps))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        log_tail = np.log(tail)
        entropy_est: FloatArray | None = None
        if entropy:
            # Smallest returned probability bounds every token outside the returned set.
            p_k = np.where(finite, probs, np.inf).min(axis=1)
            p_k[~np.isfinite(p_k)] = 1.0
            positive = probs > 0
            plogp = np.where(positive, probs * np.log(np.where(positive, probs, 1.0)), 0.0)
            entropy_est = -plogp.sum(axis=1) + np.where(tail > 0, -tail * np.log(p_k), 0.0)
        for m, tau in enumerate(temperatures):
            if tau <= 0:
                raise ValueError(f"temperature must be > 0, got {tau}")
            a = 1.0 / tau
            if abs(a - 1.0) <= 1e-12:  # np.isclose(a, 1, rtol=0, atol=1e-12), without its cost
                log_z_lo[:, m] = 0.0
                log_z_hi[:, m] = 0.0
                continue
            # Every sum is taken relative to its largest head term (a max shift), so that
            # Z's terms never underflow: log Z = shift + log Σ exp(term − shift).
            scaled = np.where(finite, a * top0, -np.inf)
            shift = scaled.max(axis=1)
            shift[~np.isfinite(shift)] = 0.0
            scaled -= shift[:, None]
            head = np.exp(scaled).sum(axis=1)
            # tail · p_K^(a−1), the tail's share when a > 1 (and its floor when a < 1)
            tail_pk = np.exp(log_tail + (a - 1.0) * log_pk - shift)
            if a > 1.0:
                lo = head
                hi = head + tail_pk
            else:
                if vocab_size is None:
                    raise ValueError(
                        f"temperature {tau} > 1 needs the vocabulary size to bound the tail"
                    )
                n_returned = finite.sum(axis=1)
                n_tail = np.clip(vocab_size - n_returned, 0, None).astype(np.float64)
                lo = head + tail_pk
                hi = head + np.exp((1.0 - a) * np.log(n_tail) + a * log_tail - shift)
                lo = np.minimum(lo, hi)
            log_z_lo[:, m] = np.log(lo) + shift
            log_z_hi[:, m] = np.log(hi) + shift
    # Every temperature at once, outside the errstate: a NaN here still warns.
    a_sampled = sampled[:, None] * np.array([1.0 / tau for tau in temperatures])
    logq_lo = a_sampled - log_z_hi
    logq_hi = a_sampled - log_z_lo
    return PositionScores(logq_lo, logq_hi, entropy_est, log_z_lo, log_z_hi)


def exact_scores(
    sampled_ids: Sequence[int] | np.ndarray,
    full_logp0: FloatArray,
    temperatures: Sequence[float],
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(log p0, log q [n, M], entropy)`` of sampled tokens from full-vocabulary logprobs."""
    full = np.asarray(full_logp0, dtype=np.float64)
    ids = np.asarray(sampled_ids, dtype=np.int64)
    rows = np.arange(full.shape[0])
    logp0 = full[rows, ids]
    logq = np.empty((full.shape[0], len(temperatures)))
    for m, tau in enumerate(temperatures):
        scaled = full / tau
        logq[:, m] = scaled[rows, ids] - _logsumexp_rows(scaled)
    p = np.exp(full)
    entropy = -(p * np.where(p > 0, full, 0.0)).sum(axis=1)
    return logp0, logq, entropy


def _logsumexp_rows(x: FloatArray) -> FloatArray:
    top = x.max(axis=1, keepdims=True)
    out: FloatArray = (top + np.log(np.exp(x - top).sum(axis=1, keepdims=True)))[:, 0]
    return out


def log_softmax(logits: FloatArray) -> FloatArray:
    """Row-wise log-softmax."""
    x = np.atleast_2d(np.asarray(logits, dtype=np.float64))
    return x - _logsumexp_rows(x)[:, None]
