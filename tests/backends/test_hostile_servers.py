"""Hostile servers against the real pool (aiohttp on both sides): a huge body, a huge SSE line,
keepalive comments forever, one byte at a time. Each is refused within seconds, naming the limit,
the size seen and the setting, after reading at most the cap (memory bounded)."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from presto_client.backends.transport import Transport
from presto_client.errors import EngineUnavailableError, InvalidResponseError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MIB = 1 << 20
BLOCK = b"x" * (64 * 1024)


@pytest.fixture
async def served() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        app.router.add_get("/v1/models", handler)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def _no_sleep(seconds: float) -> None:
    return None


def _transport(url: str, **kwargs: float) -> Transport:
    return Transport(url, engine_name="e", sleep=_no_sleep, **kwargs)  # type: ignore[arg-type]


async def _drip(response: web.StreamResponse, piece: bytes, every_s: float, total: int) -> None:
    for _ in range(total):
        await response.write(piece)
        await asyncio.sleep(every_s)


async def test_a_200_mb_body_is_refused_after_reading_at_most_the_cap(
    served: Callable[[Handler], Awaitable[str]],
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # chunked: no Content-Length to refuse up front
        await response.prepare(request)
        for _ in range(200 * MIB // len(BLOCK)):
            await response.write(BLOCK)
        return response

    t = _transport(await served(handler), max_response_mb=2)
    tracemalloc.start()
    try:
        started = time.monotonic()
        with pytest.raises(InvalidResponseError) as caught:
            await t.request_json("POST", "/v1/completions", {}, label="p")
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await t.aclose()
    message = str(caught.value)
    assert f"cap of {2 * MIB} bytes" in message and "max_response_mb" in message
    seen = int(message.split("(")[1].split(" bytes seen")[0])
    assert 2 * MIB < seen < 3 * MIB
    assert peak < 16 * MIB, f"peak {peak / MIB:.1f} MiB while refusing a 200 MB body"
    assert elapsed < 5
    assert t.requests_sent == 1  # refused, not retried


async def test_an_announced_500_mb_body_is_refused_before_reading(
    served: Callable[[Handler], Awaitable[str]],
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": str(500 * MIB)})
        await response.prepare(request)
        await _drip(response, BLOCK, 0.01, 100)
        return response

    t = _transport(await served(handler))
    started = time.monotonic()
    with pytest.raises(InvalidResponseError, match=rf"\({500 * MIB} bytes seen"):
        await t.get_text("/v1/models", label="models")
    assert time.monotonic() - started < 2
    await t.aclose()


async def test_a_request_asking_for_more_gets_a_larger_cap(
    served: Callable[[Handler], Awaitable[str]],
) -> None:
    body = b'{"pad": "' + b"y" * (3 * MIB) + b'"}'

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    t = _transport(await served(handler), max_response_mb=1)
    with pytest.raises(InvalidResponseError, match="max_response_mb"):
        await t.request_json("POST", "/v1/completions", {}, label="p")
    answer = await t.request_json("POST", "/v1/completions", {}, label="p", max_bytes=4 * MIB)
    assert len(answer["pad"]) == 3 * MIB
    await t.aclose()


async def _stream_events(t: Transport) -> list[object]:
    return [
        e async for batch in t.stream_event_batches("/v1/completions", {}, label="p") for e in batch
    ]


async def test_a_185_mb_sse_line_is_refused_at_the_line_cap(
    served: Callable[[Handler], Awaitable[str]],
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"a": 1}\n\ndata: "')
        for _ in range(185 * MIB // len(BLOCK)):
            await response.write(BLOCK)
        return response

    t = _transport(await served(handler), max_response_mb=16)
    started = time.monotonic()
    with pytest.raises(InvalidResponseError, match=r"one stream line .* cap of 1048576 bytes"):
        await _stream_events(t)
    assert time.monotonic() - started < 5
    await t.aclose()


async def test_keepalive_comments_forever_meet_the_deadline(
    served: Callable[[Handler], Awaitable[str]],
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await _drip(response, b": keepalive\n\n", 0.05, 10_000)
        return response

    t = _transport(await served(handler), request_timeout_s=1.0, request_deadline_s=1.5)
    started = time.monotonic()
    with pytest.raises(EngineUnavailableError, match=r"request_deadline_s=1\.5 s") as caught:
        await _stream_events(t)
    elapsed = time.monotonic() - started
    assert 1.4 < elapsed < 4 and not caught.value.retryable
    assert t.requests_sent == 1  # a deadline is not retried
    await t.aclose()


async def test_a_body_dripping_one_byte_at_a_time_meets_the_deadline(
    served: Callable[[Handler], Awaitable[str]],
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await _drip(response, b" ", 0.1, 10_000)
        return response

    t = _transport(await served(handler), request_timeout_s=1.0, request_deadline_s=1.0)
    started = time.monotonic()
    with pytest.raises(EngineUnavailableError, match="did not finish answering within"):
        await t.request_json("POST", "/v1/completions", {}, label="p")
    assert time.monotonic() - started < 3
    assert t.requests_sent == 1 and t.retries == 0
    await t.aclose()
