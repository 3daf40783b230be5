"""How a planned engine's replicas open: plain objects the plan holds (no pydantic below the
plan), one per engine kind, each making the engines of its replicas when the job starts."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from presto_client import defaults
from presto_client.backends.registry import create_engine
from presto_client.backends.spec import EngineSpec
from presto_client.core.reference import ReferenceEngine, ReferenceModel, SimulatedLatencyEngine
from presto_client.errors import ConfigError


@dataclass(frozen=True, slots=True)
class HttpOpener:
    """Opens one HTTP engine per replica URL; the API key is read from the environment only
    then (a config names the variable, never the key)."""

    spec: EngineSpec
    api_key_env: str | None
    index: int

    def _api_key(self) -> str | None:
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(
                f"engines[{self.index}].api_key_env: environment variable {self.api_key_env} "
                f"is not set; export {self.api_key_env}=... before running"
            )
        return key

    def open_replicas(self, embedded_urls: Mapping[str, str]) -> list[Any]:
        spec = dataclasses.replace(self.spec, api_key=self._api_key())
        return [create_engine(spec, i) for i in range(len(spec.base_urls))]


@dataclass(frozen=True, slots=True)
class StartedServerOpener:
    """Opens the HTTP engine of a server that presto started for the job (the embedded
    engine's vLLM-dialect server, a managed llama-server): one replica, at the URL it took."""

    kind: str
    """The backend that speaks its dialect (``vllm``, ``llamacpp``)."""
    name: str
    top_k: int
    max_concurrency: int
    request_timeout_s: float

    def open_replicas(self, embedded_urls: Mapping[str, str]) -> list[Any]:
        if self.name not in embedded_urls:
            raise ConfigError(f"engine {self.name}: its server was not started")
        spec = EngineSpec(
            kind=self.kind,
            base_urls=(embedded_urls[self.name],),
            top_k=self.top_k,
            max_concurrency=self.max_concurrency,
            request_timeout_s=self.request_timeout_s,
            name=self.name,
            # Both serve SmolLM2-135M (its tokenizer, so its vocabulary).
            vocab_size=defaults.EMBEDDED_VOCAB_SIZE,
        )
        return [create_engine(spec, 0)]


@dataclass(frozen=True, slots=True)
class ReferenceOpener:
    """Makes the in-process reference engine (one replica)."""

    name: str
    vocab_size: int
    model_seed: int
    logit_scale: float
    eos_token_id: int | None
    top_k: int | None
    latency_s: float
    token_latency_s: float

    def open_replicas(self, embedded_urls: Mapping[str, str]) -> list[Any]:
        model = ReferenceModel(
            self.vocab_size,
            seed=self.model_seed,
            logit_scale=self.logit_scale,
            eos_token_id=self.eos_token_id,
        )
        engine: Any = ReferenceEngine(model, top_k=self.top_k, name=self.name)
        if self.latency_s or self.token_latency_s:
            engine = SimulatedLatencyEngine(engine, self.latency_s, self.token_latency_s)
        return [engine]
