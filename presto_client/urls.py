"""Credentials in URLs: split off for HTTP Basic auth, redacted wherever a URL is shown or stored.

A server URL may carry ``user:password@``; the transport sends it as HTTP Basic auth and every
message, log line, table and run-directory file shows the URL as ``http://***@host:port``.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_URL_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@'\"]+@")


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


def redact_url(url: str) -> str:
    """``http://user:pw@host:8000/x`` → ``http://***@host:8000/x``; other URLs unchanged."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit((parts.scheme, "***@" + _host(url), parts.path, parts.query, parts.fragment))


def host_port(url: str) -> str:
    """``host:port`` of a URL, never its credentials."""
    return _host(url) or url


def redact_text(text: str) -> str:
    """Every ``scheme://user:pw@`` in free text (error messages, log lines) as ``scheme://***@``."""
    return _URL_USERINFO.sub(r"\1***@", text)
