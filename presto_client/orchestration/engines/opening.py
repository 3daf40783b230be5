"""A job's engines, opened: every replica of every engine, probed, identified, checked.

Each engine of the plan (:class:`~presto_client.orchestration.planned.PlannedEngine`) opens
its replicas through its own opener: an HTTP engine through the backends' registry
(:func:`presto_client.backends.create_engine`), the embedded engine as a vLLM-dialect server on
loopback and a managed llama.cpp as its llama-server (both started here first, by
:mod:`presto_client.child_servers`), the reference engine as the
in-process model, a registered kind as it says. Optional capabilities of a replica (a probe, an
identity, prefix-cache metrics, a context length) are read through the protocols of
:mod:`presto_client.core.engine_protocol`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from presto_client.child_servers.lifecycle import ChildServer
from presto_client.concurrency import gather_or_fail
from presto_client.core.engine_protocol import (
    ContextLimited,
    Identified,
    PrefixCacheMetered,
    Probing,
)
from presto_client.core.speculation import SpeculationBudget
from presto_client.errors import ConfigError, EngineUnavailableError, ProbeError
from presto_client.orchestration.engines.eos_discovery import discover_eos_token_id
from presto_client.orchestration.planned import JobPlan, PlannedEngine, ServerToStart
from presto_client.terminal_text import server_text

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class OpenedEngine:
    """An engine of the job, opened: its replicas and what the orchestration needs to know.

    It owns the speculation budget of each replica (one server, one cost curve), which every
    chain on that replica shares: made here, handed to the chains through the orchestrator's
    :class:`~presto_client.orchestration.executors.orchestrator.EnginePool`.
    """

    name: str
    kind: str
    replicas: list[Any]
    max_concurrency: int
    eos_token_id: int | None = None
    probes: list[Any] = field(default_factory=list)
    budgets: list[SpeculationBudget] = field(default_factory=list)
    takes_text: bool = True
    """Whether the replicas tokenize and detokenize text."""

    @classmethod
    def of(
        cls,
        e: PlannedEngine,
        replicas: Sequence[Any],
        job_max_concurrency: int,
        *,
        capacity: int | None = None,
    ) -> OpenedEngine:
        """``replicas`` of the planned engine ``e``, each with a budget of its own sized from
        the bounds its requests run under (the engine's and the job's; ``capacity``: a Ray
        worker's share of them instead). The one place an engine's budgets are made."""
        if capacity is None:
            capacity = min(e.max_concurrency, job_max_concurrency)
        return cls(
            e.name,
            e.kind,
            list(replicas),
            e.max_concurrency,
            e.eos_token_id,
            budgets=SpeculationBudget.per_replica(
                len(replicas),
                capacity,
                tolerance=e.speculation_tolerance,
                probe=e.speculation_probe,
            ),
            takes_text=e.takes_text,
        )


def start_embedded_servers(
    plan: JobPlan,
    stack: contextlib.ExitStack,
    only: Sequence[str] | None = None,
    *,
    started: dict[str, ChildServer] | None = None,
) -> dict[str, str]:
    """Start the server of every engine that asks for one (the embedded engine, a managed
    llama.cpp: :mod:`presto_client.child_servers`); stopped when ``stack`` closes. Returns
    engine name → base URL; ``started`` receives engine name → its server (for a
    :class:`~presto_client.orchestration.engines.server_watch.ServerWatch`)."""
    urls: dict[str, str] = {}
    for e in plan.engines.values():
        if e.server is None or (only is not None and e.name not in only):
            continue
        child = e.server.child()
        urls[e.name] = _start_server(e.name, e.server, child, stack)
        if started is not None:
            started[e.name] = child
    return urls


def _start_server(
    name: str, server: ServerToStart, child: ChildServer, stack: contextlib.ExitStack
) -> str:
    logger.info("starting %s of engine %s: %s", server.what, name, server)
    try:
        return stack.enter_context(child)
    except (RuntimeError, OSError) as exc:
        raise EngineUnavailableError(f"{server.what} did not start: {exc}", engine=name) from exc


async def open_engines(
    plan: JobPlan,
    stack: contextlib.AsyncExitStack,
    *,
    embedded_urls: Mapping[str, str] | None = None,
    only: Sequence[str] | None = None,
    probe: bool = True,
) -> dict[str, OpenedEngine]:
    """Create every engine (all replicas) of ``plan``; closed when ``stack`` closes."""
    embedded_urls = embedded_urls or {}
    opened: dict[str, OpenedEngine] = {}
    for name, e in plan.engines.items():
        if only is not None and name not in only:
            continue
        replicas = e.opener.open_replicas(embedded_urls)
        for r in replicas:
            stack.push_async_callback(r.aclose)
        handle = OpenedEngine.of(e, replicas, plan.settings.max_concurrency)
        if probe and e.probes:
            handle.probes = await probe_engine(handle)
        opened[name] = handle
    return opened


async def probe_engine(handle: OpenedEngine) -> list[Any]:
    """Probe every replica; a replica with problems raises :class:`ProbeError`."""
    reports = await asyncio.gather(*(r.probe() for r in handle.replicas if isinstance(r, Probing)))
    for report in reports:  # (the backend logs the probe's warnings itself)
        if not report.ok:
            raise ProbeError(
                f"probe of {report.base_url} failed: {'; '.join(report.problems)}",
                engine=handle.name,
            )
    return list(reports)


def probe_drift(handle: OpenedEngine) -> dict[str, float] | None:
    """How far the engine's logprobs move with the batch (its replicas' probes, the largest):
    a row of ``metrics.jsonl`` (``None``: not probed, or no scoring call to measure it)."""
    found = [r.details for r in handle.probes if "drift_max_nats" in getattr(r, "details", {})]
    if not found:
        return None
    keys = ("drift_max_nats", "drift_median_nats", "drift_batch_max")
    return {k: min(max(d[k] for d in found), 1e9) for k in keys}  # (JSON has no infinity)


METRICS_TIMEOUT_S = 10.0
"""Bound on one read of an engine's prefix-cache counters (all its replicas together)."""
METRICS_TIMEOUT_STOPPING_S = 1.0
"""The bound when the job is stopping (interrupted, or failed): a healthy server answers
``/metrics`` in milliseconds, and one that is down would otherwise hold the exit for the whole
bound while its connection is retried (the counters are a by-product, not worth the wait)."""


async def read_prefix_cache_counters(
    handle: OpenedEngine, *, timeout_s: float = METRICS_TIMEOUT_S
) -> list[dict[str, float]] | None:
    """The engine's prefix-cache counters, one reading per replica (read concurrently, within
    ``timeout_s`` in all; with the server's start time where it exposes one); ``None`` when a
    replica has none or does not answer in time. Per replica, because a restart is told and
    accounted for replica by replica (``summary.prefix_cache_delta``)."""
    replicas: list[PrefixCacheMetered] = []
    for r in handle.replicas:
        if not isinstance(r, PrefixCacheMetered):
            return None
        replicas.append(r)
    try:
        async with asyncio.timeout(timeout_s):
            readings = await gather_or_fail([r.metrics() for r in replicas])
    except asyncio.CancelledError:
        raise
    except TimeoutError:
        logger.info("engine %s: no metrics (no answer within %g s)", handle.name, timeout_s)
        return None
    except Exception as exc:
        logger.info("engine %s: no metrics (%s)", handle.name, exc)
        return None
    out: list[dict[str, float]] = []
    for m in readings:
        if "prefix_cache_queries" not in m or "prefix_cache_hits" not in m:
            return None
        keys = ("prefix_cache_queries", "prefix_cache_hits", "process_start_time")
        out.append({k: float(m[k]) for k in keys if k in m})
    return out


def check_lengths(
    plan: JobPlan, engines: Mapping[str, OpenedEngine], prompt_ids: Mapping[str, Any] | None = None
) -> None:
    """Refuse a response that cannot fit the server's context: the longest prompt (token ids
    per engine, when known) plus ``block_size × num_blocks`` against ``max_model_len``."""
    s = plan.settings
    response = s.block_size * s.num_blocks
    known = [len(p.token_ids) for p in plan.prompts if p.token_ids is not None]
    for name, handle in engines.items():
        limits = [
            r.max_model_len
            for r in handle.replicas
            if isinstance(r, ContextLimited) and r.max_model_len
        ]
        if not limits:
            continue
        limit = min(limits)
        if prompt_ids is not None and prompt_ids.get(name):
            prompt, what = max(len(p) for p in prompt_ids[name]), "the longest prompt"
        elif known and len(known) == len(plan.prompts):
            prompt, what = max(known), "the longest prompt"
        else:
            prompt, what = 1, "at least one prompt token"
        if prompt + response > limit:
            raise ConfigError(
                f"engine {name} serves a context of max_model_len = {limit} tokens, but a "
                f"response of sampler.block_size x num_blocks = {s.block_size} x "
                f"{s.num_blocks} = {response} tokens after {what} ({prompt}) needs "
                f"{prompt + response}: lower block_size or num_blocks, shorten the prompts, or "
                "serve the model with a larger --max-model-len"
            )


async def engine_identities(engines: Mapping[str, OpenedEngine]) -> dict[str, dict[str, Any]]:
    """What each HTTP engine serves (model, version, max_model_len, logprob mode); its replicas
    must agree."""
    out: dict[str, dict[str, Any]] = {}
    for name, handle in engines.items():
        found = [await r.identity() for r in handle.replicas if isinstance(r, Identified)]
        if not found:
            continue
        models = sorted({str(i["model"]) for i in found})
        if len(models) > 1:
            raise ConfigError(
                f"engine {name}: its replicas serve different models "
                f"({server_text(', '.join(models))}); a chain's replica would decide its model. "
                "Point base_urls at one model"
            )
        out[name] = found[0]
    return out


def describe_probe(name: str, report: Any) -> list[str]:
    """A replica's probe report in words (``presto validate --probe``)."""
    extra = ""
    if report.seeds_honoured is not None:
        extra = f", seeds honoured: {report.seeds_honoured}"
    gateway = getattr(report, "gateway", None)  # (HTTP engines: the gateway at the URL)
    if gateway:
        extra += f", through the gateway {gateway}"
    lines = [
        f"  {name} {report.base_url}: ok, model {server_text(report.model)}, "
        f"logprob mode {report.logprob_mode}{extra}"
    ]
    drift = report.details.get("drift_max_nats") if hasattr(report, "details") else None
    if drift is not None:
        batch = int(report.details.get("drift_batch_max", 1))
        lines.append(
            f"    batch-invariant: drift 0 nats in batches of up to {batch}"
            if drift == 0
            else f"    drifting: up to {drift:.3g} nats per token (median "
            f"{report.details['drift_median_nats']:.3g}) in batches of up to {batch}"
        )
    lines.extend(f"    warning: {w}" for w in report.warnings)
    return lines


def probe_job(plan: JobPlan) -> list[str]:
    """Open and probe every engine of the job (starting embedded servers), check the context
    lengths, and describe what answered; blocking (``presto validate --probe``)."""

    async def probe_all(urls: Mapping[str, str]) -> list[str]:
        lines: list[str] = []
        async with contextlib.AsyncExitStack() as astack:
            engines = await open_engines(plan, astack, embedded_urls=urls, probe=True)
            check_lengths(plan, engines)
            for name, handle in engines.items():
                if not handle.probes:
                    lines.append(f"  {name}: ok (in-process)")
                for report in handle.probes:
                    lines.extend(describe_probe(name, report))
                if (
                    handle.takes_text
                    and handle.replicas
                    and plan.engines[name].eos_token_id is None
                ):
                    eos, why = await discover_eos_token_id(handle.replicas[0])
                    lines.append(
                        f"  {name}: EOS token {eos}, as the server states it"
                        if eos is not None
                        else f"  {name}: no EOS token known ({why}); set engines[].eos_token_id"
                    )
                for replica in handle.replicas:
                    generation = getattr(replica, "generation", None)
                    plan_of = getattr(generation, "slot_plan", None)
                    slots = await plan_of() if plan_of is not None else None
                    if slots is not None:
                        lines.append(
                            f"  {name}: {slots.slots} slot(s): at most {slots.slots} request(s) "
                            "at once, the others wait in the client"
                        )
        return lines

    with contextlib.ExitStack() as stack:
        urls = start_embedded_servers(plan, stack)
        return asyncio.run(probe_all(urls))
