"""The pool seam: how the transport puts one HTTP request on the wire.

A :class:`Pool` sends a request to an absolute URL with the headers and body the transport
built, and answers either a whole :class:`Reply` (:meth:`Pool.fetch`) or a
:class:`StreamReply` whose body is read as it arrives (:meth:`Pool.open`). It follows no
redirects, keeps no cookies, and raises only the :class:`TransportError` family below, so
that status handling, retries, error messages and timeouts are written once, in
:mod:`presto_client.backends.transport`, against these types. The default pool is aiohttp's
(:mod:`presto_client.backends.aiohttp_pool`); tests put an in-memory double here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol


class TransportError(Exception):
    """The request got no HTTP answer (or its body broke off)."""


class ConnectError(TransportError):
    """No connection: refused, unreachable, name not resolved."""


class ConnectTimeout(TransportError):
    """No connection within the connect timeout."""


class ReadTimeout(TransportError):
    """The server sent nothing for the request timeout."""


class ReadError(TransportError):
    """The connection broke while the answer was read (reset, truncated body)."""


class RemoteProtocolError(TransportError):
    """The server closed the connection without answering."""


class NetworkError(TransportError):
    """Any other failure on the wire."""


class UnsupportedURL(TransportError):
    """A URL the pool cannot send to (retrying cannot change it)."""


class ResponseTooLarge(Exception):
    """The answer is larger than the request's cap (read no further than the cap).

    Not a :class:`TransportError`: the server answered, and asking again brings the same."""

    def __init__(self, limit: int, seen: int) -> None:
        super().__init__(f"more than {limit} bytes ({seen} seen)")
        self.limit = limit
        self.seen = seen


def declared_length(headers: Mapping[str, str]) -> int | None:
    """The ``Content-Length`` a server announced (``None``: absent or not a number)."""
    value = headers.get("Content-Length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class RequestHeaders:
    """The headers of a request without a body and of one with a JSON body, built once (read
    only: a chain's set is its own, and sending it costs no copy)."""

    plain: Mapping[str, str]
    json: Mapping[str, str]

    @classmethod
    def of(cls, headers: Mapping[str, str]) -> RequestHeaders:
        plain = dict(headers)
        return cls(
            MappingProxyType(plain),
            MappingProxyType({**plain, "Content-Type": "application/json"}),
        )


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole HTTP answer."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes


class StreamReply(Protocol):
    """An HTTP answer whose headers have arrived; the body is read by the caller, then
    :meth:`aclose` (an unfinished body closes the connection, which aborts the request on the
    server; a finished one returns the connection to the pool)."""

    @property
    def status(self) -> int: ...

    @property
    def reason(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, one chunk per network read (no re-chunking)."""
        ...

    async def read(self) -> bytes: ...

    async def aclose(self) -> None: ...


class Pool(Protocol):
    """The connections to one replica (bounded, kept alive between requests)."""

    async def fetch(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        max_bytes: int,
    ) -> Reply:
        """The whole answer; :class:`ResponseTooLarge` once its body (or its announced
        ``Content-Length``) passes ``max_bytes``, having read at most ``max_bytes`` plus one
        network read."""
        ...

    async def open(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]
    ) -> StreamReply: ...

    async def aclose(self) -> None: ...
