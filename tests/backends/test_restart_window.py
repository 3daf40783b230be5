"""Retry defaults that ride out a server restart (issue 10, item 5): refused connections and
502/503/504 are retried for about a minute of backoff, while 4xx still fail at once and read
timeouts keep their few retries."""

from __future__ import annotations

import pytest

from presto_client.backends.pool import ConnectError, ReadTimeout
from presto_client.backends.spec import DEFAULT_RESTART_WINDOW_S, EngineSpec
from presto_client.backends.transport import Transport
from presto_client.errors import EngineRequestError, EngineUnavailableError
from presto_client.orchestration.config.schema import HttpEngineConfig
from tests.support.memory_pool import Answer, MemoryPool, Sent, json_answer


def _transport(handler: object, sleeps: list[float], **kw: object) -> Transport:
    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    return Transport(
        "http://engine:8000",
        engine_name="e",
        pool=MemoryPool(handler),  # type: ignore[arg-type]
        sleep=sleep,
        **kw,  # type: ignore[arg-type]
    )


def test_the_defaults_agree() -> None:
    assert 30.0 <= DEFAULT_RESTART_WINDOW_S <= 120.0
    assert EngineSpec("vllm", ("http://a:1",)).restart_window_s == DEFAULT_RESTART_WINDOW_S
    cfg = HttpEngineConfig(kind="vllm", base_url="http://a:1")
    assert cfg.restart_window_s == DEFAULT_RESTART_WINDOW_S


@pytest.mark.parametrize("outage_s", [30.0, 50.0])
async def test_a_restart_of_up_to_a_minute_is_ridden_out(outage_s: float) -> None:
    sleeps: list[float] = []

    def handler(request: Sent) -> Answer:
        if sum(sleeps) < outage_s:  # down (refused, then 503 while loading) for outage_s
            if sum(sleeps) < outage_s / 2:
                raise ConnectError("[Errno 111] Connection refused")
            return json_answer(503, {"error": {"message": "loading"}})
        return json_answer(200, {"ok": 1})

    t = _transport(handler, sleeps)
    assert await t.request_json("POST", "/v1/completions", {}, label="p") == {"ok": 1}
    await t.aclose()


async def test_an_outage_longer_than_the_window_fails_after_it() -> None:
    sleeps: list[float] = []

    def handler(request: Sent) -> Answer:
        raise ConnectError("[Errno 111] Connection refused")

    t = _transport(handler, sleeps, restart_window_s=20.0)
    with pytest.raises(EngineUnavailableError, match="connection refused"):
        await t.request_json("GET", "/v1/models", label="p")
    await t.aclose()
    assert 20.0 <= sum(sleeps) <= 20.0 + 12.0


async def test_4xx_fails_at_once_and_read_timeouts_keep_max_retries() -> None:
    sleeps: list[float] = []
    t = _transport(lambda r: json_answer(400, {"error": "bad"}), sleeps)
    with pytest.raises(EngineRequestError):
        await t.request_json("POST", "/v1/completions", {}, label="p")
    assert sleeps == []
    await t.aclose()

    def timeout(request: Sent) -> Answer:
        raise ReadTimeout("")

    t = _transport(timeout, sleeps, max_retries=3)
    with pytest.raises(EngineUnavailableError, match="read timeout"):
        await t.request_json("POST", "/v1/completions", {}, label="p")
    assert len(sleeps) == 3
    await t.aclose()
