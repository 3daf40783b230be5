"""Credentials in URLs: split off for HTTP Basic auth, redacted wherever a URL is shown or stored.

A server URL may carry ``user:password@``; the transport sends it as HTTP Basic auth and every
message, log line, table and run-directory file shows the URL as ``http://***@host:port``.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"
"""What a credential is shown as."""
_URL_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@'\"]+@")
# A query parameter's value inside a URL (``?token=...``, ``&key=...``): a URL's query may carry
# a secret (an API key some gateways take there), so no value of it is ever shown.
_QUERY_VALUE = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"?#]*\?[^\s'\"#]*)")
_PARAM_VALUE = re.compile(r"([?&][^=&\s'\"#]+=)[^&\s'\"#]+")


def _host(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    if parts.port:
        host += f":{parts.port}"
    return host


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """``(url without user:password@, (user, password) or None)``."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    clean = urlunsplit((parts.scheme, _host(url), parts.path, parts.query, parts.fragment))
    return clean, (parts.username or "", parts.password or "")


def _redact_query(query: str) -> str:
    return _PARAM_VALUE.sub(rf"\1{REDACTED}", "?" + query)[1:] if query else query


def redact_url(url: str) -> str:
    """``http://user:pw@host:8000/x?key=k`` → ``http://***@host:8000/x?key=***``; a URL without
    credentials or a query unchanged."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None and not parts.query:
        return url
    host = _host(url) if parts.username is None and parts.password is None else f"***@{_host(url)}"
    return urlunsplit((parts.scheme, host, parts.path, _redact_query(parts.query), parts.fragment))


def host_port(url: str) -> str:
    """``host:port`` of a URL, never its credentials."""
    return _host(url) or url


def redact_text(text: str) -> str:
    """Every ``scheme://user:pw@`` in free text (error messages, log lines) as ``scheme://***@``,
    and every value of a URL's query as ``***``."""
    text = _URL_USERINFO.sub(r"\1***@", text)
    return _QUERY_VALUE.sub(lambda m: _PARAM_VALUE.sub(rf"\1{REDACTED}", m.group(1)), text)
