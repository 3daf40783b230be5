"""HTTP backends: one adapter per serving dialect, a shared transport, a registry.

``create_engine(spec, replica)`` builds the engine for one replica of an :class:`EngineSpec`;
``discover_vocab_size(engine)`` asks its server for the model's vocabulary size and
``adopt_vocab_size`` sets it on the engine (:mod:`.vocabulary`).
"""

from __future__ import annotations

from presto_client.backends.registry import available_backends, create_engine, register_backend
from presto_client.backends.routing import check_routing_key_header
from presto_client.backends.spec import Capabilities, EngineSpec, ProbeReport
from presto_client.backends.vocabulary import VocabAnswer, adopt_vocab_size, discover_vocab_size

__all__ = [
    "Capabilities",
    "EngineSpec",
    "ProbeReport",
    "VocabAnswer",
    "adopt_vocab_size",
    "available_backends",
    "check_routing_key_header",
    "create_engine",
    "discover_vocab_size",
    "register_backend",
]
