"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with its status."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from presto_client.errors import (
    EngineError,
    EngineRequestError,
    EngineUnavailableError,
    PrestoError,
)
from presto_client.urls import redact_text

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    408: "timeout",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout",
}


class ApiError(Exception):
    """An answer that is an error: raised anywhere in a handler, rendered by the app."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 naming the parameter at fault."""
    return ApiError(400, message, param=param, code=code)


_ADDRESS = re.compile(
    r"(?:[a-z][a-z0-9+.-]*://[^\s,;()'\"]*[^\s,;()'\":.])"  # a URL
    r"|(?:\[[0-9a-fA-F:.]+\](?::\d+)?)"  # [v6]:port
    r"|(?:\b[A-Za-z0-9][A-Za-z0-9.-]*:\d{2,5}\b)"  # host:port
    r"|(?:\b\d{1,3}(?:\.\d{1,3}){3}\b)",  # a bare v4 address
    re.IGNORECASE,
)


def client_text(text: str) -> str:
    """An upstream's error as an API client may read it: no upstream address (URL, host:port,
    IP), no credentials; the server's log keeps the whole message for its operator."""
    return _ADDRESS.sub("<upstream>", redact_text(text))


def server_gone(failure: BaseException) -> ApiError:
    """The 503 of a service whose engine's started server is gone for good: its cause (the
    first line: the log tail is the operator's), no address; no Retry-After, as only a restart
    of ``presto serve`` brings it back."""
    cause = str(failure).splitlines()[0].removesuffix("; log tail:")
    return ApiError(
        503,
        f"{client_text(cause)}; nothing is served until presto serve is restarted",
        code="upstream_gone",
    )


def error_for(exc: BaseException) -> ApiError:
    """The API error an exception in a handler answers with (never the upstream's address)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, TimeoutError):
        return ApiError(504, "the request ran past the server's deadline", code="timeout")
    if isinstance(exc, EngineUnavailableError):
        return ApiError(
            503, f"the upstream engine is unavailable: {client_text(str(exc))}", code="upstream"
        )
    if isinstance(exc, EngineRequestError):
        # The engine refused a request built from the client's input (a prompt it cannot
        # take, a token id outside its vocabulary): the client's to fix, so a 400.
        return ApiError(
            400,
            f"the engine refused the request: {client_text(exc.detail)}",
            code="upstream_rejected",
        )
    if isinstance(exc, EngineError):
        return ApiError(
            502, f"the upstream engine failed: {client_text(str(exc))}", code="upstream"
        )
    if isinstance(exc, PrestoError):
        return ApiError(500, client_text(str(exc)))
    return ApiError(500, f"internal error: {type(exc).__name__}")
