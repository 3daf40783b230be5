"""A server presto started for a job, gone for good mid-run (issue 38, item 2): the job stops
at once naming the cause and the kept log, what finished stays on disk and a rerun resumes it.

The server is a tiny child HTTP server watched by the real
:class:`~presto_client.child_servers.lifecycle.ChildServer`; the engine is the reference engine
reached through it, as an HTTP engine reaches its server: every request first connects to the
child, retrying a refused connection for the restart window (as the HTTP backends do), so a
dead server holds the job as a real one does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from orch_helpers import CountingEngine, make_config, reference_engine, wait_until

from presto_client.child_servers.lifecycle import ChildServer
from presto_client.child_servers.ports import HOST
from presto_client.child_servers.process import health_ok
from presto_client.orchestration.engines.server_watch import ServerFailedError, ServerWatch
from presto_client.orchestration.executors.orchestrator import JobFailedError
from presto_client.orchestration.job import run_job_async
from presto_client.orchestration.run_dir.rundir import read_jsonl
from tests.support.plans import plan_of

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals")

SERVE = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
print("fake server up", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

RESTART_WINDOW_S = 130.0
"""How long the engine retries a refused connection (the HTTP backends' default window)."""


class FakeServer(ChildServer):
    name: ClassVar[str] = "fake server"
    workdir_prefix: ClassVar[str] = "presto-fake-"

    def __init__(self) -> None:
        super().__init__(
            port=None,
            startup_timeout_s=30.0,
            stop_grace_s=5.0,
            note_every_s=60.0,
            max_restarts=2,
            watch_every_s=0.1,
        )

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-c", SERVE, str(port)]


class ThroughServer(CountingEngine):
    """The reference engine behind ``url``: each request first reaches the server."""

    def __init__(self, inner: Any, url: str, **kwargs: Any) -> None:
        super().__init__(inner, **kwargs)
        self.port = int(url.rsplit(":", 1)[1])

    async def _reach(self) -> None:
        deadline = time.monotonic() + RESTART_WINDOW_S
        while True:
            try:
                _, writer = await asyncio.open_connection(HOST, self.port)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return

    async def generate(self, requests: Sequence[Any]) -> list[Any]:
        await self._reach()
        return await super().generate(requests)

    async def score(self, requests: Sequence[Any]) -> list[Any]:
        await self._reach()
        return await super().score(requests)


@pytest.fixture(autouse=True)
def own_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The servers' folders in the test's own: a dead server's logs are kept."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))


def kill_until_given_up(server: ChildServer, within_s: float = 60.0) -> None:
    """SIGKILL the server each time it is (re)started and serves, until the watch gives it
    up (its restarts spent)."""
    deadline = time.monotonic() + within_s
    killed: set[int] = set()
    while server.failure is None:
        assert time.monotonic() < deadline, "the watch never gave the server up"
        pid, url = server.pid, server.base_url
        if pid is not None and pid not in killed and url is not None and health_ok(url):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.02)


async def test_a_job_stops_at_once_naming_its_dead_server_and_resumes(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "run", max_active_chains=1)
    plan = plan_of(cfg)
    server = FakeServer()
    url = server.start()
    try:
        engine = ThroughServer(reference_engine(), url, delay_s=0.02)
        job = asyncio.create_task(
            run_job_async(plan, engine_overrides={"ref": [engine]}, servers={"ref": server})
        )
        samples = tmp_path / "run" / "samples.jsonl"
        await wait_until(lambda: samples.exists() and len(read_jsonl(samples)) >= 2, timeout_s=60)
        await asyncio.to_thread(kill_until_given_up, server)
        given_up = time.monotonic()
        with pytest.raises(JobFailedError) as err:
            # (without the watch, the job would retry the dead port for its restart window)
            await asyncio.wait_for(job, timeout=15)
        took = time.monotonic() - given_up
        log = server.log_path
    finally:
        server.stop()
    assert took < 15
    msg = str(err.value)
    assert "engine ref" in msg and "fake server" in msg, msg
    # (a kill that lands while a restart is still checked fails that restart: gone too)
    assert "killed by SIGKILL" in msg, msg
    assert "after 2 restart(s)" in msg or "could not be restarted" in msg, msg
    assert log is not None and str(log) in msg and log.exists(), msg
    assert str(tmp_path / "run") in msg and "rerun" in msg, msg
    assert engine.in_flight == 0
    done = {s["chain_id"] for s in read_jsonl(samples) if s["status"] == "ok"}
    assert len(done) >= 2
    json.loads((tmp_path / "run" / "summary.json").read_text())  # written at the stop
    # the server is back (the reference engine, no server): the rerun skips what finished
    result = await run_job_async(plan)
    assert result.skipped == len(done) and result.completed == len(plan.chains) - len(done)


async def test_a_server_already_gone_stops_the_work_before_it_runs(tmp_path: Path) -> None:
    server = FakeServer()
    server.max_restarts = 0
    server.start()
    try:
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(kill_until_given_up, server)
        ran = asyncio.Event()

        async def work() -> None:
            ran.set()
            await asyncio.sleep(60)

        async with ServerWatch({"e": server}) as watch:
            assert watch.failed is not None
            with pytest.raises(ServerFailedError, match="engine e: its server is gone"):
                await asyncio.wait_for(watch.race(work()), timeout=5)
    finally:
        server.stop()


async def test_the_callers_cancellation_cancels_the_work_and_is_not_swallowed(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    server.start()
    try:
        cancelled = asyncio.Event()

        async def work() -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        async with ServerWatch({"e": server}) as watch:
            racing = asyncio.create_task(watch.race(work()))
            await asyncio.sleep(0.05)
            racing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await racing
            assert cancelled.is_set() and watch.failed is None
    finally:
        server.stop()
