"""The exception hierarchy of presto-client.

Every error a user can meet names what is wrong and how to fix it. Engine errors carry the engine
name so that a multi-engine job can say which server misbehaved.
"""

from __future__ import annotations


class PrestoError(Exception):
    """Base class of every error raised by presto-client."""


class ConfigError(PrestoError):
    """A job configuration is malformed or inconsistent."""


class EngineError(PrestoError):
    """An engine failed to serve a request."""

    def __init__(self, message: str, *, engine: str = "", retryable: bool = False) -> None:
        prefix = f"[{engine}] " if engine else ""
        super().__init__(prefix + message)
        self.detail = message  # without the engine's prefix, for a message that wraps this one
        self.engine = engine
        self.retryable = retryable


class EngineUnavailableError(EngineError):
    """The engine cannot be reached (connection refused, DNS, timeouts after retries)."""


class EngineRequestError(EngineError):
    """The engine rejected a request (4xx): the message is the server's own."""


class InvalidResponseError(EngineError):
    """The engine answered, but the answer cannot be used (missing/NaN logprobs, wrong length)."""


class ProbeError(EngineError):
    """The start-up probe found the engine misconfigured (e.g. wrong logprob semantics)."""
