"""HTTP emulation servers: the exact reference model behind vLLM's and SGLang's dialects.

A real HTTP server (stdlib ``ThreadingHTTPServer`` in a thread, on 127.0.0.1, an ephemeral port)
serves a :class:`~presto_client.core.reference.ReferenceModel` (64 tokens by default, so a
top-20 is a real truncation) the way the real engines answer, shapes copied from recorded vLLM 0.32
responses (``tests/fixtures/vllm_cpu``) and from SGLang's sources:

vLLM (``/v1/completions``, ``/health``, ``/v1/models``, ``/metrics``):
  ``raw_logprobs`` / ``processed_logprobs`` modes; the top-logprob dict lists the sampled token
  first, then the top-K (K or K+1 entries), keyed ``token_id:<id>``; ``-inf`` written as
  ``-9999.0``; ``prompt_logprobs`` (always raw) keyed by bare ids with ``rank``, element 0
  ``null``; 400 with vLLM's error body when ``logprobs``/``prompt_logprobs`` exceed
  ``max_logprobs`` (``-1``: the vocabulary); ``top_k`` masking in processed mode (masked tokens
  ``-9999.0``); greedy below τ = 1e-5 (unscaled logprobs); ``prompt + max_tokens`` over
  ``max_model_len`` silently cut, a prompt over it a 400 (``input_tokens``); an unknown model a
  404; a stream's usage chunk only with ``stream_options.include_usage``; seeds honoured (same
  generator as ``ReferenceModel.sample``); multi-prompt
  requests share the seed; SSE streaming with one token per event; prefix-cache counters in
  blocks of ``block_size`` tokens (prompt-logprob requests skip cache reads); with
  ``tokenizer=True`` also ``/tokenize`` and ``/detokenize`` over a toy byte tokenizer.

SGLang (``/generate``, ``/health``, ``/get_model_info``, ``/v1/models``, ``/metrics``):
  scaled output logprobs by default, raw with ``return_original_logprob=True`` (the
  ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` server); ``[logprob, id, null]`` triples; −inf clamped to
  float32's minimum; ``sampling_seed`` ignored unless ``deterministic=True`` (then unseeded
  requests use 42); ``logprob_start_len`` scoring with element 0 ``[null, id, null]``; batches.

Faults for tests (:class:`Faults`): answer an HTTP error N times (with ``Retry-After``), NaN
logprobs, dropped logprobs, one token short, slow responses / slow streams.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from presto_client.core.engine_protocol import FloatArray
from presto_client.core.logprob_math import log_softmax
from presto_client.core.reference import ReferenceModel
from presto_client.embedded import vllm_shapes

logger = logging.getLogger(__name__)

VLLM_SENTINEL = vllm_shapes.LOGPROB_FLOOR
GREEDY_BELOW = 1e-5  # vLLM samples greedily below this temperature
FLOAT32_MIN = -3.4028234663852886e38


class MaskedReferenceModel(ReferenceModel):
    """A reference model whose ``masked`` tokens have probability 0 (``log p0 = −inf``)."""

    def __init__(self, vocab_size: int, *, seed: int = 0, masked: Sequence[int] = ()) -> None:
        super().__init__(vocab_size, seed=seed)
        self.masked = tuple(int(t) for t in masked)

    def logprobs(self, context: Sequence[int]) -> FloatArray:
        if not self.masked:
            return super().logprobs(context)
        key = tuple(map(int, context))
        row = self._cache.get(key)
        if row is None:
            row = super().logprobs(context)
            if self.masked:
                row = row.copy()
                row[list(self.masked)] = -np.inf
                finite = np.isfinite(row)
                row[finite] = log_softmax(row[finite])[0]
                self._cache[key] = row
        return row


@dataclass
class Faults:
    """Faults injected into generation answers (``/v1/completions``, ``/generate``)."""

    fail_times: int = 0
    fail_status: int = 503
    fail_body: dict[str, Any] | None = None
    retry_after: str | None = None
    nan_times: int = 0
    drop_logprobs_times: int = 0
    short_times: int = 0
    delay_s: float = 0.0
    """Sleep before answering (and between streamed events)."""
    stall_streams: bool = False
    """Streams (vLLM ``"stream": true``) send their headers, then only SSE keepalive comments,
    forever: a stream that never ends (until the client closes it or the server stops)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self, name: str) -> bool:
        with self._lock:
            left = getattr(self, name)
            if left > 0:
                setattr(self, name, left - 1)
                return True
            return False


@dataclass
class Stats:
    requests: dict[str, int] = field(default_factory=dict)
    payloads: list[dict[str, Any]] = field(default_factory=list)
    aborted_streams: int = 0
    completed_streams: int = 0
    stalled_streams: int = 0
    """Streams started while ``faults.stall_streams`` held (they send only keepalives)."""
    prefix_queries: int = 0
    prefix_hits: int = 0
    stream_ended: threading.Event = field(default_factory=threading.Event, repr=False)
    """Set when a stream finished or was aborted by the client."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, path: str, payload: dict[str, Any] | None) -> None:
        with self._lock:
            self.requests[path] = self.requests.get(path, 0) + 1
            if payload is not None:
                self.payloads.append(payload)


class BadRequest(Exception):
    """A request the engine refuses (an HTTP 4xx with the dialect's error body)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def _token_text(token: int) -> str:
    return f"<t{token}>"


DRIFT_BATCH_WINDOW_S = 0.005
"""How long a request of a drifting server waits for others to share its batch."""


class EmulationServer:
    """A vLLM- or SGLang-dialect HTTP server over the reference model (a context manager)."""

    def __init__(
        self,
        dialect: str = "vllm",
        *,
        vocab_size: int = 64,
        model_seed: int = 0,
        model_name: str | None = None,
        logprobs_mode: str = "raw_logprobs",
        max_logprobs: int = 20,
        return_original_logprob: bool = False,
        deterministic: bool = False,
        block_size: int = 16,
        max_model_len: int = 1024,
        masked_token_ids: Sequence[int] = (),
        tokenizer: bool = False,
        end_of_turn_token_id: int | None = None,
        checked_vocab_size: int | None = None,
        drift_nats: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if dialect not in ("vllm", "sglang"):
            raise ValueError(f"unknown dialect {dialect!r}; valid dialects are: sglang, vllm")
        if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(f"unknown vLLM logprobs mode {logprobs_mode!r}")
        self.dialect = dialect
        self.model = MaskedReferenceModel(vocab_size, seed=model_seed, masked=masked_token_ids)
        self.model_name = model_name or f"reference-{vocab_size}"
        self.logprobs_mode = logprobs_mode
        self.max_logprobs = max_logprobs
        self.return_original_logprob = return_original_logprob
        self.deterministic = deterministic
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer
        self.end_of_turn_token_id = end_of_turn_token_id
        """With one, ``/tokenize`` renders messages through a chat template that closes each
        turn with this token (``add_generation_prompt``, ``continue_final_message`` honoured);
        without one, as ``role: content`` lines whatever the fields say (no template)."""
        self.checked_vocab_size = vocab_size if checked_vocab_size is None else checked_vocab_size
        """The vocabulary the server checks ids against (prompt ids, ``logit_bias``) and
        states in its refusals; another than the model's makes a hostile server whose answers
        hold ids past the vocabulary it says it has."""
        self.drift_nats = drift_nats
        """A bf16 server without batch invariance: every returned row's logits moved by up to
        this much, by a deterministic function of the context and of how many generation
        requests are in flight (the batch it shares). 0: batch-invariant."""
        self.in_flight = 0
        self.faults = Faults()
        self.stats = Stats()
        self._cache_blocks: set[tuple[int, ...]] = set()
        self._cache_seqs: list[tuple[int, ...]] = []
        self._cache_lock = threading.Lock()
        self._model_lock = threading.Lock()
        self._host = host
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self.stopping = threading.Event()
        """Set by :meth:`stop`: what a handler that would never end stops on."""
        self._thread: threading.Thread | None = None

    # ---- lifecycle

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the emulation server is not running")
        host, port = self._server.server_address[:2]
        host_text = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://{host_text}:{port}"

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def start(self) -> EmulationServer:
        self.stopping.clear()
        handler = _make_handler(self)
        self._server = ThreadingHTTPServer((self._host, self._port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name=f"emulation-{self.dialect}",
            daemon=True,
        )
        self._thread.start()
        logger.debug("emulation %s server on %s", self.dialect, self.base_url)
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> EmulationServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the model

    def rows(self, context: Sequence[int], token_ids: Sequence[int]) -> FloatArray:
        with self._model_lock:
            rows = self.model.rows(context, token_ids)
        if not self.drift_nats:
            return rows
        full = [*context, *token_ids]
        return np.stack([self.drifted(full[: len(context) + i], r) for i, r in enumerate(rows)])

    def row(self, context: Sequence[int]) -> FloatArray:
        with self._model_lock:
            return self.drifted(context, self.model.logprobs(context))

    def drifted(self, context: Sequence[int], row: FloatArray) -> FloatArray:
        """``row`` as a server that is not batch-invariant returns it (:attr:`drift_nats`)."""
        if not self.drift_nats:
            return row
        key = hash((tuple(int(t) for t in context), self.in_flight)) % 2**32
        noise = np.random.default_rng(key).uniform(-1.0, 1.0, row.shape[0])
        finite = np.isfinite(row)
        out = np.full_like(row, -np.inf)
        out[finite] = log_softmax(row[finite] + self.drift_nats * noise[finite])[0]
        return out

    def sample(
        self, prefix: Sequence[int], n: int, temperature: float, seed: int | None, top_k: int = 0
    ) -> tuple[list[int], FloatArray]:
        """``n`` tokens and their raw rows (``top_k <= 0``: exactly ``ReferenceModel.sample``)."""
        ids: list[int] = []
        rows = np.empty((n, self.vocab_size))
        for i, (token, row) in enumerate(self.iter_sample(prefix, n, temperature, seed, top_k)):
            rows[i] = self.drifted([*prefix, *ids], row) if top_k <= 0 else row
            ids.append(token)
        return ids, rows

    def iter_sample(
        self, prefix: Sequence[int], n: int, temperature: float, seed: int | None, top_k: int = 0
    ) -> Iterator[tuple[int, FloatArray]]:
        """:meth:`sample` one token at a time: ``(token, raw row)`` (the model lock per token)."""
        if seed is None:
            seed = random.SystemRandom().randrange(2**63)
        if temperature < GREEDY_BELOW:
            context = list(prefix)
            for _ in range(n):
                with self._model_lock:
                    row = self.model.logprobs(context)
                token = int(np.argmax(row))
                context.append(token)
                yield token, row
            return
        if top_k <= 0 or top_k >= self.vocab_size:
            inner = self.model.iter_sample(prefix, n, temperature, seed)
            while True:
                with self._model_lock:
                    item = next(inner, None)
                if item is None:
                    return
                yield item
        rng = np.random.default_rng(seed)
        context = list(prefix)
        for _ in range(n):
            with self._model_lock:
                row = self.model.logprobs(context)
            q = np.exp(self._processed(row, temperature, top_k))
            token = min(int(np.searchsorted(np.cumsum(q), rng.random(), side="right")), len(q) - 1)
            context.append(token)
            yield token, row

    @staticmethod
    def _processed(row: FloatArray, temperature: float, top_k: int = 0) -> FloatArray:
        """``log q_τ`` over the vocabulary (after top-k masking when ``top_k > 0``)."""
        scaled = row / temperature
        if 0 < top_k < row.shape[0]:
            kth = np.sort(scaled)[-top_k]
            scaled = np.where(scaled >= kth, scaled, -np.inf)
        finite = np.isfinite(scaled)
        out = np.full_like(scaled, -np.inf)
        out[finite] = log_softmax(scaled[finite])[0]
        return out

    def prefix_cache_read(self, tokens: Sequence[int]) -> int:
        """Count a prefix-cache lookup of ``tokens``; returns the number of cached tokens hit."""
        return self._prefix_cache(tokens, read=True)

    def prefix_cache_insert(self, tokens: Sequence[int]) -> None:
        """Make the blocks of ``tokens`` cached (as a finished or aborted request leaves them)."""
        self._cache_insert(tokens)

    def _prefix_cache(self, tokens: Sequence[int], *, read: bool) -> int:
        """Count a cache lookup of ``tokens``; returns the number of cached tokens hit."""
        b = self.block_size
        key = tuple(int(t) for t in tokens)
        with self._cache_lock:
            hit = 0
            if read:
                if self.dialect == "vllm":
                    while (hit + b) <= len(key) and key[: hit + b] in self._cache_blocks:
                        hit += b
                else:
                    for seq in self._cache_seqs:
                        common = 0
                        for x, y in zip(seq, key, strict=False):
                            if x != y:
                                break
                            common += 1
                        hit = max(hit, common)
                    hit = min(hit, max(len(key) - 1, 0))
                self.stats.prefix_queries += len(key)
                self.stats.prefix_hits += hit
            return hit

    def _cache_insert(self, tokens: Sequence[int]) -> None:
        key = tuple(int(t) for t in tokens)
        with self._cache_lock:
            for end in range(self.block_size, len(key) + 1, self.block_size):
                self._cache_blocks.add(key[:end])
            self._cache_seqs.append(key)
            if len(self._cache_seqs) > 256:
                del self._cache_seqs[:128]

    # ---- vLLM dialect

    def vllm_models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": self.model_name,
                    "parent": None,
                    "max_model_len": self.max_model_len,
                    "permission": [],
                }
            ],
        }

    def vllm_tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        """vLLM's ``/tokenize`` over a toy tokenizer: one token per UTF-8 byte (mod the
        vocabulary) of the prompt, or of a chat request's turns as ``role: content`` lines."""
        messages = body.get("messages")
        if isinstance(messages, list) and self.end_of_turn_token_id is not None:
            tokens = self._chat_template(messages, body)
            return {"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens}
        if isinstance(messages, list):
            text = "".join(f"{m.get('role')}: {m.get('content')}\n" for m in messages)
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise BadRequest("give a prompt or messages", param="prompt")
        tokens = [b % self.vocab_size for b in text.encode()]
        return {"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens}

    def _chat_template(self, messages: list[Any], body: dict[str, Any]) -> list[int]:
        """A toy chat template: each turn ``role: content`` bytes then the end-of-turn token;
        ``add_generation_prompt`` adds ``assistant: ``; ``continue_final_message`` leaves the
        last turn open (vLLM's 400 with both)."""
        eot = self.end_of_turn_token_id
        assert eot is not None
        generation = bool(body.get("add_generation_prompt", True))
        open_last = bool(body.get("continue_final_message", False))
        if generation and open_last:
            raise BadRequest(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                param="continue_final_message",
            )

        def text_ids(text: str) -> list[int]:
            return [b % self.vocab_size for b in text.encode()]

        tokens: list[int] = []
        for i, m in enumerate(messages):
            tokens += text_ids(f"{m.get('role')}: {m.get('content')}")
            if not (open_last and i == len(messages) - 1):
                tokens.append(eot)
        if generation:
            tokens += text_ids("assistant: ")
        return tokens

    def vllm_detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise BadRequest("tokens must be a list of token ids", param="tokens")
        return {"prompt": "".join(_token_text(t) for t in tokens)}

    def vllm_validate(self, body: dict[str, Any]) -> tuple[list[list[int]], dict[str, Any]]:
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise BadRequest(
                f"The model `{model}` does not exist. Valid aliases: {self.model_name}.",
                "model",
                status=404,
            )
        prompt = body.get("prompt")
        if isinstance(prompt, list) and not prompt:
            raise BadRequest("You must pass at least one prompt")
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            prompts = [prompt]
        elif isinstance(prompt, list) and all(
            isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt
        ):
            prompts = prompt
        else:
            raise BadRequest(
                "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"
            )
        for p in prompts:
            for t in p:
                if not 0 <= t < self.checked_vocab_size:
                    raise BadRequest(f"Token id {t} is out of vocabulary")
        bias = body.get("logit_bias") or {}
        wrong = [int(k) for k in bias if not 0 <= int(k) < self.checked_vocab_size]
        if wrong:  # (vLLM 0.32's words: sampling_params._validate_logit_bias)
            raise BadRequest(
                f"token_id(s) {wrong} in logit_bias contain out-of-vocab token ids. "
                f"Vocabulary size: {self.checked_vocab_size}",
                "logit_bias",
            )
        max_tokens = body.get("max_tokens", 16)
        if max_tokens is None:
            max_tokens = 16
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
        for p in prompts:
            # A prompt over the context is a 400; prompt + max_tokens over it is not: vLLM
            # silently cuts max_tokens (finish_reason "length").
            if len(p) >= self.max_model_len:
                raise BadRequest(
                    f"This model's maximum context length is {self.max_model_len} tokens. "
                    f"However, your prompt contains {len(p)} input tokens. Please reduce the "
                    "length of the input prompt.",
                    "input_tokens",
                )
        top_k = body.get("top_k", 0)
        top_k = 0 if top_k is None else top_k
        if top_k < -1:
            raise BadRequest(f"top_k must be 0 (disable), or at least 1, got {top_k}.", "top_k")
        temperature = body.get("temperature", 1.0)
        temperature = 1.0 if temperature is None else float(temperature)
        if not 0.0 <= temperature <= 2.0:
            raise BadRequest(f"temperature must be in [0, 2], got {temperature}.", "temperature")
        limit = self.vocab_size if self.max_logprobs == -1 else self.max_logprobs
        for field_name, kind in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
            value = body.get(field_name)
            if value is None:
                continue
            if not isinstance(value, int) or (value < 0 and value != -1):
                raise BadRequest(f"`{field_name}` must be a positive value or -1.", field_name)
            n = self.vocab_size if value == -1 else value
            if n > limit:
                raise BadRequest(
                    f"Requested {kind} logprobs of {n}, which is greater than max allowed: "
                    f"{limit} (parameter={field_name}, value={n})",
                    field_name,
                )
        if body.get("stream") and body.get("prompt_logprobs") is not None:
            raise BadRequest("`prompt_logprobs` are not available when `stream=True`.")
        opts = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_k": top_k,
            "seed": body.get("seed"),
            "logprobs": body.get("logprobs"),
            "prompt_logprobs": body.get("prompt_logprobs"),
            "as_ids": bool(body.get("return_tokens_as_token_ids")),
            "return_token_ids": bool(body.get("return_token_ids")),
            "include_usage": bool((body.get("stream_options") or {}).get("include_usage")),
        }
        return prompts, opts

    def _vllm_token_logprobs(
        self, token: int, row_ret: FloatArray, k: int, as_ids: bool
    ) -> tuple[float, dict[str, float]]:
        def key(t: int) -> str:
            return f"token_id:{t}" if as_ids else _token_text(t)

        value = vllm_shapes.floor(float(row_ret[token]))
        top: list[tuple[str, float]] = []
        if k != 0:
            kk = self.vocab_size if k == -1 else k
            order = np.argsort(-row_ret, kind="stable")[:kk].tolist()
            values = np.maximum(row_ret[order], VLLM_SENTINEL).tolist()
            top = [(key(t), v) for t, v in zip(order, values, strict=True)]
        return value, vllm_shapes.top_logprobs_entry((key(token), value), top)

    def vllm_token_entry(
        self, token: int, row: FloatArray, opts: dict[str, Any]
    ) -> tuple[float, dict[str, float]] | None:
        """The logprob and top-logprob dict returned for ``token`` drawn from raw ``row``."""
        if opts["logprobs"] is None:
            return None
        temperature = opts["temperature"]
        if self.logprobs_mode == "raw_logprobs" or temperature < GREEDY_BELOW:
            row_ret = row  # greedy requests return unscaled logprobs
        else:
            top_k = opts["top_k"] if opts["top_k"] > 0 else 0
            row_ret = self._processed(row, temperature, top_k)
        return self._vllm_token_logprobs(token, row_ret, opts["logprobs"], opts["as_ids"])

    def _vllm_prompt_logprobs(self, prompt: Sequence[int], k: int) -> list[Any]:
        out: list[Any] = [None]
        kk = self.vocab_size if k == -1 else k
        for p in range(1, len(prompt)):
            row = self.row(prompt[:p])
            token = int(prompt[p])
            order = np.argsort(-row, kind="stable")
            ranks = np.empty(self.vocab_size, dtype=np.int64)
            ranks[order] = np.arange(1, self.vocab_size + 1)
            out.append(
                vllm_shapes.prompt_logprobs_entry(
                    (t, float(row[t]), int(ranks[t]), _token_text(t))
                    for t in [token, *[int(x) for x in order[:kk]]]
                )
            )
        return out

    def vllm_choice(
        self, index: int, prompt: list[int], opts: dict[str, Any]
    ) -> tuple[dict[str, Any], list[int], list[tuple[float, dict[str, float]]]]:
        n = self.vllm_num_tokens(prompt, opts)
        top_k = opts["top_k"] if opts["top_k"] > 0 else 0
        ids, rows = self.sample(prompt, n, opts["temperature"], opts["seed"], top_k)
        if opts["prompt_logprobs"] is None:
            self._prefix_cache(prompt, read=True)
        self._cache_insert([*prompt, *ids])
        per_token: list[tuple[float, dict[str, float]]] = []
        for i, t in enumerate(ids):
            entry = self.vllm_token_entry(t, rows[i], opts)
            if entry is not None:
                per_token.append(entry)
        return self.vllm_choice_body(index, prompt, ids, per_token, opts), ids, per_token

    def vllm_num_tokens(self, prompt: Sequence[int], opts: dict[str, Any]) -> int:
        """Tokens a request generates (``max_tokens`` cut at ``max_model_len``)."""
        return int(min(opts["max_tokens"], self.max_model_len - len(prompt)))

    def vllm_choice_body(
        self,
        index: int,
        prompt: list[int],
        ids: list[int],
        per_token: Sequence[tuple[float, dict[str, float]]],
        opts: dict[str, Any],
    ) -> dict[str, Any]:
        """A non-streamed choice for ``ids`` (``per_token`` from :meth:`vllm_token_entry`)."""
        return vllm_shapes.completion_choice(
            index,
            "".join(_token_text(t) for t in ids),
            None
            if opts["logprobs"] is None
            else self._vllm_logprobs_block(ids, per_token, opts["as_ids"]),
            "length",
            token_ids=ids if opts["return_token_ids"] else None,
            prompt_logprobs=None
            if opts["prompt_logprobs"] is None
            else self._vllm_prompt_logprobs(prompt, opts["prompt_logprobs"]),
            prompt_token_ids=prompt if opts["return_token_ids"] else None,
        )

    @staticmethod
    def _vllm_logprobs_block(
        ids: Sequence[int], per_token: Sequence[tuple[float, dict[str, float]]], as_ids: bool
    ) -> dict[str, Any]:
        tokens = [f"token_id:{t}" if as_ids else _token_text(t) for t in ids]
        return vllm_shapes.completion_logprobs(
            tokens, [lp for lp, _ in per_token], [top for _, top in per_token]
        )

    def vllm_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        prompts, opts = self.vllm_validate(body)
        choices = []
        n_prompt = n_gen = 0
        for i, p in enumerate(prompts):
            choice, ids, _ = self.vllm_choice(i, p, opts)
            choices.append(choice)
            n_prompt += len(p)
            n_gen += len(ids)
        return self.vllm_completion_body(choices, n_prompt, n_gen)

    def vllm_completion_body(
        self, choices: list[dict[str, Any]], n_prompt: int, n_gen: int
    ) -> dict[str, Any]:
        """The envelope of a non-streamed completion around its choices."""
        return vllm_shapes.completion_body(
            f"cmpl-{uuid.uuid4().hex[:16]}",
            int(time.time()),
            self.model_name,
            choices,
            n_prompt,
            n_gen,
            system_fingerprint="emulation-vllm",
        )

    def vllm_stream_events(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        prompts, opts = self.vllm_validate(body)
        if len(prompts) != 1:
            raise BadRequest("the emulation streams single prompts only", "prompt")
        prompt = prompts[0]
        _, ids, per_token = self.vllm_choice(0, prompt, opts)
        rid = f"cmpl-{uuid.uuid4().hex[:16]}"
        created = int(time.time())
        for i in range(len(ids)):
            yield self.vllm_stream_chunk(
                rid, created, prompt, ids, per_token, opts, start=i, stop=i + 1
            )
        if opts["include_usage"]:
            yield self.vllm_usage_chunk(rid, created, len(prompt), len(ids))

    def vllm_stream_chunk(
        self,
        rid: str,
        created: int,
        prompt: list[int],
        ids: Sequence[int],
        per_token: Sequence[tuple[float, dict[str, float]]],
        opts: dict[str, Any],
        *,
        start: int,
        stop: int,
    ) -> dict[str, Any]:
        """The SSE event carrying tokens ``ids[start:stop]`` of a request generating ``ids``.

        ``ids``/``per_token`` may hold only the tokens generated so far (at least ``stop``);
        ``opts["max_tokens"]`` (cut at the context) says whether ``stop`` is the last token.
        """
        part = [int(t) for t in ids[start:stop]]
        last = stop >= self.vllm_num_tokens(prompt, opts)
        chunk_choice = vllm_shapes.stream_choice(
            "".join(_token_text(t) for t in part),
            None
            if opts["logprobs"] is None
            else self._vllm_logprobs_block(part, per_token[start:stop], opts["as_ids"]),
            "length" if last else None,
            prompt_token_ids=prompt if (start == 0 and opts["return_token_ids"]) else None,
            token_ids=part if opts["return_token_ids"] else None,
        )
        return vllm_shapes.stream_event(rid, created, self.model_name, chunk_choice)

    def vllm_usage_chunk(self, rid: str, created: int, n_prompt: int, n_gen: int) -> dict[str, Any]:
        """The final usage event of a stream (with ``stream_options.include_usage``)."""
        return vllm_shapes.usage_event(rid, created, self.model_name, n_prompt, n_gen)

    def vllm_metrics(self, running: int = 0, waiting: int = 0) -> str:
        labels = f'engine="0",model_name="{self.model_name}"'
        lines = [
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of "
            "queried tokens.",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{{{labels}}} {float(self.stats.prefix_queries)}",
            "# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number "
            "of queried tokens.",
            "# TYPE vllm:prefix_cache_queries_created gauge",
            f"vllm:prefix_cache_queries_created{{{labels}}} 1.7960391825571456e+09",
            "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached "
            "tokens.",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{{{labels}}} {float(self.stats.prefix_hits)}",
            "# HELP vllm:external_prefix_cache_queries_total External prefix cache queries from "
            "KV connector cross-instance cache sharing, in terms of number of queried tokens.",
            "# TYPE vllm:external_prefix_cache_queries_total counter",
            f"vllm:external_prefix_cache_queries_total{{{labels}}} 0.0",
            "# HELP vllm:external_prefix_cache_hits_total External prefix cache hits from KV "
            "connector cross-instance cache sharing, in terms of number of cached tokens.",
            "# TYPE vllm:external_prefix_cache_hits_total counter",
            f"vllm:external_prefix_cache_hits_total{{{labels}}} 0.0",
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {float(running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} {float(waiting)}",
        ]
        return "\n".join(lines) + "\n"

    # ---- SGLang dialect

    def _sglang_value(self, x: float) -> float:
        return FLOAT32_MIN if not math.isfinite(x) else float(x)

    def _sglang_row(self, row: FloatArray, temperature: float) -> FloatArray:
        if self.return_original_logprob or temperature <= 0:
            return row
        return self._processed(row, temperature)

    def _sglang_top(self, row_ret: FloatArray, k: int) -> list[list[Any]]:
        order = np.argsort(-row_ret, kind="stable")[: max(k, 0)]
        return [[self._sglang_value(float(row_ret[t])), int(t), None] for t in order]

    def sglang_one(
        self,
        input_ids: list[int],
        params: dict[str, Any],
        return_logprob: bool,
        top_n: int,
        start: int,
    ) -> dict[str, Any]:
        if not input_ids or not all(isinstance(t, int) and t >= 0 for t in input_ids):
            raise BadRequest("input_ids must be a non-empty list of token ids in the vocabulary")
        if max(input_ids) >= self.checked_vocab_size:  # (SGLang's words)
            raise BadRequest(
                f"The input_ids {input_ids} contains values greater than the vocab size "
                f"({self.checked_vocab_size})."
            )
        n = int(params.get("max_new_tokens", 128))
        temperature = float(params.get("temperature", 1.0))
        seed = params.get("sampling_seed")
        if not self.deterministic:
            seed = None  # ignored by a non-deterministic server
        elif seed is None:
            seed = 42
        top_k = int(params.get("top_k", -1))
        if n > 0:
            ids, rows = self.sample(input_ids, n, max(temperature, 1e-6), seed, max(top_k, 0))
        else:
            ids, rows = [], np.zeros((0, self.vocab_size))
        cached = self._prefix_cache(input_ids, read=True)
        self._cache_insert([*input_ids, *ids])
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": {"type": "length", "length": n},
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(ids),
            "cached_tokens": cached,
        }
        if return_logprob:
            out_lp: list[list[Any]] = []
            out_top: list[list[list[Any]]] = []
            for i, t in enumerate(ids):
                row_ret = self._sglang_row(rows[i], temperature)
                out_lp.append([self._sglang_value(float(row_ret[t])), t, None])
                out_top.append(self._sglang_top(row_ret, top_n))
            meta["output_token_logprobs"] = out_lp
            meta["output_top_logprobs"] = out_top
            if start >= 0:
                in_lp: list[list[Any]] = []
                in_top: list[Any] = []
                for p in range(start, len(input_ids)):
                    token = int(input_ids[p])
                    if p == start:
                        in_lp.append([None, token, None])
                        in_top.append(None)
                        continue
                    row_ret = self._sglang_row(self.row(input_ids[:p]), temperature)
                    in_lp.append([self._sglang_value(float(row_ret[token])), token, None])
                    in_top.append(self._sglang_top(row_ret, top_n))
                meta["input_token_logprobs"] = in_lp
                meta["input_top_logprobs"] = in_top
        return {
            "text": "".join(_token_text(t) for t in ids),
            "output_ids": ids,
            "meta_info": meta,
        }

    def sglang_generate(self, body: dict[str, Any]) -> Any:
        if body.get("stream"):
            raise BadRequest("the emulation does not stream /generate")
        input_ids = body.get("input_ids")
        params = body.get("sampling_params") or {}
        return_logprob = bool(body.get("return_logprob"))
        top_n = int(body.get("top_logprobs_num") or 0)
        start = body.get("logprob_start_len")
        start = -1 if start is None else int(start)
        if isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list):
            plist = params if isinstance(params, list) else [params] * len(input_ids)
            if len(plist) != len(input_ids):
                raise BadRequest("sampling_params and input_ids have different lengths")
            return [
                self.sglang_one(ids, p, return_logprob, top_n, start)
                for ids, p in zip(input_ids, plist, strict=True)
            ]
        if not isinstance(input_ids, list):
            raise BadRequest("input_ids is required")
        if isinstance(params, list):
            params = params[0]
        return self.sglang_one(input_ids, params, return_logprob, top_n, start)

    def sglang_metrics(self) -> str:
        labels = f'model_name="{self.model_name}"'
        rate = (
            self.stats.prefix_hits / self.stats.prefix_queries if self.stats.prefix_queries else 0
        )
        return (
            "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n"
            "# TYPE sglang:prompt_tokens_total counter\n"
            f"sglang:prompt_tokens_total{{{labels}}} {float(self.stats.prefix_queries)}\n"
            "# HELP sglang:cached_tokens_total Number of cached prompt tokens.\n"
            "# TYPE sglang:cached_tokens_total counter\n"
            f'sglang:cached_tokens_total{{{labels},cache_source="device"}} '
            f"{float(self.stats.prefix_hits)}\n"
            f'sglang:cached_tokens_total{{{labels},cache_source="host"}} 0.0\n'
            "# HELP sglang:cache_hit_rate The cache hit rate\n"
            "# TYPE sglang:cache_hit_rate gauge\n"
            f"sglang:cache_hit_rate{{{labels}}} {rate}\n"
        )

    # ---- faults applied to a generation answer

    def corrupt(self, body: Any) -> Any:
        """Apply NaN / dropped-logprob / short-answer faults to a generation answer."""
        nan = self.faults.take("nan_times")
        drop = self.faults.take("drop_logprobs_times")
        short = self.faults.take("short_times")
        if not (nan or drop or short):
            return body
        items = body if isinstance(body, list) else [body]
        for item in items:
            if "choices" in item:
                for choice in item["choices"]:
                    lp = choice.get("logprobs")
                    if drop:
                        choice["logprobs"] = None
                    elif lp and nan and lp["token_logprobs"]:
                        lp["token_logprobs"][0] = float("nan")
                    if short and choice.get("token_ids"):
                        choice["token_ids"] = choice["token_ids"][:-1]
                        if choice.get("logprobs"):
                            for key in ("token_logprobs", "tokens", "top_logprobs", "text_offset"):
                                choice["logprobs"][key] = choice["logprobs"][key][:-1]
            elif "meta_info" in item:
                meta = item["meta_info"]
                if drop:
                    meta.pop("output_token_logprobs", None)
                elif nan and meta.get("output_token_logprobs"):
                    meta["output_token_logprobs"][0][0] = float("nan")
                if short and meta.get("output_token_logprobs"):
                    meta["output_token_logprobs"] = meta["output_token_logprobs"][:-1]
                    meta["output_top_logprobs"] = meta["output_top_logprobs"][:-1]
                    item["output_ids"] = item["output_ids"][:-1]
        return body


_TOKENIZER_PATHS: dict[str, Callable[[EmulationServer, dict[str, Any]], dict[str, Any]]] = {
    "/tokenize": EmulationServer.vllm_tokenize,
    "/detokenize": EmulationServer.vllm_detokenize,
}
"""Served only by an emulation started with ``tokenizer=True`` (others answer 404, as before)."""


def _make_handler(server: EmulationServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out as separate writes

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("emulation %s: " + format, server.dialect, *args)

        def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(data)

        def _error(self, status: int, message: str, param: str | None = None) -> None:
            if server.dialect == "vllm":
                kind = "BadRequestError" if status == 400 else "InternalServerError"
                body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
            else:
                body = {"error": {"message": message}}
            self._send(status, body)

        def _read_json(self) -> dict[str, Any] | None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                data = json.loads(raw) if raw else {}
            except json.JSONDecodeError:
                self._error(400, "invalid JSON body")
                return None
            if not isinstance(data, dict):
                self._error(400, "the body must be a JSON object")
                return None
            return data

        def _stopped(self) -> bool:
            """A stopped server answers nothing, not even on a connection kept alive from
            before (the client sees the connection closed, as when a server goes down)."""
            if server.stopping.is_set():
                self.close_connection = True
                return True
            return False

        def do_GET(self) -> None:
            if self._stopped():
                return
            path = self.path.split("?")[0]
            server.stats.count(path, None)
            if path == "/health":
                self._send(200, "", "text/plain")
            elif path == "/v1/models":
                self._send(200, server.vllm_models())
            elif path == "/get_model_info" and server.dialect == "sglang":
                self._send(
                    200,
                    {
                        "model_path": server.model_name,
                        "tokenizer_path": server.model_name,
                        "is_generation": True,
                    },
                )
            elif path == "/metrics":
                text = (
                    server.vllm_metrics() if server.dialect == "vllm" else server.sglang_metrics()
                )
                self._send(200, text, "text/plain; version=0.0.4")
            else:
                self._error(404, f"Not Found: {path}")

        def do_POST(self) -> None:
            if self._stopped():
                return
            path = self.path.split("?")[0]
            body = self._read_json()
            if body is None:
                return
            server.stats.count(path, body)
            if server.tokenizer and server.dialect == "vllm" and path in _TOKENIZER_PATHS:
                try:
                    self._send(200, _TOKENIZER_PATHS[path](server, body))
                except BadRequest as exc:
                    self._error(exc.status, exc.message, exc.param)
                return
            generation = (server.dialect == "vllm" and path == "/v1/completions") or (
                server.dialect == "sglang" and path == "/generate"
            )
            if not generation:
                self._error(404, f"Not Found: {path}")
                return
            if server.faults.take("fail_times"):
                status = server.faults.fail_status
                payload = server.faults.fail_body or {
                    "error": {"message": f"emulated HTTP {status}", "code": status}
                }
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if server.faults.retry_after is not None:
                    self.send_header("Retry-After", server.faults.retry_after)
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)
                return
            with server._cache_lock:  # (the batch this request shares: server.drifted)
                server.in_flight += 1
            if server.drift_nats:  # a batching server: requests sent together are run together
                time.sleep(DRIFT_BATCH_WINDOW_S)
            try:
                if server.dialect == "vllm" and body.get("stream"):
                    self._stream(server.vllm_stream_events(body))
                    return
                if server.faults.delay_s:
                    time.sleep(server.faults.delay_s)
                if server.dialect == "vllm":
                    answer = server.vllm_completion(body)
                else:
                    answer = server.sglang_generate(body)
            except BadRequest as exc:
                self._error(exc.status, exc.message, exc.param)
                return
            finally:
                with server._cache_lock:
                    server.in_flight -= 1
            self._send(200, server.corrupt(answer))

        def _stream(self, events: Iterator[dict[str, Any]]) -> None:
            # Validate (and sample) before the headers go out, so errors are plain 400s.
            first = next(events)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                if server.faults.stall_streams:
                    with server.stats._lock:
                        server.stats.stalled_streams += 1
                    while not server.stopping.wait(0.1):
                        self.wfile.write(b": keepalive\n\n")
                        self.wfile.flush()
                    return
                for event in [first, *events]:
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()
                    if server.faults.delay_s:
                        time.sleep(server.faults.delay_s)
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                server.stats.completed_streams += 1
            except (BrokenPipeError, ConnectionResetError):
                server.stats.aborted_streams += 1
            finally:
                server.stats.stream_ended.set()

    return Handler
