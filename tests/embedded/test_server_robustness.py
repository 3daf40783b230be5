"""``presto serve-embedded`` on a busy port, and clients that hang up early."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from presto_client.child_servers.embedded import EmbeddedServer

pytestmark = pytest.mark.embedded

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m"


def test_busy_port_names_the_port_and_what_to_do_rc_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        proc = subprocess.run(
            [sys.executable, "-m", "presto_client.cli", "serve-embedded", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=ROOT,
        )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    line = next(ln for ln in proc.stderr.splitlines() if "cannot listen" in ln)
    assert f"port {port} is already in use" in line
    assert "--port" in line
    assert f"lsof -i :{port}" in line


@pytest.fixture(scope="module")
def verbose_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(startup_timeout_s=900, extra_args=("-v",))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def _post(path: str, body: dict[str, object]) -> bytes:
    raw = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\n\r\n"
    )
    return head.encode() + raw


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a killed client does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_early_disconnects_log_one_line_each_and_the_server_keeps_serving(
    verbose_server: EmbeddedServer,
) -> None:
    url = verbose_server.base_url
    assert url is not None and verbose_server.log_path is not None
    stream = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 64, "logprobs": 5, "stream": True}

    # a body promised and cut short: the 400 the server answers meets a closed socket
    c = _connect(url)
    c.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"a"')
    c.close()
    # an answer written to a peer that reset the connection
    c = _connect(url)
    c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    _reset(c)
    # a stream abandoned after its first chunk, closed and reset
    for hang_up in (socket.socket.close, _reset):
        c = _connect(url)
        c.sendall(_post("/v1/completions", stream))
        assert c.recv(100)
        hang_up(c)
    # a non-streamed completion abandoned before its answer
    c = _connect(url)
    c.sendall(_post("/v1/completions", {**stream, "stream": False}))
    c.close()
    # a request line cut in two
    c = _connect(url)
    c.sendall(b"GET /hea")
    c.close()

    time.sleep(3)  # the server notices each hang-up within its polling interval
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/health").status_code == 200
        done = client.post(
            "/v1/completions", json={"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}
        )
        assert done.status_code == 200, done.text

    log = verbose_server.log_path.read_text(errors="replace")
    assert "Traceback" not in log
    assert "Exception occurred" not in log
    assert "BrokenPipeError:" not in log and "ConnectionResetError:" not in log
    gone = [ln for ln in log.splitlines() if "closed the connection early" in ln]
    assert gone, log[-3000:]
    assert all(" DEBUG " in ln for ln in gone)
