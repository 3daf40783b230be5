"""One worker of the Ray executor: an asyncio orchestrator over engines of its own, in a Ray actor.

A plain class (Ray is imported by the driver only, which makes it an actor with ``ray.remote``):
it opens its own replicas of the job's engines (its own HTTP pools), probes them from its node,
and runs the chains it is handed under its share of the job's bounds
(:class:`~presto_client.orchestration.executors.shares.WorkerShare`). It writes nothing: each
finished chain goes back to the driver whole, as the orchestrator's own objects (the outcome and the
chain's rounds), so a chain of a worker that dies leaves no trace and is rerun elsewhere.
The failure budget is the driver's: a failed chain is reported like a finished one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from presto_client.core.stats import RoundRecord
from presto_client.orchestration.engines.opening import OpenedEngine, probe_engine
from presto_client.orchestration.engines.vocab_discovery import resolve_engine_vocab
from presto_client.orchestration.executors.orchestrator import (
    ChainOutcome,
    ChainSpec,
    EnginePool,
    Orchestrator,
)
from presto_client.orchestration.executors.shares import WorkerShare
from presto_client.orchestration.planned import PlannedEngine
from presto_client.orchestration.prompts.prompt_tokens import decode

logger = logging.getLogger(__name__)

NO_FAILURE_BUDGET = sys.maxsize
"""A worker never stops on failures itself: the job-wide budget is counted by the driver."""


@dataclass(frozen=True, slots=True)
class ChainReport:
    """A chain finished by a worker: its outcome and its rounds (record, queue_s, epoch time)."""

    outcome: ChainOutcome
    rounds: tuple[tuple[RoundRecord, float, float], ...]


class _Collector:
    """The worker's sink: keeps each chain's rounds until it finishes, then hands the chain to
    the queue of the ``run`` call it belongs to."""

    def __init__(self) -> None:
        self.rounds: dict[str, list[tuple[RoundRecord, float, float]]] = {}
        self.routes: dict[str, asyncio.Queue[ChainReport]] = {}

    def chain_started(self, spec: ChainSpec, replica: int) -> None:
        self.rounds[spec.chain_id] = []

    def round_done(self, spec: ChainSpec, record: RoundRecord, queue_s: float) -> None:
        self.rounds.setdefault(spec.chain_id, []).append((record, queue_s, time.time()))

    def chain_done(self, outcome: ChainOutcome) -> None:
        cid = outcome.spec.chain_id
        rounds = tuple(self.rounds.pop(cid, ()))
        self.routes.pop(cid).put_nowait(ChainReport(outcome, rounds))


class ChainWorker:
    """A Ray actor's body (see the module's docstring)."""

    def __init__(
        self,
        share: WorkerShare,
        engines: Mapping[str, PlannedEngine],
        embedded_urls: Mapping[str, str],
        probe: bool,
    ) -> None:
        self.share = share
        self.engines = dict(engines)
        self.embedded_urls = dict(embedded_urls)
        self.probe = probe
        self.stack = contextlib.AsyncExitStack()
        self.opened: dict[str, OpenedEngine] = {}
        self.collector = _Collector()
        self.orchestrator: Orchestrator | None = None
        self.chains = 0

    async def open(self) -> dict[str, Any]:
        """Open (and probe) the engines; returns where this worker runs."""
        share = self.share
        for name, e in self.engines.items():
            replicas = e.opener.open_replicas(self.embedded_urls)
            for r in replicas:
                self.stack.push_async_callback(r.aclose)
            handle = OpenedEngine.of(
                e, replicas, share.max_concurrency, capacity=share.budget_capacity[name]
            )
            handle.max_concurrency = share.engine_slots[name]
            if self.probe and e.probes:
                handle.probes = await probe_engine(handle)
            # Each worker asks its servers, as the driver does (the driver's answer is not
            # known yet when the workers open): every answer is checked in the worker.
            await resolve_engine_vocab(name, replicas)
            self.opened[name] = handle
        self.orchestrator = Orchestrator(
            {
                n: EnginePool(n, h.replicas, h.max_concurrency, h.budgets)
                for n, h in self.opened.items()
            },
            max_concurrency=share.max_concurrency,
            max_active_chains=share.max_active_chains,
            max_failed_chains=NO_FAILURE_BUDGET,
            sinks=[self.collector],
            finish=self._add_text,
        )
        return {"worker": share.index, "pid": os.getpid(), "node": socket.gethostname()}

    async def _add_text(self, outcome: ChainOutcome) -> None:
        handle = self.opened[outcome.spec.engine]
        if outcome.result is not None and handle.takes_text:
            outcome.text = await decode(handle.replicas[outcome.replica], outcome.result.token_ids)

    async def run(self, specs: Sequence[ChainSpec]) -> AsyncIterator[list[ChainReport]]:
        """Run ``specs``, yielding the chains as they finish (whatever finished since the last
        yield, in one list: one Ray object per batch rather than per chain)."""
        if self.orchestrator is None:
            raise RuntimeError("the worker is not open")
        queue: asyncio.Queue[ChainReport] = asyncio.Queue()
        for spec in specs:
            self.collector.routes[spec.chain_id] = queue
        task = asyncio.create_task(self.orchestrator.run(specs))
        left = len(specs)
        try:
            while left:
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    task.result()  # (an orchestrator that ended with chains left raises here)
                    if queue.empty():
                        raise RuntimeError(f"worker {self.share.index}: {left} chain(s) lost")
                    continue
                batch = [getter.result()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                left -= len(batch)
                self.chains += len(batch)
                yield batch
            await task
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def close(self) -> dict[str, Any]:
        """Close the engines; returns this process's resource use (CPU seconds, peak RSS)."""
        await self.stack.aclose()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "worker": self.share.index,
            "pid": os.getpid(),
            "node": socket.gethostname(),
            "chains": self.chains,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024,
        }
