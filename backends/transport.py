"""The one HTTP transport of a replica: what is sent, how answers are checked, retried and
turned into the errors the orchestration catches.

* Requests go to a :class:`~presto_client.backends.pool.Pool` (aiohttp's by default, an in-memory
double in
  tests): every request, plain or streamed, completion or probe, takes the same path, so the
  status handling, retries, error mapping and timeouts below are the ones that run.
* The pool's connection limit (``max_concurrency``) is the replica's one bound on requests in
  flight; the orchestrator's semaphores bound a job.
* Retries (:mod:`presto_client.backends.retry`): connection errors, timeouts, 408, 429 and 5xx, a
restarting
  server's symptoms for ``restart_window_s``, ``Retry-After`` honoured. A 4xx surfaces at once
  as :class:`~presto_client.errors.EngineRequestError` with the server's own message, cut short
  (an HTML page is named as not an OpenAI-compatible server).
* Redirects are never followed; a URL's ``user:password@`` is sent as HTTP Basic auth and never
  shown (messages carry the redacted URL).
* Every request has a total deadline (``request_deadline_s``: the request timeout is the
  longest silence, which keepalive comments or a trickle of bytes never reach) and a size cap
  (``max_response_mb``, raised per request by what it asks for: tokens x top-K), an SSE line
  a sixteenth of it. Neither is retried: the server answered, and asking again costs the same
  again (a deadline retried would hold a chain ``max_retries + 1`` times as long).
* Cancellation is never swallowed: cancelling a caller aborts its HTTP request, and closing a
  stream iterator closes the HTTP stream (which aborts the request on the server).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

import orjson
from tenacity import RetryCallState

from presto_client import defaults
from presto_client.backends.aiohttp_pool import AiohttpPool
from presto_client.backends.http_errors import (
    FINAL_5XX,
    body_message,
    describe_transport_error,
    is_refused,
)
from presto_client.backends.pool import (
    Pool,
    ReadTimeout,
    RequestHeaders,
    ResponseTooLarge,
    StreamReply,
    TransportError,
    declared_length,
)
from presto_client.backends.retry import (
    RETRY_STATUSES,
    RetryableHTTPError,
    Sleep,
    is_dropped_connection,
    is_restart_symptom,
    parse_retry_after,
    retrying,
)
from presto_client.backends.spec import DEFAULT_RESTART_WINDOW_S
from presto_client.backends.wire import SSEDecoder, decode_events, decode_json
from presto_client.errors import (
    ConfigError,
    EngineError,
    EngineRequestError,
    EngineUnavailableError,
    InvalidResponseError,
)
from presto_client.urls import redact_url, split_userinfo

logger = logging.getLogger(__name__)


BYTES_PER_LOGPROB = 1024
"""A generous size of one returned logprob entry on the wire (token text, bytes, id, value)."""
SSE_LINE_SHARE = 16
"""An SSE line may take this fraction of the response cap (one event carries a few tokens)."""
_MIB = 1 << 20


def response_cap(max_response_mb: float, tokens: int = 0, top_k: int = 0) -> int:
    """The size cap of one answer: ``max_response_mb``, or more for a request that asks for
    ``tokens`` tokens with ``top_k`` alternatives each (and the token itself)."""
    return max(int(max_response_mb * _MIB), tokens * (max(top_k, 0) + 1) * BYTES_PER_LOGPROB)


def _basic_auth_header(username: str, password: str) -> str:
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return f"Basic {token}"


class Transport:
    """HTTP access to one replica (``base_url``)."""

    def __init__(
        self,
        base_url: str,
        *,
        engine_name: str,
        max_concurrency: int = defaults.ENGINE_MAX_CONCURRENCY,
        request_timeout_s: float = defaults.REQUEST_TIMEOUT_S,
        connect_timeout_s: float = defaults.CONNECT_TIMEOUT_S,
        max_retries: int = defaults.MAX_RETRIES,
        restart_window_s: float = DEFAULT_RESTART_WINDOW_S,
        request_deadline_s: float = defaults.REQUEST_DEADLINE_S,
        max_response_mb: float = defaults.MAX_RESPONSE_MB,
        api_key: str | None = None,
        pool: Pool | None = None,
        sleep: Sleep | None = None,
        start_hint: str = "",
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        url, userinfo = split_userinfo(base_url.rstrip("/"))
        if userinfo is not None and api_key:
            raise ConfigError(
                f"{redact_url(base_url)}: give user:password@ or an API key, not both"
            )
        self.base_url = redact_url(base_url.rstrip("/"))
        """The URL as shown in messages (credentials redacted)."""
        self.engine_name = engine_name
        self.max_retries = max(0, int(max_retries))
        self.restart_window_s = max(0.0, float(restart_window_s))
        self.start_hint = start_hint
        self.request_deadline_s = float(request_deadline_s)
        self.max_response_mb = float(max_response_mb)
        self._timeouts = {
            "request_timeout_s": request_timeout_s,
            "connect_timeout_s": connect_timeout_s,
        }
        self._url = url
        headers = {"Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        if userinfo is not None:
            headers["Authorization"] = _basic_auth_header(*userinfo)
        self._base_headers = headers
        self.headers = RequestHeaders.of(headers)
        """What every request carries (a routed chain's add its key: :meth:`with_header`)."""
        self._pool: Pool = (
            pool
            if pool is not None
            else AiohttpPool(
                max_concurrency,
                request_timeout_s=request_timeout_s,
                connect_timeout_s=connect_timeout_s,
            )
        )
        self._sleep: Sleep = sleep if sleep is not None else asyncio.sleep
        self.requests_sent = 0
        self.retries = 0

    def with_header(self, name: str, value: str) -> RequestHeaders:
        """The request headers plus ``name: value`` (a chain's routing key), built once."""
        return RequestHeaders.of({**self._base_headers, name: value})

    # ---- errors

    def _unavailable(self, exc: BaseException, attempts: int) -> EngineUnavailableError:
        hint = f"; if no server runs there, {self.start_hint}" if self.start_hint else ""
        if isinstance(exc, ReadTimeout):
            hint = ""  # the server took the connection: there is nothing to start
        elif is_refused(exc):  # most often a typo in the URL or port, not a server to start
            hint = f"; check the host and port of base_url ({self.base_url}){hint}"
        what = describe_transport_error(exc, **self._timeouts)
        return EngineUnavailableError(
            f"cannot reach {self.base_url} after {attempts} attempt(s) ({what}){hint}",
            engine=self.engine_name,
            retryable=True,
        )

    def _final_error(self, exc: BaseException, attempts: int, label: str) -> BaseException:
        if isinstance(exc, RetryableHTTPError):
            cls = EngineUnavailableError if exc.status in (503, 429, 408) else EngineError
            return cls(
                f"{label}: HTTP {exc.status} from {self.base_url} after {attempts} attempt(s): "
                f"{exc.message}",
                engine=self.engine_name,
                retryable=True,
            )
        if isinstance(exc, TransportError):
            return self._unavailable(exc, attempts)
        return exc

    def _raise_for_status(
        self, status: int, headers: Mapping[str, str], reason: str, body: bytes, label: str
    ) -> None:
        """An answer of status >= 400 as the exception it stands for (always raises)."""
        text = body.decode("utf-8", "replace")
        try:
            parsed: Any = json.loads(text) if text else None
        except json.JSONDecodeError:
            parsed = None
        message = body_message(parsed, text, headers.get("Content-Type", ""), reason)
        if status in RETRY_STATUSES or (status >= 500 and status not in FINAL_5XX):
            raise RetryableHTTPError(status, message, parse_retry_after(headers.get("Retry-After")))
        raise EngineRequestError(
            f"{label}: HTTP {status} from {self.base_url}: {message}", engine=self.engine_name
        )

    def _refuse_redirect(self, status: int, headers: Mapping[str, str], label: str) -> None:
        """A 3xx answer as the error it is: redirects are never followed (they could take the
        credentials to another host), so the URL is to be fixed instead (always raises)."""
        where = headers.get("Location")
        target = repr(redact_url(where[:200])) if where else "nowhere (no Location header)"
        raise EngineRequestError(
            f"{label}: HTTP {status} from {self.base_url}: a redirect to {target}, not followed "
            "(redirects never are); point base_url at the server itself",
            engine=self.engine_name,
        )

    def _too_large(self, exc: ResponseTooLarge, label: str, what: str) -> EngineError:
        return InvalidResponseError(
            f"{label}: {what} from {self.base_url} is larger than its cap of {exc.limit} bytes "
            f"({exc.seen} bytes seen, refused there); if the server is right, raise "
            f"max_response_mb (now {self.max_response_mb:g}) in the engine config",
            engine=self.engine_name,
        )

    def _past_deadline(self, label: str) -> EngineError:
        return EngineUnavailableError(
            f"{label}: {self.base_url} did not finish answering within "
            f"request_deadline_s={self.request_deadline_s:g} s (silent, or answering too slowly "
            "to finish: the request's whole deadline, not the read timeout, ran out); not "
            "retried; raise request_deadline_s in the engine config if its answers are that slow",
            engine=self.engine_name,
        )

    # ---- retries

    def _before_sleep(self, state: RetryCallState) -> None:
        self.retries += 1
        exc = state.outcome.exception() if state.outcome is not None else None
        reason = (
            describe_transport_error(exc, **self._timeouts)
            if isinstance(exc, TransportError)
            else str(exc)
        )
        budget = (
            f"for up to {self.restart_window_s:g} s (restart_window_s)"
            if is_restart_symptom(exc)
            else f"of {self.max_retries + 1}"
        )
        # A dropped connection's first retry is routine (a kept-alive connection the server
        # had closed): said only at debug level.
        quiet = state.attempt_number == 1 and is_dropped_connection(exc)
        logger.log(
            logging.DEBUG if quiet else logging.WARNING,
            "[%s] retrying %s (attempt %d %s) after %s",
            self.engine_name,
            self.base_url,
            state.attempt_number + 1,
            budget,
            reason,
        )

    async def _with_retries(self, attempt: Callable[[], Awaitable[Any]], label: str) -> Any:
        # The first attempt runs outside tenacity: it almost always succeeds, and building and
        # driving an AsyncRetrying costs ~20 µs per request. A failure is replayed as
        # tenacity's first attempt (raised again, nothing re-sent), so which errors are
        # retried, attempt counts, messages, backoff and the restart window (which counts
        # sleeps only) are tenacity's. BaseException (cancellation) propagates.
        try:
            return await attempt()
        except Exception as exc:
            first: Exception | None = exc

        async def again() -> Any:
            nonlocal first
            if first is not None:
                failure, first = first, None
                raise failure
            return await attempt()

        attempts = 0
        try:
            async for try_ in retrying(
                max_retries=self.max_retries,
                restart_window_s=self.restart_window_s,
                sleep=self._sleep,
                before_sleep=self._before_sleep,
            ):
                with try_:
                    attempts += 1
                    return await again()
        except asyncio.CancelledError:
            raise
        except (RetryableHTTPError, TransportError) as exc:
            raise self._final_error(exc, attempts, label) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    # ---- requests

    async def _fetch(
        self,
        method: str,
        path: str,
        body: bytes | None,
        label: str,
        max_bytes: int | None,
        sent: RequestHeaders,
    ) -> bytes:
        """One attempt: the answer's body, its status checked."""
        self.requests_sent += 1
        headers = sent.plain if body is None else sent.json
        cap = response_cap(self.max_response_mb) if max_bytes is None else max_bytes
        try:
            async with asyncio.timeout(self.request_deadline_s):
                reply = await self._pool.fetch(
                    method, self._url + path, body, headers, max_bytes=cap
                )
        except ResponseTooLarge as exc:
            raise self._too_large(exc, label, "the response") from exc
        except TimeoutError as exc:  # the pool's own timeouts arrive as ReadTimeout
            raise self._past_deadline(label) from exc
        if reply.status >= 400:
            self._raise_for_status(reply.status, reply.headers, reply.reason, reply.body, label)
        if reply.status >= 300:
            self._refuse_redirect(reply.status, reply.headers, label)
        return reply.body

    async def request_json(
        self,
        method: str,
        path: str,
        payload: dict[str, Any] | None = None,
        *,
        label: str,
        max_bytes: int | None = None,
        headers: RequestHeaders | None = None,
    ) -> Any:
        """Send one request (with retries) and decode its JSON answer (``max_bytes``: its
        size cap, default ``max_response_mb``, see :func:`response_cap`; ``headers``: a
        chain's own, default :attr:`headers`)."""
        content = None if payload is None else orjson.dumps(payload)
        sent = self.headers if headers is None else headers
        data: bytes = await self._with_retries(
            lambda: self._fetch(method, path, content, label, max_bytes, sent), label
        )
        return decode_json(data, label)

    async def get_text(self, path: str, *, label: str) -> str:
        data: bytes = await self._with_retries(
            lambda: self._fetch("GET", path, None, label, None, self.headers), label
        )
        return data.decode("utf-8", "replace")

    async def get_status(self, path: str, *, refuse_redirects: bool = False) -> int:
        """The HTTP status of ``GET path`` with one attempt (connection errors propagate; a
        redirect raises with ``refuse_redirects``)."""
        cap = response_cap(self.max_response_mb)
        try:
            async with asyncio.timeout(self.request_deadline_s):
                reply = await self._pool.fetch(
                    "GET", self._url + path, None, self.headers.plain, max_bytes=cap
                )
        except TransportError as exc:
            raise self._unavailable(exc, 1) from exc
        except ResponseTooLarge as exc:
            raise self._too_large(exc, f"GET {path}", "the response") from exc
        except TimeoutError as exc:
            raise self._past_deadline(f"GET {path}") from exc
        if refuse_redirects and 300 <= reply.status < 400:
            self._refuse_redirect(reply.status, reply.headers, f"GET {path}")
        return reply.status

    async def _open(
        self, path: str, content: bytes, label: str, deadline: float, sent: RequestHeaders
    ) -> StreamReply:
        """One attempt of a streaming POST: its headers received and checked."""
        self.requests_sent += 1
        try:
            async with asyncio.timeout_at(deadline):
                reply = await self._pool.open("POST", self._url + path, content, sent.json)
                if reply.status >= 400:
                    try:
                        body = await self._read_error_body(reply, label)
                    finally:
                        await reply.aclose()
                    self._raise_for_status(reply.status, reply.headers, reply.reason, body, label)
                if reply.status >= 300:
                    await reply.aclose()
                    self._refuse_redirect(reply.status, reply.headers, label)
        except TimeoutError as exc:
            raise self._past_deadline(label) from exc
        return reply

    async def _read_error_body(self, reply: StreamReply, label: str) -> bytes:
        """An error answer's body, no larger than the cap of any answer."""
        cap = response_cap(self.max_response_mb)
        announced = declared_length(reply.headers)
        if announced is not None and announced > cap:
            raise self._too_large(ResponseTooLarge(cap, announced), label, "an error answer")
        parts: list[bytes] = []
        size = 0
        async for chunk in reply.chunks():
            size += len(chunk)
            if size > cap:
                raise self._too_large(ResponseTooLarge(cap, size), label, "an error answer")
            parts.append(chunk)
        return b"".join(parts)

    async def stream_event_batches(
        self,
        path: str,
        payload: dict[str, Any],
        *,
        label: str,
        max_bytes: int | None = None,
        headers: RequestHeaders | None = None,
    ) -> AsyncGenerator[list[Any], None]:
        """Server-sent events of a streaming POST, decoded from JSON, until ``[DONE]``: the
        events decoded from each network read together (one list per read that completed at
        least one event), so a consumer that falls behind gets several at once.

        Connecting is retried like any request; once events have arrived a failure surfaces
        (a proposal cannot be resumed midway). Closing the iterator closes the HTTP stream,
        which aborts the request on the server.
        """
        content = orjson.dumps(payload)
        # One deadline for the whole stream, retries of its connection included.
        deadline = asyncio.get_running_loop().time() + self.request_deadline_s
        cap = response_cap(self.max_response_mb) if max_bytes is None else max_bytes
        line_cap = max(cap // SSE_LINE_SHARE, 1)
        sent = self.headers if headers is None else headers
        reply: StreamReply = await self._with_retries(
            lambda: self._open(path, content, label, deadline, sent), label
        )
        decoder = SSEDecoder()
        size = 0
        chunks = aiter(reply.chunks())
        clock = asyncio.get_running_loop().time
        # A read's silence is bounded by the pool's read timeout; a deadline further away
        # than that is checked after each read (a trickle of bytes or keepalives), which
        # costs a clock reading where a timeout context costs a timer per read.
        silence = self._timeouts["request_timeout_s"]
        try:
            while True:
                try:
                    if deadline - clock() > silence:
                        chunk = await anext(chunks)
                    else:
                        # Re-entered per read (never held across a yield: a timeout context
                        # left open there would cancel the consumer, not this read).
                        async with asyncio.timeout_at(deadline):
                            chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                except TimeoutError as exc:
                    raise self._past_deadline(label) from exc
                if clock() >= deadline:
                    raise self._past_deadline(label)
                size += len(chunk)
                if size > cap:
                    raise self._too_large(ResponseTooLarge(cap, size), label, "the stream")
                batch, done = decode_events(decoder, chunk, label)
                if decoder.pending > line_cap:
                    raise self._too_large(
                        ResponseTooLarge(line_cap, decoder.pending), label, "one stream line"
                    )
                if batch:
                    yield batch
                if done:
                    break
        except TransportError as exc:
            raise EngineUnavailableError(
                f"{label}: the stream from {self.base_url} broke: {exc}",
                engine=self.engine_name,
                retryable=True,
            ) from exc
        finally:
            await reply.aclose()

    async def aclose(self) -> None:
        await self._pool.aclose()
        # aiohttp closes its sockets on the loop's next turn: give it that turn, so that a loop
        # closed right after (asyncio.run, tests) does not leak them.
        await asyncio.sleep(0)
