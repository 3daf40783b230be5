"""HTTP backends: one adapter per serving dialect, a shared transport, a registry.

``create_engine(spec, replica)`` builds the engine for one replica of an :class:`EngineSpec`.
"""

from __future__ import annotations

from presto_client.backends.registry import available_backends, create_engine, register_backend
from presto_client.backends.routing import check_routing_key_header
from presto_client.backends.spec import Capabilities, EngineSpec, ProbeReport

__all__ = [
    "Capabilities",
    "EngineSpec",
    "ProbeReport",
    "available_backends",
    "check_routing_key_header",
    "create_engine",
    "register_backend",
]
