"""SGLang's native ``/generate`` dialect (its ``/v1/completions`` loses logprobs to key collisions).

Modes (process-wide on the server, the probe checks it):

* ``scaled`` (SGLang's default): output logprobs are temperature-scaled, i.e. the exact
  ``log q_τ`` of the sampled token; ``log p0`` and the raw top-K come from a cheap scoring call
  (``input_ids = prefix + suffix``, ``max_new_tokens: 0``, ``logprob_start_len = len(prefix) − 1``,
  temperature 1): the radix cache is reused up to ``logprob_start_len``.
* ``raw`` (server started with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``): output logprobs are
  ``log p0``; one call, ``log q`` as certified intervals from the top-K.

``sampling_seed`` is ignored unless the server runs with ``--enable-deterministic-inference``;
the probe says so in the logs. −inf comes back clamped to float32's minimum.
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
    ParsedModels,
    ScoringCalls,
)
from presto_client.backends.parsing import (
    TokenLogprobs,
    check_ids,
    check_length,
    logprob_array,
    logprob_value,
    pair_rows_flat,
    token_id_array,
    token_id_value,
    topk_from_flat,
    topk_rows,
)
from presto_client.backends.tokenizer_calls import SERVER_TOKENIZER, ServerTokenizer
from presto_client.core.engine_protocol import FloatArray, IntArray, ProposalRequest
from presto_client.errors import InvalidResponseError
from presto_client.terminal_text import server_text

NEUTRAL_SAMPLING: dict[str, Any] = {
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_new_tokens": 0,
    "ignore_eos": True,
    "skip_special_tokens": False,
    "no_stop_trim": True,
}


def _meta(body: Any, label: str) -> dict[str, Any]:
    if isinstance(body, list):
        if len(body) != 1:
            raise InvalidResponseError(f"{label}: {len(body)} results, expected 1")
        body = body[0]
    if not isinstance(body, dict):
        raise InvalidResponseError(f"{label}: the response is not a JSON object")
    if body.get("error"):
        err = body["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        raise InvalidResponseError(f"{label}: the engine reported an error: {msg}")
    meta = body.get("meta_info")
    if not isinstance(meta, dict):
        raise InvalidResponseError(f"{label}: the response has no meta_info")
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise InvalidResponseError(
            f"{label}: the engine aborted it: {server_text(finish.get('message'))}"
        )
    return meta


def _triples(
    entries: Any, label: str, what: str, *, first_null: bool = False
) -> tuple[IntArray, FloatArray]:
    if not isinstance(entries, list):
        raise InvalidResponseError(f"{label}: meta_info.{what} is missing")
    fast = _fast_triples(entries, first_null=first_null)
    if fast is not None:
        return fast
    ids, values = _triples_per_token(entries, label, what, first_null=first_null)
    return np.asarray(ids, dtype=np.int64), np.asarray(values, dtype=np.float64)


def _fast_triples(entries: list[Any], *, first_null: bool) -> tuple[IntArray, FloatArray] | None:
    """``[[logprob, id, text], ...]`` as arrays in C-level passes (``None``: unusual)."""
    flat = pair_rows_flat([entries], value_at=0, id_at=1)
    if flat is None:
        return None
    ids_list, values_list, _ = flat
    ids = token_id_array(ids_list)
    if ids is None:
        return None
    if first_null and values_list:
        rest = logprob_array(values_list[1:])
        if rest is None:
            return None
        return ids, np.concatenate([np.full(1, np.nan), rest])
    values = logprob_array(values_list)
    if values is None:
        return None
    return ids, values


def _triples_per_token(
    entries: list[Any], label: str, what: str, *, first_null: bool = False
) -> tuple[list[int], list[float]]:
    ids: list[int] = []
    values: list[float] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, list | tuple) or len(entry) < 2:
            raise InvalidResponseError(f"{label}: malformed {what}[{i}]: {entry!r}")
        ids.append(token_id_value(entry[1], label=label, what=f"{what}[{i}]"))
        if first_null and i == 0:
            values.append(float("nan"))
            continue
        values.append(logprob_value(entry[0], label=label, what=f"{what}[{i}]"))
    return ids, values


def _top_rows(entries: Any, n: int, k: int, label: str, what: str) -> tuple[IntArray, FloatArray]:
    if not isinstance(entries, list) or len(entries) != n:
        got = len(entries) if isinstance(entries, list) else "no"
        raise InvalidResponseError(f"{label}: {got} {what} rows for {n} tokens")
    flat = pair_rows_flat(entries, value_at=0, id_at=1)
    if flat is not None:
        ids, lps = token_id_array(flat[0]), logprob_array(flat[1])
        if ids is not None and lps is not None:
            rows = topk_from_flat(ids, lps, flat[2], k)
            if rows is not None:
                return rows
    rows: list[list[tuple[int, float]]] = []
    for i, row in enumerate(entries):
        if not isinstance(row, list):
            raise InvalidResponseError(f"{label}: {what}[{i}] is missing")
        pairs = []
        for entry in row:
            if not isinstance(entry, list | tuple) or len(entry) < 2:
                raise InvalidResponseError(f"{label}: malformed {what}[{i}] entry {entry!r}")
            pairs.append(
                (
                    token_id_value(entry[1], label=label, what=what),
                    logprob_value(entry[0], label=label, what=f"{what}[{i}]"),
                )
            )
        rows.append(pairs)
    return topk_rows(rows, k, label=label)


class SglangAdapter(OneCallScoring, Adapter):
    traits: ClassVar[DialectTraits] = DialectTraits(
        dialect="sglang",
        modes=(SCALED, RAW),
        default_mode=SCALED,
        models_path="/get_model_info",
        metric_names=("sglang:prompt_tokens", "sglang:cached_tokens"),
        start_hint=(
            "start it with `python -m sglang.launch_server --model-path DIR --port PORT "
            "--enable-metrics --enable-deterministic-inference` (SGLang needs a GPU)"
        ),
    )

    @property
    def semantics(self) -> str:
        return SCALED if self.mode == SCALED else RAW

    @property
    def scoring(self) -> ScoringCalls:
        return self

    def parse_models(self, body: Any) -> ParsedModels:
        if isinstance(body, dict) and isinstance(body.get("model_path"), str):
            return ParsedModels([body["model_path"]])
        return super().parse_models(body)

    def _sampling(
        self, temperature: float, max_new_tokens: int, seed: int | None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": int(max_new_tokens),
            "temperature": float(temperature),
            **NEUTRAL_SAMPLING,
        }
        if seed is not None:
            params["sampling_seed"] = int(seed)
        return params

    @property
    def tokenizer(self) -> ServerTokenizer:
        return SERVER_TOKENIZER

    def build_generate(
        self, request: ProposalRequest, model: str, *, label: str, stream: bool = False
    ) -> HttpCall:
        if not request.prefix:
            raise ValueError("a proposal needs a non-empty prefix (the prompt)")
        payload: dict[str, Any] = {
            "input_ids": [int(t) for t in request.prefix],
            "sampling_params": self._sampling(
                request.temperature, request.num_tokens, request.seed
            ),
            "return_logprob": True,
            "top_logprobs_num": int(self.spec.top_k),
            "return_text_in_logprobs": False,
            "stream": False,
        }
        return HttpCall("/generate", payload, label)

    def parse_generate(self, request: ProposalRequest, body: Any, *, label: str) -> TokenLogprobs:
        meta = _meta(body, label)
        ids, values = _triples(meta.get("output_token_logprobs"), label, "output_token_logprobs")
        check_length(len(ids), request.num_tokens, label=label)
        top_ids, top_lps = _top_rows(
            meta.get("output_top_logprobs"), len(ids), self.spec.top_k, label, "output_top_logprobs"
        )
        return TokenLogprobs(np.asarray(ids, dtype=np.int64), np.asarray(values), top_ids, top_lps)

    def build_score(
        self, prefix: Sequence[int], token_ids: Sequence[int], model: str, top_k: int, *, label: str
    ) -> HttpCall:
        if not prefix:
            raise ValueError("scoring needs a non-empty prefix")
        payload: dict[str, Any] = {
            "input_ids": [int(t) for t in (*prefix, *token_ids)],
            "sampling_params": self._sampling(1.0, 0, None),
            "return_logprob": True,
            "logprob_start_len": len(prefix) - 1,
            "top_logprobs_num": int(top_k),
            "return_text_in_logprobs": False,
            "stream": False,
        }
        return HttpCall("/generate", payload, label)

    def parse_score(
        self, prefix: Sequence[int], token_ids: Sequence[int], body: Any, top_k: int, *, label: str
    ) -> TokenLogprobs:
        meta = _meta(body, label)
        ids, values = _triples(
            meta.get("input_token_logprobs"), label, "input_token_logprobs", first_null=True
        )
        n = len(token_ids)
        if len(ids) != n + 1:
            raise InvalidResponseError(
                f"{label}: {len(ids)} input_token_logprobs entries, expected {n + 1} "
                "(the last prefix token, then the scored tokens)"
            )
        tops = meta.get("input_top_logprobs")
        if not isinstance(tops, list) or len(tops) != n + 1:
            raise InvalidResponseError(f"{label}: input_top_logprobs has the wrong length")
        top_ids, top_lps = _top_rows(tops[1:], n, top_k, label, "input_top_logprobs")
        out = TokenLogprobs(
            np.asarray(ids[1:], dtype=np.int64), np.asarray(values[1:]), top_ids, top_lps
        )
        check_ids(out.token_ids, token_ids, label=label)
        return out

    def build_next_token_topk(
        self, contexts: Sequence[Sequence[int]], temperature: float, model: str, *, label: str
    ) -> list[HttpCall]:
        payload: dict[str, Any] = {
            "input_ids": [[int(t) for t in c] for c in contexts],
            "sampling_params": [self._sampling(temperature, 1, 0) for _ in contexts],
            "return_logprob": True,
            "top_logprobs_num": int(self.spec.top_k),
            "return_text_in_logprobs": False,
            "stream": False,
        }
        return [HttpCall("/generate", payload, label)]

    def parse_next_token_topk(
        self, calls: Sequence[HttpCall], bodies: Sequence[Any], n: int, *, label: str
    ) -> TokenLogprobs:
        body = bodies[0]
        if not isinstance(body, list) or len(body) != n:
            raise InvalidResponseError(f"{label}: expected a list of {n} results")
        out = TokenLogprobs.empty(self.spec.top_k)
        for item in body:
            meta = _meta(item, label)
            ids, values = _triples(
                meta.get("output_token_logprobs"), label, "output_token_logprobs"
            )
            check_length(len(ids), 1, label=label)
            top_ids, top_lps = _top_rows(
                meta.get("output_top_logprobs"), 1, self.spec.top_k, label, "output_top_logprobs"
            )
            out = out.concat(
                TokenLogprobs(np.asarray(ids, dtype=np.int64), np.asarray(values), top_ids, top_lps)
            )
        return out

    def full_vocab_top_k(self) -> int | None:
        return self.spec.vocab_size  # SGLang has no cap; it needs the number

    def hint_for_semantics(self, detected: str) -> str:
        if detected == SCALED:
            return (
                "the server returns temperature-scaled logprobs (SGLang's default); set "
                "logprob_mode: scaled, or restart SGLang with SGLANG_RETURN_ORIGINAL_LOGPROB=1"
            )
        return (
            "the server returns raw logprobs (SGLANG_RETURN_ORIGINAL_LOGPROB=1 is set); set "
            "logprob_mode: raw, or restart SGLang without SGLANG_RETURN_ORIGINAL_LOGPROB"
        )

    def hint_for_seeds(self) -> str:
        return (
            "SGLang ignored sampling_seed: restart it with --enable-deterministic-inference, "
            "or proposals are not reproducible (CRN replay and resumes will differ)"
        )

    def hint_for_scoring(self) -> str:
        return (
            "exact scoring in raw mode needs the full vocabulary: set vocab_size in the engine "
            "spec, or use logprob_mode: scaled"
        )
