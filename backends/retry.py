"""Which failures are retried, for how long, and how long to wait (tenacity).

Connection errors, timeouts, 408, 429 and 5xx are retried (not 501/505, which retrying cannot
change). What a restarting server answers (refused/reset connections, 502/503/504) is retried
for ``restart_window_s`` of backoff, the rest ``max_retries`` times; the wait is jittered
exponential backoff, or the server's ``Retry-After``.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Awaitable, Callable

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_random_exponential

from presto_client.backends.pool import (
    ConnectError,
    ReadError,
    RemoteProtocolError,
    TransportError,
    UnsupportedURL,
)

RETRY_STATUSES = frozenset({408, 429})
RESTART_STATUSES = frozenset({502, 503, 504})
MAX_RETRY_AFTER_S = 60.0
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 8.0
Sleep = Callable[[float], Awaitable[None]]


class RetryableHTTPError(Exception):
    """An answer worth retrying (408, 429, 5xx); becomes an EngineError when retries run out."""

    def __init__(self, status: int, message: str, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def is_restart_symptom(exc: BaseException | None) -> bool:
    """What a restarting server answers: refused/reset connections, a gateway error, 503."""
    if isinstance(exc, RetryableHTTPError):
        return exc.status in RESTART_STATUSES
    return isinstance(exc, ConnectError | RemoteProtocolError | ReadError)


def is_dropped_connection(exc: BaseException | None) -> bool:
    """A connection closed under a request (reset, or closed before any answer). Most often
    a kept-alive connection the server had already closed (its idle timeout; llama-server
    after every stream), which the request never reached: sent again at once, the first time
    (a server really going down then refuses the new connection, and backs off as a restart)."""
    return isinstance(exc, RemoteProtocolError | ReadError)


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, RetryableHTTPError):
        return True
    return isinstance(exc, TransportError) and not isinstance(exc, UnsupportedURL)


class _Wait:
    """Jittered exponential backoff, or the server's ``Retry-After`` when it gave one."""

    def __init__(self) -> None:
        self._backoff = wait_random_exponential(multiplier=BACKOFF_INITIAL_S, max=BACKOFF_MAX_S)

    def __call__(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, RetryableHTTPError) and exc.retry_after is not None:
            return exc.retry_after
        if state.attempt_number == 1 and is_dropped_connection(exc):
            return 0.0
        return float(self._backoff(state))


def retrying(
    *,
    max_retries: int,
    restart_window_s: float,
    sleep: Sleep,
    before_sleep: Callable[[RetryCallState], None],
) -> AsyncRetrying:
    """The retry loop of one request (``reraise``: the last failure surfaces as itself)."""

    def stop(state: RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome is not None else None
        if is_restart_symptom(exc):  # a server restarting: ride it out for a while
            return state.idle_for >= restart_window_s
        return bool(state.attempt_number >= max_retries + 1)

    return AsyncRetrying(
        stop=stop,
        wait=_Wait(),
        retry=retry_if_exception(is_retryable),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
