"""Reading the files a user hands to presto (a job config, a prompts file) without trusting them.

A path may name a device (``/dev/zero`` reads forever), a huge file, bytes that are not UTF-8, or
YAML built to exhaust the reader (nesting hundreds deep, an alias bomb that expands to 10^8
values). Each is refused with a :class:`~presto_client.errors.ConfigError` naming the file and
what is wrong, before it costs more than the limit below.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from presto_client.errors import ConfigError

MAX_CONFIG_BYTES = 16 << 20
"""A job config larger than this (16 MiB) is refused."""
MAX_PROMPTS_BYTES = 1 << 30
"""A prompts file larger than this (1 GiB) is refused."""
MAX_YAML_DEPTH = 64
"""YAML nested deeper than this is refused (a config needs a handful of levels; Python's
recursion limit is reached near 500)."""
MAX_ALIAS_EXPANSION = 1_000_000
"""Values that ``*alias`` references may add to a YAML document beyond its own nodes."""


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def read_text_file(path: Path, *, what: str, max_bytes: int, missing_hint: str = "") -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes``.

    ``what`` names the file in errors ("config file", "prompts file"), ``missing_hint`` ends
    the error of a missing one. A device, a pipe or a directory is refused before it is read,
    the size is checked on the open file, and no more than ``max_bytes + 1`` bytes are ever read
    (a file growing meanwhile is refused too).
    """
    try:
        with path.open("rb") as fh:
            size = _regular(fh, path, what)
            _check_size(path, what, size, max_bytes)
            # (its size and a byte more, not the limit's worth: a read of n bytes takes n bytes
            # of memory first, 1 GiB for every prompts file; a file that grew reads on)
            data = fh.read(size + 1)
            if len(data) > size:
                data += fh.read(max_bytes + 1 - len(data))
    except OSError as exc:
        raise _unreadable(exc, path, what, missing_hint) from None
    if len(data) > max_bytes:
        raise ConfigError(f"{path}: the {what} is more than the limit of {_size(max_bytes)}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise _not_utf8(path, what, line, column, data[exc.start]) from None


def text_lines(
    path: Path, *, what: str, max_bytes: int, missing_hint: str = "", whole: bool = True
) -> Iterator[str]:
    """The lines of a UTF-8 text file, each with its ``\\n`` (split there only), read as they
    are taken: memory follows the lines kept, not the file's size (a prompts file's first rows,
    or a sample of its rows). The checks of :func:`read_text_file`, with a line's bytes that are
    not UTF-8 named when it is reached; ``whole``: the file is to be read to its end, so one
    larger than ``max_bytes`` is refused before a line is read (else when the lines taken pass
    the limit)."""
    try:
        with path.open("rb") as fh:
            size = _regular(fh, path, what)
            if whole:
                _check_size(path, what, size, max_bytes)
            read = lineno = 0
            # (a line is read to its end, but never past the limit: a file without a newline
            # is not taken in whole)
            while raw := fh.readline(max_bytes - read + 1):
                read += len(raw)
                lineno += 1
                if read > max_bytes:
                    raise ConfigError(
                        f"{path}: the {what} is more than the limit of {_size(max_bytes)}"
                    )
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise _not_utf8(path, what, lineno, exc.start + 1, raw[exc.start]) from None
                yield line
    except OSError as exc:
        raise _unreadable(exc, path, what, missing_hint) from None


def _regular(fh: Any, path: Path, what: str) -> int:
    """The size of the open file ``fh``, refused unless it is a regular file."""
    st = os.fstat(fh.fileno())
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(
            f"{path}: the {what} is not a regular file (a device, pipe or directory); "
            "give the path of a file"
        )
    return st.st_size


def _check_size(path: Path, what: str, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise ConfigError(
            f"{path}: the {what} is {_size(size)}, more than the limit of {_size(max_bytes)}"
        )


def _unreadable(exc: OSError, path: Path, what: str, missing_hint: str) -> ConfigError:
    if isinstance(exc, FileNotFoundError):
        return ConfigError(f"{path}: no such {what}{missing_hint}")
    if isinstance(exc, IsADirectoryError):
        return ConfigError(
            f"{path}: the {what} is not a regular file (a directory); give the path of a file"
        )
    return ConfigError(f"{path}: cannot read the {what}: {exc.strerror or exc}")


def _not_utf8(path: Path, what: str, line: int, column: int, byte: int) -> ConfigError:
    return ConfigError(
        f"{path} (line {line}, column {column}): the {what} is not UTF-8 text (byte "
        f"0x{byte:02x}); save it as UTF-8"
    )


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys, deep nesting and alias bombs."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise ConstructorError(
                    None,
                    None,
                    f"nested deeper than {MAX_YAML_DEPTH} levels",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise ConstructorError(
                    None,
                    None,
                    f"duplicate key {key_node.value!r} (first on line {seen[key] + 1}); "
                    "keep one of them",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _expanded_size(root: Node) -> tuple[int, int]:
    """(values once every alias is expanded, distinct nodes), without expanding anything: the
    expanded size of a node shared by aliases is computed once (the document is a DAG)."""
    memo: dict[int, int] = {}
    open_: set[int] = set()
    # iterative post-order: a deep document must not hit the recursion limit here
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in memo and not done:
            continue
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            memo[id(node)] = min(1 + sum(memo[id(c)] for c in children), 1 << 62)
            open_.discard(id(node))
            continue
        if any(id(c) in open_ or c is node for c in children):
            raise ValueError("an alias refers to a value that contains it (a recursive YAML)")
        open_.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in memo)
    return memo[id(root)], len(memo)


def load_yaml(text: str, *, source: str) -> Any:
    """Parse one YAML document strictly; errors name ``source`` and the line."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            expanded, distinct = _expanded_size(node)
        except ValueError as exc:
            raise ConfigError(f"{source}: not valid YAML: {exc}") from None
        if expanded - distinct > MAX_ALIAS_EXPANSION:
            raise ConfigError(
                f"{source}: the YAML's aliases (*name) expand to about {expanded:.2g} values, "
                f"more than the limit of {MAX_ALIAS_EXPANSION:,} beyond its own; write the "
                "values out, or use fewer aliases"
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{where}: not valid YAML: {problem}") from None
    finally:
        loader.dispose()
