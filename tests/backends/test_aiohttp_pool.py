"""The transport over its default pool (aiohttp) and a real server: headers and auth sent,
status handling, retries, aiohttp's errors mapped (read timeout), redirects not followed,
cancellation, and stream decoding."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from presto_client.backends.aiohttp_pool import AiohttpPool, transport_error
from presto_client.backends.pool import (
    ConnectError,
    ConnectTimeout,
    NetworkError,
    ReadError,
    ReadTimeout,
    RemoteProtocolError,
    TransportError,
    UnsupportedURL,
)
from presto_client.backends.transport import Transport
from presto_client.errors import EngineRequestError, EngineUnavailableError, InvalidResponseError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _serve(handler: Handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"127.0.0.1:{port}"


@pytest.fixture
async def served() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        runner, hostport = await _serve(handler)
        runners.append(runner)
        return hostport

    yield start
    for runner in runners:
        await runner.cleanup()


async def _no_sleep(seconds: float) -> None:
    return None


async def _events(t: Transport, label: str) -> list[object]:
    return [
        e
        async for batch in t.stream_event_batches("/v1/completions", {}, label=label)
        for e in batch
    ]


async def test_the_default_pool_is_aiohttps() -> None:
    t = Transport("http://127.0.0.1:1", engine_name="e", max_concurrency=7)
    assert isinstance(t._pool, AiohttpPool) and t._pool.max_connections == 7
    await t.aclose()


async def test_headers_auth_retries_and_status_messages(
    served: Callable[[Handler], Awaitable[str]],
) -> None:
    seen: list[dict[str, str]] = []
    answers = [
        web.json_response({"error": {"message": "busy"}}, status=503),
        web.json_response({"ok": 1}),
        web.json_response({"error": {"message": "max_tokens is too large"}}, status=400),
        web.Response(body=b"<html>nope</html>", content_type="text/html"),
    ]

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append({**request.headers, "body": await request.text()})
        return answers.pop(0)

    hostport = await served(handler)
    t = Transport(f"http://user:s3cret@{hostport}", engine_name="e", sleep=_no_sleep)
    assert await t.request_json("POST", "/v1/completions", {"n": 1}, label="p") == {"ok": 1}
    assert t.retries == 1 and t.requests_sent == 2
    assert seen[0]["body"] == '{"n":1}' and seen[0]["Content-Type"] == "application/json"
    assert seen[0]["Accept"] == "application/json"
    expected = base64.b64encode(b"user:s3cret").decode()
    assert seen[0]["Authorization"] == f"Basic {expected}"
    with pytest.raises(EngineRequestError, match=r"HTTP 400.*max_tokens is too large"):
        await t.request_json("POST", "/v1/completions", {}, label="p")
    with pytest.raises(InvalidResponseError, match="not JSON"):
        await t.request_json("POST", "/v1/completions", {}, label="p")
    await t.aclose()


async def test_cancellation_aborts_the_request(
    served: Callable[[Handler], Awaitable[str]],
) -> None:
    started, aborted = asyncio.Event(), asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        started.set()
        for _ in range(500):  # (aiohttp does not cancel a handler whose client left)
            if request.transport is None or request.transport.is_closing():
                aborted.set()
                break
            await asyncio.sleep(0.01)
        return web.json_response({})

    hostport = await served(handler)
    t = Transport(f"http://{hostport}", engine_name="e", sleep=_no_sleep)
    task = asyncio.create_task(t.request_json("POST", "/v1/completions", {}, label="p"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(aborted.wait(), 5)
    assert t.retries == 0
    await t.aclose()


async def test_stream_reads_that_complete_no_event(
    served: Callable[[Handler], Awaitable[str]],
) -> None:
    """An event split across network reads, the first of which ends no line (a large event,
    a slow server): the read yields nothing, the next completes it."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            await response.write(b'data: {"i": ')
            await asyncio.sleep(0.02)  # its own read
            await response.write(f"{i}}}\n\n".encode())
            await asyncio.sleep(0.02)
        await response.write(b"data: [DONE]\n\n")
        return response

    hostport = await served(handler)
    t = Transport(f"http://{hostport}", engine_name="e", sleep=_no_sleep)
    events = await _events(t, "s")
    assert events == [{"i": 0}, {"i": 1}, {"i": 2}]
    await t.aclose()


async def test_stream_status_errors_surface_the_server_message(
    served: Callable[[Handler], Awaitable[str]],
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "prompt too long"}}, status=400)

    hostport = await served(handler)
    t = Transport(f"http://{hostport}", engine_name="e", sleep=_no_sleep)
    with pytest.raises(EngineRequestError, match=r"HTTP 400.*prompt too long"):
        await _events(t, "s")
    await t.aclose()


async def test_redirects_are_not_followed(served: Callable[[Handler], Awaitable[str]]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("moved"):
            raise AssertionError("the redirect was followed")
        raise web.HTTPTemporaryRedirect("/v1/completions?moved=1")

    hostport = await served(handler)
    t = Transport(f"http://{hostport}", engine_name="e", sleep=_no_sleep)
    with pytest.raises(
        EngineRequestError,
        match=r"HTTP 307 .*redirect to '/v1/completions\?moved=\*\*\*', not followed",
    ):
        await t.request_json("POST", "/v1/completions", {}, label="p")
    with pytest.raises(EngineRequestError, match=r"HTTP 307 .*not followed"):
        [e async for e in t.stream_event_batches("/v1/completions", {}, label="p")]
    assert t.requests_sent == 2
    await t.aclose()


async def test_a_silent_server_is_a_read_timeout(
    served: Callable[[Handler], Awaitable[str]],
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.json_response({})

    hostport = await served(handler)
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    t = Transport(
        f"http://{hostport}", engine_name="e", request_timeout_s=0.2, max_retries=1, sleep=sleep
    )
    with pytest.raises(EngineUnavailableError, match=r"after 2 attempt.*read timeout.*0\.2 s"):
        await t.request_json("POST", "/v1/completions", {}, label="p")
    assert len(sleeps) == 1  # retried max_retries times, not as a restart
    with pytest.raises(EngineUnavailableError, match="read timeout"):
        await _events(t, "s")
    await t.aclose()


def test_aiohttp_failures_map_to_the_pool_errors() -> None:
    """The one place aiohttp's exceptions are translated: what retries, restart detection and
    messages are written against."""
    key = aiohttp.client_reqrep.ConnectionKey("h", 1, False, True, None, None, None)
    cases: list[tuple[BaseException, type[TransportError]]] = [
        (aiohttp.ServerDisconnectedError(), RemoteProtocolError),
        (aiohttp.ClientConnectorError(key, OSError(111, "Connection refused")), ConnectError),
        (aiohttp.ConnectionTimeoutError(), ConnectTimeout),
        (aiohttp.SocketTimeoutError(), ReadTimeout),
        (TimeoutError(), ReadTimeout),
        (aiohttp.ClientPayloadError("cut"), ReadError),
        (aiohttp.ClientOSError(104, "reset"), ReadError),
        (aiohttp.InvalidURL("ftp://x"), UnsupportedURL),
        (aiohttp.ClientError("other"), NetworkError),
    ]
    for exc, want in cases:
        assert type(transport_error(exc)) is want, exc
