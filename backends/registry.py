"""The registry of backend dialects: register, list, create. The one list of backend names.

A backend is an adapter class (pure request builders and response parsers, see
:mod:`presto_client.backends.adapter`); the shared
:class:`~presto_client.backends.http_engine.HttpEngine` drives it over the shared transport. Every
other list of engine kinds (the job config's ``kind``, ``presto validate``, error messages) is
derived from :func:`available_backends`.

Third-party adapters come in two ways:

- :func:`register_backend` at import time (a Python caller, a test);
- an entry point in the group ``presto_client.backends`` of an installed distribution, loaded
  on first use, so that YAML configs and ``presto validate`` accept the kind with no code::

      [project.entry-points."presto_client.backends"]
      tgi = "presto_tgi.adapter:TgiAdapter"
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from presto_client.backends.adapter import Adapter
from presto_client.backends.spec import EngineSpec
from presto_client.errors import ConfigError

if TYPE_CHECKING:
    from presto_client.backends.http_engine import HttpEngine
    from presto_client.backends.pool import Pool
    from presto_client.backends.retry import Sleep

# Built-in dialects are imported on first use: "module:attribute".
_BUILTIN: dict[str, str] = {
    "vllm": "presto_client.backends.vllm:VllmAdapter",
    "sglang": "presto_client.backends.sglang:SglangAdapter",
    "openai": "presto_client.backends.openai_compat:OpenAICompatAdapter",
    "llamacpp": "presto_client.backends.llamacpp:LlamaCppAdapter",
}
BUILTIN_BACKENDS: tuple[str, ...] = tuple(_BUILTIN)
"""The built-in dialects, in the order messages list them."""
_REGISTRY: dict[str, type[Adapter]] = {}

ENTRY_POINT_GROUP = "presto_client.backends"
"""Entry-point group of third-party backends: ``name = "module:AdapterClass"``."""


def _entry_points() -> dict[str, str]:
    """Backends declared by installed distributions: name -> ``"module:attribute"``."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def register_backend(name: str, adapter_cls: type[Adapter]) -> None:
    """Make ``adapter_cls`` available as ``kind: name`` (replaces an earlier registration)."""
    if not name or not isinstance(name, str):
        raise ConfigError(f"backend name must be a non-empty string, got {name!r}")
    if not (isinstance(adapter_cls, type) and issubclass(adapter_cls, Adapter)):
        raise ConfigError(
            f"backend {name!r}: {adapter_cls!r} is not a presto_client.backends.adapter.Adapter"
        )
    _REGISTRY[name] = adapter_cls


def available_backends() -> tuple[str, ...]:
    """The registered backend names (built-in, registered, entry points), sorted."""
    return tuple(sorted(set(_BUILTIN) | set(_REGISTRY) | set(_entry_points())))


def _load(name: str, target: str) -> type[Adapter]:
    module_name, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"backend {name!r}: cannot load {target} ({exc})") from None
    register_backend(name, cls)
    return cls


def adapter_class(name: str) -> type[Adapter]:
    """The adapter class registered as ``name``; ConfigError listing the valid names otherwise."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _BUILTIN:
        return _load(name, _BUILTIN[name])
    declared = _entry_points()
    if name in declared:
        return _load(name, declared[name])
    raise ConfigError(
        f"unknown backend {name!r}; valid backends are: {', '.join(available_backends())}"
    )


def create_engine(
    spec: EngineSpec,
    replica: int = 0,
    *,
    pool: Pool | None = None,
    sleep: Sleep | None = None,
) -> HttpEngine:
    """The engine serving replica ``replica`` of ``spec`` (an unknown kind raises ConfigError).

    ``pool`` replaces the connection pool (tests: an in-memory double);
    ``sleep`` replaces the sleep between retries.
    """
    cls = adapter_class(spec.kind)
    from presto_client.backends.http_engine import HttpEngine

    if not spec.base_urls:
        raise ConfigError(f"engine {spec.kind!r} has no base_urls")
    if not 0 <= replica < len(spec.base_urls):
        raise ConfigError(
            f"replica {replica} out of range: engine {spec.display_name()} has "
            f"{len(spec.base_urls)} base_urls"
        )
    return HttpEngine(spec, cls(spec), replica=replica, pool=pool, sleep=sleep)
