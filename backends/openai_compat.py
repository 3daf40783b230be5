"""A generic OpenAI-compatible completions server (e.g. llama.cpp's server): raw one-call mode.

The server must return *raw* top-K logprobs with token ids (llama.cpp: ``n_probs`` without
``post_sampling_probs``; entries carry ``id``), so ``log q_τ`` is a certified interval from the
top-K. Two response shapes are parsed: the legacy completions shape (``logprobs.tokens``,
``token_logprobs``, ``top_logprobs`` as a list of dicts) and the chat shape
(``logprobs.content[i]`` with ``top_logprobs`` lists). There is no scoring call: ``Engine.score``
is not available and the probe cannot check the logprob semantics.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from presto_client.backends.adapter import Adapter, DialectTraits, HttpCall
from presto_client.backends.completions import parse_completion_logprobs
from presto_client.backends.parsing import TokenLogprobs, check_length, logprob_value, topk_rows
from presto_client.backends.tokenizer_calls import SERVER_TOKENIZER, ServerTokenizer
from presto_client.core.engine_protocol import ProposalRequest
from presto_client.errors import InvalidResponseError


def _entry_id(entry: dict[str, Any], label: str, what: str) -> int:
    tid = entry.get("id", entry.get("token_id"))
    if isinstance(tid, int) and not isinstance(tid, bool):
        return tid
    token = entry.get("token")
    if isinstance(token, str) and token.startswith("token_id:"):
        text = token.removeprefix("token_id:")
        if text.lstrip("-").isdigit():
            return int(text)
    raise InvalidResponseError(
        f"{label}: {what} has no token id (the server must return ids, e.g. llama.cpp's `id` "
        "or `token_id:<id>` tokens); text keys collide and cannot be used"
    )


def parse_chat_logprobs(
    logprobs: dict[str, Any], k: int, *, label: str, expect: int | None
) -> TokenLogprobs:
    """The chat shape: ``logprobs.content = [{id|token, logprob, top_logprobs: [...]}, ...]``."""
    content = logprobs.get("content")
    if not isinstance(content, list):
        raise InvalidResponseError(f"{label}: logprobs.content is missing")
    if expect is not None:
        check_length(len(content), expect, label=label)
    ids: list[int] = []
    values: list[float] = []
    rows: list[list[tuple[int, float]]] = []
    for i, item in enumerate(content):
        if not isinstance(item, dict):
            raise InvalidResponseError(f"{label}: logprobs.content[{i}] is malformed")
        ids.append(_entry_id(item, label, f"logprobs.content[{i}]"))
        values.append(logprob_value(item.get("logprob"), label=label, what=f"token {i}"))
        top = item.get("top_logprobs")
        if not isinstance(top, list):
            raise InvalidResponseError(f"{label}: logprobs.content[{i}].top_logprobs is missing")
        rows.append(
            [
                (
                    _entry_id(e, label, f"top_logprobs[{i}]"),
                    logprob_value(e.get("logprob"), label=label, what=f"top_logprobs[{i}]"),
                )
                for e in top
                if isinstance(e, dict)
            ]
        )
    top_ids, top_lps = topk_rows(rows, k, label=label)
    return TokenLogprobs(np.asarray(ids, dtype=np.int64), np.asarray(values), top_ids, top_lps)


def parse_openai_choice(
    choice: dict[str, Any], k: int, *, label: str, expect: int | None
) -> TokenLogprobs:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        raise InvalidResponseError(f"{label}: the response carries no logprobs")
    if "content" in logprobs:
        return parse_chat_logprobs(logprobs, k, label=label, expect=expect)
    return parse_completion_logprobs(choice, k, label=label, expect=expect)


class OpenAICompatAdapter(Adapter):
    traits: ClassVar[DialectTraits] = DialectTraits(
        dialect="openai",
        streaming=True,
        start_hint=(
            "start an OpenAI-compatible completions server there (e.g. `llama-server -m "
            "MODEL.gguf --port PORT`)"
        ),
    )

    @property
    def tokenizer(self) -> ServerTokenizer:
        return SERVER_TOKENIZER

    def build_generate(
        self, request: ProposalRequest, model: str, *, label: str, stream: bool = False
    ) -> HttpCall:
        if not request.prefix:
            raise ValueError("a proposal needs a non-empty prefix (the prompt)")
        k = int(self.spec.top_k)
        payload: dict[str, Any] = {
            "model": model,
            "prompt": [int(t) for t in request.prefix],
            "max_tokens": int(request.num_tokens),
            "temperature": float(request.temperature),
            "top_p": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "seed": int(request.seed),
            "logprobs": k,
            "n": 1,
            "echo": False,
            "stream": bool(stream),
            # Engine extras understood by llama.cpp (and ignored elsewhere): raw top-K
            # probabilities, temperature as the only sampler, EOS ignored.
            "n_probs": k,
            "post_sampling_probs": False,
            "samplers": ["temperature"],
            "top_k": 0,
            "min_p": 0.0,
            "repeat_penalty": 1.0,
            "ignore_eos": True,
            "cache_prompt": True,
            "return_tokens_as_token_ids": True,
        }
        return HttpCall("/v1/completions", payload, label, stream=stream)

    def parse_generate(self, request: ProposalRequest, body: Any, *, label: str) -> TokenLogprobs:
        if not isinstance(body, dict):
            raise InvalidResponseError(f"{label}: the response is not a JSON object")
        choices = body.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            raise InvalidResponseError(f"{label}: expected exactly one choice")
        return parse_openai_choice(
            choices[0], self.spec.top_k, label=label, expect=request.num_tokens
        )

    def parse_stream_event(
        self, request: ProposalRequest, event: Any, *, label: str
    ) -> TokenLogprobs | None:
        if not isinstance(event, dict):
            raise InvalidResponseError(f"{label}: a stream event is not a JSON object")
        if event.get("error"):
            err = event["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            raise InvalidResponseError(f"{label}: the engine reported an error: {msg}")
        choices = event.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            return None
        logprobs = choices[0].get("logprobs")
        if not isinstance(logprobs, dict):
            return None
        if not (logprobs.get("content") or logprobs.get("token_logprobs")):
            return None
        return parse_openai_choice(choices[0], self.spec.top_k, label=label, expect=None)

    def hint_for_scoring(self) -> str:
        return (
            "this OpenAI-compatible server has no prompt-scoring call; Engine.score needs a "
            "vllm or sglang backend"
        )
