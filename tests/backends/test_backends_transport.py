"""Transport: retries counted with sleeps patched out, errors, cancellation (over the
in-memory pool; the bound on requests in flight is the aiohttp pool's: test_backends_pool)."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from presto_client.backends.pool import ConnectError, ReadError, RemoteProtocolError
from presto_client.backends.retry import parse_retry_after
from presto_client.backends.transport import Transport
from presto_client.concurrency import gather_or_fail
from presto_client.errors import (
    EngineError,
    EngineRequestError,
    EngineUnavailableError,
)
from tests.support.memory_pool import Answer, MemoryPool, Sent, json_answer, text_answer


def make(handler: object, sleeps: list[float], **kw: object) -> Transport:
    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    transport = MemoryPool(handler)  # type: ignore[arg-type]
    return Transport(
        "http://engine:8000",
        engine_name="vllm@engine:8000",
        pool=transport,
        sleep=sleep,
        **kw,  # type: ignore[arg-type]
    )


async def test_503_then_ok_is_retried() -> None:
    calls = 0

    def handler(request: Sent) -> Answer:
        nonlocal calls
        calls += 1
        if calls <= 2:
            return json_answer(503, {"error": {"message": "loading"}})
        return json_answer(200, {"ok": True})

    sleeps: list[float] = []
    t = make(handler, sleeps, max_retries=3)
    assert await t.request_json("POST", "/v1/completions", {}, label="p") == {"ok": True}
    assert calls == 3 and len(sleeps) == 2 and t.retries == 2
    assert all(0 <= s <= 8 for s in sleeps)
    await t.aclose()


async def test_429_honours_retry_after() -> None:
    calls = 0

    def handler(request: Sent) -> Answer:
        nonlocal calls
        calls += 1
        if calls == 1:
            return json_answer(429, {"error": "slow down"}, {"Retry-After": "7"})
        return json_answer(200, [1])

    sleeps: list[float] = []
    t = make(handler, sleeps)
    assert await t.request_json("GET", "/x", label="p") == [1]
    assert sleeps == [7.0]
    await t.aclose()


async def test_400_is_not_retried_and_surfaces_the_server_message() -> None:
    calls = 0
    message = "Requested sample logprobs of 50, which is greater than max allowed: 20"

    def handler(request: Sent) -> Answer:
        nonlocal calls
        calls += 1
        body = {"error": {"message": message, "type": "BadRequestError", "code": 400}}
        return json_answer(400, body)

    sleeps: list[float] = []
    t = make(handler, sleeps)
    with pytest.raises(EngineRequestError) as info:
        await t.request_json("POST", "/v1/completions", {}, label="proposal 3")
    assert calls == 1 and sleeps == []
    text = str(info.value)
    assert message in text and "proposal 3" in text and "HTTP 400" in text
    assert text.startswith("[vllm@engine:8000]")
    await t.aclose()


async def test_5xx_exhausts_retries() -> None:
    calls = 0

    def handler(request: Sent) -> Answer:
        nonlocal calls
        calls += 1
        return text_answer(500, "Internal Server Error")

    sleeps: list[float] = []
    t = make(handler, sleeps, max_retries=2)
    with pytest.raises(EngineError, match=r"HTTP 500.*after 3 attempt") as info:
        await t.request_json("POST", "/v1/completions", {}, label="p")
    assert not isinstance(info.value, EngineRequestError)
    assert info.value.retryable and calls == 3 and len(sleeps) == 2
    await t.aclose()


async def test_connection_errors_become_unavailable_after_retries() -> None:
    calls = 0

    def handler(request: Sent) -> Answer:
        nonlocal calls
        calls += 1
        raise ConnectError("connection refused")

    sleeps: list[float] = []
    t = make(handler, sleeps, max_retries=3, restart_window_s=5.0)  # (retried as a restart)
    with pytest.raises(EngineUnavailableError, match=r"cannot reach http://engine:8000 after"):
        await t.request_json("GET", "/health", label="p")
    assert calls == len(sleeps) + 1 and sum(sleeps[:-1]) < 5.0 <= sum(sleeps)
    await t.aclose()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_real_connection_refused_names_url_and_fix() -> None:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    port = _closed_port()
    t = Transport(
        f"http://127.0.0.1:{port}",
        engine_name="e",
        max_retries=2,
        restart_window_s=2.0,  # a refused connection is retried as a restarting server
        sleep=sleep,
        start_hint="start it with `bash scripts/vllm_cpu.sh start`",
    )
    with pytest.raises(EngineUnavailableError) as info:
        await t.request_json("GET", "/v1/models", label="p")
    assert f"127.0.0.1:{port}" in str(info.value) and "vllm_cpu.sh start" in str(info.value)
    assert "check the host and port" in str(info.value)
    assert sum(sleeps[:-1]) < 2.0 <= sum(sleeps)
    await t.aclose()


async def test_cancellation_propagates_and_aborts_the_request() -> None:
    started = asyncio.Event()
    aborted = asyncio.Event()

    async def handler(request: Sent) -> Answer:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            aborted.set()
            raise
        return json_answer(200, {})

    sleeps: list[float] = []
    t = make(handler, sleeps, max_retries=5)
    task = asyncio.create_task(t.request_json("POST", "/v1/completions", {}, label="p"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert aborted.is_set() and sleeps == [] and t.retries == 0
    await t.aclose()


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("-2") == 0.0
    assert parse_retry_after("100000") == 60.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


async def test_gather_or_fail_cancels_siblings_on_failure() -> None:
    cancelled = []

    async def slow(i: int) -> int:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return i

    async def fail() -> int:
        await asyncio.sleep(0)
        raise EngineError("boom")

    with pytest.raises(EngineError, match="boom"):
        await gather_or_fail([slow(0), fail(), slow(2)])
    assert sorted(cancelled) == [0, 2]
    assert await gather_or_fail([asyncio.sleep(0, result=1)]) == [1]


@pytest.mark.parametrize("error", [ReadError, RemoteProtocolError])
async def test_a_dropped_connection_is_sent_again_at_once_then_backs_off(
    error: type[Exception], caplog: pytest.LogCaptureFixture
) -> None:
    # A kept-alive connection the server had closed (llama-server closes one after every
    # stream) fails the request written into it: the first retry goes at once, quietly; a
    # second failure is a server going down, and backs off as a restart.
    calls = 0

    def handler(request: Sent) -> Answer:
        nonlocal calls
        calls += 1
        if calls <= (1 if request.path == "/once" else 2):
            raise error("Can not write request body")
        return json_answer(200, {"ok": True})

    sleeps: list[float] = []
    t = make(handler, sleeps, max_retries=3)
    with caplog.at_level(logging.DEBUG, logger="presto_client.backends.transport"):
        assert await t.request_json("POST", "/once", {}, label="p") == {"ok": True}
    assert sleeps == [0.0] and calls == 2
    assert [r.levelno for r in caplog.records if "retrying" in r.message] == [logging.DEBUG]
    calls, sleeps[:] = 0, []
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="presto_client.backends.transport"):
        assert await t.request_json("POST", "/twice", {}, label="p") == {"ok": True}
    assert sleeps[0] == 0.0 and sleeps[1] > 0 and calls == 3
    levels = [r.levelno for r in caplog.records if "retrying" in r.message]
    assert levels == [logging.DEBUG, logging.WARNING]
    await t.aclose()
