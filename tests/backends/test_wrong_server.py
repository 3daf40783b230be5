"""A server that is not the one expected (issue 10, items 6 and 15): a plain HTTP server on the
URL is named as such, error bodies stay short, a 404 on /health means a wrong URL, and a refused
connection suggests checking the URL and port before starting a server."""

from __future__ import annotations

import pytest

from presto_client.backends import EngineSpec, create_engine
from presto_client.backends.pool import ConnectError
from presto_client.backends.transport import Transport
from presto_client.errors import EngineError, EngineUnavailableError
from tests.support.memory_pool import Answer, MemoryPool, Sent, json_answer, text_answer

HTML_501 = (
    '<!DOCTYPE HTML>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
    "<title>Error response</title>\n</head>\n<body>\n<h1>Error response</h1>\n"
    "<p>Error code: 501</p>\n<p>Message: Unsupported method ('POST').</p>\n"
    "<p>Error code explanation: 501 - Server does not support this operation.</p>\n"
    + "<p>padding</p>\n" * 200
    + "</body>\n</html>\n"
)
HTML_404 = HTML_501.replace("501", "404").replace("Unsupported method ('POST')", "File not found")


def http_server(request: Sent) -> Answer:
    """What ``python -m http.server`` answers: 404 pages for GET, 501 pages for POST."""
    if request.method == "POST":
        return text_answer(501, HTML_501, "text/html")
    return text_answer(404, HTML_404, "text/html")


def engine(handler: object, calls: list[float] | None = None) -> object:
    async def sleep(seconds: float) -> None:
        if calls is not None:
            calls.append(seconds)

    spec = EngineSpec("vllm", ("http://box:8000",), model="m")
    return create_engine(spec, pool=MemoryPool(handler), sleep=sleep)  # type: ignore[arg-type]


async def test_a_plain_http_server_fails_the_probe_as_a_wrong_url() -> None:
    e = engine(http_server)
    with pytest.raises(EngineError) as info:
        await e.probe()  # type: ignore[attr-defined]
    text = str(info.value)
    assert "404" in text and "wrong URL" in text and "still loading" not in text
    assert "OpenAI-compatible" in text
    await e.aclose()  # type: ignore[attr-defined]


async def test_without_the_probe_a_501_is_not_retried_and_the_page_is_not_dumped() -> None:
    sleeps: list[float] = []
    t = Transport(
        "http://box:8000",
        engine_name="vllm@box:8000",
        pool=MemoryPool(http_server),
        sleep=lambda s: sleeps.append(s) or _none(),  # type: ignore[arg-type,func-returns-value]
    )
    with pytest.raises(EngineError) as info:
        await t.request_json("POST", "/v1/completions", {}, label="proposal")
    await t.aclose()
    text = str(info.value)
    assert sleeps == []  # 501 Not Implemented is final
    assert "not an OpenAI-compatible server" in text
    assert "Unsupported method" in text and "<html" not in text.lower()
    assert len(text) < 400


async def _none() -> None:
    return None


async def test_a_refused_connection_suggests_checking_the_url() -> None:
    def refuse(request: Sent) -> Answer:
        raise ConnectError("[Errno 111] Connection refused")

    e = engine(refuse)
    with pytest.raises(EngineUnavailableError) as info:
        await e.probe()  # type: ignore[attr-defined]
    text = str(info.value)
    assert "connection refused" in text.lower()
    assert "check" in text and "port" in text
    assert text.index("port") < text.index("start it")  # check the URL before starting one
    await e.aclose()  # type: ignore[attr-defined]


async def test_models_endpoint_missing_is_not_an_openai_server() -> None:
    def handler(request: Sent) -> Answer:
        if request.path == "/health":
            return text_answer(200, "ok")
        return text_answer(404, HTML_404, "text/html")

    e = engine(handler)
    with pytest.raises(EngineError) as info:
        await e.probe()  # type: ignore[attr-defined]
    assert "not an OpenAI-compatible server" in str(info.value)
    assert len(str(info.value)) < 500
    await e.aclose()  # type: ignore[attr-defined]


async def test_a_redirect_on_health_is_named_not_followed() -> None:
    def redirecting(request: Sent) -> Answer:
        return Answer(302, headers={"Location": "https://login.example/sso"}, reason="Found")

    e = engine(redirecting)
    with pytest.raises(EngineError) as info:
        await e.probe()  # type: ignore[attr-defined]
    text = str(info.value)
    assert "HTTP 302" in text and "redirect to 'https://login.example/sso', not followed" in text
    assert "still loading" not in text
    await e.aclose()  # type: ignore[attr-defined]


async def test_kind_sglang_against_a_vllm_server_names_the_dialect_that_answered() -> None:
    def vllm_server(request: Sent) -> Answer:
        if request.path == "/health":
            return Answer(200)
        if request.path == "/v1/models":
            return json_answer(200, {"object": "list", "data": [{"id": "m"}]})
        return json_answer(404, {"detail": "Not Found"})

    spec = EngineSpec("sglang", ("http://box:8000",))
    e = create_engine(spec, pool=MemoryPool(vllm_server))
    with pytest.raises(EngineError) as info:
        await e.probe()
    text = str(info.value)
    assert "model discovery: HTTP 404" in text
    assert "/v1/models answers" in text and "kind: vllm" in text
    await e.aclose()


def sglang_server(request: Sent) -> Answer:
    """An SGLang server's model listing; no OpenAI one."""
    if request.path == "/get_model_info":
        return json_answer(200, {"model_path": "m"})
    return text_answer(404, '{"detail":"Not Found"}', "application/json")


async def test_the_other_dialect_is_named_and_the_engine_once() -> None:
    spec = EngineSpec("vllm", ("http://box:8000",), name="gw")
    e = create_engine(spec, pool=MemoryPool(sglang_server))  # type: ignore[arg-type]
    with pytest.raises(EngineError) as info:
        await e.model()  # type: ignore[attr-defined]
    text = str(info.value)
    assert "an SGLang server (kind: sglang)" in text and "fix `kind`" in text
    assert text.startswith("[gw] ") and text.count("[gw]") == 1
    await e.aclose()  # type: ignore[attr-defined]


async def test_a_llama_server_probed_as_vllm_is_named_with_the_flag_that_fixes_it() -> None:
    """Issue 46: without ``--backend llamacpp`` a llama-server failed the probe with a hint at
    float32; its own endpoint (/props) now says what it is, and the error says the fix."""

    def llama_server(request: Sent) -> Answer:
        if request.path == "/health":
            return json_answer(200, {"status": "ok"})
        if request.path == "/v1/models":
            return json_answer(200, {"object": "list", "data": [{"id": "m"}]})
        if request.path == "/props":
            return json_answer(200, {"total_slots": 4, "eos_token": "<|im_end|>"})
        # its OpenAI-compatible completions: no token_logprobs/top_logprobs
        return json_answer(200, {"choices": [{"text": "hi", "index": 0, "logprobs": None}]})

    e = engine(llama_server)
    with pytest.raises(EngineError) as info:
        await e.probe()  # type: ignore[attr-defined]
    text = str(info.value)
    assert "llama.cpp's llama-server" in text and "--backend llamacpp" in text
    assert "float32" not in text
    await e.aclose()  # type: ignore[attr-defined]
