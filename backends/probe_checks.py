"""What the probe of an HTTP engine sends, and how it reads the answers: the logprob semantics
(raw ``log p0`` or the temperature-scaled ``log q_τ``) told apart from one generation and the
exact scoring of its tokens. Pure numpy over parsed answers; the engine does the requests."""

from __future__ import annotations

import numpy as np

from presto_client.backends.adapter import RAW, SCALED, Adapter
from presto_client.backends.parsing import TokenLogprobs
from presto_client.backends.spec import ProbeReport
from presto_client.core.engine_protocol import FloatArray
from presto_client.core.logprob_math import scores_from_topk

# Probe settings: a short prompt, a few tokens at a low temperature.
PROBE_PROMPT: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
PROBE_TOKENS = 8
PROBE_TEMPERATURE = 0.25
PROBE_SEED = 1234
SEMANTICS_INDISTINCT = 1e-3
"""Below this mean difference raw and scaled logprobs cannot be told apart (confident tokens)."""
SEMANTICS_DRIFT_WARN = 0.05
"""Above this the matching hypothesis still leaves a large numeric drift (bf16?)."""


def judge_semantics(
    generated: TokenLogprobs,
    raw: TokenLogprobs,
    adapter: Adapter,
    vocab_size: int | None,
    report: ProbeReport,
) -> None:
    """Which semantics the generation's logprobs have (against the raw scores of the same
    tokens), written into ``report``: a mismatch with the adapter's mode is a problem, an
    inconclusive probe or a large drift a warning."""
    returned = generated.logprobs
    # Differences to the sampled token of every token in both top-K lists are exact under
    # either hypothesis, whatever the normaliser: raw, Δ returned = Δ log p0; scaled,
    # Δ returned = Δ log p0 / τ. They separate the two even on confident positions.
    rel_raw, rel_scaled = relative_diffs(generated, raw)
    # Each hypothesis also fixes the sampled token's own value: log p0, or log q_τ inside
    # the certified interval from the raw top-K.
    d_raw = np.abs(returned - raw.logprobs)
    derived = scores_from_topk(raw.logprobs, raw.top_logprobs, (PROBE_TEMPERATURE,), vocab_size)
    lo, hi = derived.logq_lo[:, 0], derived.logq_hi[:, 0]
    d_scaled = np.maximum(np.maximum(lo - returned, returned - hi), 0.0)
    mean_raw = float(np.mean(np.concatenate([d_raw, rel_raw])))
    mean_scaled = float(np.mean(np.concatenate([d_scaled, rel_scaled])))
    report.details["probe_mean_diff_raw"] = mean_raw
    report.details["probe_mean_diff_scaled"] = mean_scaled
    report.details["probe_topk_pairs"] = float(rel_raw.size)
    if abs(mean_raw - mean_scaled) < SEMANTICS_INDISTINCT:
        report.warnings.append(
            "logprob semantics inconclusive: the probe tokens were near-deterministic"
        )
        return
    detected = RAW if mean_raw < mean_scaled else SCALED
    report.details["probe_detected_scaled"] = float(detected == SCALED)
    expected = adapter.semantics
    worst = (
        np.concatenate([d_raw, rel_raw])
        if expected == RAW
        else np.concatenate([d_scaled, rel_scaled])
    )
    report.max_abs_logprob_diff = float(np.max(worst))
    if detected != expected:
        report.problems.append(
            f"logprob semantics mismatch (configured mode {adapter.mode!r}): "
            f"{adapter.hint_for_semantics(detected)}"
        )
    elif report.max_abs_logprob_diff > SEMANTICS_DRIFT_WARN:
        report.warnings.append(
            f"returned logprobs differ from the scoring call by up to "
            f"{report.max_abs_logprob_diff:.3g} nats: run the server batch-invariant (on a GPU, "
            "vLLM with VLLM_BATCH_INVARIANT=1, SGLang with --enable-deterministic-inference; "
            "on a CPU, float32)"
        )


def relative_diffs(generated: TokenLogprobs, raw: TokenLogprobs) -> tuple[FloatArray, FloatArray]:
    """|Δgen − Δraw| and |Δgen − Δraw/τ| over the tokens in both top-K lists of a position,
    Δ taken against the sampled token."""
    rel_raw: list[float] = []
    rel_scaled: list[float] = []
    for i in range(len(generated)):
        gen_row = {
            int(t): float(v)
            for t, v in zip(generated.top_ids[i], generated.top_logprobs[i], strict=True)
            if t >= 0 and np.isfinite(v)
        }
        raw_row = {
            int(t): float(v)
            for t, v in zip(raw.top_ids[i], raw.top_logprobs[i], strict=True)
            if t >= 0 and np.isfinite(v)
        }
        s_gen, s_raw = float(generated.logprobs[i]), float(raw.logprobs[i])
        if not (np.isfinite(s_gen) and np.isfinite(s_raw)):
            continue
        for token in gen_row.keys() & raw_row.keys():
            if token == int(generated.token_ids[i]):
                continue
            d_gen = gen_row[token] - s_gen
            d_raw = raw_row[token] - s_raw
            rel_raw.append(abs(d_gen - d_raw))
            rel_scaled.append(abs(d_gen - d_raw / PROBE_TEMPERATURE))
    return np.asarray(rel_raw, dtype=np.float64), np.asarray(rel_scaled, dtype=np.float64)


DRIFT_BATCHES = (2, 8, 32)
"""Batch sizes the drift probe scores its context in (up to the engine's concurrency)."""
DRIFT_HINT = (
    "serve it batch-invariant to replay token for token (vLLM on a GPU: VLLM_BATCH_INVARIANT=1, "
    "bf16; SGLang: --enable-deterministic-inference; on a CPU: float32)"
)


def drift_batches(max_concurrency: int) -> list[int]:
    """The probe's batch sizes for an engine of ``max_concurrency`` requests at once."""
    return sorted({min(b, max_concurrency) for b in DRIFT_BATCHES if min(b, max_concurrency) > 1})


def judge_drift(
    alone: FloatArray, beside: list[tuple[int, FloatArray]], report: ProbeReport
) -> None:
    """How far the logprobs of one context move when it is scored beside other requests
    (``beside``: batch size and logprobs, against ``alone``), written into ``report``: the
    largest and the median drift in nats per token, and a warning when they are not zero."""
    diffs = np.concatenate([np.abs(lp - alone) for _, lp in beside]) if beside else np.zeros(0)
    finite = diffs[np.isfinite(diffs)]
    worst = float(finite.max()) if finite.size else 0.0
    if finite.size < diffs.size:  # a token -inf in one batch and finite in another
        worst = float("inf")
    report.details["drift_max_nats"] = worst
    report.details["drift_median_nats"] = float(np.median(finite)) if finite.size else 0.0
    report.details["drift_batch_max"] = float(max((b for b, _ in beside), default=1))
    if worst > 0.0:
        report.warnings.append(
            f"the server's logprobs change with the batch a request shares: up to {worst:.3g} "
            f"nats per token (median {report.details['drift_median_nats']:.3g}) in batches of "
            f"up to {int(report.details['drift_batch_max'])} requests. Chains use the numbers "
            "it returns (both sides of every ratio from the same call), so each decision is "
            "the kernel's on those numbers, but a replay of the sequential chain token for "
            f"token is not expected; {DRIFT_HINT}"
        )
