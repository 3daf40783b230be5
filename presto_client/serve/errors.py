"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with its status."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
