"""The embedded engine's vLLM API without HTTP: request validation and responses.

:class:`EmbeddedApp` turns a decoded JSON request into engine requests and the engine's events
into vLLM 0.32's response shapes (rendered by :mod:`presto_client.embedded.vllm_shapes`); what
vLLM would refuse or what would change the sampled distribution is a 400 (:class:`ApiError`).
:mod:`presto_client.embedded.server` carries it over HTTP.
"""

from __future__ import annotations

import json
import math
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from http import HTTPStatus
from typing import Any

from presto_client.embedded import vllm_shapes
from presto_client.embedded.batching import (
    BatchingEngine,
    BatchingError,
    Event,
    Failed,
    Finished,
    PromptScores,
    SamplingParams,
    TokenEvent,
)
from presto_client.embedded.model import SERVED_MODEL_NAME, LoadedModel

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


def _check_fields(body: dict[str, Any]) -> None:
    """Refuse a field the engine does not know, and one it knows only at its neutral values:
    either could change the sampled distribution, which the engine will not guess at."""
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


def _max_tokens(body: dict[str, Any]) -> int:
    """``max_tokens``: at least 1; 16 when absent (vLLM's default)."""
    max_tokens = _opt_int(body, "max_tokens")
    if max_tokens is None:
        max_tokens = 16
    if max_tokens < 1:
        raise ApiError(
            f"max_tokens must be at least 1, got {max_tokens}.",
            param="max_tokens",
            value=max_tokens,
        )
    return max_tokens


def _temperature(body: dict[str, Any]) -> float:
    """``temperature``: in [0, 2]; 1 when absent."""
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
    return temperature


def _seed(body: dict[str, Any]) -> int:
    """``seed``: 64 bits; a fresh random one when absent."""
    seed = _opt_int(body, "seed")
    if seed is not None and not -(2**63) <= seed < 2**64:
        raise ApiError("seed must fit in 64 bits", param="seed", value=seed)
    if seed is None:
        seed = secrets.randbits(63)
    return seed


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    """``stream_options.include_usage`` (stream options only with ``stream=True``)."""
    stream_options = body.get("stream_options")
    if stream_options is None:
        return False
    if not stream:
        raise ApiError("Stream options can only be defined when `stream=True`.")
    if not isinstance(stream_options, dict):
        raise ApiError("stream_options must be an object", param="stream_options")
    return bool(stream_options.get("include_usage", False))


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
        # As prometheus_client's process collector writes it (no labels): a client tells a
        # restart from it, since the counters above restart from zero with the server.
        lines.append(
            "# HELP process_start_time_seconds Start time of the process since unix epoch "
            "in seconds."
        )
        lines.append("# TYPE process_start_time_seconds gauge")
        lines.append(f"process_start_time_seconds {float(self.started)}")
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
        """Validate a ``/v1/completions`` body (raises :class:`ApiError`).

        The checks' order decides which fault a body with several is refused for: keep it."""
        self.check_model(body)
        _check_fields(body)
        prompts = self._completion_prompts(body)
        self._check_context(prompts)
        max_tokens = _max_tokens(body)
        temperature = _temperature(body)
        seed = _seed(body)
        stream = _flag(body, "stream", False)
        logprobs = self._logprob_count(body, "logprobs", "sample")
        prompt_logprobs = self._logprob_count(body, "prompt_logprobs", "prompt")
        if stream and prompt_logprobs:
            raise ApiError(
                "`prompt_logprobs` are not available when `stream=True`.",
                param="prompt_logprobs",
            )
        include_usage = _include_usage(body, stream)
        stop_ids = self._stop_ids(body)
        if stream and len(prompts) > 1:
            raise ApiError(
                "the embedded engine streams one prompt per request; send several streamed "
                "requests concurrently instead (they are batched)",
                param="prompt",
            )
        ignore_eos = _flag(body, "ignore_eos", False)
        max_len = self.config.max_model_len
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

    def _check_context(self, prompts: list[list[int]]) -> None:
        """Every prompt leaves room for at least one output token in the model's context."""
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

    def _stop_ids(self, body: dict[str, Any]) -> list[int]:
        """``stop_token_ids``: a list of the vocabulary's ids (none: ``[]``)."""
        stop_ids_raw = body.get("stop_token_ids") or []
        if not isinstance(stop_ids_raw, list):
            raise ApiError("stop_token_ids must be a list of token ids", param="stop_token_ids")
        return self.check_ids(stop_ids_raw, "stop_token_ids")

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
