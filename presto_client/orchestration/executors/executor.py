"""Where a job's chains run: the executors behind ``executor.kind`` of the job config.

An executor takes the job's chain specs and its sinks and runs every chain, reporting each
finished chain (its rounds, then its outcome) to the sinks in the driver's process, the one writer
of the run directory. ``local`` runs them in this process with one
:class:`~presto_client.orchestration.executors.orchestrator.Orchestrator` (rounds reported as they
come);
``ray`` (:mod:`presto_client.orchestration.executors.ray_executor`) shards them over Ray actors,
each an orchestrator of its own, and reports each chain whole when it finishes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from presto_client.errors import ConfigError
from presto_client.orchestration.executors.orchestrator import (
    ChainOutcome,
    ChainSink,
    ChainSpec,
    EnginePool,
    Orchestrator,
    OrchestratorResult,
)
from presto_client.orchestration.planned import JobPlan, JobSettings


class ChainExecutor(Protocol):
    async def run(
        self,
        specs: Sequence[ChainSpec],
        *,
        pools: Mapping[str, EnginePool],
        sinks: Sequence[ChainSink],
        finish: Callable[[ChainOutcome], Awaitable[None]] | None,
        settings: JobSettings,
    ) -> OrchestratorResult:
        """Run every chain of ``specs``; raises ``JobFailedError`` past the failure budget and
        re-raises cancellation after stopping every chain."""
        ...


class LocalExecutor:
    """Every chain in this process: one orchestrator over the driver's own engine pools."""

    async def run(
        self,
        specs: Sequence[ChainSpec],
        *,
        pools: Mapping[str, EnginePool],
        sinks: Sequence[ChainSink],
        finish: Callable[[ChainOutcome], Awaitable[None]] | None,
        settings: JobSettings,
    ) -> OrchestratorResult:
        orchestrator = Orchestrator(
            pools,
            max_concurrency=settings.max_concurrency,
            max_active_chains=settings.max_active_chains,
            max_failed_chains=settings.failure_budget,
            sinks=sinks,
            finish=finish,
        )
        return await orchestrator.run(specs)


async def open_executor(
    plan: JobPlan,
    stack: contextlib.AsyncExitStack,
    *,
    engines: Sequence[str],
    embedded_urls: Mapping[str, str],
    probe: bool,
    overridden: bool,
    started: list[Any] | None = None,
) -> ChainExecutor:
    """The job's executor, ready before the run directory is opened (a cluster that cannot be
    joined, or workers that cannot start, leave nothing written); closed with ``stack``.
    ``engines``: those with chains to run (none: nothing to start). ``started`` (optional)
    receives the Ray executor, whose ``worker_stats`` are filled when it closes."""
    settings = plan.settings.executor
    if settings.kind == "local" or not engines:
        return LocalExecutor()
    if overridden:
        raise ConfigError(
            "executor.kind ray opens every engine in its workers from the job's config; "
            "engine_overrides (replicas made in this process) need executor.kind local"
        )
    from presto_client.orchestration.executors.ray_executor import RayExecutor, RaySession

    session = await RaySession.connect(settings)
    stack.callback(session.close)
    executor = RayExecutor(session, settings)
    stack.push_async_callback(executor.close)
    if started is not None:
        started.append(executor)
    await executor.start(plan, engines, embedded_urls=embedded_urls, probe=probe)
    return executor
