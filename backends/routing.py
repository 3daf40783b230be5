"""A chain's routing key: the header a gateway in front of several replicas routes by.

A serving gateway (``smg``, ``vllm-router``) picks a replica per request; a chain whose requests
land on different replicas loses its prefix cache. With ``routing_key_header`` set on an engine,
every request of a chain (proposals, block extensions, scoring; the start-up probe aside) carries
that header with the chain's key, which the gateway's consistent-hash policy maps to one replica.

:class:`RoutedEngine` is one chain's view of an
:class:`~presto_client.backends.http_engine.HttpEngine`: its headers are built once when the chain
starts (an immutable mapping of its own, never shared with another chain), so a request costs
nothing more for carrying the key however long the chain grows.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from presto_client.backends.pool import RequestHeaders
from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens, ScoreRequest

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP header name (RFC 9110 ``token``)."""

RESERVED_HEADERS = frozenset(
    {
        # what the transport itself sends or the HTTP library manages
        "accept",
        "authorization",
        "content-length",
        "content-type",
        "host",
        "transfer-encoding",
        # hop-by-hop and connection control (a proxy drops or acts on them)
        "connection",
        "expect",
        "keep-alive",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
        "cookie",
        "proxy-connection",
        "proxy-authenticate",
        "via",
        "max-forwards",
        "forwarded",
        # the body's encoding and ranges (the request would be read differently)
        "range",
        "accept-encoding",
        # credentials and what a server or a proxy trusts
        "x-api-key",
        "api-key",
        "x-auth-token",
        "set-cookie",
        "www-authenticate",
        "origin",
        "x-real-ip",
        "x-http-method-override",
        "x-method-override",
    }
)
"""Header names a routing key may not take: the request would change, not just be routed."""

RESERVED_PREFIXES = ("content-", "proxy-", "x-forwarded-", "sec-", "if-", "access-control-")
"""Families of headers a routing key may not take (``content-encoding``, ``content-range``,
``proxy-*``, ``x-forwarded-for``, browsers' ``sec-*``, conditionals, CORS)."""


def check_routing_key_header(name: str) -> str:
    """``name`` if it can carry a routing key; :class:`ValueError` saying why not otherwise."""
    if not _TOKEN.fullmatch(name):
        raise ValueError(
            f"{name!r} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~ only, "
            "no spaces or colons), e.g. x-smg-routing-key for smg, x-session-id for vllm-router"
        )
    if name.lower() in RESERVED_HEADERS or name.lower().startswith(RESERVED_PREFIXES):
        raise ValueError(
            f"{name!r} is a header the request itself needs, a hop-by-hop or proxy header, or "
            "one that carries credentials (the client sets it, the HTTP layer or a proxy acts "
            "on it); a routing key takes a header of its own, e.g. "
            "x-smg-routing-key for smg, x-session-id for vllm-router"
        )
    return name


class HeaderedEngine(Protocol):
    """What a chain's view needs of the engine: its calls, each with the headers to send."""

    name: str

    @property
    def max_concurrency(self) -> int: ...

    async def generate(
        self, requests: Sequence[ProposalRequest], *, headers: RequestHeaders | None = None
    ) -> list[ScoredTokens]: ...

    def stream(
        self, request: ProposalRequest, *, headers: RequestHeaders | None = None
    ) -> AsyncIterator[ScoredTokens]: ...

    async def score(
        self, requests: Sequence[ScoreRequest], *, headers: RequestHeaders | None = None
    ) -> list[ScoredTokens]: ...


class RoutedEngine:
    """One chain's view of an HTTP engine: every request it sends carries the chain's key.

    It owns nothing (the engine is closed by whoever opened it) and keeps no state of its own
    besides the headers: the model, the probe's findings and the transport are the engine's.
    """

    def __init__(self, engine: HeaderedEngine, key: str, headers: RequestHeaders) -> None:
        self.engine = engine
        self.key = key
        self.name = engine.name
        self.headers = headers

    @property
    def max_concurrency(self) -> int:
        return self.engine.max_concurrency

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        return await self.engine.generate(requests, headers=self.headers)

    def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        return self.engine.stream(request, headers=self.headers)

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoredTokens]:
        return await self.engine.score(requests, headers=self.headers)

    async def aclose(self) -> None:
        return None
