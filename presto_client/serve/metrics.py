"""The service's metrics (``GET /metrics``), through the Prometheus client library.

Why the library and not hand-written text: its exposition escapes label values (a crafted URL
once printed a forged ``forged_metric_total 42`` line), and its types give the histograms a
dashboard expects. Labels are bounded by construction: ``endpoint`` is the matched route's
template (an unmatched path, a 404 scan, is ``other``), ``status`` the answer's code, so no
client can add a series. Each service has a registry of its own (several services in one
process, as the tests run them, do not share counters).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from presto_client.core.runners import ChainResult

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The exposition's content type (Prometheus text format)."""

ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"})
"""The routes a label may name; any other path is ``other``."""

_COUNTERS = {
    "chains": "Chains finished",
    "transitions": "Metropolis-Hastings transitions decided",
    "accepts": "Transitions accepted",
    "rounds": "Proposal calls (sequential steps or PreSTO rounds)",
    "engine_requests_issued": "Proposal requests sent to the engine (speculative ones included)",
    "engine_requests_used": "Proposal requests a decision used",
    "engine_requests_cancelled": "Speculative requests aborted once the walk could not use them",
    "tokens_generated": "Tokens the engine generated (proposals and extensions included)",
    "completion_tokens": "Tokens of the returned answers",
    "prompt_tokens": "Prompt tokens of the requests",
}

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
"""Seconds: a request's time spans a /health (milliseconds) to a long power-sampled answer."""


def endpoint_label(route: str | None) -> str:
    """The label of a request's route template (``other`` for anything unmatched)."""
    return route if route in ROUTES else "other"


class Metrics:
    """Counters of requests (by endpoint and status) and of the chains run for them, latency
    histograms, and gauges read when scraped."""

    def __init__(self, gauges: dict[str, tuple[str, Callable[[], float]]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = Counter(
            "presto_serve_requests",
            "Requests answered, by endpoint (route template) and status.",
            ("endpoint", "status"),
            registry=r,
        )
        self._latency = Histogram(
            "presto_serve_request_duration_seconds",
            "Time from a request's arrival to its answer (a stream: to its end), by endpoint.",
            ("endpoint",),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._queue = Histogram(
            "presto_serve_queue_wait_seconds",
            "Time a generation request waited for a running slot.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._counters = {
            name: Counter(f"presto_serve_{name}", f"{help_text}.", registry=r)
            for name, help_text in _COUNTERS.items()
        }
        for name, (help_text, read) in (gauges or {}).items():
            Gauge(f"presto_serve_{name}", f"{help_text}.", registry=r).set_function(read)

    def request(self, route: str | None, status: int, seconds: float | None = None) -> None:
        endpoint = endpoint_label(route)
        self._requests.labels(endpoint, str(status)).inc()
        if seconds is not None:
            self._latency.labels(endpoint).observe(seconds)

    def queued(self, seconds: float) -> None:
        self._queue.observe(seconds)

    def chains(self, results: Sequence[ChainResult], prompt_tokens: int) -> None:
        c = self._counters
        c["prompt_tokens"].inc(prompt_tokens)
        for r in results:
            s = r.stats
            c["chains"].inc()
            c["transitions"].inc(s.transitions)
            c["accepts"].inc(s.accepts)
            c["rounds"].inc(s.rounds)
            c["engine_requests_issued"].inc(s.requests_issued)
            c["engine_requests_used"].inc(s.requests_used)
            c["engine_requests_cancelled"].inc(s.requests_cancelled)
            c["tokens_generated"].inc(s.tokens_generated)
            c["completion_tokens"].inc(len(r.token_ids))

    def render(self) -> bytes:
        return generate_latest(self.registry)
