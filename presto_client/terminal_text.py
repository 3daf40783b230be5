"""What a server says, made safe to print: no terminal escapes, no forged lines, bounded length.

A model id, an error body, a header or a dialect name comes from the server; printed raw, an ESC
sequence could clear the screen or recolour output, and a CR or LF could forge a line that looks
like the client's own. :func:`server_text` shows every control character (C0, DEL, C1, line and
paragraph separators) and every bidirectional override or isolate as a visible escape, and caps
the length. Used wherever server-provided text is formatted into a message or a log line.
"""

from __future__ import annotations

MAX_SERVER_TEXT_CHARS = 200
"""The default cap on what is shown of one piece of server text (after escaping)."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Characters that reorder or hide the text around them (the "Trojan Source" set) and the
# Unicode line breaks a terminal or a log viewer may honour.
_INVISIBLE = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"
)


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if code < 0x20 or 0x7F <= code <= 0x9F:
        return f"\\x{code:02x}"
    if ch in _INVISIBLE:
        return f"\\u{code:04x}"
    return ch


def server_text(value: object, limit: int = MAX_SERVER_TEXT_CHARS) -> str:
    """``value`` (as ``str``) with control and bidi characters escaped, at most ``limit``
    characters; a cut is marked with an ellipsis."""
    text = value if isinstance(value, str) else str(value)
    # Escaping can only lengthen, so the input past the cap never shows.
    out = "".join(_escape(ch) for ch in text[: limit + 1])
    if len(out) <= limit and len(text) <= limit:
        return out
    return out[: max(limit - 1, 0)] + "…"
