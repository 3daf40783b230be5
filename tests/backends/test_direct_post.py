"""The completion POSTs over the default pool go to aiohttp directly (issue 8): same headers,
status handling, retries, error mapping, cancellation and stream decoding as through httpx."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from aiohttp import web

from backends.transport import Transport
from presto_client.errors import EngineRequestError, InvalidResponseError

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


async def test_direct_path_only_over_the_default_pool() -> None:
    t = Transport("http://127.0.0.1:1", engine_name="e")
    assert t._direct is not None
    mocked = Transport(
        "http://127.0.0.1:1",
        engine_name="e",
        transport=httpx.MockTransport(lambda r: httpx.Response(200)),
    )
    assert mocked._direct is None
    await t.aclose()
    await mocked.aclose()


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


async def test_cancellation_aborts_a_direct_request(
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
    events = [e async for e in t.stream_events("/v1/completions", {}, label="s")]
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
        async for _ in t.stream_events("/v1/completions", {}, label="s"):
            pass
    await t.aclose()
