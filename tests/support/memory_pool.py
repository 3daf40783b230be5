"""An in-memory :class:`backends.pool.Pool`: a handler answers each request, no network.

The handler takes a :class:`Sent` and returns an :class:`Answer` (or awaits one), or raises a
:class:`backends.pool.TransportError` to stand for a failure on the wire. Everything above the
pool (headers, status handling, retries, error messages, SSE decoding) runs as in production.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from presto_client.backends.pool import Reply, ResponseTooLarge


@dataclass(frozen=True, slots=True)
class Sent:
    """One request as the pool received it."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.url).path


@dataclass(frozen=True, slots=True)
class Answer:
    """What the handler answers: a status, headers and a body (in ``chunks`` when streamed)."""

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    chunks: Sequence[bytes] | None = None
    reason: str = ""


def json_answer(status: int, obj: Any, headers: Mapping[str, str] | None = None) -> Answer:
    return Answer(
        status, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})}
    )


def text_answer(status: int, text: str, content_type: str = "text/plain") -> Answer:
    return Answer(status, text.encode(), {"Content-Type": content_type})


Handler = Callable[[Sent], "Answer | Awaitable[Answer]"]


class _StreamReply:
    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self.closed = False

    @property
    def status(self) -> int:
        return self._answer.status

    @property
    def reason(self) -> str:
        return self._answer.reason

    @property
    def headers(self) -> Mapping[str, str]:
        return self._answer.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        answer = self._answer
        for chunk in answer.chunks if answer.chunks is not None else (answer.body,):
            yield chunk

    async def read(self) -> bytes:
        answer = self._answer
        return b"".join(answer.chunks) if answer.chunks is not None else answer.body

    async def aclose(self) -> None:
        self.closed = True


class MemoryPool:
    """The in-memory pool; ``sent`` records every request."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self.sent: list[Sent] = []
        self.closed = False

    async def _answer(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]
    ) -> Answer:
        sent = Sent(method, url, dict(headers), body or b"")
        self.sent.append(sent)
        answer = self._handler(sent)
        if inspect.isawaitable(answer):
            answer = await answer
        assert isinstance(answer, Answer)
        return answer

    async def fetch(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        max_bytes: int,
    ) -> Reply:
        answer = await self._answer(method, url, body, headers)
        data = b"".join(answer.chunks) if answer.chunks is not None else answer.body
        if len(data) > max_bytes:
            raise ResponseTooLarge(max_bytes, len(data))
        return Reply(answer.status, answer.reason, answer.headers, data)

    async def open(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]
    ) -> _StreamReply:
        return _StreamReply(await self._answer(method, url, body, headers))

    async def aclose(self) -> None:
        self.closed = True
