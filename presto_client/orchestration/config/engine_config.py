"""The engines of a job config: one pydantic class per kind of engine, and their registry.

HTTP kinds share one class (:class:`HttpEngineConfig`, any kind the backends' registry knows);
every other kind is a class of its own registered by its ``kind`` with
:func:`register_engine_kind` (the embedded server and the reference model below; a new
in-process kind is one file that defines its class and registers it). A class may also take an
HTTP kind for the entries that give no URL, when presto starts that backend's server itself
(:attr:`EngineConfigBase.starts_backend_server`: ``kind: llamacpp`` without ``base_url``,
:mod:`.llamacpp_engine`); it is registered the same way, under the tag ``<kind>-managed``.
The job config's ``engines`` union is built from this registry, so a config error still names
the field path and lists valid kinds.

Each class knows how its replicas are opened (:meth:`opener`: a plain object the plan holds, so
nothing below the plan sees these models), how to describe itself (:meth:`describe`), what it
serves in a run's fingerprint (:meth:`fingerprint_model`), whether it takes text prompts
(:attr:`takes_text`) and keeps its prefix caches per slot (:meth:`per_slot_caches`), so nothing
else switches on engine kinds. HTTP kinds are the backends' registry, never restated here.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from presto_client import defaults
from presto_client.backends import check_routing_key_header
from presto_client.backends.registry import (
    BUILTIN_BACKENDS,
    adapter_class,
    available_backends,
)
from presto_client.backends.spec import EngineSpec
from presto_client.core.speculation import DEFAULT_TOLERANCE
from presto_client.orchestration.engines.engine_openers import (
    HttpOpener,
    ReferenceOpener,
    StartedServerOpener,
)
from presto_client.orchestration.planned import (
    EmbeddedServer,
    PlannedEngine,
    ReplicaOpener,
    ServerToStart,
)
from presto_client.urls import REDACTED, redact_url, split_userinfo

HTTP_TAG = "http"
"""The union tag of :class:`HttpEngineConfig` (every kind the backends' registry knows)."""


def managed_tag(kind: str) -> str:
    """The union tag of the class that serves the HTTP kind ``kind`` when presto starts its
    server (an entry without a URL)."""
    return f"{kind}-managed"


def local_kinds() -> tuple[str, ...]:
    """Engine kinds that are not HTTP backends, in registration order (:func:`register_engine_kind`:
    the embedded CPU server, the reference model, then any registered later)."""
    return tuple(
        k for k, cls in ENGINE_TAGS.items() if k != HTTP_TAG and not cls.starts_backend_server
    )


def http_kinds() -> tuple[str, ...]:
    """The HTTP engine kinds: the backends' registry (built-ins first, then registered ones and
    the entry points of ``presto_client.backends``), never restated here."""
    local = local_kinds()
    names = [k for k in available_backends() if k not in local]
    return (
        *[k for k in BUILTIN_BACKENDS if k in names],
        *[k for k in names if k not in BUILTIN_BACKENDS],
    )


def engine_kinds() -> tuple[str, ...]:
    """Every valid ``kind`` of an engine in a job config."""
    return (*http_kinds(), *local_kinds())


def _numeric(annotation: Any) -> bool:
    """Whether a field takes a number and not a boolean (``float``, ``int | None``, ...)."""
    args = typing.get_args(annotation) or (annotation,)
    return bool not in args and any(a in (int, float) for a in args)


class StrictModel(BaseModel):
    """A config model: unknown fields are errors, defaults are validated too, and a boolean
    is no number (pydantic would read ``alpha: true`` as 1.0)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _numeric(field.annotation):
                raise ValueError(f"{value!r} is a boolean, not a number: write the number")
        return value


# --------------------------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------------------------


class EngineConfigBase(StrictModel):
    """What every engine config has (a name, its concurrency, its EOS) and does: a registered
    kind subclasses it with ``kind: Literal["NAME"]`` and the methods below."""

    name: str | None = Field(
        None,
        description="Display name of the engine, used in arm ids and tables; unique per job. "
        "Default: the kind (with an index if the kind appears twice).",
    )
    max_concurrency: int = Field(
        defaults.ENGINE_MAX_CONCURRENCY,
        ge=1,
        description="Most requests in flight to this engine (all replicas together).",
    )
    speculation_tolerance: float = Field(
        DEFAULT_TOLERANCE,
        ge=0,
        description="How much PreSTO's speculative proposals may slow a decode step of this "
        "engine, as a fraction of the step of the chains' own requests alone (measured per "
        "replica). Higher buys speed with the engine's time where many chains share it (past "
        "the tolerance a lone chain's likely proposals go out anyway); on a CPU every extra "
        "sequence costs. Never changes a chain, only its speed.",
    )
    speculation_probe: bool | None = Field(
        None,
        description="Whether stream may send a speculative proposal before the engine's cost "
        "under load is measured. null: yes, except on llama.cpp (per-slot prefix caches: a "
        "probe prefills its prompt on another slot; its chains speculate once several at once "
        "have measured the cost). Never changes a chain, only its speed.",
    )
    eos_token_id: int | None = Field(
        None,
        description="Token id at which final responses are truncated; null: no truncation "
        "(the embedded engine knows its own).",
    )

    #: Whether the engine tokenizes text prompts (and detokenizes responses) itself.
    takes_text: ClassVar[bool] = True
    #: The EOS of an engine whose model is known (the embedded one), used when none is given.
    known_eos_token_id: ClassVar[int | None] = None
    #: Whether the class's ``kind`` is an HTTP backend's whose server presto starts itself for
    #: an entry that gives no URL (``kind: llamacpp`` without ``base_url``); an entry with a URL
    #: stays an :class:`HttpEngineConfig`.
    starts_backend_server: ClassVar[bool] = False

    def resolved_eos_token_id(self) -> int | None:
        """The EOS at which the engine's responses are truncated: the config's, else the
        engine's own."""
        return self.eos_token_id if self.eos_token_id is not None else self.known_eos_token_id

    def known_vocab_size(self) -> int | None:
        """The model's vocabulary size where the config gives it or the engine's model is
        known (prompt token ids at or past it are refused)."""
        value = getattr(self, "vocab_size", None)
        return int(value) if value is not None else None

    def fingerprint_model(self) -> str | None:
        """What the engine serves, as a run directory's fingerprint records it."""
        raise NotImplementedError

    def describe(self) -> str:
        """Where the engine is and what it serves, in words (``presto validate``)."""
        raise NotImplementedError

    def opener(self, index: int) -> ReplicaOpener:
        """How the engine's replicas are opened, as a plain object (``index``: its place in
        ``engines:``, for error messages)."""
        raise NotImplementedError

    def probes(self) -> bool:
        """Whether the replicas are probed before the job (a served engine)."""
        return False

    def per_slot_caches(self) -> bool:  # llama.cpp
        return False

    def server(self) -> ServerToStart | None:
        """A server to start for this engine before it opens (none by default)."""
        return None

    def planned(self, index: int) -> PlannedEngine:
        """The engine as the plan holds it: plain data, its opener included."""
        return PlannedEngine(
            name=str(self.name),
            kind=str(getattr(self, "kind", "")),
            max_concurrency=self.max_concurrency,
            speculation_tolerance=self.speculation_tolerance,
            speculation_probe=self.speculation_probe is True
            or (self.speculation_probe is None and not self.per_slot_caches()),
            eos_token_id=self.resolved_eos_token_id(),
            takes_text=self.takes_text,
            probes=self.probes(),
            description=self.describe(),
            opener=self.opener(index),
            server=self.server(),
        )


class HttpEngineConfig(EngineConfigBase):
    """A running vLLM / SGLang / OpenAI-compatible server (one or several replicas)."""

    kind: str = Field(
        description="Serving dialect, a registered backend: 'vllm' (/v1/completions), 'sglang' "
        "(native /generate), 'openai' (any OpenAI-compatible completions server), or a "
        "third-party backend (backends.register_backend, entry points presto_client.backends)."
    )
    base_url: str | None = Field(
        None, description="URL of the server, e.g. http://localhost:8000 (or use base_urls)."
    )
    base_urls: list[str] | None = Field(
        None,
        description="Several data-parallel replicas (or routers); a chain sticks to one of them "
        "so that the replica's prefix cache serves it.",
    )
    model: str | None = Field(
        None, description="Served model name; null: discovered from the server (/v1/models)."
    )
    logprob_mode: str = Field(
        "auto",
        description="What the server's logprobs mean. vllm: 'raw' | 'processed'; sglang: "
        "'scaled' | 'raw'; openai: 'raw'; 'auto': the dialect's default.",
    )
    top_k: int = Field(defaults.TOP_K, ge=1, description="Top-K raw logprobs requested per token.")
    request_timeout_s: float = Field(
        defaults.REQUEST_TIMEOUT_S, gt=0, description="Longest silence within a request, seconds."
    )
    connect_timeout_s: float = Field(
        defaults.CONNECT_TIMEOUT_S, gt=0, description="Connect timeout, seconds."
    )
    request_deadline_s: float = Field(
        defaults.REQUEST_DEADLINE_S,
        gt=0,
        description="The most one request may take in all, seconds (keepalives or a trickle "
        "of bytes never reach request_timeout_s); not retried.",
    )
    max_response_mb: float = Field(
        defaults.MAX_RESPONSE_MB,
        gt=0,
        description="Least size cap of one answer, MiB (a request's grows with tokens x "
        "top-K; an SSE line may take a sixteenth); larger answers are refused.",
    )
    max_retries: int = Field(
        defaults.MAX_RETRIES, ge=0, description="Retries on timeouts and HTTP 408/429/500."
    )
    restart_window_s: float = Field(
        defaults.RESTART_WINDOW_S,
        ge=0,
        description="Seconds (of backoff) over which a request retries what a restarting server "
        "answers: refused or reset connections and HTTP 502/503/504. A 4xx is never retried.",
    )
    api_key_env: str | None = Field(
        None,
        description="Name of the environment variable holding the API key, sent as a Bearer "
        "token (the key itself is never written in a config or a run directory). A base_url "
        "with user:password@ is sent as HTTP Basic auth instead; giving both is an error.",
    )
    vocab_size: int | None = Field(
        None,
        ge=2,
        description="Vocabulary size (the model's config.json); null: asked of the server at "
        "start (llama.cpp's model listing, vLLM's and SGLang's refusal of an id past it), and one "
        "given that the server contradicts is an error. Needed for temperatures above 1; token "
        "ids at or past it (answers, prompts) are refused.",
    )
    probe: bool = Field(True, description="Probe the server (health, logprob semantics) first.")
    routing_key_header: str | None = Field(
        None,
        description="Behind a gateway (base_url is smg or vllm-router in front of several "
        "replicas): the header its consistent-hash policy reads, e.g. x-smg-routing-key (smg, "
        "policy consistent_hashing, kind sglang) or x-session-id (vllm-router, policy "
        "consistent_hash, kind vllm). Every request of a chain then carries the chain's key, "
        "so the gateway keeps the chain on one replica (its prefix cache); null: no key.",
    )

    @field_validator("routing_key_header")
    @classmethod
    def _header_name(cls, name: str | None) -> str | None:
        return None if name is None else check_routing_key_header(name)

    @field_validator("kind")
    @classmethod
    def _registered_kind(cls, kind: str) -> str:
        if kind not in http_kinds():
            raise ValueError(
                f"unknown engine kind {kind!r}; valid kinds are: {', '.join(engine_kinds())}"
            )
        return kind

    @model_validator(mode="after")
    def _one_url(self) -> HttpEngineConfig:
        if self.base_url and self.base_urls:
            raise ValueError("give base_url or base_urls, not both")
        if not self.base_url and not self.base_urls:
            raise ValueError(
                "base_url is required: the server's URL, e.g. base_url: http://localhost:8000"
            )
        for url in self.urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(
                    f"{redact_url(url)!r} is not an http(s) URL, e.g. http://localhost:8000"
                )
            userinfo = split_userinfo(url)[1]
            if userinfo is not None and REDACTED in userinfo:
                raise ValueError(
                    f"{redact_url(url)} holds {REDACTED} where its credentials were (a run "
                    "directory's config.resolved.yaml never keeps them): give the credential "
                    "again, as http://user:password@host:port or api_key_env"
                )
            if self.api_key_env and userinfo is not None:
                raise ValueError(
                    f"{redact_url(url)} carries user:password@ and api_key_env is set too: give "
                    "one credential, not both (the URL's is sent as HTTP Basic auth, the key of "
                    "api_key_env as a Bearer token)"
                )
        return self

    @property
    def urls(self) -> tuple[str, ...]:
        if self.base_urls:
            return tuple(self.base_urls)
        return (self.base_url,) if self.base_url else ()

    def fingerprint_model(self) -> str | None:
        return self.model

    def describe(self) -> str:
        where = ", ".join(redact_url(u) for u in self.urls)
        return f"{where}; model={self.model or '(from server)'} logprob_mode={self.logprob_mode}"

    def probes(self) -> bool:
        return self.probe

    def per_slot_caches(self) -> bool:
        return adapter_class(self.kind).traits.slots_path is not None

    def opener(self, index: int) -> HttpOpener:
        spec = EngineSpec(
            kind=self.kind,
            base_urls=self.urls,
            model=self.model,
            logprob_mode=self.logprob_mode,
            top_k=self.top_k,
            max_concurrency=self.max_concurrency,
            request_timeout_s=self.request_timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            request_deadline_s=self.request_deadline_s,
            max_response_mb=self.max_response_mb,
            max_retries=self.max_retries,
            restart_window_s=self.restart_window_s,
            name=str(self.name),
            vocab_size=self.vocab_size,
            routing_key_header=self.routing_key_header,
        )
        return HttpOpener(spec, self.api_key_env, index)


class EmbeddedEngineConfig(EngineConfigBase):
    """The embedded CPU server (SmolLM2-135M, vLLM dialect on loopback), started by presto."""

    kind: Literal["embedded"] = Field(description="The embedded CPU engine ('embedded').")
    port: int | None = Field(None, ge=1, le=65535, description="Port; null: a free one.")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Model dtype; float32 keeps scores batch-invariant."
    )
    startup_timeout_s: float = Field(
        defaults.EMBEDDED_STARTUP_TIMEOUT_S, gt=0, description="How long to wait for start-up."
    )
    top_k: int = Field(defaults.TOP_K, ge=1, description="Top-K raw logprobs requested per token.")
    request_timeout_s: float = Field(
        defaults.EMBEDDED_REQUEST_TIMEOUT_S, gt=0, description="Timeout of one request, seconds."
    )
    probe: bool = Field(True, description="Probe the server (health, logprob semantics) first.")

    known_eos_token_id: ClassVar[int | None] = defaults.EMBEDDED_EOS_TOKEN_ID

    def known_vocab_size(self) -> int | None:
        return defaults.EMBEDDED_VOCAB_SIZE

    def fingerprint_model(self) -> str | None:
        return f"{defaults.EMBEDDED_MODEL}:{self.dtype}"

    def describe(self) -> str:
        return (
            f"embedded CPU server (started by presto); model={defaults.EMBEDDED_MODEL} "
            f"dtype={self.dtype}"
        )

    def probes(self) -> bool:
        return self.probe

    def server(self) -> EmbeddedServer:
        return EmbeddedServer(self.port, self.dtype, self.startup_timeout_s)

    def opener(self, index: int) -> StartedServerOpener:
        return StartedServerOpener(
            "vllm", str(self.name), self.top_k, self.max_concurrency, self.request_timeout_s
        )


class ReferenceEngineConfig(EngineConfigBase):
    """The exact in-process reference model: no server, runs in seconds (tests, demos)."""

    kind: Literal["reference"] = Field(description="The in-process reference model.")
    vocab_size: int = Field(8, ge=2, description="Vocabulary size of the toy model.")
    model_seed: int = Field(0, ge=0, description="Seed of the toy model's logits.")
    logit_scale: float = Field(1.5, gt=0, description="Spread of the toy model's logits.")
    top_k: int | None = Field(
        None,
        ge=1,
        description="Return only top-K raw logprobs (certified intervals, like an HTTP engine); "
        "null: exact scores.",
    )
    latency_s: float = Field(
        0.0, ge=0, description="Simulated latency of every request, seconds (for demos)."
    )
    token_latency_s: float = Field(
        0.0, ge=0, description="Simulated time per generated token of a request, seconds."
    )

    takes_text: ClassVar[bool] = False

    def known_vocab_size(self) -> int | None:
        # The toy model's contexts are any ids (a prompt only seeds its rows): none refused.
        return None

    def fingerprint_model(self) -> str | None:
        return f"reference:{self.vocab_size}:{self.model_seed}:{self.logit_scale}:{self.top_k}"

    def describe(self) -> str:
        return f"in-process reference model; vocab={self.vocab_size} top_k={self.top_k}"

    def opener(self, index: int) -> ReferenceOpener:
        return ReferenceOpener(
            str(self.name),
            self.vocab_size,
            self.model_seed,
            self.logit_scale,
            self.eos_token_id,
            self.top_k,
            self.latency_s,
            self.token_latency_s,
        )


def _engine_tag(value: Any) -> str | None:
    """Which config class an engine entry is: its registered local kind; for an HTTP kind
    whose server presto can start, that class when the entry gives no URL; else ``http``
    (checked against the backends' registry by :class:`HttpEngineConfig`)."""
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    if kind is None:
        return None
    if kind in local_kinds():
        return kind
    managed = ENGINE_TAGS.get(managed_tag(str(kind)))
    if managed is not None and (
        isinstance(value, managed)
        or (
            isinstance(value, dict)
            and value.get("base_url") is None
            and value.get("base_urls") is None
        )
    ):
        return managed_tag(str(kind))
    return HTTP_TAG


ENGINE_TAGS: dict[str, type[EngineConfigBase]] = {HTTP_TAG: HttpEngineConfig}
"""The registry: union tag -> engine config class (``http``, then each registered kind by its
name, and ``<kind>-managed`` for a class that starts an HTTP kind's server)."""

_REGISTERED_HOOKS: list[Callable[[], None]] = []

E = TypeVar("E", bound=type[EngineConfigBase])


def _declared_kind(cls: type[EngineConfigBase]) -> str:
    field = cls.model_fields.get("kind")
    args = typing.get_args(field.annotation) if field is not None else ()
    if (
        field is None
        or typing.get_origin(field.annotation) is not Literal
        or len(args) != 1
        or not isinstance(args[0], str)
    ):
        raise ValueError(
            f"engine config {cls.__name__}: declare its kind as kind: Literal['NAME'] "
            "(one name, the one a config gives)"
        )
    return args[0]


def register_engine_kind(cls: E) -> E:
    """Register an engine config class by its ``kind`` (usable as a class decorator).

    A taken kind (a registered class, an HTTP backend, or ``http``) is refused; a class that
    starts an HTTP backend's server (:attr:`~EngineConfigBase.starts_backend_server`) must name
    one, and is registered for the entries of that kind without a URL. The job config's
    ``engines`` are validated against the new registry from then on."""
    if not (isinstance(cls, type) and issubclass(cls, EngineConfigBase)):
        raise ValueError(
            f"{cls!r} is not an engine config class (subclass "
            "presto_client.orchestration.config.engine_config.EngineConfigBase)"
        )
    kind = _declared_kind(cls)
    if not kind or any(c in kind for c in "/\\ \t\n,"):
        raise ValueError(f"engine kind {kind!r} must be non-empty without '/', ',' or spaces")
    tag = managed_tag(kind) if cls.starts_backend_server else kind
    if tag in ENGINE_TAGS:
        raise ValueError(
            f"engine kind {kind!r} is already registered (by {ENGINE_TAGS[tag].__name__}); "
            "choose another kind"
        )
    if cls.starts_backend_server and kind not in available_backends():
        raise ValueError(
            f"engine kind {kind!r} is no HTTP backend: a class that starts a backend's server "
            "(starts_backend_server) names the backend that speaks to it"
        )
    if not cls.starts_backend_server and kind in available_backends():
        raise ValueError(f"engine kind {kind!r} is already an HTTP backend; choose another kind")
    ENGINE_TAGS[tag] = cls
    for hook in _REGISTERED_HOOKS:
        hook()
    return cls


def on_engine_kind_registered(hook: Callable[[], None]) -> None:
    """Call ``hook`` after every registration (the job config rebuilds its ``engines`` union)."""
    _REGISTERED_HOOKS.append(hook)


def engine_config_type() -> Any:
    """The discriminated union of every registered engine config class, by tag."""
    members = tuple(Annotated[cls, Tag(tag)] for tag, cls in ENGINE_TAGS.items())
    return Annotated[Union[members], Discriminator(_engine_tag)]  # noqa: UP007


register_engine_kind(EmbeddedEngineConfig)
register_engine_kind(ReferenceEngineConfig)

EngineConfig = engine_config_type()
"""An engine entry of a job config, as the registry stood when this module was imported (the
job config keeps its own copy up to date: :func:`on_engine_kind_registered`)."""
