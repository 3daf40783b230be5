"""Bytes on the wire: JSON decoding and server-sent events (pure functions, no I/O).

JSON goes through orjson (an engine's answer carries a top-K logprob block per token);
server-sent events are split and decoded from the raw bytes as they arrive.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from presto_client.errors import InvalidResponseError

_NOT_JSON = (json.JSONDecodeError, UnicodeDecodeError, ValueError)


def loads(data: bytes | memoryview) -> Any:
    """orjson, falling back to the standard library for what only it reads (``NaN``,
    ``Infinity``: Python servers write them, and a NaN logprob must reach the parser, which
    names it). Raises :class:`ValueError` on anything that is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(bytes(data))


def decode_json(data: bytes, label: str) -> Any:
    """A response body as JSON; :class:`InvalidResponseError` (quoting its start) otherwise."""
    try:
        return loads(data)
    except _NOT_JSON as exc:
        snippet = data.decode("utf-8", "replace")[:200]
        raise InvalidResponseError(f"{label}: the response is not JSON: {snippet!r}") from exc


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

    @property
    def pending(self) -> int:
        """Bytes of the line not yet completed (what an endless line would grow)."""
        return len(self._buf) - self._consumed

    def compact(self) -> None:
        """Drop the lines already returned (their views must no longer be in use)."""
        start, self._consumed = self._consumed, 0
        if start:
            try:
                del self._buf[:start]
            except BufferError:  # a view is still alive somewhere: copy the rest instead
                self._buf = self._buf[start:]


def decode_events(decoder: SSEDecoder, chunk: bytes, label: str) -> tuple[list[Any], bool]:
    """The JSON events completed by ``chunk``, and whether ``[DONE]`` came (the decoder's
    views die with this frame, before its next :meth:`SSEDecoder.feed` compacts the buffer;
    a chunk that completes no line is fine)."""
    batch: list[Any] = []
    for data in decoder.feed(chunk):
        if data[:1] == b"[" and bytes(data).strip() == b"[DONE]":
            return batch, True
        try:
            batch.append(loads(data))
        except _NOT_JSON as exc:
            text = bytes(data).decode("utf-8", "replace").strip()
            raise InvalidResponseError(
                f"{label}: a stream event is not JSON: {text[:200]!r}"
            ) from exc
    return batch, False
