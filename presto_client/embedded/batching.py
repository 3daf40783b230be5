"""The in-process generation engine: one model worker thread, continuous batching, prefix KV reuse.

Requests are submitted from any thread (:meth:`BatchingEngine.submit`) and answered through a
:class:`RequestHandle` (a queue of :class:`TokenEvent` / :class:`PromptScores` / :class:`Finished`
/ :class:`Failed` events, plus ``cancel()``). All model work runs on one worker thread, so
nothing else ever touches torch.

Per iteration the worker

1. admits newly arrived requests (when idle it waits ``gather_s`` for more to arrive so that
   a burst of concurrent proposals starts together): each is prefilled alone (batch 1), reusing
   the longest cached KV prefix and computing only the rest; requests with the same prompt
   in one admission share one prefill. The prompt's KV goes into the prefix cache at once,
   so the other proposals of a burst hit it;
2. merges the admitted sequences into the running batch (one left-padded ``DynamicCache``, an
   attention mask and explicit position ids) and decodes one token for every sequence in one
   forward pass;
3. retires finished or cancelled sequences, storing the KV of each finished one (prompt +
   generated tokens) in the prefix cache.

Sampling is exact and per request: each sequence owns a ``numpy`` PCG64 generator seeded with
its ``seed`` and draws one uniform per token, inverted through the CDF of
``softmax(logits / τ)`` computed in float64 from the float32 logits. The same (prompt, seed)
gives the same tokens whether the request runs alone or in a batch, up to the float32
differences of batched matmuls (≈1e-6 in logits, so a token flips only when a uniform falls
within ~1e-6 of a CDF boundary). Reported logprobs are raw (temperature 1):
``log_softmax`` of the float32 logits, computed in float64 (vLLM's ``raw_logprobs`` mode).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

if TYPE_CHECKING:
    from presto_client.embedded.model import LoadedModel

logger = logging.getLogger(__name__)

SAMPLING_EPS = 1e-5
"""Temperatures below this are greedy (as in vLLM)."""

KVList = list[tuple[torch.Tensor, torch.Tensor]]
"""Per-layer (keys, values), each ``[batch, kv_heads, length, head_dim]``."""


# --------------------------------------------------------------------------------------------
# Requests and events
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What the engine needs to know about one request (already validated)."""

    max_tokens: int
    temperature: float
    seed: int
    logprobs: int | None = None
    """Top-K raw logprobs per generated token (None: none; 0: the sampled token only)."""
    prompt_logprobs: int | None = None
    """Top-K raw logprobs per prompt position (None: none). Such requests skip cache reads."""
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token with its raw logprob and (if asked) the top-K raw logprobs."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    """Top-K (token id, raw logprob) pairs, best first (empty unless logprobs was asked)."""
    finish_reason: str | None = None
    """Set on the last token of the request: ``"stop"`` or ``"length"``."""


@dataclass(frozen=True, slots=True)
class PromptScores:
    """Raw logprobs of the prompt: entry 0 is None, entry i scores prompt token i."""

    entries: tuple[tuple[float, int, tuple[tuple[int, float], ...]] | None, ...]
    """Per position: (logprob of the prompt token, its rank (1 = best), top-K pairs)."""


@dataclass(frozen=True, slots=True)
class Finished:
    """The request ended: ``reason`` is ``"stop"`` (EOS / stop token) or ``"length"``."""

    reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine could not serve the request."""

    message: str


Event = TokenEvent | PromptScores | Finished | Failed


class RequestHandle:
    """The caller's side of a submitted request."""

    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        self.events: queue.Queue[Event] = queue.Queue()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Ask the engine to stop this request (it is dropped at the next step)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def result(self, timeout: float | None = None) -> CompletedRequest:
        """Block until the request ends and return everything it produced."""
        deadline = None if timeout is None else time.monotonic() + timeout
        tokens: list[TokenEvent] = []
        prompt: PromptScores | None = None
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                ev = self.events.get(timeout=remaining)
            except queue.Empty as exc:
                self.cancel()
                raise TimeoutError(f"request {self.request_id} did not finish in time") from exc
            if isinstance(ev, TokenEvent):
                tokens.append(ev)
            elif isinstance(ev, PromptScores):
                prompt = ev
            elif isinstance(ev, Failed):
                raise BatchingError(ev.message)
            else:
                return CompletedRequest(tokens=tokens, prompt_scores=prompt, finished=ev)


@dataclass(frozen=True, slots=True)
class CompletedRequest:
    tokens: list[TokenEvent]
    prompt_scores: PromptScores | None
    finished: Finished


class BatchingError(RuntimeError):
    """The engine failed a request (or is not running)."""


@dataclass(slots=True)
class EngineStats:
    """Counters exported on ``/metrics`` (prefix-cache counts are in tokens, as in vLLM)."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    finished_stop: int = 0
    finished_length: int = 0
    requests_cancelled: int = 0
    forward_passes: int = 0
    running: int = 0
    waiting: int = 0
    prefix_cache_entries: int = 0
    prefix_cache_bytes: int = 0


# --------------------------------------------------------------------------------------------
# Prefix cache
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _PrefixEntry:
    tokens: np.ndarray
    kv: KVList
    """Per layer, ``[1, heads, len(tokens), head_dim]``."""
    nbytes: int


class PrefixCache:
    """LRU of KV states keyed by token sequences; a lookup finds the longest common prefix.

    Entries that are a prefix of a newer entry are dropped (the longer one covers them). The
    cache never mutates stored tensors; users slice them and ``torch.cat`` makes new ones.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[int, _PrefixEntry] = OrderedDict()
        self._next_id = 0
        self.nbytes = 0
        # The worker thread looks up and inserts; HTTP threads count and reset: one lock.
        self._lock = threading.RLock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def lookup(self, tokens: Sequence[int], limit: int) -> tuple[KVList | None, int]:
        """The longest cached prefix of ``tokens`` (at most ``limit`` tokens) and its length."""
        with self._lock:
            return self._lookup(tokens, limit)

    def _lookup(self, tokens: Sequence[int], limit: int) -> tuple[KVList | None, int]:
        if limit <= 0 or not self._entries:
            return None, 0
        query = np.asarray(tokens[:limit], dtype=np.int64)
        best_key, best_len = -1, 0
        for key, entry in self._entries.items():
            n = min(len(entry.tokens), len(query))
            if n <= best_len:
                continue
            diff = np.flatnonzero(entry.tokens[:n] != query[:n])
            common = int(diff[0]) if diff.size else n
            if common > best_len:
                best_key, best_len = key, common
        if best_len == 0:
            return None, 0
        self._entries.move_to_end(best_key)
        entry = self._entries[best_key]
        kv = [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in entry.kv]
        return kv, best_len

    def insert(self, tokens: Sequence[int], kv: KVList) -> None:
        """Store ``kv`` (per layer ``[1, heads, len(tokens), head_dim]``) for ``tokens``."""
        with self._lock:
            self._insert(tokens, kv)

    def _insert(self, tokens: Sequence[int], kv: KVList) -> None:
        arr = np.asarray(tokens, dtype=np.int64)
        n = len(arr)
        if n == 0:
            return
        for key, entry in list(self._entries.items()):
            m = len(entry.tokens)
            if m >= n and np.array_equal(entry.tokens[:n], arr):
                self._entries.move_to_end(key)  # already covered by a longer entry
                return
            if m < n and np.array_equal(arr[:m], entry.tokens):
                self._drop(key)
        nbytes = sum(k.nelement() * k.element_size() * 2 for k, _ in kv)
        if nbytes > self.capacity_bytes:
            return
        self._entries[self._next_id] = _PrefixEntry(tokens=arr, kv=kv, nbytes=nbytes)
        self._next_id += 1
        self.nbytes += nbytes
        while self.nbytes > self.capacity_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.nbytes -= entry.nbytes


# --------------------------------------------------------------------------------------------
# Sequences and the running batch
# --------------------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Seq:
    handle: RequestHandle
    prompt: tuple[int, ...]
    params: SamplingParams
    rng: np.random.Generator
    output: list[int] = field(default_factory=list)
    kv: KVList | None = None
    """Own KV (batch 1) between prefill and joining the batch."""
    cached_tokens: int = 0
    pad: int = 0
    """Left padding of this row in the batch cache."""

    @property
    def kv_len(self) -> int:
        """Tokens whose KV is stored: prompt + all generated but the last."""
        return len(self.prompt) + len(self.output) - 1


def _seed_generator(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed % (1 << 64)))


class BatchingEngine:
    """Serves generation requests on one worker thread (see the module docstring)."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        max_batch_size: int = 32,
        prefix_cache_bytes: int = 1 << 30,
        max_model_len: int = 2048,
        gather_s: float = 0.004,
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len
        self.gather_s = gather_s
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.stats = EngineStats()
        self._stats_lock = threading.Lock()
        self._inbox: queue.Queue[_Seq | None] = queue.Queue()
        self._pending: list[_Seq] = []
        self._batch: list[_Seq] = []
        self._kbufs: list[torch.Tensor] = []
        self._vbufs: list[torch.Tensor] = []
        self._blen = 0
        self._next_id = 0
        self._id_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fatal: str | None = None
        self._cache_kw = _cache_kwarg(self.model)
        self._decoder = self.model.get_decoder()

    # ---- public API ----------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name="presto-embedded-engine", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._fatal is None

    def submit(self, prompt: Sequence[int], params: SamplingParams) -> RequestHandle:
        """Queue a request; events arrive on the returned handle's ``events`` queue."""
        if not prompt:
            raise ValueError("the prompt must contain at least one token")
        with self._id_lock:
            self._next_id += 1
            handle = RequestHandle(self._next_id)
        if not self.alive:
            handle.events.put(Failed(self._fatal or "the engine is not running"))
            return handle
        seq = _Seq(
            handle=handle,
            prompt=tuple(int(t) for t in prompt),
            params=params,
            rng=_seed_generator(params.seed),
        )
        self._inbox.put(seq)
        return handle

    def reset(self) -> None:
        """Forget the counters and the prefix cache (call only while no request is in flight)."""
        with self._stats_lock:
            self.stats = EngineStats()
        self.prefix_cache.clear()

    def snapshot(self) -> EngineStats:
        """A copy of the counters."""
        with self._stats_lock:
            s = self.stats
            return EngineStats(
                prefix_cache_queries=s.prefix_cache_queries,
                prefix_cache_hits=s.prefix_cache_hits,
                prompt_tokens=s.prompt_tokens,
                generation_tokens=s.generation_tokens,
                requests_finished=s.requests_finished,
                finished_stop=s.finished_stop,
                finished_length=s.finished_length,
                requests_cancelled=s.requests_cancelled,
                forward_passes=s.forward_passes,
                running=len(self._batch),
                waiting=self._inbox.qsize() + len(self._pending),
                prefix_cache_entries=len(self.prefix_cache),
                prefix_cache_bytes=self.prefix_cache.nbytes,
            )

    # ---- worker --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while not self._stop.is_set():
                    new = self._take_new(block=not self._batch)
                    if self._stop.is_set():
                        break
                    if new:
                        self._admit(new)
                    if self._batch:
                        self._decode_step()
        except Exception as exc:  # pragma: no cover - reported to every waiting request
            logger.exception("embedded engine worker crashed")
            self._fatal = f"embedded engine worker crashed: {exc!r}"
        finally:
            message = self._fatal or "the engine stopped"
            for seq in [*self._batch, *self._pending]:
                seq.handle.events.put(Failed(message))
            self._batch.clear()
            self._pending.clear()
            while True:
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item.handle.events.put(Failed(message))

    def _take_new(self, block: bool) -> list[_Seq]:
        room = self.max_batch_size - len(self._batch)
        if block and not self._pending:
            try:
                first = self._inbox.get(timeout=0.5)
            except queue.Empty:
                return []
            if first is None:
                return []
            self._pending.append(first)
            deadline = time.monotonic() + self.gather_s
            while len(self._pending) < room:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = self._inbox.get(timeout=remaining)
                except queue.Empty:
                    break
                if item is None:
                    return []
                self._pending.append(item)
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return []
            self._pending.append(item)
        taken, self._pending = self._pending[:room], self._pending[room:]
        return [s for s in taken if not self._drop_if_cancelled(s)]

    def _drop_if_cancelled(self, seq: _Seq) -> bool:
        if seq.handle.cancelled:
            with self._stats_lock:
                self.stats.requests_cancelled += 1
            return True
        return False

    # ---- prefill ---------------------------------------------------------------------------

    def _forward(
        self,
        input_ids: torch.Tensor,
        cache: DynamicCache,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """One forward pass (``cache`` is updated in place); float32 logits ``[B, q, V]``."""
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "attention_mask": attention_mask,
            self._cache_kw: cache,
            "use_cache": True,
        }
        if not all_logits:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        with self._stats_lock:
            self.stats.forward_passes += 1
        logits: torch.Tensor = out.logits.float()
        return logits

    def _cache_from(self, kv: KVList | None) -> DynamicCache:
        """A ``DynamicCache`` holding ``kv`` (no copy; ``update`` concatenates into new tensors)."""
        cache = DynamicCache(config=self.model.config)
        if kv:
            for layer, (k, v) in zip(_dynamic_layers(cache), kv, strict=True):
                layer.lazy_initialization(k, v)
                layer.keys, layer.values = k, v
        return cache

    def _admit(self, seqs: list[_Seq]) -> None:
        """Prepare arrived requests and merge them into the running batch.

        A request's context is its prompt but the last token: that context is prefilled (only
        what the prefix cache lacks; nothing at all on a full hit) and the last prompt token is
        fed by the next batched decode step, which samples the first token. Sequential
        admission makes the proposals of a burst hit the context the first one stored.
        """
        joined: list[_Seq] = []
        for seq in seqs:
            if seq.params.prompt_logprobs is not None:
                if self._prefill_scoring(seq):
                    joined.append(seq)
                continue
            try:
                seq.kv, seq.cached_tokens = self._prefill_context(seq.prompt[:-1])
            except Exception as exc:
                logger.exception("prefill failed")
                seq.handle.events.put(Failed(f"prefill failed: {exc!r}"))
                continue
            with self._stats_lock:
                self.stats.prefix_cache_queries += len(seq.prompt)
                self.stats.prefix_cache_hits += seq.cached_tokens
                self.stats.prompt_tokens += len(seq.prompt)
            joined.append(seq)
        if joined:
            self._merge(joined)

    def _prefill_context(self, tokens: tuple[int, ...]) -> tuple[KVList, int]:
        """KV of ``tokens`` (batch 1), reusing the prefix cache; returns (KV, cached tokens)."""
        n = len(tokens)
        if n == 0:
            return self._empty_kv(), 0
        prefix_kv, cached = self.prefix_cache.lookup(tokens, limit=n)
        if cached == n and prefix_kv is not None:
            return prefix_kv, n
        input_ids = torch.tensor([tokens[cached:]], dtype=torch.long)
        positions = torch.arange(cached, n, dtype=torch.long).unsqueeze(0)
        cache = self._cache_from(prefix_kv)
        # The base model only: no logits are needed for a context.
        self._decoder(
            input_ids=input_ids, position_ids=positions, use_cache=True, **{self._cache_kw: cache}
        )
        with self._stats_lock:
            self.stats.forward_passes += 1
        kv = _cache_kv(cache)
        self.prefix_cache.insert(tokens, kv)
        return kv, cached

    def _empty_kv(self) -> KVList:
        config = self.model.config
        heads = int(config.num_key_value_heads)
        head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        dtype = next(self.model.parameters()).dtype
        empty = torch.zeros((1, heads, 0, head_dim), dtype=dtype)
        return [(empty, empty) for _ in range(int(config.num_hidden_layers))]

    def _prefill_scoring(self, seq: _Seq) -> bool:
        """Full prefill with logits at every position (no cache read); True if it runs on."""
        prompt = seq.prompt
        k = seq.params.prompt_logprobs or 0
        input_ids = torch.tensor([prompt], dtype=torch.long)
        positions = torch.arange(len(prompt), dtype=torch.long).unsqueeze(0)
        try:
            cache = self._cache_from(None)
            logits = self._forward(input_ids, cache, positions, None, all_logits=True)
        except Exception as exc:
            logger.exception("prefill failed")
            seq.handle.events.put(Failed(f"prefill failed: {exc!r}"))
            return False
        with self._stats_lock:
            self.stats.prompt_tokens += len(prompt)
        kv = _cache_kv(cache)
        self.prefix_cache.insert(prompt, kv)
        entries: list[tuple[float, int, tuple[tuple[int, float], ...]] | None] = [None]
        targets = torch.tensor(prompt[1:], dtype=torch.long)
        chunk = 256  # bounds the float64 copies of [positions, vocab]
        for start in range(0, len(prompt) - 1, chunk):
            stop = min(start + chunk, len(prompt) - 1)
            logp = torch.log_softmax(logits[0, start:stop].double(), dim=-1)
            chosen = logp.gather(1, targets[start:stop].unsqueeze(1)).squeeze(1)
            ranks = ((logp > chosen.unsqueeze(1)).sum(dim=1) + 1).tolist()
            top_vl: list[list[float]] = [[] for _ in range(stop - start)]
            top_il: list[list[int]] = [[] for _ in range(stop - start)]
            if k > 0:
                top_v, top_i = torch.topk(logp, k=min(k, logp.shape[-1]), dim=-1)
                top_vl, top_il = top_v.tolist(), top_i.tolist()
            for r, lp in enumerate(chosen.tolist()):
                top = tuple(zip(top_il[r], top_vl[r], strict=True))
                entries.append((float(lp), int(ranks[r]), top))
        seq.handle.events.put(PromptScores(entries=tuple(entries)))
        seq.kv = kv
        return self._sample([seq], logits[0, -1:])[0]

    # ---- sampling --------------------------------------------------------------------------

    def _sample(self, seqs: Sequence[_Seq], logits: torch.Tensor) -> list[bool]:
        """Sample one token per row of float32 ``logits`` ``[n, V]`` for ``seqs``; emit them.

        Row-wise float64 math, one uniform per sampled token from the row's own generator: a
        row's result does not depend on the other rows. Returns, per row, whether it runs on.
        """
        logits64 = logits.double()
        log_z = torch.logsumexp(logits64, dim=-1)  # raw log p0 = logit - log Z (temperature 1)
        tokens = torch.argmax(logits64, dim=-1)
        hot = [i for i, s in enumerate(seqs) if s.params.temperature >= SAMPLING_EPS]
        if hot:
            idx = torch.tensor(hot, dtype=torch.long)
            temps = torch.tensor([seqs[i].params.temperature for i in hot], dtype=torch.float64)
            scaled = logits64.index_select(0, idx) / temps.unsqueeze(1)
            probs = torch.exp(scaled - scaled.max(dim=1, keepdim=True).values)
            cdf = torch.cumsum(probs, dim=1)
            u = torch.tensor([seqs[i].rng.random() for i in hot], dtype=torch.float64)
            drawn = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
            drawn = drawn.clamp(max=cdf.shape[1] - 1)
            for r, i in enumerate(hot):
                t = int(drawn[r])
                while t > 0 and float(probs[r, t]) == 0.0:  # never a zero-mass token
                    t -= 1
                tokens[i] = t
        kmax = max((s.params.logprobs or 0) for s in seqs)
        top_i: list[list[int]] = []
        top_v: list[list[float]] = []
        if kmax:
            # float32 -> float64 is exact, so the float32 ranking is the float64 one.
            _, indices = torch.topk(logits, k=min(kmax, logits.shape[1]), dim=-1)
            values = logits64.gather(1, indices) - log_z.unsqueeze(1)
            top_v, top_i = values.tolist(), indices.tolist()
        chosen = (logits64.gather(1, tokens.unsqueeze(1)).squeeze(1) - log_z).tolist()
        running = []
        for i, (seq, token) in enumerate(zip(seqs, tokens.tolist(), strict=True)):
            k = seq.params.logprobs or 0
            top = tuple(zip(top_i[i][:k], top_v[i][:k], strict=True)) if k else ()
            running.append(self._emit(seq, int(token), float(chosen[i]), top))
        return running

    def _emit(
        self, seq: _Seq, token: int, logprob: float, top: tuple[tuple[int, float], ...]
    ) -> bool:
        """Record and send ``token``; True if the sequence runs on (else it got Finished)."""
        params = seq.params
        seq.output.append(token)
        reason: str | None = None
        eos = not params.ignore_eos and token in self.loaded.eos_token_ids
        if eos or token in params.stop_token_ids:
            reason = "stop"
        elif len(seq.output) >= params.max_tokens or (
            len(seq.prompt) + len(seq.output) >= self.max_model_len
        ):
            reason = "length"
        seq.handle.events.put(
            TokenEvent(token_id=token, logprob=logprob, top=top, finish_reason=reason)
        )
        with self._stats_lock:
            self.stats.generation_tokens += 1
        if reason is None:
            return True
        seq.handle.events.put(
            Finished(
                reason=reason,
                prompt_tokens=len(seq.prompt),
                completion_tokens=len(seq.output),
                cached_tokens=seq.cached_tokens,
            )
        )
        with self._stats_lock:
            self.stats.requests_finished += 1
            if reason == "stop":
                self.stats.finished_stop += 1
            else:
                self.stats.finished_length += 1
        return False

    # ---- the running batch -----------------------------------------------------------------
    #
    # The batch KV lives in per-layer buffers ``[B, heads, capacity, head_dim]``; rows are
    # left-padded (zeros, masked out) so that every row's last token sits at ``self._blen - 1``.
    # Each decode step writes one column in place (no per-step copy of the whole cache).

    def _merge(self, seqs: list[_Seq]) -> None:
        """Add prefilled sequences (each with its own batch-1 KV) to the running batch."""
        old_len = self._blen if self._batch else 0
        new_len = max([old_len, *(s.kv_len for s in seqs)])
        shift = new_len - old_len
        rows = len(self._batch) + len(seqs)
        capacity = _capacity(new_len + 1)
        kbufs: list[torch.Tensor] = []
        vbufs: list[torch.Tensor] = []
        first_kv = seqs[0].kv
        assert first_kv is not None
        for li, (k0, _) in enumerate(first_kv):
            shape = (rows, k0.shape[1], capacity, k0.shape[3])
            kb = torch.zeros(shape, dtype=k0.dtype)
            vb = torch.zeros(shape, dtype=k0.dtype)
            if self._batch:
                n_old = len(self._batch)
                kb[:n_old, :, shift:new_len] = self._kbufs[li][:, :, :old_len]
                vb[:n_old, :, shift:new_len] = self._vbufs[li][:, :, :old_len]
            for j, s in enumerate(seqs, start=len(self._batch)):
                assert s.kv is not None
                k, v = s.kv[li]
                kb[j, :, new_len - k.shape[2] : new_len] = k[0]
                vb[j, :, new_len - v.shape[2] : new_len] = v[0]
            kbufs.append(kb)
            vbufs.append(vb)
        for s in self._batch:
            s.pad += shift
        for s in seqs:
            s.pad = new_len - s.kv_len
            s.kv = None
        self._batch.extend(seqs)
        self._kbufs, self._vbufs, self._blen = kbufs, vbufs, new_len

    def _ensure_capacity(self, length: int) -> None:
        if self._kbufs and self._kbufs[0].shape[2] >= length:
            return
        capacity = _capacity(length)
        for li in range(len(self._kbufs)):
            for bufs in (self._kbufs, self._vbufs):
                old = bufs[li]
                new = torch.zeros(
                    (old.shape[0], old.shape[1], capacity, old.shape[3]), dtype=old.dtype
                )
                new[:, :, : self._blen] = old[:, :, : self._blen]
                bufs[li] = new

    def _decode_step(self) -> None:
        # Drop cancelled rows before paying for them.
        self._retire([s for s in self._batch if s.handle.cancelled], finished=False)
        if not self._batch:
            return
        self._ensure_capacity(self._blen + 1)
        n = len(self._batch)
        # Each row feeds its newest token (the last prompt token before the first sample).
        input_ids = torch.tensor(
            [[s.output[-1] if s.output else s.prompt[-1]] for s in self._batch], dtype=torch.long
        )
        positions = torch.tensor([[s.kv_len] for s in self._batch], dtype=torch.long)
        mask: torch.Tensor | None = None
        if any(s.pad for s in self._batch):
            pads = torch.tensor([s.pad for s in self._batch], dtype=torch.long)
            mask = (torch.arange(self._blen + 1).unsqueeze(0) >= pads.unsqueeze(1)).long()
        cache = DynamicCache(config=self.model.config)
        cache.layers = [
            _BufferLayer(kb, vb, self._blen)
            for kb, vb in zip(self._kbufs, self._vbufs, strict=True)
        ]
        logits = self._forward(input_ids, cache, positions, mask)
        self._blen += 1
        assert logits.shape[0] == n
        running = self._sample(self._batch, logits[:, -1])
        done = [s for s, run in zip(self._batch, running, strict=True) if not run]
        if done:
            self._retire(done, finished=True)

    def _retire(self, seqs: list[_Seq], *, finished: bool) -> None:
        """Remove rows from the batch; store the KV of finished ones in the prefix cache."""
        if not seqs:
            return
        gone = set(map(id, seqs))
        if finished:
            for s in seqs:
                row = self._batch.index(s)
                n = s.kv_len
                kv = [
                    (
                        kb[row : row + 1, :, s.pad : s.pad + n].clone(),
                        vb[row : row + 1, :, s.pad : s.pad + n].clone(),
                    )
                    for kb, vb in zip(self._kbufs, self._vbufs, strict=True)
                ]
                self.prefix_cache.insert((*s.prompt, *s.output)[:n], kv)
        else:
            with self._stats_lock:
                self.stats.requests_cancelled += len(seqs)
        keep = [i for i, s in enumerate(self._batch) if id(s) not in gone]
        self._batch = [self._batch[i] for i in keep]
        if not self._batch:
            self._kbufs, self._vbufs, self._blen = [], [], 0
            return
        idx = torch.tensor(keep, dtype=torch.long)
        trim = min(s.pad for s in self._batch)
        # index_select copies; dropping the common left padding is a view.
        self._kbufs = [kb.index_select(0, idx)[:, :, trim:] for kb in self._kbufs]
        self._vbufs = [vb.index_select(0, idx)[:, :, trim:] for vb in self._vbufs]
        self._blen -= trim
        for s in self._batch:
            s.pad -= trim


class _BufferLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A KV cache layer over a preallocated buffer: ``update`` writes in place."""

    def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor, length: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.lazy_initialization(kbuf, vbuf)
        self.kbuf, self.vbuf, self.length = kbuf, vbuf, length
        self.keys, self.values = kbuf[:, :, :length], vbuf[:, :, :length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        if end > self.kbuf.shape[2]:
            raise RuntimeError("KV buffer too small (the engine reserves room before a step)")
        self.kbuf[:, :, self.length : end] = key_states
        self.vbuf[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self.kbuf[:, :, :end], self.vbuf[:, :, :end]
        return self.keys, self.values


def _capacity(length: int) -> int:
    """Buffer length for ``length`` tokens: room to grow, rounded up to a multiple of 64."""
    return ((length + length // 4 + 64) // 64) * 64


def _dynamic_layers(cache: DynamicCache) -> list[DynamicLayer]:
    layers = list(cache.layers)
    if not all(isinstance(layer, DynamicLayer) for layer in layers):
        raise TypeError("the embedded engine needs a model whose KV cache is all DynamicLayer")
    return [layer for layer in layers if isinstance(layer, DynamicLayer)]


def _cache_kv(cache: DynamicCache) -> KVList:
    """Per-layer (keys, values) held by ``cache``."""
    out: KVList = []
    for layer in _dynamic_layers(cache):
        if layer.keys is None or layer.values is None:
            raise RuntimeError("a KV cache layer was never filled")
        out.append((layer.keys, layer.values))
    return out


def _cache_kwarg(model: Any) -> str:
    """The forward() keyword for the KV cache (``cache`` in transformers 5.x)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
