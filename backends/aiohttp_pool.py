"""The default :class:`~presto_client.backends.pool.Pool`: aiohttp's connection pool.

One :class:`aiohttp.ClientSession` per replica, created on first use inside the event loop,
keep-alive on, at most ``max_connections`` sockets: the connector's limit is the replica's one
bound on requests in flight (a streamed answer holds its connection until it is closed).
aiohttp rather than httpx's pool (httpcore), whose bookkeeping cost client CPU per request that
grew with the number of connections (``docs/benchmarks.md``); vLLM's and SGLang's benchmark
clients use aiohttp for the same reason. aiohttp's exceptions become
:class:`~presto_client.backends.pool.TransportError` s here, and nowhere else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import aiohttp

from presto_client.backends.pool import (
    ConnectError,
    ConnectTimeout,
    NetworkError,
    ReadError,
    ReadTimeout,
    RemoteProtocolError,
    Reply,
    ResponseTooLarge,
    TransportError,
    UnsupportedURL,
    declared_length,
)

KEEPALIVE_S = 30.0
"""How long an idle connection is kept for the next request."""

_FAILURES = (aiohttp.ClientError, TimeoutError)


def transport_error(exc: BaseException) -> TransportError:
    """The :class:`~presto_client.backends.pool.TransportError` an aiohttp failure stands for."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return RemoteProtocolError(message)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ConnectError(message)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ConnectTimeout(message)
    if isinstance(exc, aiohttp.SocketTimeoutError | TimeoutError):
        return ReadTimeout(message)
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ClientOSError):
        return ReadError(message)
    if isinstance(exc, aiohttp.InvalidURL):
        return UnsupportedURL(message)
    return NetworkError(message)


async def _read_capped(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body, refused (the connection dropped) as soon as it passes ``max_bytes``."""
    announced = declared_length(response.headers)
    if announced is not None and announced > max_bytes:
        raise ResponseTooLarge(max_bytes, announced)
    parts: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > max_bytes:
            raise ResponseTooLarge(max_bytes, size)
        parts.append(chunk)
    return b"".join(parts)


class AiohttpStreamReply:
    """A :class:`~presto_client.backends.pool.StreamReply` over an aiohttp response."""

    __slots__ = ("_response",)

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def reason(self) -> str:
        return self._response.reason or ""

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except _FAILURES as exc:
            raise transport_error(exc) from exc

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except _FAILURES as exc:
            raise transport_error(exc) from exc

    async def aclose(self) -> None:
        self._response.release()
        await self._response.wait_for_close()


class AiohttpPool:
    """aiohttp's pool to one replica (see the module docstring)."""

    def __init__(
        self,
        max_connections: int,
        *,
        request_timeout_s: float,
        connect_timeout_s: float,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self.max_connections = max_connections
        self._keepalive_s = keepalive_s
        # sock_read: the request timeout is the longest silence of the server (a long
        # generation streams or answers within it). Waiting for a free connection has no
        # timeout (connect=None): it is the queue of the replica's bound.
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=connect_timeout_s, sock_read=request_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None:
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, limit_per_host=0, keepalive_timeout=self._keepalive_s
            )
            session = self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),  # an engine sets none
                timeout=self._timeout,
            )
        return session

    async def fetch(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        max_bytes: int,
    ) -> Reply:
        try:
            async with self._client().request(
                method, url, data=body, headers=headers, allow_redirects=False
            ) as response:
                data = await _read_capped(response, max_bytes)
        except _FAILURES as exc:
            raise transport_error(exc) from exc
        return Reply(response.status, response.reason or "", response.headers, data)

    async def open(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]
    ) -> AiohttpStreamReply:
        try:
            response = await self._client().request(
                method, url, data=body, headers=headers, allow_redirects=False
            )
        except _FAILURES as exc:
            raise transport_error(exc) from exc
        return AiohttpStreamReply(response)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
