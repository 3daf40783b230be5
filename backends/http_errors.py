"""Error messages of the HTTP layer, in words a user can act on (pure functions, no I/O).

* An error body is cut short: the server's own JSON message where there is one; from an HTML
  page (a web server that is not an inference server) its text, a line long, and the remark
  that the URL does not serve an OpenAI-compatible API.
* A transport failure says what happened (connection refused, connect/read timeout after how
  long) and what to do about it.
"""

from __future__ import annotations

import html
import re
from typing import Any

from presto_client.backends.parsing import error_message
from presto_client.backends.pool import ConnectError, ConnectTimeout, ReadTimeout
from presto_client.terminal_text import server_text

NOT_OPENAI = "this is not an OpenAI-compatible server (it answered with an HTML page)"
FINAL_5XX = frozenset({501, 505})
"""5xx answers that retrying cannot change (not implemented, HTTP version not supported)."""
MAX_BODY_CHARS = 200
MAX_MESSAGE_CHARS = 500

_TAG = re.compile(r"<(script|style)\b.*?</\1>|<[^>]*>", re.IGNORECASE | re.DOTALL)
_SPACE = re.compile(r"\s+")


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, escaped for the terminal, at most ``limit`` characters (an
    ellipsis marks a cut)."""
    return server_text(_SPACE.sub(" ", text).strip(), limit)


def looks_like_html(text: str, content_type: str = "") -> bool:
    head = text.lstrip()[:200].lower()
    return "html" in content_type.lower() or head.startswith(("<!doctype html", "<html"))


def html_text(text: str) -> str:
    """The readable text of an HTML page (title dropped when the body repeats it)."""
    return html.unescape(_TAG.sub(" ", text))


def body_message(body: Any, text: str, content_type: str, reason: str) -> str:
    """A short message from an error answer: the server's own (JSON), else the page's text."""
    own = error_message(body, "")
    if own:
        return shorten(own, MAX_MESSAGE_CHARS)
    if looks_like_html(text, content_type):
        page = shorten(html_text(text), MAX_BODY_CHARS)
        return f"{page} - {NOT_OPENAI}" if page else NOT_OPENAI
    return shorten(text, MAX_BODY_CHARS) or reason


def describe_transport_error(
    exc: BaseException,
    *,
    request_timeout_s: float | None = None,
    connect_timeout_s: float | None = None,
) -> str:
    """What a transport failure was, in words (a timeout's own text is often empty)."""
    detail = str(exc).strip()
    if isinstance(exc, ReadTimeout):
        after = f" after {request_timeout_s:g} s" if request_timeout_s else ""
        return (
            f"read timeout: no answer{after} (request_timeout_s); a long generation on a busy "
            "server needs more: raise engines[].request_timeout_s"
        )
    if isinstance(exc, ConnectTimeout):
        after = f" within {connect_timeout_s:g} s" if connect_timeout_s else ""
        return f"connect timeout: no connection{after} (connect_timeout_s)"
    if isinstance(exc, ConnectError) and "refused" in detail.lower():
        return "connection refused"
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def is_refused(exc: BaseException) -> bool:
    return isinstance(exc, ConnectError)
