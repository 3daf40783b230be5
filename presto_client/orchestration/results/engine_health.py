"""What a run's metrics say of each engine (``metrics.jsonl``, a row per engine per session):
its prefix-cache hit rate, whether a replica restarted during a session, and how far its
logprobs drift with the batch a request shares (its probes' measure)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("presto_client.orchestration.results.summary")


@dataclass(frozen=True, slots=True)
class EngineHealth:
    """Per engine: prefix-cache hit rate, replica restarted or not, drift with the batch."""

    hit_rates: Mapping[str, float | None]
    restarted: set[str]
    drift: Mapping[str, float]


def engine_health(metrics: Iterable[Mapping[str, Any]]) -> EngineHealth:
    rows = list(metrics)
    return EngineHealth(cache_hit_rates(rows), engines_restarted(rows), engines_drift(rows))


def as_number(value: Any) -> float:
    """``value`` as a finite float (0 for anything else: a missing or broken figure)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return 0.0
    return out if math.isfinite(out) else 0.0


def ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def cache_hit_rates(metrics: Iterable[Mapping[str, Any]]) -> dict[str, float | None]:
    """Per engine: prefix-cache hits / queries over every session's counter deltas (a delta
    whose counters went backwards, which older runs wrote, is left out; the rate is at most 1)."""
    queries: dict[str, float] = {}
    hits: dict[str, float] = {}
    for row in metrics:
        engine = str(row.get("engine"))
        q, h = row.get("queries"), row.get("hits")
        if q is None or as_number(q) < 0 or as_number(h) < 0:
            if q is not None:
                logger.warning(
                    "metrics of engine %s, session %s: negative prefix-cache counts (the "
                    "server restarted?); left out of the hit rate",
                    engine,
                    row.get("session"),
                )
            queries.setdefault(engine, 0.0)
            continue
        queries[engine] = queries.get(engine, 0.0) + as_number(q)
        hits[engine] = hits.get(engine, 0.0) + as_number(h)
    rates = {e: ratio(hits.get(e, 0.0), q) for e, q in queries.items()}
    return {e: None if r is None else min(max(r, 0.0), 1.0) for e, r in rates.items()}


def engines_restarted(metrics: Iterable[Mapping[str, Any]]) -> set[str]:
    """The engines a replica of which restarted during a session: their hit rate covers only
    what that replica served after its restart."""
    return {
        str(row.get("engine")) for row in metrics if as_number(row.get("restarted_replicas")) > 0
    }


def engines_drift(metrics: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Per engine, the largest drift with the batch its probes measured, in nats per token."""
    out: dict[str, float] = {}
    for row in metrics:
        if row.get("drift_max_nats") is not None:
            name = str(row.get("engine"))
            out[name] = max(out.get(name, 0.0), float(row["drift_max_nats"]))  # (inf counts)
    return out
