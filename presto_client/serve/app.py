"""``presto serve``: power sampling behind an OpenAI-compatible HTTP API (aiohttp.web).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (plain, and ``stream: true`` as
server-sent events), ``GET /v1/models``, ``GET /health``, ``GET /metrics``.

Why aiohttp.web and not FastAPI on uvicorn (the engines' convention): aiohttp is already a
dependency (the client's connection pool, the embedded server, the latency server), so the
service adds no web framework (only prometheus_client, for /metrics); the handlers are plain
coroutines on the same event loop as the chains (no thread pool, no dependency-injection
layer), and its ``handler_cancellation`` turns a client
that goes away into a cancelled handler, which is how a disconnected client cancels its chains
and aborts their upstream requests. The request bodies are still validated with pydantic (the
wire models), as FastAPI would. ``benchmarks/bench_serve.py`` measures what the service costs
per request against a direct ``run_chain``.

Streaming: power sampling's cut is uniform over the whole response, so a later block's
Metropolis-Hastings steps may still resample an earlier block: no text is final before the
chain's last transition. A stream therefore carries, while the chains run, one SSE comment per
finished block (``: block 2/4 prompt 0 chain 1``; OpenAI clients skip comments, and they keep
proxies from timing the stream out), then each choice's answer when its chains are done, the
usage chunk (``stream_options.include_usage``) and ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from presto_client.core.runners import ChainResult
from presto_client.errors import (
    ConfigError,
    EngineError,
)
from presto_client.orchestration.engines.server_watch import ServerWatch
from presto_client.serve.admission import Admission
from presto_client.serve.chains import ChainBatch, ServingEngine
from presto_client.serve.errors import ApiError, error_for, invalid, server_gone
from presto_client.serve.mapping import Limits, batch_for, check_config_within
from presto_client.serve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from presto_client.serve.metrics import Metrics
from presto_client.serve.wire import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    ChatBody,
    CompletionBody,
    check_fields,
    parse,
)
from presto_client.terminal_text import server_text
from presto_client.urls import redact_text

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

RETRY_AFTER_LOST_S = 5
"""The Retry-After of a request stopped because its upstream is unreachable."""


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8100
    traversal: str = "stream"
    model_name: str | None = None
    """The model id clients name (default: the engine's name); the upstream's id works too."""
    api_key: str | None = None
    max_active: int = 64
    """Requests running at once; the chains of all of them share the engine's slots."""
    max_queue: int = 256
    request_timeout_s: float = 600.0
    max_body_bytes: int = 1 << 20
    limits: Limits | None = None
    """What one request may ask for; ``None``: the config's ``serve.limits``."""
    shutdown_grace_s: float = 20.0
    """On SIGTERM/SIGINT: how long running requests may finish before they are cut."""
    idle_timeout_s: float = 15.0
    """A connection's deadline for a request's headers, and for idling between requests."""
    body_timeout_s: float = 30.0
    """A request's deadline for its body (408 past it)."""
    max_connections: int | None = None
    """Open connections; one more is answered 503 and closed (``None``: half of the
    process's descriptor limit, at most 1024)."""
    probe: bool = True


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(data), status=status, content_type="application/json", headers=headers
    )


async def _write_queued(response: web.StreamResponse, progress: asyncio.Queue[str]) -> None:
    """Every progress comment in the queue, in one write."""
    queued: list[str] = []
    while not progress.empty():
        queued.append(progress.get_nowait())
    if queued:
        await response.write("".join(queued).encode())


def _route(request: web.Request) -> str | None:
    """The template of the route ``request`` matched (``None``: none, a 404)."""
    try:
        resource = request.match_info.route.resource
    except AttributeError:
        return None
    return resource.canonical if resource is not None else None


def _cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    at = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text[:at], True) if at >= 0 else (text, False)


class Service:
    """The app's state and handlers: one served engine, its admission and counters."""

    def __init__(self, engine: ServingEngine, options: ServeOptions) -> None:
        self.engine = engine
        self.options = options
        self.limits: Limits = options.limits or engine.config.serve.limits
        check_config_within(engine.config, self.limits)
        self.admission = Admission(options.max_active, options.max_queue)
        self.metrics = Metrics(
            {
                "active_requests": ("Requests running", lambda: float(self.admission.active)),
                "queued_requests": (
                    "Requests waiting for a slot",
                    lambda: float(self.admission.waiting),
                ),
                "engine_in_flight": (
                    "Engine requests in flight",
                    lambda: float(self.engine.in_flight),
                ),
            }
        )
        if options.model_name is not None and (
            not options.model_name or server_text(options.model_name) != options.model_name
        ):
            raise ConfigError(
                f"--model-name {server_text(options.model_name)}: a model id is printable text "
                "of at most 200 characters, without control characters (ESC, CR, LF, ...) or "
                "bidirectional overrides"
            )
        self.model_id = options.model_name or engine.name
        self.models = {self.model_id, engine.name}
        if engine.upstream_model:
            self.models.add(engine.upstream_model)
        self._key = options.api_key.encode() if options.api_key else None
        self._cut = asyncio.Event()
        self.watch = ServerWatch()
        """The engine's started server, when presto started it (set by ``start_service``)."""
        self.cut_requests = 0
        """Requests that were running when the grace period ended (answered 503)."""

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.options.max_body_bytes,
            middlewares=[self._errors, self._draining, self._auth],
        )
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        return app

    # ---- middlewares

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        try:
            response = await handler(request)
        except asyncio.CancelledError:
            # the client went away
            self.metrics.request(_route(request), 499, time.perf_counter() - start)
            raise
        except web.HTTPException as exc:  # aiohttp's own (404 route, 405 method)
            error = ApiError(exc.status, exc.reason or "not found")
            response = _json(error.body(), exc.status)
        except Exception as exc:
            error = error_for(exc)
            if error.status >= 500 or isinstance(exc, EngineError):
                # the operator's log: the whole message (the upstream's address included)
                logger.warning(
                    "%s %s: %s",
                    server_text(request.method),
                    server_text(request.path),
                    server_text(redact_text(str(exc)), 2000),
                )
                logger.debug("traceback", exc_info=True)
            response = _json(error.body(), error.status, error.headers)
            if error.status == 408:  # (the rest of a slow body is not waited for)
                response.force_close()
        self.metrics.request(_route(request), response.status, time.perf_counter() - start)
        logger.info(
            "%s %s %d %.3fs",
            server_text(request.method),
            server_text(request.path),
            response.status,
            time.perf_counter() - start,
        )
        return response

    @web.middleware
    async def _draining(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A stopping service answers every new request but /health and /metrics with 503."""
        if self.admission.draining and request.path not in ("/health", "/metrics"):
            raise self.admission.closing()
        if self.watch.failed is not None and request.path not in ("/health", "/metrics"):
            raise server_gone(self.watch.failed)  # (rather than retry a dead port for minutes)
        return await handler(request)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._key is not None and request.path != "/health":
            given = request.headers.get("Authorization", "")
            token = given[7:].strip() if given[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(token.encode(), self._key):
                raise ApiError(
                    401,
                    "a valid API key is needed: Authorization: Bearer <key>",
                    code="invalid_api_key",
                )
        return await handler(request)

    # ---- small routes

    async def health(self, request: web.Request) -> web.Response:
        """200 when the upstream engine answers its own health route, 503 (with what is
        wrong, never its address) when not. Checked at most once a second, however many
        clients ask: /health needs no key and must not become a way to load the upstream."""
        if self.admission.draining:
            return _json({"status": "draining", "engine": self.engine.name}, 503)
        if self.watch.failed is not None:
            gone = server_gone(self.watch.failed).message
            return _json({"status": "gone", "engine": self.engine.name, "upstream": gone}, 503)
        problem = await self.engine.checked_health(fresh=False)
        if problem is not None:
            return _json(
                {"status": "unavailable", "engine": self.engine.name, "upstream": problem}, 503
            )
        return _json({"status": "ok", "engine": self.engine.name, "upstream": "ok"})

    async def list_models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "presto",
            "root": self.engine.upstream_model or self.engine.name,
            "max_model_len": self.engine.max_model_len,
        }
        return _json({"object": "list", "data": [card]})

    async def prometheus(self, request: web.Request) -> web.Response:
        response = web.Response(body=self.metrics.render())
        response.headers["Content-Type"] = METRICS_CONTENT_TYPE
        return response

    # ---- generation

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, CompletionBody, COMPLETION_FIELDS, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, ChatBody, CHAT_FIELDS, chat=True)

    async def _read(self, request: web.Request) -> Any:
        try:
            async with asyncio.timeout(self.options.body_timeout_s):
                raw = await request.read()
        except TimeoutError:
            raise ApiError(
                408,
                f"the request body did not arrive within {self.options.body_timeout_s:g} s",
                code="request_timeout",
            ) from None
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(
                413,
                f"the body is larger than this server's limit of "
                f"{self.options.max_body_bytes} bytes",
                code="request_too_large",
            ) from None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise invalid(f"the body is not valid JSON: {exc}") from None

    async def _generate(
        self, request: web.Request, model: type[Any], fields: tuple[str, ...], *, chat: bool
    ) -> web.StreamResponse:
        raw = await self._read(request)
        ignored = check_fields(raw, fields)
        body = parse(model, raw)
        if body.model not in self.models:
            raise ApiError(
                404,
                f"the model {body.model!r} does not exist; this server serves {self.model_id!r}",
                param="model",
                code="model_not_found",
            )
        deadline = self.options.request_timeout_s
        if body.stream:
            return await self._stream(request, body, ignored, chat=chat)
        async with asyncio.timeout(deadline):
            batch = await batch_for(self.engine, body, self.options.traversal, self.limits)
            queued_at = time.perf_counter()
            async with self.admission.slot():
                start = time.perf_counter()
                self.metrics.queued(start - queued_at)
                results = await self._run_or_cut(batch)
                self.admission.observe(time.perf_counter() - start)
            answer = await self._answer(body, batch, results, ignored, chat=chat)
        return _json(answer)

    # ---- stopping

    def begin_drain(self) -> int:
        """Stop admitting (new and queued requests: 503 with Retry-After); returns how many
        queued requests were answered so."""
        self.admission.drain_retry_after_s = max(1, math.ceil(self.options.shutdown_grace_s))
        return self.admission.drain()

    def cut_running(self) -> None:
        """End every running request now: its chains are cancelled (their upstream requests
        aborted) and it is answered 503 with Retry-After."""
        self._cut.set()

    async def _run_or_cut(
        self, batch: ChainBatch, on_block: Callable[[int, int, int], None] | None = None
    ) -> list[ChainResult]:
        """``engine.run(batch)``, or a 503 when the stopping service cuts it."""
        if self._cut.is_set():
            raise self.admission.closing()
        run = asyncio.ensure_future(self.engine.run(batch, on_block))
        cut = asyncio.ensure_future(self._cut.wait())
        lost = asyncio.ensure_future(self.engine.unreachable())
        stops: set[asyncio.Future[Any]] = {cut, lost}
        if self.watch.servers:  # (the engine's server gone for good ends the request too)
            stops.add(asyncio.ensure_future(self.watch.wait()))
        try:
            await asyncio.wait({run, *stops}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for stop in stops:
                stop.cancel()
            if not run.done():
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
        if self.watch.failed is not None and (run.cancelled() or run.exception() is not None):
            raise server_gone(self.watch.failed)
        if lost.done() and not lost.cancelled() and run.cancelled():
            raise ApiError(
                503,
                f"the upstream engine is unreachable ({lost.result()}): this request was "
                "stopped; retry (another replica, or this one once its engine is back)",
                headers={"Retry-After": str(RETRY_AFTER_LOST_S)},
            )
        if run.cancelled():
            self.cut_requests += 1
            error = self.admission.closing()
            error.message = (
                "the server is shutting down: this request was still running at the end of "
                "its grace period and was cut; retry"
            )
            raise error
        return run.result()

    async def _texts(
        self, body: Any, results: Sequence[ChainResult]
    ) -> list[tuple[str, str, tuple[int, ...]]]:
        """``(text, finish_reason, token_ids)`` of every choice: EOS or a stop string is
        ``stop`` (the EOS's own text is left out of the text). A stop string cuts the text
        before it and the tokens after the one that completed it (vLLM's convention), so the
        ids and the text end at the same place."""
        out: list[tuple[str, str, tuple[int, ...]]] = []
        eos = self.engine.eos_token_id
        stops = body.stops()
        for r in results:
            ids = tuple(r.token_ids)
            text = ""
            if self.engine.can_detokenize:
                # The EOS ends the answer; its text (<|im_end|>) is no part of it, as OpenAI's
                # and vLLM's answers leave it out (the ids keep it: finish_reason says why).
                shown = ids[:-1] if eos is not None and ids and ids[-1] == eos else ids
                text = await self.engine.detokenize(shown) or ""
            text, stopped = _cut_at_stop(text, stops)
            if stopped:
                ids = ids[: await self._stop_token_count(ids, stops)]
            ended = eos is not None and len(ids) > 0 and ids[-1] == eos
            out.append((text, "stop" if stopped or ended else "length", ids))
        return out

    async def _stop_token_count(self, ids: tuple[int, ...], stops: Sequence[str]) -> int:
        """The fewest leading tokens whose text holds a stop string (the whole text does):
        a binary search, as a longer prefix's text extends a shorter one's."""
        low, high = 1, len(ids)
        while low < high:
            mid = (low + high) // 2
            text = await self.engine.detokenize(ids[:mid]) or ""
            if _cut_at_stop(text, stops)[1]:
                high = mid
            else:
                low = mid + 1
        return high

    def _usage(
        self, batch: ChainBatch, results: Sequence[ChainResult], completion: int
    ) -> dict[str, int]:
        prompt = sum(len(p) for p in batch.prompts)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "tokens_generated": sum(r.stats.tokens_generated for r in results),
        }

    def _presto(self, batch: ChainBatch, ignored: Sequence[str]) -> dict[str, Any]:
        s = batch.sampler
        return {
            "seed": batch.seed,
            "sampler": s.sampler,
            "traversal": batch.traversal,
            "alpha": s.alpha,
            "block_size": s.block_size,
            "num_blocks": s.num_blocks,
            "steps_per_block": s.steps_per_block,
            "ignored": list(ignored),
        }

    async def _answer(
        self,
        body: Any,
        batch: ChainBatch,
        results: Sequence[ChainResult],
        ignored: Sequence[str],
        *,
        chat: bool,
    ) -> dict[str, Any]:
        self.metrics.chains(results, sum(len(p) for p in batch.prompts))
        choices: list[dict[str, Any]] = []
        for index, (text, reason, ids) in enumerate(await self._texts(body, results)):
            choice: dict[str, Any] = {"index": index, "finish_reason": reason, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choice["token_ids"] = list(ids)
            choices.append(choice)
        return {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.model,
            "choices": choices,
            "usage": self._usage(batch, results, sum(len(c["token_ids"]) for c in choices)),
            "presto": self._presto(batch, ignored),
        }

    async def _stream(
        self, request: web.Request, body: Any, ignored: Sequence[str], *, chat: bool
    ) -> web.StreamResponse:
        ends = time.monotonic() + self.options.request_timeout_s
        async with contextlib.AsyncExitStack() as stack:
            async with asyncio.timeout(self.options.request_timeout_s):  # (before the headers)
                batch = await batch_for(self.engine, body, self.options.traversal, self.limits)
                queued_at = time.perf_counter()
                await stack.enter_async_context(self.admission.slot())  # a 429: no headers yet
                self.metrics.queued(time.perf_counter() - queued_at)
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            progress: asyncio.Queue[str] = asyncio.Queue()
            total = batch.sampler.num_blocks

            def on_block(i: int, j: int, done: int) -> None:
                progress.put_nowait(f": block {done}/{total} prompt {i} chain {j}\n\n")

            start = time.perf_counter()
            run = asyncio.ensure_future(self._run_or_cut(batch, on_block))
            getter: asyncio.Future[str] | None = None
            try:
                while not run.done():
                    getter = asyncio.ensure_future(progress.get())
                    left = ends - time.monotonic()
                    await asyncio.wait(
                        {run, getter}, timeout=max(left, 0), return_when=asyncio.FIRST_COMPLETED
                    )
                    if getter.done():
                        await response.write(getter.result().encode())
                    else:
                        getter.cancel()
                    await _write_queued(response, progress)
                    if not run.done() and time.monotonic() >= ends:
                        raise TimeoutError
                results = run.result()
                # the chains' last blocks finish together: their comments are still queued
                await _write_queued(response, progress)
            except Exception as exc:
                error = error_for(exc)
                logger.warning(
                    "stream %s: %s",
                    server_text(request.path),
                    server_text(redact_text(str(exc)), 2000),
                )
                with contextlib.suppress(ConnectionError):
                    await response.write(b"data: " + orjson.dumps(error.body()) + b"\n\n")
                return response
            finally:
                if getter is not None:
                    getter.cancel()
                if not run.done():  # the client went away (or the deadline passed)
                    run.cancel()
                    await asyncio.gather(run, return_exceptions=True)
            self.admission.observe(time.perf_counter() - start)
            answer = await self._answer(body, batch, results, ignored, chat=chat)
            for chunk in self._chunks(answer, chat=chat):
                await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            if body.include_usage:
                usage = {**self._chunk_head(answer, chat), "choices": [], "usage": answer["usage"]}
                await response.write(b"data: " + orjson.dumps(usage) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        raise AssertionError("unreachable")  # (the stack never swallows)

    @staticmethod
    def _chunk_head(answer: dict[str, Any], chat: bool) -> dict[str, Any]:
        return {
            "id": answer["id"],
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": answer["created"],
            "model": answer["model"],
            "presto": answer["presto"],
        }

    def _chunks(self, answer: dict[str, Any], *, chat: bool) -> list[dict[str, Any]]:
        head = self._chunk_head(answer, chat)
        chunks: list[dict[str, Any]] = []
        for c in answer["choices"]:
            if chat:
                content = c["message"]["content"]
                delta = {"role": "assistant", "content": content}
                first = {
                    "index": c["index"],
                    "delta": delta,
                    "finish_reason": None,
                    "logprobs": None,
                    "token_ids": c["token_ids"],
                }
                last = {
                    "index": c["index"],
                    "delta": {},
                    "finish_reason": c["finish_reason"],
                    "logprobs": None,
                }
                chunks += [{**head, "choices": [first]}, {**head, "choices": [last]}]
            else:
                choice = {
                    "index": c["index"],
                    "text": c["text"],
                    "finish_reason": c["finish_reason"],
                    "logprobs": None,
                    "token_ids": c["token_ids"],
                }
                chunks.append({**head, "choices": [choice]})
        return chunks
