"""``--set key.path=value`` overrides of a parsed job config, and the dotted field paths they use.

A path is ``engines[1].base_url`` or ``engines.1.base_url``; the value is parsed as YAML.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from presto_client.errors import ConfigError

TEXT_FIELDS = frozenset({"template", "system_prompt"})
"""Fields that hold text: a value YAML reads as something else (``{problem}`` is a mapping in
YAML) is taken as written."""


def parse_path(path: str) -> list[str | int]:
    """``engines[1].base_url`` / ``engines.1.base_url`` → ``["engines", 1, "base_url"]``."""
    out: list[str | int] = []
    for part in path.replace("[", ".").replace("]", "").split("."):
        if part == "":
            raise ValueError("empty path component")
        out.append(int(part) if part.lstrip("-").isdigit() else part)
    return out


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one ``key.path=value`` override in place (the value is parsed as YAML)."""
    if "=" not in override:
        raise ConfigError(
            f"bad override {override!r}: expected KEY=VALUE, e.g. --set sampler.alpha=4"
        )
    key, _, raw = override.partition("=")
    key = key.strip()
    try:
        path = parse_path(key)
        value = yaml.safe_load(raw) if raw.strip() else None
        if path[-1] in TEXT_FIELDS and value is not None and not isinstance(value, str):
            value = raw.strip()
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"bad override {override!r}: {exc}; expected KEY=VALUE, e.g. --set sampler.alpha=4"
        ) from None
    node: Any = data
    for i, part in enumerate(path[:-1]):
        where = format_loc(path[: i + 1])
        if isinstance(part, int):
            if not isinstance(node, list) or not -len(node) <= part < len(node):
                size = len(node) if isinstance(node, list) else 0
                raise ConfigError(
                    f"bad override {override!r}: {where} does not exist "
                    f"(the config lists {size} item(s) there)"
                )
            node = node[part]
        else:
            if not isinstance(node, dict):
                raise ConfigError(f"bad override {override!r}: {where} is not a mapping")
            nxt = node.get(part)
            if nxt is None:
                nxt = {}
                node[part] = nxt
            node = nxt
    last = path[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or not -len(node) <= last < len(node):
            raise ConfigError(f"bad override {override!r}: {format_loc(path)} does not exist")
        node[last] = value
    else:
        if not isinstance(node, dict):
            raise ConfigError(
                f"bad override {override!r}: {format_loc(path[:-1])} is not a mapping"
            )
        node[last] = value


def format_loc(loc: Sequence[str | int]) -> str:
    """``("engines", 1, "base_url")`` → ``engines[1].base_url``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"
