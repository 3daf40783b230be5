"""Timeouts and retries explained (issue 10, item 4): a read timeout says so, with the timeout
and how to raise it; every retry log line gives its reason."""

from __future__ import annotations

import logging

import pytest

from presto_client.backends.pool import ReadTimeout
from presto_client.backends.transport import Transport
from presto_client.errors import EngineUnavailableError
from tests.support.memory_pool import Answer, MemoryPool, Sent, json_answer


async def test_read_timeout_names_the_limit_and_retries_give_their_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def handler(request: Sent) -> Answer:
        raise ReadTimeout("")

    async def sleep(seconds: float) -> None:
        return None

    t = Transport(
        "http://engine:8000",
        engine_name="vllm@engine:8000",
        pool=MemoryPool(handler),
        sleep=sleep,
        max_retries=2,
        request_timeout_s=42.0,
        start_hint="start it with `python -m vllm...`",
    )
    with (
        caplog.at_level(logging.WARNING, logger="presto_client.backends.transport"),
        pytest.raises(EngineUnavailableError) as info,
    ):
        await t.request_json("POST", "/v1/completions", {}, label="proposal")
    await t.aclose()
    text = str(info.value)
    assert "read timeout" in text and "42 s" in text and "request_timeout_s" in text
    assert "start it" not in text  # the server answered the connection: nothing to start
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 2
    assert all("read timeout" in line for line in retries), retries


async def test_retry_lines_give_the_http_status(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    def handler(request: Sent) -> Answer:
        nonlocal calls
        calls += 1
        if calls == 1:
            return json_answer(503, {"error": {"message": "loading the model"}})
        return json_answer(200, {"ok": 1})

    async def sleep(seconds: float) -> None:
        return None

    t = Transport(
        "http://engine:8000",
        engine_name="e",
        pool=MemoryPool(handler),
        sleep=sleep,
    )
    with caplog.at_level(logging.WARNING, logger="presto_client.backends.transport"):
        assert await t.request_json("GET", "/x", label="p") == {"ok": 1}
    await t.aclose()
    (line,) = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert "HTTP 503" in line and "loading the model" in line
