"""Slowloris and floods on ``presto serve``: read deadlines, a connection limit, quiet logs."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import httpx
import pytest
from serve_helpers import ServiceThread, load, reference_job, write_config

from presto_client.serve.app import ServeOptions
from presto_client.serve.guard import LogFlood, default_max_connections


def _service(tmp_path: Path, **options: object) -> ServiceThread:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    return ServiceThread(load(config), ServeOptions(port=0, **options))  # type: ignore[arg-type]


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed ``sock`` within ``seconds`` (and what it sent first)."""
    sock.settimeout(0.2)
    got = b""
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, got
        if not chunk:
            return True, got
        got += chunk
    return False, got


def test_headers_that_never_end_are_cut_at_the_deadline(tmp_path: Path) -> None:
    with _service(tmp_path, idle_timeout_s=1.0) as service:
        sock = _connect(service.url)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        start = time.monotonic()
        closed = False
        while not closed and time.monotonic() - start < 6:
            try:
                sock.sendall(b"X-Slow: 1\r\n")  # one header line now and then, never the end
            except OSError:
                closed = True
                break
            closed, _ = _closed_within(sock, 0.3)
        assert closed, "a client that never finishes its headers holds the connection"
        assert time.monotonic() - start < 5
        sock.close()
        idle = _connect(service.url)  # and one that sends nothing at all
        assert _closed_within(idle, 5)[0]
        idle.close()
        assert httpx.get(f"{service.url}/health", timeout=10).status_code == 200


def test_a_body_that_never_ends_is_a_408(tmp_path: Path) -> None:
    with _service(tmp_path, body_timeout_s=1.0) as service:
        sock = _connect(service.url)
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": '
        )
        start = time.monotonic()
        closed, got = _closed_within(sock, 6)
        assert got.startswith(b"HTTP/1.1 408"), got
        assert b"request_timeout" in got
        assert closed and time.monotonic() - start < 5
        sock.close()


def _held_until(service: ServiceThread, count: int, *, running: bool) -> None:
    """Until the service holds ``count`` connections (each running a request, when
    ``running``): on a loaded machine its loop takes them in later than the test sends them."""
    server = service.running._runner.server  # type: ignore[union-attr]

    def ready() -> bool:
        held = list(server.connections)
        busy = all(getattr(h, "_request_in_progress", False) for h in held)
        return len(held) == count and (busy or not running)

    deadline = time.monotonic() + 30
    while not service.call(ready):
        assert time.monotonic() < deadline, f"the service never held {count} connections"
        time.sleep(0.02)


def _slow_body(url: str) -> socket.socket:
    """A connection running a request: its headers complete, its body still to come."""
    sock = _connect(url)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model": '
    )
    return sock


def test_at_the_connection_limit_a_new_client_takes_the_place_of_a_slowloris(
    tmp_path: Path,
) -> None:
    """Connections that send nothing, or headers a line at a time, hold no request: at the
    limit the one idle longest is closed for a new client, which is served (they locked
    every other client out, with a 503, until their deadline cut them)."""
    with _service(tmp_path, max_connections=4, idle_timeout_s=30.0) as service:
        slow = [_connect(service.url) for _ in range(4)]
        for sock in slow[:2]:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # never ends
        _held_until(service, 4, running=False)
        clients = [httpx.Client(timeout=10) for _ in range(3)]  # (kept open: each needs a place)
        for client in clients:
            assert client.get(f"{service.url}/health").status_code == 200
        # The three oldest were closed, oldest first (the fourth still holds its place).
        assert [_closed_within(sock, 1)[0] for sock in slow] == [True, True, True, False]
        (site,) = service.running._runner.sites  # type: ignore[union-attr]
        assert site.evicted == 3  # type: ignore[attr-defined]
        for sock in slow:
            sock.close()
        for client in clients:
            client.close()


def test_past_the_connection_limit_a_connection_gets_a_503(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """When every connection is running a request, a new one is refused at once."""
    flood = LogFlood(burst=2, window_s=60)
    guard_log = logging.getLogger("presto_client.serve.guard")
    guard_log.addFilter(flood)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="presto_client.serve.guard"),
            _service(tmp_path, max_connections=4, idle_timeout_s=30.0) as service,
        ):
            held = [_slow_body(service.url) for _ in range(4)]
            _held_until(service, 4, running=True)
            for _ in range(20):
                extra = _connect(service.url)
                closed, got = _closed_within(extra, 5)
                assert closed and got.startswith(b"HTTP/1.1 503"), got
                assert b"Retry-After: 1" in got and b"too_many_connections" in got
                extra.close()
            for sock in held:
                sock.close()
            time.sleep(0.3)
            assert httpx.get(f"{service.url}/health", timeout=10).status_code == 200
    finally:
        guard_log.removeFilter(flood)
    refusals = [r for r in caplog.records if "connection refused" in r.getMessage()]
    assert 1 <= len(refusals) <= 2, [r.getMessage() for r in refusals]  # not one per refusal


def test_a_repeated_message_is_logged_a_few_times_then_counted() -> None:
    flood = LogFlood(burst=3, window_s=0.5)
    log = logging.getLogger("test.flood")
    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record.getMessage())

    handler = Keep()
    log.addHandler(handler)
    log.addFilter(flood)
    log.propagate = False
    try:
        for _ in range(10000):
            log.error("socket.accept() out of system resource: [Errno 24] Too many open files")
        log.error("another message")
        time.sleep(0.6)
        log.error("socket.accept() out of system resource: [Errno 24] Too many open files")
    finally:
        log.removeFilter(flood)
        log.removeHandler(handler)
    assert len(kept) == 5, kept
    assert "9997 more like this suppressed" in kept[-1]


def test_the_default_connection_limit_leaves_descriptors_free() -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = default_max_connections()
    assert 8 <= limit <= 1024
    if soft != resource.RLIM_INFINITY:
        assert limit <= max(8, soft // 2)
