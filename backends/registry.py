"""The registry of backend dialects: register, list, create.

A backend is an adapter class (pure request builders and response parsers, see
:mod:`backends.adapter`); the shared :class:`~backends.http_engine.HttpEngine` drives it over the
shared transport. Third-party adapters register themselves with :func:`register_backend`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from backends.adapter import Adapter
from backends.base import EngineSpec
from presto_client.errors import ConfigError

if TYPE_CHECKING:
    import httpx

    from backends.http_engine import HttpEngine
    from backends.transport import Sleep

# Built-in dialects are imported on first use: "module:attribute".
_BUILTIN: dict[str, str] = {
    "vllm": "backends.vllm:VllmAdapter",
    "sglang": "backends.sglang:SglangAdapter",
    "openai": "backends.openai_compat:OpenAICompatAdapter",
}
_REGISTRY: dict[str, type[Adapter]] = {}


def register_backend(name: str, adapter_cls: type[Adapter]) -> None:
    """Make ``adapter_cls`` available as ``kind: name`` (replaces an earlier registration)."""
    if not name or not isinstance(name, str):
        raise ConfigError(f"backend name must be a non-empty string, got {name!r}")
    if not (isinstance(adapter_cls, type) and issubclass(adapter_cls, Adapter)):
        raise ConfigError(f"backend {name!r}: {adapter_cls!r} is not a backends.adapter.Adapter")
    _REGISTRY[name] = adapter_cls


def available_backends() -> tuple[str, ...]:
    """The registered backend names, sorted."""
    return tuple(sorted(set(_BUILTIN) | set(_REGISTRY)))


def adapter_class(name: str) -> type[Adapter]:
    """The adapter class registered as ``name``; ConfigError listing the valid names otherwise."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _BUILTIN:
        module_name, attr = _BUILTIN[name].split(":")
        cls: type[Adapter] = getattr(importlib.import_module(module_name), attr)
        _REGISTRY[name] = cls
        return cls
    raise ConfigError(
        f"unknown backend {name!r}; valid backends are: {', '.join(available_backends())}"
    )


def create_engine(
    spec: EngineSpec,
    replica: int = 0,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    sleep: Sleep | None = None,
) -> HttpEngine:
    """The engine serving replica ``replica`` of ``spec`` (an unknown kind raises ConfigError).

    ``transport`` replaces httpx's network transport (tests: ``httpx.MockTransport``);
    ``sleep`` replaces the sleep between retries.
    """
    cls = adapter_class(spec.kind)
    from backends.http_engine import HttpEngine

    if not spec.base_urls:
        raise ConfigError(f"engine {spec.kind!r} has no base_urls")
    if not 0 <= replica < len(spec.base_urls):
        raise ConfigError(
            f"replica {replica} out of range: engine {spec.display_name()} has "
            f"{len(spec.base_urls)} base_urls"
        )
    return HttpEngine(spec, cls(spec), replica=replica, transport=transport, sleep=sleep)
