"""Credentials in URLs (issue 10, item 1): redacted wherever they are printed or stored, sent as
HTTP Basic auth, and refused together with an API key (both would use Authorization)."""

from __future__ import annotations

import pytest

from presto_client.backends import EngineSpec, create_engine
from presto_client.backends.transport import Transport
from presto_client.errors import ConfigError, EngineError
from presto_client.urls import redact_text, redact_url, split_userinfo
from tests.support.memory_pool import Answer, MemoryPool, Sent, text_answer

SECRET_URL = "http://user:secret@engine:8000"


def test_redact_helpers() -> None:
    assert redact_url(SECRET_URL) == "http://***@engine:8000"
    assert redact_url("http://engine:8000/v1") == "http://engine:8000/v1"
    assert split_userinfo(SECRET_URL) == ("http://engine:8000", ("user", "secret"))
    assert split_userinfo("https://h/x") == ("https://h/x", None)
    text = f"cannot reach {SECRET_URL}/health and https://a:b@c.example/x; ok http://plain:1"
    red = redact_text(text)
    assert "secret" not in red and "a:b@" not in red
    assert "http://***@engine:8000/health" in red and "http://plain:1" in red


async def test_userinfo_is_basic_auth_and_never_in_messages() -> None:
    seen: list[Sent] = []

    def handler(request: Sent) -> Answer:
        seen.append(request)
        return text_answer(500, "boom")

    async def sleep(seconds: float) -> None:
        return None

    t = Transport(
        SECRET_URL,
        engine_name="vllm@engine:8000",
        pool=MemoryPool(handler),
        sleep=sleep,
        max_retries=0,
    )
    with pytest.raises(EngineError) as info:
        await t.request_json("GET", "/v1/models", label="model discovery")
    await t.aclose()
    assert seen[0].headers["Authorization"].startswith("Basic ")
    assert "secret" not in str(info.value) and "secret" not in t.base_url
    assert "user" not in str(seen[0].url)


def test_engine_name_and_url_are_redacted() -> None:
    engine = create_engine(EngineSpec("vllm", (SECRET_URL,)))
    assert "secret" not in engine.name and "secret" not in engine.base_url


def test_userinfo_and_api_key_at_once_are_refused() -> None:
    with pytest.raises(ConfigError, match="not both"):
        EngineSpec("vllm", (SECRET_URL,), api_key="k")
