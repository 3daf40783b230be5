"""The one HTTP transport of a replica: client, timeouts, concurrency bound, retries, streaming.

* One :class:`httpx.AsyncClient` per replica, with explicit :class:`httpx.Timeout` and
  :class:`httpx.Limits` sized to ``max_concurrency``; a semaphore bounds in-flight requests.
* The code speaks httpx, but by default the requests travel over aiohttp's connection pool
  (``httpx-aiohttp``'s transport, one ``aiohttp`` session per replica, keep-alive on, at most
  ``max_concurrency`` connections): httpx's own pool (httpcore) spends CPU per request that
  grows with the number of connections, which made the client, not the engine, the bottleneck
  with hundreds of concurrent chains (issue 8, ``docs/benchmarks.md``). JSON goes both ways
  through orjson; server-sent events are split and decoded from the raw bytes as they arrive.
* Retries (tenacity, jittered exponential backoff, ``Retry-After`` honoured) for connection
  errors, timeouts, 408, 429 and 5xx only (not 501/505, which retrying cannot change). What a
  restarting server answers (refused/reset connections, 502/503/504) is retried for
  ``restart_window_s`` of backoff (60 s: a restart takes 30-60 s), the rest ``max_retries``
  times. A 4xx
  surfaces at once as :class:`~presto_client.errors.EngineRequestError` with the server's own
  message, cut short (an HTML page is named as not an OpenAI-compatible server).
* Cancellation is never swallowed: cancelling a caller aborts its HTTP request (httpx closes
  the connection), and closing a stream iterator closes the HTTP stream.
* The httpx transport is injectable (``httpx.MockTransport`` in unit tests), and so is the
  sleep used between retries (tests count retries with sleeps patched out). Over the default
  pool the completion POSTs (``request_json`` with a payload, ``stream_event_batches``) skip
  httpx's request/response objects and go to the pool's aiohttp session directly, with the
  same headers, timeouts and error mapping: those objects were ~17 % of the client's CPU per
  request with 1,000 chains (issue 8). Any other transport (tests', ``httpx_pool``) is used
  through httpx as before.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import json
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    wait_random_exponential,
)

from backends.http_errors import (
    FINAL_5XX,
    body_message,
    describe_transport_error,
    is_refused,
)
from backends.spec import DEFAULT_RESTART_WINDOW_S
from presto_client.errors import (
    ConfigError,
    EngineError,
    EngineRequestError,
    EngineUnavailableError,
    InvalidResponseError,
)
from presto_client.urls import redact_url, split_userinfo

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 429})
MAX_RETRY_AFTER_S = 60.0
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


RESTART_STATUSES = frozenset({502, 503, 504})


def _is_restart_symptom(exc: BaseException | None) -> bool:
    """What a restarting server answers: refused/reset connections, a gateway error, 503."""
    if isinstance(exc, RetryableHTTPError):
        return exc.status in RESTART_STATUSES
    return isinstance(exc, httpx.ConnectError | httpx.RemoteProtocolError | httpx.ReadError)


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, RetryableHTTPError):
        return True
    return isinstance(exc, httpx.TransportError) and not isinstance(
        exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError
    )


class _Wait:
    """Jittered exponential backoff, or the server's ``Retry-After`` when it gave one."""

    def __init__(self, initial: float = 0.5, maximum: float = 8.0) -> None:
        self._backoff = wait_random_exponential(multiplier=initial, max=maximum)

    def __call__(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, RetryableHTTPError) and exc.retry_after is not None:
            return exc.retry_after
        return float(self._backoff(state))


def loads(data: bytes | memoryview) -> Any:
    """orjson, falling back to the standard library for what only it reads (``NaN``,
    ``Infinity``: Python servers write them, and a NaN logprob must reach the parser, which
    names it). Raises :class:`ValueError` on anything that is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(bytes(data))


def _decode_json(response: httpx.Response, label: str) -> Any:
    try:
        return loads(response.content)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        snippet = response.text[:200]
        raise InvalidResponseError(f"{label}: the response is not JSON: {snippet!r}") from exc


JSON_HEADERS = {"Content-Type": "application/json"}


def _basic_auth_header(username: str, password: str) -> str:
    """What :class:`httpx.BasicAuth` sends (UTF-8 ``user:password``, base64)."""
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return f"Basic {token}"


class _AiohttpStream(httpx.AsyncByteStream):
    """A response body as aiohttp receives it: every chunk as it arrived, no re-chunking (the
    stock stream's fixed-size chunks cost a copy and a split per chunk)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _httpx_error(exc) from exc

    async def aclose(self) -> None:
        # An unfinished body closes the connection (which aborts the request on the server);
        # a finished one goes back to the pool.
        self._response.release()
        await self._response.wait_for_close()


def _httpx_error(exc: BaseException) -> httpx.TransportError:
    """The httpx exception an aiohttp failure stands for (what httpx's own pool would raise:
    retries, restart detection and messages are written against those)."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError(message)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message)
    if isinstance(exc, aiohttp.SocketTimeoutError | TimeoutError):
        return httpx.ReadTimeout(message)
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ClientOSError):
        return httpx.ReadError(message)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(message)
    return httpx.NetworkError(message)


class _PoolTransport(AiohttpTransport):
    """httpx-aiohttp's transport with exact error mapping and pass-through body chunks."""

    def session(self) -> aiohttp.ClientSession:
        """The pool's one aiohttp session (created on first use, inside the event loop)."""
        if not isinstance(self.client, aiohttp.ClientSession):
            self.client = self.get_client()
        return self.client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except httpx.TransportError as exc:
            cause = exc.__cause__
            if isinstance(cause, aiohttp.ClientError | TimeoutError):
                raise _httpx_error(cause) from cause
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:  # what httpx-aiohttp leaves unmapped
            raise _httpx_error(exc) from exc
        stream = response.stream
        inner = getattr(stream, "_aiohttp_response", None)
        if isinstance(inner, aiohttp.ClientResponse):
            response.stream = _AiohttpStream(inner)
        return response


def aiohttp_pool(
    max_connections: int, *, keepalive_s: float = 30.0, connect_timeout_s: float | None = None
) -> httpx.AsyncBaseTransport:
    """httpx's interface over aiohttp's connection pool: at most ``max_connections`` sockets to
    the replica, kept alive ``keepalive_s`` between requests (no cookies: an engine sets none)."""

    def session() -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=max_connections, limit_per_host=0, keepalive_timeout=keepalive_s
        )
        return aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
        )

    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=keepalive_s,
    )
    return _PoolTransport(limits=limits, client=session)


def httpx_pool(max_connections: int, *, keepalive_s: float = 30.0) -> httpx.AsyncBaseTransport:
    """httpx's own pool (httpcore), as before issue 8: kept for comparisons (benchmarks)."""
    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=keepalive_s,
    )
    return httpx.AsyncHTTPTransport(limits=limits)


class SSEDecoder:
    """Incremental server-sent-events decoder over raw bytes.

    :meth:`feed` takes the bytes as they arrive and returns the ``data:`` payloads of the lines
    completed so far (``b"[DONE]"`` included) as views into one growing buffer: no per-line
    copies and no text decoding (orjson reads the views). Call :meth:`compact` once those views
    have been decoded, before the next :meth:`feed`.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._consumed = 0

    def feed(self, chunk: bytes) -> list[memoryview]:
        self.compact()
        buf = self._buf
        buf += chunk
        out: list[memoryview] = []
        start = 0
        find = buf.find
        view = memoryview(buf)
        while True:
            end = find(b"\n", start)
            if end < 0:
                break
            if buf.startswith(b"data:", start):
                stop = end - 1 if end > start and buf[end - 1] == 13 else end  # "\r\n"
                first = start + 5
                while first < stop and buf[first] == 32:  # the space(s) after "data:"
                    first += 1
                out.append(view[first:stop])
            start = end + 1
        view.release()
        self._consumed = start
        return out

    def compact(self) -> None:
        """Drop the lines already returned (their views must no longer be in use)."""
        start, self._consumed = self._consumed, 0
        if start:
            try:
                del self._buf[:start]
            except BufferError:  # a view is still alive somewhere: copy the rest instead
                self._buf = self._buf[start:]


class _ResponseBytes(httpx.AsyncByteStream):
    """An httpx streaming response's decoded body, closed with the response."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.aiter_bytes():
            yield chunk

    async def aclose(self) -> None:
        await self._response.aclose()


def _decode_events(decoder: SSEDecoder, chunk: bytes, label: str) -> tuple[list[Any], bool]:
    """The JSON events completed by ``chunk``, and whether ``[DONE]`` came (the decoder's
    views die with this frame, before its next :meth:`SSEDecoder.feed` compacts the buffer;
    a chunk that completes no line is fine)."""
    batch: list[Any] = []
    for data in decoder.feed(chunk):
        if data[:1] == b"[" and bytes(data).strip() == b"[DONE]":
            return batch, True
        try:
            batch.append(loads(data))
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            text = bytes(data).decode("utf-8", "replace").strip()
            raise InvalidResponseError(
                f"{label}: a stream event is not JSON: {text[:200]!r}"
            ) from exc
    return batch, False


class Transport:
    """HTTP access to one replica (``base_url``)."""

    def __init__(
        self,
        base_url: str,
        *,
        engine_name: str,
        max_concurrency: int = 32,
        request_timeout_s: float = 300.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 3,
        restart_window_s: float = DEFAULT_RESTART_WINDOW_S,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
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
        self._timeouts = {
            "request_timeout_s": request_timeout_s,
            "connect_timeout_s": connect_timeout_s,
        }
        headers = {"Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        auth = httpx.BasicAuth(*userinfo) if userinfo is not None else None
        pool = (
            transport
            if transport is not None
            else aiohttp_pool(max_concurrency, connect_timeout_s=connect_timeout_s)
        )
        self._client = httpx.AsyncClient(
            base_url=url,
            auth=auth,
            headers=headers,
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(
                max_connections=max_concurrency, max_keepalive_connections=max_concurrency
            ),
            transport=pool,
        )
        # The direct path (completion POSTs over the default pool's aiohttp session): what
        # httpx would send and the timeouts httpx-aiohttp would give aiohttp, built once.
        self._direct: _PoolTransport | None = pool if isinstance(pool, _PoolTransport) else None
        self._direct_url = url
        self._direct_headers = {**headers, **JSON_HEADERS}
        if userinfo is not None:
            self._direct_headers["Authorization"] = _basic_auth_header(*userinfo)
        self._direct_timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=connect_timeout_s,
            sock_read=request_timeout_s,
            connect=request_timeout_s,  # httpx's pool timeout
        )
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._sleep: Sleep = sleep if sleep is not None else asyncio.sleep
        self.requests_sent = 0
        self.retries = 0

    # ---- errors

    def _unavailable(self, exc: BaseException, attempts: int) -> EngineUnavailableError:
        hint = f"; if no server runs there, {self.start_hint}" if self.start_hint else ""
        if isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout | httpx.PoolTimeout):
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
        if isinstance(exc, httpx.TransportError):
            return self._unavailable(exc, attempts)
        return exc

    def _check_status(self, response: httpx.Response, body_text: str, label: str) -> None:
        if response.status_code >= 400:
            self._raise_for_status(
                response.status_code, response.headers, response.reason_phrase, body_text, label
            )

    def _raise_for_status(
        self, status: int, headers: Mapping[str, str], reason: str, body_text: str, label: str
    ) -> None:
        try:
            body: Any = json.loads(body_text) if body_text else None
        except json.JSONDecodeError:
            body = None
        message = body_message(body, body_text, headers.get("Content-Type", ""), reason)
        if status in RETRY_STATUSES or (status >= 500 and status not in FINAL_5XX):
            raise RetryableHTTPError(status, message, parse_retry_after(headers.get("Retry-After")))
        raise EngineRequestError(
            f"{label}: HTTP {status} from {self.base_url}: {message}", engine=self.engine_name
        )

    # ---- retries

    def _retrying(self) -> AsyncRetrying:
        def before_sleep(state: RetryCallState) -> None:
            self.retries += 1
            exc = state.outcome.exception() if state.outcome is not None else None
            reason = (
                describe_transport_error(exc, **self._timeouts)
                if isinstance(exc, httpx.TransportError)
                else str(exc)
            )
            budget = (
                f"for up to {self.restart_window_s:g} s (restart_window_s)"
                if _is_restart_symptom(exc)
                else f"of {self.max_retries + 1}"
            )
            logger.warning(
                "[%s] retrying %s (attempt %d %s) after %s",
                self.engine_name,
                self.base_url,
                state.attempt_number + 1,
                budget,
                reason,
            )

        def stop(state: RetryCallState) -> bool:
            exc = state.outcome.exception() if state.outcome is not None else None
            if _is_restart_symptom(exc):  # a server restarting: ride it out for a while
                return state.idle_for >= self.restart_window_s
            return bool(state.attempt_number >= self.max_retries + 1)

        return AsyncRetrying(
            stop=stop,
            wait=_Wait(),
            retry=retry_if_exception(_is_retryable),
            sleep=self._sleep,
            before_sleep=before_sleep,
            reraise=True,
        )

    async def _with_retries(self, attempt: Callable[[], Awaitable[Any]], label: str) -> Any:
        # The first attempt runs outside tenacity: it almost always succeeds, and building and
        # driving an AsyncRetrying costs ~20 µs per request (issue 8). A failure is replayed as
        # tenacity's first attempt (raised again, nothing re-sent), so what follows (which
        # errors are retried, attempt counts and messages, backoff, the restart window, which
        # counts sleeps only) is what it was. BaseException (cancellation) propagates, as
        # tenacity re-raised it.
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
            async for try_ in self._retrying():
                with try_:
                    attempts += 1
                    return await again()
        except asyncio.CancelledError:
            raise
        except (RetryableHTTPError, httpx.TransportError) as exc:
            raise self._final_error(exc, attempts, label) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    # ---- requests

    async def request_json(
        self, method: str, path: str, payload: dict[str, Any] | None = None, *, label: str
    ) -> Any:
        """Send one request (with retries) and decode its JSON answer."""

        content = None if payload is None else orjson.dumps(payload)
        headers = None if payload is None else JSON_HEADERS
        if content is not None and self._direct is not None:
            return await self._with_retries(
                lambda: self._post_direct(method, path, content, label), label
            )

        async def attempt() -> Any:
            async with self._semaphore:
                self.requests_sent += 1
                response = await self._client.request(
                    method, path, content=content, headers=headers
                )
            if response.status_code >= 400:
                self._check_status(response, response.text, label)
            return _decode_json(response, label)

        return await self._with_retries(attempt, label)

    async def _post_direct(self, method: str, path: str, content: bytes, label: str) -> Any:
        """One attempt of :meth:`request_json` on the pool's aiohttp session (see the module
        docstring): the same bound, status checks, decoding and httpx exceptions."""
        assert self._direct is not None
        session = self._direct.session()
        async with self._semaphore:
            self.requests_sent += 1
            try:
                async with session.request(
                    method,
                    self._direct_url + path,
                    data=content,
                    headers=self._direct_headers,
                    timeout=self._direct_timeout,
                    allow_redirects=False,
                ) as response:
                    status = response.status
                    data = await response.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _httpx_error(exc) from exc
        if status >= 400:
            text = data.decode("utf-8", "replace")
            self._raise_for_status(status, response.headers, response.reason or "", text, label)
        try:
            return loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            snippet = data.decode("utf-8", "replace")[:200]
            raise InvalidResponseError(f"{label}: the response is not JSON: {snippet!r}") from exc

    async def get_text(self, path: str, *, label: str) -> str:
        async def attempt() -> str:
            async with self._semaphore:
                self.requests_sent += 1
                response = await self._client.get(path)
            self._check_status(response, response.text, label)
            return response.text

        text: str = await self._with_retries(attempt, label)
        return text

    async def get_status(self, path: str) -> int:
        """The HTTP status of ``GET path`` with one attempt (connection errors propagate)."""
        try:
            async with self._semaphore:
                response = await self._client.get(path)
        except httpx.TransportError as exc:
            raise self._unavailable(exc, 1) from exc
        return response.status_code

    async def stream_events(
        self, path: str, payload: dict[str, Any], *, label: str
    ) -> AsyncGenerator[Any, None]:
        """Server-sent events of a streaming POST, decoded from JSON, until ``[DONE]``.

        Connecting is retried like any request; once events have arrived a failure surfaces
        (a proposal cannot be resumed midway). Closing the iterator closes the HTTP stream,
        which aborts the request on the server.
        """
        batches = self.stream_event_batches(path, payload, label=label)
        try:
            async for batch in batches:
                for event in batch:
                    yield event
        finally:
            await batches.aclose()

    async def stream_event_batches(
        self, path: str, payload: dict[str, Any], *, label: str
    ) -> AsyncGenerator[list[Any], None]:
        """As :meth:`stream_events`, but the events decoded from each network read together
        (one list per read that completed at least one event): a consumer that falls behind
        gets several events at once and can handle them as one chunk."""

        content = orjson.dumps(payload)

        async def connect() -> httpx.Response:
            request = self._client.build_request(
                "POST", path, content=content, headers=JSON_HEADERS
            )
            response = await self._client.send(request, stream=True)
            if response.status_code >= 400:
                try:
                    text = (await response.aread()).decode("utf-8", "replace")
                finally:
                    await response.aclose()
                self._check_status(response, text, label)
            return response

        async with self._semaphore:
            self.requests_sent += 1
            body: httpx.AsyncByteStream
            if self._direct is not None:
                opened = await self._with_retries(
                    lambda: self._open_direct(path, content, label), label
                )
                body = _AiohttpStream(opened)
            else:
                response: httpx.Response = await self._with_retries(connect, label)
                body = _ResponseBytes(response)
            decoder = SSEDecoder()
            try:
                async for chunk in body:
                    batch, done = _decode_events(decoder, chunk, label)
                    if batch:
                        yield batch
                    if done:
                        break
            except httpx.TransportError as exc:
                raise EngineUnavailableError(
                    f"{label}: the stream from {self.base_url} broke: {exc}",
                    engine=self.engine_name,
                    retryable=True,
                ) from exc
            finally:
                await body.aclose()

    async def _open_direct(self, path: str, content: bytes, label: str) -> aiohttp.ClientResponse:
        """A streaming POST on the pool's aiohttp session, its headers received and checked
        (the body is the caller's to read and release)."""
        assert self._direct is not None
        try:
            response = await self._direct.session().request(
                "POST",
                self._direct_url + path,
                data=content,
                headers=self._direct_headers,
                timeout=self._direct_timeout,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _httpx_error(exc) from exc
        if response.status >= 400:
            try:
                text = (await response.read()).decode("utf-8", "replace")
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _httpx_error(exc) from exc
            finally:
                response.release()
            self._raise_for_status(
                response.status, response.headers, response.reason or "", text, label
            )
        return response

    async def aclose(self) -> None:
        await self._client.aclose()
        # aiohttp closes its sockets on the loop's next turn: give it that turn, so that a loop
        # closed right after (asyncio.run, tests) does not leak them.
        await asyncio.sleep(0)
