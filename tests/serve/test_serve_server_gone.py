"""``presto serve`` over a server presto started, gone for good (issue 38, item 2): every
request and ``/health`` answer 503 naming the cause at once, rather than retrying a dead port
for the engine's restart window."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from serve_helpers import load, reference_job, write_config

from presto_client.child_servers.lifecycle import ChildServer
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.serve.app import ServeOptions
from presto_client.serve.lifecycle import start_service

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals")

SERVE = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


class FakeServer(ChildServer):
    name: ClassVar[str] = "fake server"
    workdir_prefix: ClassVar[str] = "presto-fake-"

    def __init__(self) -> None:
        super().__init__(
            port=None,
            startup_timeout_s=30.0,
            stop_grace_s=5.0,
            note_every_s=60.0,
            max_restarts=0,
            watch_every_s=0.1,
        )

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-c", SERVE, str(port)]


class Stalling(ReferenceEngine):
    """The reference engine whose requests hang once ``stalled`` is set: a dead server's
    connection retried for the engine's restart window."""

    stalled = False

    async def _wait(self) -> None:
        if self.stalled:
            await asyncio.sleep(3600)

    async def generate(self, requests: Sequence[Any]) -> list[Any]:
        await self._wait()
        return await super().generate(requests)

    async def stream(self, request: Any) -> AsyncIterator[Any]:
        await self._wait()
        async for part in super().stream(request):
            yield part

    async def score(self, requests: Sequence[Any]) -> list[Any]:
        await self._wait()
        return await super().score(requests)


@pytest.fixture(autouse=True)
def own_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))


async def test_a_service_whose_server_is_gone_answers_503_naming_the_cause(
    tmp_path: Path,
) -> None:
    cfg = load(write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run")))
    replica = Stalling(ReferenceModel(16), name="ref")
    server = FakeServer()
    server.start()
    try:
        running = await start_service(
            cfg, ServeOptions(port=0), replicas=[replica], servers={"ref": server}
        )
        try:
            body = {"model": "ref", "prompt": [1, 2, 3], "max_tokens": 8}
            async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
                ok = await client.post("/v1/completions", json=body)
                assert ok.status_code == 200, ok.text
                replica.stalled = True  # (the server is about to die: its requests hang)
                running_request = asyncio.create_task(client.post("/v1/completions", json=body))
                await asyncio.sleep(0.2)
                pid = server.pid
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 20
                while running.service.watch.failed is None:
                    assert time.monotonic() < deadline, "the failure never reached the service"
                    await asyncio.sleep(0.05)
                # the request that was running is answered at once, not after the window
                cut = await asyncio.wait_for(running_request, timeout=10)
                gone = await client.post("/v1/completions", json=body)
                health = await client.get("/health")
        finally:
            await running.aclose()
    finally:
        server.stop()
    assert cut.status_code == 503 and cut.json()["error"]["code"] == "upstream_gone", cut.text
    assert gone.status_code == 503, gone.text
    error = gone.json()["error"]
    assert error["code"] == "upstream_gone"
    assert "killed by SIGKILL" in error["message"] and "fake server" in error["message"]
    assert "127.0.0.1" not in error["message"]  # (no upstream address for API clients)
    assert health.status_code == 503 and health.json()["status"] == "gone"
    assert "killed by SIGKILL" in health.json()["upstream"]
