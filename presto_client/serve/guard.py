"""What keeps slow or many clients from locking ``presto serve`` up.

- **Read deadlines**: a connection must deliver a request's headers within ``idle_timeout_s``
  of opening (or of its previous answer; aiohttp's keep-alive timer, which a partial header
  does not reset), and a request's body within ``body_timeout_s`` (a 408 otherwise).
- **A connection limit**: at ``max_connections`` open connections, a new one takes the place
  of the one idle longest (no request in progress: a keep-alive connection, or one whose
  headers are still trickling in, the slowloris), and only when every connection is running a
  request is it answered ``503`` with ``Retry-After`` and closed at once. So a flood of slow
  clients cannot take every file descriptor (the default stays well below the process's
  descriptor limit: the upstream's connections and the files need some too), nor lock real
  clients out while it lasts.
- **Log-flood control**: a message that repeats (``Too many open files``, a refused
  connection, a malformed request) is logged a few times per window, then once with how many
  were suppressed, instead of megabytes a second.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

logger = logging.getLogger(__name__)

FLOODED_LOGGERS = ("asyncio", "aiohttp.server", "aiohttp.web", "aiohttp.access", __name__)
"""Loggers whose records pass through :class:`LogFlood` while a service runs."""


def default_max_connections() -> int:
    """Half of the descriptors the process may open (the rest: upstream connections, files),
    between 8 and 1024."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1024
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 1024
    return max(8, min(1024, (soft - 64) // 2))


class LogFlood(logging.Filter):
    """At most ``burst`` records of one kind (logger, message template) per ``window_s``;
    the first record of the next window says how many were suppressed."""

    def __init__(self, burst: int = 5, window_s: float = 10.0) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self._seen: dict[tuple[str, str], tuple[float, int, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        now = time.monotonic()
        with self._lock:
            start, count, suppressed = self._seen.get(key, (now, 0, 0))
            if now - start >= self.window_s:
                if suppressed:
                    record.msg = f"{record.msg} ({suppressed} more like this suppressed)"
                start, count, suppressed = now, 0, 0
            count += 1
            keep = count <= self.burst
            if not keep:
                suppressed += 1
            if len(self._seen) > 1024:  # (bounded: the oldest kinds go)
                self._seen.clear()
            self._seen[key] = (start, count, suppressed)
        return keep


def install_log_flood(flood: LogFlood | None = None) -> tuple[LogFlood, list[logging.Logger]]:
    """Attach ``flood`` to the loggers of :data:`FLOODED_LOGGERS` (undo with
    :func:`remove_log_flood`)."""
    flood = flood or LogFlood()
    loggers = [logging.getLogger(name) for name in FLOODED_LOGGERS]
    for log in loggers:
        log.addFilter(flood)
    return flood, loggers


def remove_log_flood(flood: LogFlood, loggers: list[logging.Logger]) -> None:
    for log in loggers:
        log.removeFilter(flood)


_REFUSAL = orjson.dumps(
    {
        "error": {
            "message": "the server has too many open connections; retry",
            "type": "service_unavailable",
            "param": None,
            "code": "too_many_connections",
        }
    }
)


class _Refuse(asyncio.Protocol):
    """A connection past the limit: a 503 and close, without reading the request."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
            + str(len(_REFUSAL)).encode()
            + b"\r\n\r\n"
            + _REFUSAL
        )
        transport.close()

    def data_received(self, data: bytes) -> None:
        pass


class GuardedSite(web.BaseSite):
    """A TCP site that answers connections past ``max_connections`` with a 503."""

    __slots__ = ("_host", "_port", "evicted", "max_connections", "refused")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, max_connections: int) -> None:
        super().__init__(runner)
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self._host = host
        self._port = port
        self.max_connections = max_connections
        self.refused = 0
        self.evicted = 0

    @property
    def name(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None

        # Handlers made in one burst of accepts get their connection_made a loop turn later:
        # until then they are counted here (for a second at most).
        fresh: deque[tuple[float, Any]] = deque()

        def factory() -> Any:
            now = time.monotonic()
            while fresh and (fresh[0][1].transport is not None or now - fresh[0][0] > 1.0):
                fresh.popleft()
            if len(server.connections) + len(fresh) >= self.max_connections:
                idle = _idle_longest(server.connections)
                if idle is not None:
                    idle.force_close()
                    self.evicted += 1
                    logger.warning(
                        "at the connection limit (--max-connections %d): the connection idle "
                        "longest closed for a new one",
                        self.max_connections,
                    )
                    handler = server()
                    fresh.append((now, handler))
                    return handler
                self.refused += 1
                logger.warning(
                    "a connection refused (503): %d open, the limit (--max-connections)",
                    self.max_connections,
                )
                return _Refuse()
            handler = server()
            fresh.append((now, handler))
            return handler

        self._server = await loop.create_server(
            factory, self._host, self._port, backlog=self._backlog, reuse_address=True
        )


def _idle_longest(connections: Sequence[Any]) -> Any:
    """The open connection without a request in progress whose deadline for its next request
    (aiohttp's keep-alive close time: its opening or its last answer, plus the idle timeout)
    comes first; ``None`` when every one is running a request (or aiohttp's handlers no
    longer tell: then the new connection is refused, as before)."""
    best, first = None, math.inf
    for handler in connections:
        busy = getattr(handler, "_request_in_progress", None)
        messages = getattr(handler, "_messages", None)
        due = getattr(handler, "_next_keepalive_close_time", None)
        if busy is not False or messages or not isinstance(due, float):
            continue
        if handler.transport is not None and due < first:
            best, first = handler, due
    return best
