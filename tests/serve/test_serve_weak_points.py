"""Issue 38's weak points of ``presto serve``: a client's bad prompt is a 400 that never names
the upstream's address, ``/health`` reports the upstream's health, and what reaches the log
cannot forge lines or send terminal escapes."""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from serve_helpers import ServiceThread, load, reference_job, write_config

from presto_client.errors import ConfigError
from presto_client.serve.app import ServeOptions
from presto_client.serve.command import options_from
from presto_client.serve.errors import client_text
from tests.support.emulation import EmulationServer


def _emulated(tmp_path: Path, url: str) -> Path:
    data = reference_job(tmp_path / "run")
    data["engines"] = [
        {
            "kind": "vllm",
            "name": "emu",
            "base_url": url,
            "max_retries": 0,
            "connect_timeout_s": 2,
            "restart_window_s": 0,
        }
    ]
    return write_config(tmp_path / "job.yaml", data)


def test_a_bad_prompt_is_a_400_without_the_upstreams_address(tmp_path: Path) -> None:
    with EmulationServer("vllm", vocab_size=32) as upstream:
        address = urlsplit(upstream.base_url).netloc
        with ServiceThread(load(_emulated(tmp_path, upstream.base_url))) as service:

            def post(prompt: object) -> httpx.Response:
                return httpx.post(
                    f"{service.url}/v1/completions",
                    json={"model": "emu", "prompt": prompt, "seed": 1},
                    timeout=60,
                )

            for prompt in ([99], [40, 1], [-1], [1, -5], [], [[]], [[1], []]):
                r = post(prompt)
                assert r.status_code == 400, (prompt, r.text)
                assert address not in r.text and "127.0.0.1" not in r.text, r.text
            # (the vocabulary told by the upstream at open: refused before it is asked)
            assert "outside the vocabulary [0, 32)" in post([99]).json()["error"]["message"]
            assert post([-1]).json()["error"]["param"] == "prompt"
            assert post([1, 2]).status_code == 200


def test_health_reports_the_upstreams_health(tmp_path: Path) -> None:
    upstream = EmulationServer("vllm", vocab_size=32).start()
    address = urlsplit(upstream.base_url).netloc
    try:
        with ServiceThread(load(_emulated(tmp_path, upstream.base_url))) as service:
            ok = httpx.get(f"{service.url}/health", timeout=10)
            assert ok.status_code == 200 and ok.json()["upstream"] == "ok"
            upstream.stop()
            for _ in range(40):  # (one check answers for a second)
                down = httpx.get(f"{service.url}/health", timeout=10)
                if down.status_code == 503:
                    break
                threading.Event().wait(0.1)
            assert down.status_code == 503, down.text
            assert down.json()["status"] == "unavailable"
            assert "unreachable" in down.json()["upstream"]
            assert address not in down.text
    finally:
        upstream.stop()


def test_the_client_text_of_an_upstream_error_has_no_address() -> None:
    for text in (
        "HTTP 400 from http://127.0.0.1:39709: Token id 99",
        "Cannot connect to host gpu-7.internal:8000 ssl:default",
        "at http://user:secret@10.1.2.3:8000/v1.",
        "from [::1]:8080",
    ):
        out = client_text(text)
        assert "<upstream>" in out
        for part in ("127.0.0.1", "39709", "gpu-7", "8000", "10.1.2.3", "secret", "::1"):
            assert part not in out, out


@pytest.mark.parametrize("name", ["evil\x1b[2Jname", "two\nlines", "bidi\u202eeman", ""])
def test_a_model_name_with_control_characters_is_refused(tmp_path: Path, name: str) -> None:
    args = argparse.Namespace(
        host="127.0.0.1",
        port=0,
        traversal="stream",
        model_name=name,
        api_key_env=None,
        max_active=4,
        max_queue=4,
        request_timeout=60.0,
        max_body_bytes=1 << 20,
        max_n=None,
        max_tokens=None,
        no_probe=False,
    )
    with pytest.raises(ConfigError, match="--model-name"):
        options_from(args)
    from presto_client.serve.app import Service
    from presto_client.serve.chains import ServedEngine

    cfg = load(write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run")))
    engine = ServedEngine.__new__(ServedEngine)  # (only its name and config are read first)
    engine.name, engine.config, engine.upstream_model = "ref", cfg, None
    with pytest.raises(ConfigError, match="--model-name"):
        Service(engine, ServeOptions(model_name=name))


def test_a_request_path_cannot_forge_log_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    with (
        caplog.at_level(logging.INFO, logger="presto_client.serve.app"),
        ServiceThread(load(config)) as service,
    ):
        r = httpx.get(f"{service.url}/x%1b%5b2J%0aFORGED%20200", timeout=10)
        assert r.status_code == 404
    lines = [rec.getMessage() for rec in caplog.records]
    assert any("FORGED" in line for line in lines), lines
    assert not any("\x1b" in line or "\n" in line for line in lines), lines


def test_health_answers_at_once_while_a_slow_upstream_check_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 48, item 3: under load an upstream's health route answers slowly (up to the 2 s
    timeout), and /health waited for it every second: a load balancer's 1 s probe evicted a
    replica that was serving. After the first check /health answers with the last one while
    the next runs."""
    from presto_client.serve.chains import ServedEngine

    checks: list[float] = []

    async def slow_upstream(self: ServedEngine, timeout_s: float = 2.0) -> str | None:
        checks.append(time.monotonic())
        await asyncio.sleep(1.5)
        return None

    monkeypatch.setattr(ServedEngine, "upstream_health", slow_upstream)
    with ServiceThread(
        load(write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run")))
    ) as service:
        assert httpx.get(f"{service.url}/health", timeout=10).status_code == 200  # the first waits
        waits = []
        end = time.monotonic() + 4
        while time.monotonic() < end:
            t0 = time.perf_counter()
            assert httpx.get(f"{service.url}/health", timeout=10).status_code == 200
            waits.append(time.perf_counter() - t0)
            time.sleep(0.1)
    assert len(checks) >= 2  # the upstream was checked again meanwhile (once a TTL at most)
    assert max(waits) < 0.5, waits
