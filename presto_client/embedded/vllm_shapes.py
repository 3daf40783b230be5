"""vLLM 0.32's ``/v1/completions`` response shapes, rendered from plain values (server side).

One copy for every server of this project that speaks vLLM's dialect: the embedded engine
(:mod:`presto_client.embedded.api`) and the test emulation (``tests/support/emulation.py``,
whose content ``benchmarks/latency_server.py`` serves too). Shapes copied from recorded vLLM
0.32 responses (``tests/fixtures/vllm_cpu``). Pure functions of values: no model, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

LOGPROB_FLOOR = -9999.0
"""vLLM writes ``-inf`` logprobs as ``-9999.0`` (OpenAI's convention)."""


def floor(logprob: float) -> float:
    """A logprob as vLLM writes it (``-inf`` and below the floor: the floor)."""
    return max(logprob, LOGPROB_FLOOR)


def top_logprobs_entry(
    sampled: tuple[str, float], top: Iterable[tuple[str, float]]
) -> dict[str, float]:
    """One position's ``top_logprobs`` dict: the sampled token first, then the top-K; a key
    already present keeps its first value (vLLM lists the sampled token again among the top)."""
    name, logprob = sampled
    out = {name: floor(logprob)}
    for key, value in top:
        out.setdefault(key, floor(value))
    return out


def completion_logprobs(
    tokens: Sequence[str],
    token_logprobs: Sequence[float],
    top_logprobs: Sequence[dict[str, float]],
    offset: int = 0,
) -> dict[str, Any]:
    """``CompletionLogProbs`` of ``tokens`` (their strings), the text offsets from ``offset``."""
    text_offset: list[int] = []
    for token in tokens:
        text_offset.append(offset)
        offset += len(token)
    return {
        "text_offset": text_offset,
        "token_logprobs": list(token_logprobs),
        "tokens": list(tokens),
        "top_logprobs": list(top_logprobs),
    }


def prompt_logprobs_entry(entries: Iterable[tuple[int, float, int, str]]) -> dict[str, Any]:
    """One prompt position of ``prompt_logprobs``: ``(token id, logprob, rank, decoded)`` for the
    prompt token first, then the top-K, keyed by bare token id (a repeated id keeps its first)."""
    out: dict[str, Any] = {}
    for token_id, logprob, rank, decoded in entries:
        out.setdefault(
            str(token_id), {"logprob": floor(logprob), "rank": rank, "decoded_token": decoded}
        )
    return out


def completion_choice(
    index: int,
    text: str,
    logprobs: dict[str, Any] | None,
    finish_reason: str | None,
    *,
    token_ids: list[int] | None,
    prompt_logprobs: list[Any] | None,
    prompt_token_ids: list[int] | None,
) -> dict[str, Any]:
    """One choice of a non-streamed completion."""
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": token_ids,
        "prompt_logprobs": prompt_logprobs,
        "prompt_token_ids": prompt_token_ids,
        "routed_experts": None,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def completion_body(
    request_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    prompt_tokens: int,
    completion_tokens: int,
    *,
    system_fingerprint: str,
) -> dict[str, Any]:
    """The envelope of a non-streamed completion around its choices."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": system_fingerprint,
        "usage": {
            **usage(prompt_tokens, completion_tokens),
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def stream_choice(
    text: str,
    logprobs: dict[str, Any] | None,
    finish_reason: str | None,
    *,
    prompt_token_ids: list[int] | None,
    token_ids: list[int] | None,
) -> dict[str, Any]:
    """The choice of one SSE event of a streamed (single-prompt) completion."""
    return {
        "index": 0,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "prompt_token_ids": prompt_token_ids,
        "token_ids": token_ids,
    }


def stream_event(
    request_id: str, created: int, model: str, choice: dict[str, Any]
) -> dict[str, Any]:
    """One SSE event (without ``data:`` framing) carrying ``choice``."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def usage_event(
    request_id: str,
    created: int,
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    system_fingerprint: str | None = None,
) -> dict[str, Any]:
    """The final usage event of a stream (``stream_options.include_usage``)."""
    out: dict[str, Any] = {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens),
    }
    if system_fingerprint is not None:
        out["system_fingerprint"] = system_fingerprint
    return out
