"""The service's counters, as Prometheus text (``GET /metrics``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from presto_client.core.runners import ChainResult

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


class Metrics:
    """Counters of requests (by endpoint and status) and of the chains run for them."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.counters: Counter[str] = Counter()

    def request(self, endpoint: str, status: int) -> None:
        self.requests[(endpoint, status)] += 1

    def chains(self, results: Sequence[ChainResult], prompt_tokens: int) -> None:
        c = self.counters
        c["prompt_tokens"] += prompt_tokens
        for r in results:
            s = r.stats
            c["chains"] += 1
            c["transitions"] += s.transitions
            c["accepts"] += s.accepts
            c["rounds"] += s.rounds
            c["engine_requests_issued"] += s.requests_issued
            c["engine_requests_used"] += s.requests_used
            c["engine_requests_cancelled"] += s.requests_cancelled
            c["tokens_generated"] += s.tokens_generated
            c["completion_tokens"] += len(r.token_ids)

    def render(self, gauges: dict[str, tuple[str, Callable[[], float]]]) -> str:
        lines = [
            "# HELP presto_serve_requests_total Requests answered, by endpoint and status.",
            "# TYPE presto_serve_requests_total counter",
        ]
        for (endpoint, status), n in sorted(self.requests.items()):
            lines.append(
                f'presto_serve_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}'
            )
        for name, help_text in _COUNTERS.items():
            metric = f"presto_serve_{name}_total"
            lines += [
                f"# HELP {metric} {help_text}.",
                f"# TYPE {metric} counter",
                f"{metric} {self.counters[name]}",
            ]
        for name, (help_text, read) in gauges.items():
            metric = f"presto_serve_{name}"
            lines += [
                f"# HELP {metric} {help_text}.",
                f"# TYPE {metric} gauge",
                f"{metric} {read():g}",
            ]
        return "\n".join(lines) + "\n"
