"""vLLM's OpenAI-compatible ``/v1/completions`` dialect.

Modes (the server's ``--logprobs-mode`` is server-wide, the probe checks it):

* ``raw`` (server ``raw_logprobs``, vLLM's default): one call per proposal; returned logprobs
  are ``log p0``; ``log q_τ`` for every temperature is a certified interval from the top-K.
* ``processed`` (server ``processed_logprobs``): the sampled token's logprob is the exact
  ``log q_τ``; ``log p0`` and the raw top-K come from a second, scoring call
  (``prompt = prefix + suffix``, ``max_tokens: 1``, ``prompt_logprobs: K`` at temperature 1;
  prompt logprobs are always raw).

Every sampling knob is sent explicitly, or the server fills it from the model's
``generation_config.json``. One HTTP request per proposal: a multi-prompt request shares one seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from presto_client.backends.adapter import (
    RAW,
    SCALED,
    Adapter,
    DialectTraits,
    HttpCall,
    OneCallScoring,
    ScoringCalls,
)
from presto_client.backends.completions import fast_completion_logprobs, parse_completion_logprobs
from presto_client.backends.parsing import (
    TokenLogprobs,
    check_ids,
    logprob_value,
    token_id_value,
    topk_rows,
)
from presto_client.backends.tokenizer_calls import SERVER_TOKENIZER, ServerTokenizer
from presto_client.core.engine_protocol import ProposalRequest
from presto_client.errors import InvalidResponseError

PROCESSED = "processed"

# Knobs that would change the sampled distribution, all set to "off".
NEUTRAL_SAMPLING: dict[str, Any] = {
    "top_p": 1.0,
    "top_k": 0,  # vLLM >= 0.8: 0 disables (it quietly accepts -1 too)
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_tokens": 0,
    "n": 1,
    "echo": False,
    "ignore_eos": True,
    "skip_special_tokens": False,
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
}


def _choices(body: Any, label: str) -> list[dict[str, Any]]:
    if not isinstance(body, dict):
        raise InvalidResponseError(f"{label}: the response is not a JSON object")
    if body.get("error"):
        err = body["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        raise InvalidResponseError(f"{label}: the engine reported an error: {msg}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise InvalidResponseError(f"{label}: the response has no choices")
    if not all(isinstance(c, dict) for c in choices):
        raise InvalidResponseError(f"{label}: malformed choices")
    return choices


def _merge_stream_choices(events: Sequence[Any]) -> dict[str, Any] | None:
    """The token chunks of several stream events as one choice (``None``: not plain chunks)."""
    ids: list[Any] = []
    values: list[Any] = []
    top: list[Any] = []
    for event in events:
        if not isinstance(event, dict) or event.get("error"):
            return None
        choices = event.get("choices")
        if not choices:
            continue  # the usage chunk
        choice = choices[0] if isinstance(choices, list) else None
        if not isinstance(choice, dict):
            return None
        logprobs = choice.get("logprobs")
        token_ids = choice.get("token_ids")
        if not token_ids and not (isinstance(logprobs, dict) and logprobs.get("token_logprobs")):
            continue  # no tokens in this event (the final, empty one)
        if not isinstance(token_ids, list) or not isinstance(logprobs, dict):
            return None
        lps, rows = logprobs.get("token_logprobs"), logprobs.get("top_logprobs")
        if not isinstance(lps, list) or not isinstance(rows, list):
            return None
        ids += token_ids
        values += lps
        top += rows
    return {"token_ids": ids, "logprobs": {"token_logprobs": values, "top_logprobs": top}}


class VllmAdapter(OneCallScoring, Adapter):
    traits: ClassVar[DialectTraits] = DialectTraits(
        dialect="vllm",
        modes=(RAW, PROCESSED),
        default_mode=RAW,
        metric_names=("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"),
        streaming=True,
        max_top_k=20,  # --max-logprobs default
        start_hint=(
            "start it with `VLLM_BATCH_INVARIANT=1 vllm serve DIR --port PORT --max-logprobs 20` "
            "on a GPU (bf16, batch-invariant; `--dtype float32` instead on a CPU); or "
            "`bash scripts/vllm_cpu.sh start` for the CPU test server, which serves on port "
            "8765, not 8000 (configs/vllm_cpu.yaml points there; elsewhere add "
            "`--set engines[0].base_url=http://127.0.0.1:8765`)"
        ),
    )

    @property
    def semantics(self) -> str:
        return SCALED if self.mode == PROCESSED else RAW

    @property
    def scoring(self) -> ScoringCalls:
        return self

    @property
    def tokenizer(self) -> ServerTokenizer:
        return SERVER_TOKENIZER

    # ---- generation

    def build_generate(
        self, request: ProposalRequest, model: str, *, label: str, stream: bool = False
    ) -> HttpCall:
        if not request.prefix:
            raise ValueError("a proposal needs a non-empty prefix (the prompt)")
        payload: dict[str, Any] = {
            "model": model,
            "prompt": [int(t) for t in request.prefix],
            "max_tokens": int(request.num_tokens),
            "temperature": float(request.temperature),
            "seed": int(request.seed),
            "logprobs": int(self.spec.top_k),
            **NEUTRAL_SAMPLING,
            "stream": bool(stream),
        }
        return HttpCall("/v1/completions", payload, label, stream=stream)

    def parse_generate(self, request: ProposalRequest, body: Any, *, label: str) -> TokenLogprobs:
        choices = _choices(body, label)
        if len(choices) != 1:
            raise InvalidResponseError(f"{label}: {len(choices)} choices, expected 1")
        return parse_completion_logprobs(
            choices[0], self.spec.top_k, label=label, expect=request.num_tokens
        )

    def parse_stream_event(
        self, request: ProposalRequest, event: Any, *, label: str
    ) -> TokenLogprobs | None:
        if not isinstance(event, dict):
            raise InvalidResponseError(f"{label}: a stream event is not a JSON object")
        if event.get("error"):
            _choices(event, label)  # raises with the server's message
        choices = event.get("choices") or []
        if not choices:
            return None  # the usage chunk
        choice = choices[0]
        if not isinstance(choice, dict):
            raise InvalidResponseError(f"{label}: malformed stream choice")
        has_tokens = bool(choice.get("token_ids")) or bool(
            (choice.get("logprobs") or {}).get("token_logprobs")
        )
        if not has_tokens:
            return None
        return parse_completion_logprobs(choice, self.spec.top_k, label=label, expect=None)

    def parse_stream_events(
        self, request: ProposalRequest, events: Sequence[Any], *, label: str
    ) -> TokenLogprobs | None:
        if len(events) > 1:
            merged = _merge_stream_choices(events)
            if merged is not None:
                fast = fast_completion_logprobs(merged, self.spec.top_k, expect=None)
                if fast is not None:
                    return fast
        # One event, or anything unusual: event by event (errors name the event's own rows).
        return super().parse_stream_events(request, events, label=label)

    def stream_choice(self, events: Sequence[Any]) -> dict[str, Any] | None:
        return _merge_stream_choices(events)

    # ---- scoring (raw prompt logprobs)

    def build_score(
        self, prefix: Sequence[int], token_ids: Sequence[int], model: str, top_k: int, *, label: str
    ) -> HttpCall:
        if not prefix:
            raise ValueError("scoring needs a non-empty prefix")
        payload: dict[str, Any] = {
            "model": model,
            "prompt": [int(t) for t in (*prefix, *token_ids)],
            "max_tokens": 1,
            "temperature": 1.0,
            "seed": 0,
            "prompt_logprobs": int(top_k),
            **NEUTRAL_SAMPLING,
            "stream": False,
        }
        return HttpCall("/v1/completions", payload, label)

    def parse_score(
        self, prefix: Sequence[int], token_ids: Sequence[int], body: Any, top_k: int, *, label: str
    ) -> TokenLogprobs:
        choice = _choices(body, label)[0]
        plp = choice.get("prompt_logprobs")
        total = len(prefix) + len(token_ids)
        if not isinstance(plp, list):
            raise InvalidResponseError(f"{label}: the response carries no prompt_logprobs")
        if len(plp) != total:
            raise InvalidResponseError(
                f"{label}: {len(plp)} prompt_logprobs entries for a {total}-token prompt"
            )
        start = len(prefix)
        values: list[float] = []
        rows: list[list[tuple[int, float]]] = []
        # top_k == -1: the whole vocabulary; 0: no top-K (only the prompt token is listed).
        k = top_k if top_k >= 0 else 10**9
        for j, token in enumerate(token_ids):
            entry = plp[start + j]
            if not isinstance(entry, dict):
                raise InvalidResponseError(f"{label}: prompt_logprobs[{start + j}] is missing")
            row: list[tuple[int, float]] = []
            found: float | None = None
            for key, info in entry.items():
                tid = token_id_value(key, label=label, what="prompt_logprobs key")
                raw = info.get("logprob") if isinstance(info, dict) else info
                lp = logprob_value(raw, label=label, what=f"prompt_logprobs[{start + j}]")
                rank = info.get("rank") if isinstance(info, dict) else None
                if tid == int(token):
                    found = lp
                    # The prompt token is listed in addition to the top-K: it belongs to the
                    # top set only when its rank says so (sorting and cutting to K would drop
                    # it anyway when the rank is missing).
                    if isinstance(rank, int) and rank > k:
                        continue
                row.append((tid, lp))
            if found is None:
                raise InvalidResponseError(
                    f"{label}: prompt_logprobs[{start + j}] lacks the prompt token {token}"
                )
            values.append(found)
            rows.append(row)
        width = top_k if top_k >= 0 else max((len(r) for r in rows), default=0)
        top_ids, top_lps = topk_rows(rows, width, label=label)
        out = TokenLogprobs(
            np.asarray(token_ids, dtype=np.int64), np.asarray(values), top_ids, top_lps
        )
        check_ids(out.token_ids, token_ids, label=label)
        return out

    def build_next_token_topk(
        self, contexts: Sequence[Sequence[int]], temperature: float, model: str, *, label: str
    ) -> list[HttpCall]:
        # One multi-prompt request: the seed is irrelevant, only the logprobs are read.
        payload: dict[str, Any] = {
            "model": model,
            "prompt": [[int(t) for t in c] for c in contexts],
            "max_tokens": 1,
            "temperature": float(temperature),
            "seed": 0,
            "logprobs": int(self.spec.top_k),
            **NEUTRAL_SAMPLING,
            "stream": False,
        }
        return [HttpCall("/v1/completions", payload, label)]

    def parse_next_token_topk(
        self, calls: Sequence[HttpCall], bodies: Sequence[Any], n: int, *, label: str
    ) -> TokenLogprobs:
        choices = _choices(bodies[0], label)
        if len(choices) != n:
            raise InvalidResponseError(f"{label}: {len(choices)} choices for {n} prompts")
        choices = sorted(choices, key=lambda c: int(c.get("index", 0)))
        out = TokenLogprobs.empty(self.spec.top_k)
        for choice in choices:
            out = out.concat(
                parse_completion_logprobs(choice, self.spec.top_k, label=label, expect=1)
            )
        return out

    def full_vocab_top_k(self) -> int | None:
        return -1

    # ---- hints

    def hint_for_semantics(self, detected: str) -> str:
        if detected == SCALED:
            return (
                "the server returns processed (temperature-scaled) logprobs; set "
                "logprob_mode: processed, or restart vLLM with --logprobs-mode raw_logprobs"
            )
        return (
            "the server returns raw logprobs; set logprob_mode: raw, or restart vLLM with "
            "--logprobs-mode processed_logprobs"
        )

    def hint_for_scoring(self) -> str:
        return (
            "exact scoring (Engine.score) in raw mode needs full-vocabulary prompt logprobs: "
            "restart vLLM with --max-logprobs -1, or use logprob_mode: processed "
            "(server --logprobs-mode processed_logprobs)"
        )

    def hint_for_seeds(self) -> str:
        return (
            "identical seeds gave different tokens: run vLLM in --dtype float32 (bf16 results "
            "depend on batching)"
        )
