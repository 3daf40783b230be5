"""Reading Prometheus text exposition (``/metrics``): the prefix-cache counters we need."""

from __future__ import annotations

import math
import re

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)"
)


def parse_prometheus(text: str) -> dict[str, float]:
    """``{metric name: value summed over label sets}`` of every sample line.

    Counters appear with their ``_total`` suffix (prometheus_client adds it); ``_created``
    timestamps are skipped.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name = match.group("name")
        if name.endswith("_created"):
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def counter(samples: dict[str, float], name: str) -> float | None:
    """A counter's value under its bare name, with ``_total``, or ``None`` when absent."""
    for candidate in (f"{name}_total", name):
        if candidate in samples:
            return samples[candidate]
    return None


PROCESS_START_METRIC = "process_start_time_seconds"
"""The server process's start time (Unix seconds) in the standard Prometheus exposition."""


def prefix_cache_metrics(
    text: str, names: tuple[str, str] | None, *, queries_exclude_hits: bool = False
) -> dict[str, float]:
    """``prefix_cache_queries``/``prefix_cache_hits`` (and ``prefix_cache_hit_rate``).

    ``queries_exclude_hits``: the first counter counts only the prompt tokens computed, not
    those found in the cache (llama.cpp's ``prompt_tokens``), so the queries are both summed.
    """
    samples = parse_prometheus(text)
    out: dict[str, float] = {}
    if names is None:
        return out
    # prometheus_client's process collector (vLLM, SGLang, the embedded engine): the counters
    # below restart from zero with the process, so a change of this value between two readings
    # says the server restarted in between, even when its counters have since grown past the
    # first reading (then "after minus before" would be a plausible but meaningless number).
    started = samples.get(PROCESS_START_METRIC)
    if started is not None:
        out["process_start_time"] = started
    queries = counter(samples, names[0])
    hits = counter(samples, names[1])
    if queries_exclude_hits and queries is not None:
        queries = queries + hits if hits is not None else None
    if queries is not None:
        out["prefix_cache_queries"] = queries
    if hits is not None:
        out["prefix_cache_hits"] = hits
    if queries and hits is not None:
        out["prefix_cache_hit_rate"] = hits / queries
    return out
