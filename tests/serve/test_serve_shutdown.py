"""SIGTERM while ``presto serve`` is busy: a bounded drain.

The first signal stops listening and admitting (queued requests: 503 with Retry-After at once),
running requests have ``--shutdown-grace`` seconds to finish, those still running then are cut
(503) and the exit status is 1; a second signal cuts at once.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_helpers import reference_job, write_config

ROOT = Path(__file__).resolve().parents[2]

HEAVY = {"steps_per_block": 1024, "num_blocks": 4, "max_tokens": 8, "n": 4, "seed": 5}
"""A request of many seconds on the reference engine (16,384 transitions)."""


class Serve:
    """``presto serve`` in a subprocess; ``url`` once it listens, ``log`` its stderr."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        cmd = [sys.executable, "-m", "presto_client.cli", "serve", str(config), "--port", "0"]
        self.proc = subprocess.Popen(
            [*cmd, *args], stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path
        )
        self.log: list[str] = []
        assert self.proc.stderr is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            match = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
            url = match.group(1) if match else None
        assert url is not None, "".join(self.log)
        self.url = url
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def gauge(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        match = re.search(rf"^presto_serve_{name} (\S+)$", text, re.MULTILINE)
        assert match, text
        return float(match.group(1))

    def wait_for(self, name: str, value: float, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.gauge(name) < value:
            assert time.monotonic() < deadline, (name, value)
            time.sleep(0.05)

    def post(self, body: dict[str, Any], out: list[httpx.Response]) -> threading.Thread:
        def run() -> None:
            out.append(
                httpx.post(
                    f"{self.url}/v1/completions",
                    json={"model": "ref", "prompt": [1, 2, 3], **body},
                    timeout=120,
                )
            )

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def busy(tmp_path: Path) -> Iterator[Any]:
    started: list[Serve] = []

    def start(*args: str) -> Serve:
        serve = Serve(tmp_path, "--max-active", "1", *args)
        started.append(serve)
        return serve

    yield start
    for s in started:
        s.close()


def test_sigterm_answers_the_queue_and_cuts_what_outlives_the_grace(busy: Any) -> None:
    serve = busy("--shutdown-grace", "1")
    heavy: list[httpx.Response] = []
    threads = [serve.post(HEAVY, heavy)]
    serve.wait_for("active_requests", 1)
    small: list[httpx.Response] = []
    threads += [serve.post({"max_tokens": 2, "seed": i}, small) for i in range(3)]
    serve.wait_for("queued_requests", 3)
    signalled = time.monotonic()
    serve.proc.send_signal(signal.SIGTERM)
    for t in threads[1:]:
        t.join(timeout=10)
    assert time.monotonic() - signalled < 5  # the queue is answered at once
    assert [r.status_code for r in small] == [503, 503, 503], [r.text for r in small]
    assert all(int(r.headers["Retry-After"]) >= 1 for r in small)
    assert all(r.json()["error"]["code"] == "shutting_down" for r in small)
    with pytest.raises(httpx.ConnectError):  # no longer listening
        httpx.get(f"{serve.url}/health", timeout=5)
    threads[0].join(timeout=30)
    assert heavy and heavy[0].status_code == 503, heavy
    assert "cut" in heavy[0].json()["error"]["message"]
    assert serve.proc.wait(timeout=30) == 1  # work was cut
    assert time.monotonic() - signalled < 20
    assert any("were cut" in line for line in serve.log), serve.log


def test_a_request_that_finishes_within_the_grace_is_answered_and_the_exit_is_clean(
    busy: Any,
) -> None:
    serve = busy("--shutdown-grace", "120")
    done: list[httpx.Response] = []
    body = {"steps_per_block": 256, "num_blocks": 2, "max_tokens": 8, "seed": 1}
    thread = serve.post(body, done)
    serve.wait_for("active_requests", 1)
    serve.proc.send_signal(signal.SIGTERM)
    thread.join(timeout=120)
    assert done and done[0].status_code == 200, done
    assert serve.proc.wait(timeout=60) == 0


def test_a_second_signal_stops_at_once(busy: Any) -> None:
    serve = busy("--shutdown-grace", "600")
    heavy: list[httpx.Response] = []
    thread = serve.post(HEAVY, heavy)
    serve.wait_for("active_requests", 1)
    serve.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert serve.proc.poll() is None  # draining: the heavy request has 600 s
    signalled = time.monotonic()
    serve.proc.send_signal(signal.SIGINT)
    assert serve.proc.wait(timeout=20) == 1
    assert time.monotonic() - signalled < 10
    thread.join(timeout=30)
    assert heavy and heavy[0].status_code == 503, heavy
