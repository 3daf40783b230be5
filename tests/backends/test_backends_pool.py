"""The default pool (aiohttp's): 1,000 concurrent requests and streams, bounded by the
connector's limit (the replica's one bound), connections reused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from presto_client.backends.aiohttp_pool import AiohttpPool
from presto_client.backends.transport import Transport
from presto_client.backends.wire import SSEDecoder

BOUND = 24
REQUESTS = 1000


@dataclass
class Counters:
    in_flight: int = 0
    peak: int = 0
    served: int = 0
    peers: set[tuple[str, int]] = field(default_factory=set)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Counters]]:
    counters = Counters()

    async def complete(request: web.Request) -> web.StreamResponse:
        counters.in_flight += 1
        counters.peak = max(counters.peak, counters.in_flight)
        counters.peers.add(request.transport.get_extra_info("peername"))  # type: ignore[union-attr]
        try:
            body = await request.json()
            await asyncio.sleep(0.002)
            if body.get("stream"):
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await response.prepare(request)
                for i in range(3):
                    # Two events in one write, the second split across writes.
                    await response.write(f'data: {{"i": {i}}}\n\ndata: {{"j"'.encode())
                    await response.write(f": {i}}}\r\n\r\n".encode())
                await response.write(b"data: [DONE]\n\n")
                return response
            return web.json_response({"n": body["n"]})
        finally:
            counters.in_flight -= 1
            counters.served += 1

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", counters
    await runner.cleanup()


async def test_thousand_concurrent_requests_share_a_bounded_kept_alive_pool(
    server: tuple[str, Counters],
) -> None:
    url, counters = server
    t = Transport(url, engine_name="e", max_concurrency=BOUND)
    assert isinstance(t._pool, AiohttpPool)  # the default pool
    answers = await asyncio.gather(
        *[
            t.request_json("POST", "/v1/completions", {"n": i}, label=f"p{i}")
            for i in range(REQUESTS)
        ]
    )
    assert [a["n"] for a in answers] == list(range(REQUESTS))
    assert counters.served == REQUESTS and t.requests_sent == REQUESTS
    assert counters.peak == BOUND  # the bound is reached, never passed
    assert len(counters.peers) <= BOUND  # connections are reused, not one per request
    await t.aclose()


async def test_thousand_concurrent_streams_stay_bounded(server: tuple[str, Counters]) -> None:
    url, counters = server
    t = Transport(url, engine_name="e", max_concurrency=BOUND)

    async def one() -> list[object]:
        batches = t.stream_event_batches("/v1/completions", {"stream": True}, label="s")
        return [e async for batch in batches for e in batch]

    results = await asyncio.gather(*[one() for _ in range(REQUESTS)])
    expected = [x for i in range(3) for x in ({"i": i}, {"j": i})]
    assert all(r == expected for r in results)
    assert counters.peak == BOUND and counters.served == REQUESTS
    assert len(counters.peers) <= BOUND
    await t.aclose()


def test_sse_decoder_splits_lines_across_chunks() -> None:
    decoder = SSEDecoder()
    got: list[bytes] = []
    for chunk in (b'data: {"a"', b": 1}\r\n\r\ndata:[DONE]", b"\n\n: comment\nevent: x\n"):
        got.extend(bytes(v) for v in decoder.feed(chunk))
    assert got == [b'{"a": 1}', b"[DONE]"]
