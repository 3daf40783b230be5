"""What every HTTP backend shares: the engine spec, the probe report, the capabilities record.

An :class:`EngineSpec` is the plain object the faces layer builds from a job config; the
registry (:func:`presto_client.backends.create_engine`) turns it into an engine for one replica.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from presto_client import defaults
from presto_client.backends.routing import check_routing_key_header
from presto_client.errors import ConfigError
from presto_client.urls import host_port, split_userinfo

DEFAULT_RESTART_WINDOW_S = defaults.RESTART_WINDOW_S
"""See :data:`presto_client.defaults.RESTART_WINDOW_S`."""


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One serving engine (possibly several data-parallel replicas) as the backends see it."""

    kind: str
    """Registry key: ``"vllm"`` | ``"sglang"`` | ``"openai"``."""
    base_urls: tuple[str, ...]
    """One or more replicas (data-parallel servers); a chain sticks to one."""
    model: str | None = None
    """Served model name; ``None``: discovered via ``/v1/models`` (or the server info)."""
    logprob_mode: str = "auto"
    """vllm: ``"raw"`` (one call, certified top-K interval) | ``"processed"`` (exact, two calls);
    sglang: ``"scaled"`` (default output logprobs) | ``"raw"``
    (``SGLANG_RETURN_ORIGINAL_LOGPROB=1``); openai: ``"raw"``; ``"auto"``: the dialect's default."""
    top_k: int = defaults.TOP_K
    max_concurrency: int = defaults.ENGINE_MAX_CONCURRENCY
    """In-flight HTTP requests per replica."""
    request_timeout_s: float = defaults.REQUEST_TIMEOUT_S
    connect_timeout_s: float = defaults.CONNECT_TIMEOUT_S
    request_deadline_s: float = defaults.REQUEST_DEADLINE_S
    """The most one request may take, first byte sent to last byte read (not retried)."""
    max_response_mb: float = defaults.MAX_RESPONSE_MB
    """The least size cap of one answer (a request's grows with its tokens x top-K)."""
    max_retries: int = defaults.MAX_RETRIES
    """Retries of timeouts, 408, 429 and 500 (a restart's symptoms: ``restart_window_s``)."""
    restart_window_s: float = DEFAULT_RESTART_WINDOW_S
    """Seconds of backoff over which refused connections and 502/503/504 are retried."""
    api_key: str | None = None
    """Sent as ``Authorization: Bearer``. A URL's ``user:password@`` is sent as HTTP Basic auth
    instead; both at once are refused (they would share the one Authorization header)."""
    name: str | None = None
    """Display name; default ``kind@host:port``."""
    vocab_size: int | None = None
    """Needed only for temperatures > 1 (bounding the top-K tail)."""
    routing_key_header: str | None = None
    """The header a gateway in front of the replicas routes by (``x-smg-routing-key`` for
    ``smg``, ``x-session-id`` for ``vllm-router``): every request of a chain carries the chain's
    key in it (:mod:`presto_client.backends.routing`); ``None``: no key sent."""

    def __post_init__(self) -> None:
        if self.routing_key_header is not None:
            try:
                check_routing_key_header(self.routing_key_header)
            except ValueError as exc:
                raise ConfigError(f"routing_key_header: {exc}") from None
        if isinstance(self.base_urls, str):  # a common slip: one URL instead of a tuple
            object.__setattr__(self, "base_urls", (self.base_urls,))
        else:
            object.__setattr__(self, "base_urls", tuple(self.base_urls))
        if self.api_key and any(split_userinfo(u)[1] is not None for u in self.base_urls):
            raise ConfigError(
                "an engine URL carries user:password@ and an API key is given too: use one or "
                "the other, not both (the URL's credentials are sent as HTTP Basic auth, the "
                "API key as a Bearer token; both would use the Authorization header)"
            )

    def display_name(self, replica: int = 0) -> str:
        if self.name:
            return self.name if len(self.base_urls) <= 1 else f"{self.name}#{replica}"
        url = self.base_urls[replica] if self.base_urls else ""
        return f"{self.kind}@{host_port(url)}"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a dialect (as configured) can do; read by the orchestration and the probe."""

    dialect: str
    logprob_mode: str
    """The resolved mode (never ``"auto"``)."""
    logprob_semantics: str
    """``"raw"``: returned logprobs are ``log p0`` (log q derived, certified interval);
    ``"scaled"``: they are exact ``log q_τ`` at the request temperature."""
    exact_logq: bool
    """Whether ``generate`` returns exact ``log q`` (``lo == hi``) at the request temperature."""
    calls_per_proposal: int
    seeds_honoured: bool | None
    """``None`` until the probe has checked."""
    scoring_call: bool
    """Whether the server can score given tokens (``Engine.score``)."""
    streaming: bool
    max_top_k: int | None
    metrics: tuple[str, ...] = ()
    """Prometheus metric names read for the prefix-cache counters (queries, hits)."""


@dataclass(slots=True)
class ProbeReport:
    """What the start-up probe found; ``ok`` is False only with ``problems`` listed."""

    engine: str
    base_url: str
    model: str
    logprob_mode: str
    healthy: bool = True
    seeds_honoured: bool | None = None
    gateway: str | None = None
    """The gateway found at the URL (``smg``, ``vllm-router``, ...; ``None``: none)."""
    max_abs_logprob_diff: float | None = None
    """The largest |returned − expected| logprob seen while checking the logprob semantics."""
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    details: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems
