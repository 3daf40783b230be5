"""The orchestrator: many chains over many engines, with bounded in-flight requests.

Chains run as asyncio tasks pulled in plan order from one queue by at most
``max_active_chains`` workers: each chain's rounds are sequential, all chains are interleaved.
Every engine call goes through a :class:`LimitedEngine`, one chain's view of an engine that
splits a batch into per-request calls, each holding a slot of its engine's semaphore and of the
global one (first-come first-served :class:`FifoSemaphore`, so no chain starves). There are never
more requests in flight than configured, per engine or in all.

A chain sticks to one replica of its engine (a stable hash of its replica key), so that the
replica's prefix cache serves it. A chain whose engine call fails is recorded as failed (with the
error) and the others go on; when more chains than the failure budget have failed, the job stops
with :class:`JobFailedError`. Cancellation (Ctrl-C) stops every chain, lets the sinks keep what
finished, and is re-raised: it is never swallowed.

This layer knows no serving dialect: it sees engines only through
:class:`~presto_client.core.engine_protocol.Engine`. What to persist is up to the
:class:`ChainSink`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from presto_client import defaults
from presto_client.concurrency import gather_or_fail
from presto_client.core.chain_runner import ChainResult
from presto_client.core.engine_protocol import (
    Engine,
    ProposalRequest,
    Routable,
    ScoredTokens,
    ScoreRequest,
)
from presto_client.core.kernels import make_kernel
from presto_client.core.predictor import CertaintyPredictor
from presto_client.core.runners import run_chain
from presto_client.core.settings import ROUND_SIZE, SamplerConfig
from presto_client.core.shared_draws import SharedDraws
from presto_client.core.speculation import SpeculationBudget
from presto_client.core.stats import RoundRecord
from presto_client.errors import PrestoError
from presto_client.urls import redact_text

logger = logging.getLogger(__name__)

T = TypeVar("T")


class JobFailedError(PrestoError):
    """More chains failed than the failure budget allows; the job was stopped."""


# --------------------------------------------------------------------------------------------
# Concurrency bounds
# --------------------------------------------------------------------------------------------


class FifoSemaphore:
    """A semaphore that hands slots to waiters strictly in arrival order.

    A released slot goes straight to the oldest waiter, so a task that keeps re-acquiring cannot
    overtake one that has been waiting (asyncio's own semaphore gives no such guarantee across
    Python versions). Cancellation while waiting never leaks a slot.
    """

    def __init__(self, value: int) -> None:
        if value < 1:
            raise ValueError("a semaphore needs at least one slot")
        self.capacity = value
        self._free = value
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def in_use(self) -> int:
        return self.capacity - self._free

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def _has_waiters(self) -> bool:
        """Whether a live waiter is queued; O(1) amortised (``waiting`` counts them, O(n)):
        finished futures at the head are dropped as they are met."""
        waiters = self._waiters
        while waiters and waiters[0].done():
            waiters.popleft()
        return bool(waiters)

    async def acquire(self) -> None:
        if self._free > 0 and not self._has_waiters():
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot was handed over just as we were cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            raise

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # hand the slot over directly
                return
        if self._free >= self.capacity:
            raise RuntimeError("FifoSemaphore released more often than acquired")
        self._free += 1

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class Limits:
    """The global bound and one bound per engine name."""

    def __init__(self, max_concurrency: int, per_engine: Mapping[str, int]) -> None:
        self.global_slots = FifoSemaphore(max_concurrency)
        self.engine_slots = {name: FifoSemaphore(n) for name, n in per_engine.items()}

    def for_engine(self, name: str) -> FifoSemaphore:
        return self.engine_slots[name]


class LimitedEngine:
    """One chain's view of an engine: every request of a batch is its own call under the bounds.

    The engine slot is taken before the global one (so a request waiting for a busy engine
    holds no global slot). ``queue_s`` adds up, per batch, how long its last request waited for
    its slots: time spent queueing rather than being served.
    """

    def __init__(self, inner: Engine, engine_slots: FifoSemaphore, global_slots: FifoSemaphore):
        self.inner = inner
        self.name = inner.name
        self.max_concurrency = min(engine_slots.capacity, global_slots.capacity)
        self._engine_slots = engine_slots
        self._global_slots = global_slots
        self.queue_s = 0.0
        self.requests = 0

    async def _slotted(self, call: Callable[[], Awaitable[T]]) -> tuple[T, float]:
        start = time.perf_counter()
        async with self._engine_slots, self._global_slots:
            waited = time.perf_counter() - start
            self.requests += 1
            return await call(), waited

    async def _split(
        self,
        fn: Callable[[Sequence[Any]], Awaitable[list[ScoredTokens]]],
        requests: Sequence[Any],
    ) -> list[ScoredTokens]:
        async def one(request: Any) -> tuple[ScoredTokens, float]:
            async def call() -> ScoredTokens:
                out = await fn([request])
                if len(out) != 1:
                    raise PrestoError(
                        f"[{self.name}] engine returned {len(out)} results for one request"
                    )
                return out[0]

            return await self._slotted(call)

        results = await gather_or_fail([one(r) for r in requests])
        if results:
            self.queue_s += max(w for _, w in results)
        return [r for r, _ in results]

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        return await self._split(self.inner.generate, requests)

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoredTokens]:
        return await self._split(self.inner.score, requests)

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        async with self._engine_slots, self._global_slots:
            self.requests += 1
            iterator = self.inner.stream(request)
            try:
                async for part in iterator:
                    yield part
            finally:
                aclose = getattr(iterator, "aclose", None)
                if aclose is not None:
                    await aclose()

    async def aclose(self) -> None:
        """A view owns nothing: the engine itself is closed by whoever opened it."""
        return None


# --------------------------------------------------------------------------------------------
# Chains
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EnginePool:
    """An engine (one or more replicas), its bound on in-flight requests, and the speculation
    budget of each replica (shared by the chains on it: one server, one cost curve).

    ``budgets`` come from whoever opened the engine
    (:class:`~presto_client.orchestration.engines.opening.OpenedEngine`); left empty, the
    orchestrator makes one per replica, sized from the bounds.
    """

    name: str
    replicas: Sequence[Engine]
    max_concurrency: int = defaults.ENGINE_MAX_CONCURRENCY
    budgets: Sequence[SpeculationBudget] = ()

    def __post_init__(self) -> None:
        if self.budgets and len(self.budgets) != len(self.replicas):
            raise ValueError(
                f"engine {self.name}: {len(self.budgets)} budget(s) for "
                f"{len(self.replicas)} replica(s)"
            )

    def replica_for(self, key: str) -> int:
        """A stable replica index for ``key`` (the same in every process and session)."""
        return zlib.crc32(key.encode()) % len(self.replicas)

    def chain_engine(self, replica_key: str, route_key: str) -> tuple[int, Engine]:
        """Where one chain runs: its replica (by ``replica_key``) and that replica's view for
        it, whose every request carries ``route_key`` to a gateway in front of the replicas
        (an engine with a ``routing_key_header``), so the gateway keeps the chain's prefixes
        on one server. Every face takes a chain's engine here (``presto run``'s orchestrator,
        ``presto serve``), so no face sends a chain unrouted."""
        replica = self.replica_for(replica_key)
        engine = self.replicas[replica]
        if isinstance(engine, Routable):
            engine = engine.routed(route_key)
        return replica, engine


@dataclass(frozen=True, slots=True)
class ChainSpec:
    """One chain to run: where, what, with which seed."""

    chain_id: str
    arm: str
    engine: str
    traversal: str
    sampler: SamplerConfig
    prompt_index: int
    chain_index: int
    seed: int
    prompt_ids: tuple[int, ...]
    size: int | None = ROUND_SIZE
    """The method's size (its round size, window or samples); ``None`` for a method without one."""
    predictor: CertaintyPredictor | None = None
    """The predictive traversal's certainty predictor; ``None``: the paper's."""
    replica_key: str = ""
    """Chains with the same key use the same replica (default: the chain id)."""
    routing_key: str = ""
    """What the chain's requests tell a gateway in front of the replicas (an engine with a
    ``routing_key_header`` sends it; default: the replica key)."""
    warm_prompt: bool = False
    """Prefill the prompt on the chain's replica (one 1-token request, outside the chain's
    timings) before the first chain of its replica key runs. Set for jobs of several arms: the
    arms of a (prompt, chain) share the engine's prefix cache, so without it the arm run first
    pays the prompt's prefill for the others, and its speedup is skewed by the run order."""

    @property
    def route_key(self) -> str:
        """The key the chain's requests are routed by (its routing key, replica key or id)."""
        return self.routing_key or self.replica_key or self.chain_id


@dataclass(slots=True)
class ChainOutcome:
    spec: ChainSpec
    replica: int
    result: ChainResult | None = None
    error: str | None = None
    wall_s: float = 0.0
    queue_s: float = 0.0
    text: str | None = None
    """The response as text, when a ``finish`` hook could detokenize it."""
    alternative_texts: list[str | None] | None = None
    """The result's alternatives as text (``majority_vote``), when they could be detokenized."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.result is not None


class ChainSink(Protocol):
    """Where the orchestrator reports work as it completes (run directory, progress bar)."""

    def chain_started(self, spec: ChainSpec, replica: int) -> None: ...

    def round_done(self, spec: ChainSpec, record: RoundRecord, queue_s: float) -> None: ...

    def chain_done(self, outcome: ChainOutcome) -> None: ...


@runtime_checkable
class TimedRoundSink(Protocol):
    """A sink that records when a round happened; a round reported after the fact (a Ray
    worker's) is recorded at the time it ran, not when it arrived."""

    def round_done_at(
        self, spec: ChainSpec, record: RoundRecord, queue_s: float, at: float
    ) -> None: ...


def replay_chain(
    sinks: Sequence[ChainSink],
    outcome: ChainOutcome,
    rounds: Sequence[tuple[RoundRecord, float, float]],
) -> None:
    """Report a chain that ran elsewhere to ``sinks``: started, its rounds (record, queue_s,
    the epoch time it ran), done."""
    spec = outcome.spec
    for sink in sinks:
        sink.chain_started(spec, outcome.replica)
    for record, queue_s, at in rounds:
        for sink in sinks:
            if isinstance(sink, TimedRoundSink):
                sink.round_done_at(spec, record, queue_s, at)
            else:
                sink.round_done(spec, record, queue_s)
    for sink in sinks:
        sink.chain_done(outcome)


RunChain = Callable[..., Awaitable[ChainResult]]
"""``run_chain``'s signature: (engine, prompt_ids, sampler, *, traversal, size, seed, on_round,
predictor, budget, draws)."""


@dataclass(slots=True)
class OrchestratorResult:
    completed: list[ChainOutcome] = field(default_factory=list)
    failed: list[ChainOutcome] = field(default_factory=list)


def failure_budget_error(failed: int, budget: int, last: ChainOutcome) -> JobFailedError:
    """The job's stop when ``failed`` chains exceed the failure budget (``last`` failed last)."""
    return JobFailedError(
        f"{failed} chain(s) failed, more than the failure budget of {budget} "
        f"(max_failed_chains); the job was stopped. Last error ({last.spec.chain_id}): "
        f"{last.error}"
    )


def _describe_error(exc: BaseException) -> str:
    text = redact_text(str(exc) or repr(exc))
    return text if isinstance(exc, PrestoError) else f"{type(exc).__name__}: {text}"


@dataclass(frozen=True, slots=True)
class PlacedChain:
    """A chain's place: its replica, that replica routed for it, and its bounded view."""

    replica: int
    route_key: str
    engine: Engine
    view: LimitedEngine


class ChainStep:
    """One chain on one engine, the one way every face runs a chain (``presto run``'s
    orchestrator, local or on a Ray worker, and ``presto serve``): its replica and route
    (:meth:`place`), its prompt's warm-up, the bounded view, the replica's speculation budget
    (the pool's, else one built here: the one fallback), the engine's shared draws and the
    method's runner (:meth:`run`)."""

    def __init__(
        self,
        pool: EnginePool,
        engine_slots: FifoSemaphore,
        global_slots: FifoSemaphore,
        runner: RunChain = run_chain,
    ) -> None:
        self.pool = pool
        self.engine_slots = engine_slots
        self.global_slots = global_slots
        self.runner = runner
        self.budgets = list(pool.budgets) or SpeculationBudget.per_replica(
            len(pool.replicas), min(engine_slots.capacity, global_slots.capacity)
        )
        self.draws = SharedDraws()
        self._warm_locks: dict[tuple[int, str], asyncio.Lock] = {}
        self._warmed: set[tuple[int, str]] = set()

    def place(self, replica_key: str, route_key: str) -> PlacedChain:
        replica, engine = self.pool.chain_engine(replica_key, route_key)
        return PlacedChain(
            replica, route_key, engine, LimitedEngine(engine, self.engine_slots, self.global_slots)
        )

    async def run(
        self,
        placed: PlacedChain,
        prompt_ids: Sequence[int],
        sampler: SamplerConfig,
        *,
        traversal: str,
        size: int | None,
        seed: int,
        on_round: Callable[[RoundRecord], None] | None = None,
        predictor: CertaintyPredictor | None = None,
    ) -> ChainResult:
        """The chain run on its place."""
        return await self.runner(
            placed.view,
            prompt_ids,
            sampler,
            traversal=traversal,
            size=size,
            seed=seed,
            on_round=on_round,
            predictor=predictor,
            budget=self.budgets[placed.replica],
            draws=self.draws,
        )

    async def warm(
        self, placed: PlacedChain, prompt_ids: Sequence[int], sampler: SamplerConfig, seed: int
    ) -> None:
        """The chain's prompt prefilled on its place, once per replica and route, before the
        chain and outside its timings (:attr:`ChainSpec.warm_prompt`). A failed warm-up is only
        logged: the chain makes the same request next and reports what is wrong itself."""
        key = (placed.replica, placed.route_key)
        if key in self._warmed:
            return
        async with self._warm_locks.setdefault(key, asyncio.Lock()):
            if key in self._warmed:
                return
            # A view of its own: the chain's view counts the chain's requests and queueing.
            view = LimitedEngine(placed.engine, self.engine_slots, self.global_slots)
            extension = make_kernel(sampler).extension_request(tuple(prompt_ids), seed)
            try:
                await view.generate([dataclasses.replace(extension, num_tokens=1)])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.debug("warming a prompt on replica %d failed: %s", placed.replica, exc)
            self._warmed.add(key)
            del self._warm_locks[key]


class Orchestrator:
    """Runs chains concurrently under the bounds, reporting to sinks as work completes."""

    def __init__(
        self,
        pools: Mapping[str, EnginePool],
        *,
        max_concurrency: int = defaults.JOB_MAX_CONCURRENCY,
        max_active_chains: int | None = None,
        max_failed_chains: int = 0,
        sinks: Sequence[ChainSink] = (),
        runner: RunChain = run_chain,
        finish: Callable[[ChainOutcome], Awaitable[None]] | None = None,
    ) -> None:
        if not pools:
            raise ValueError("the orchestrator needs at least one engine")
        self.pools = dict(pools)
        self.limits = Limits(max_concurrency, {n: p.max_concurrency for n, p in pools.items()})
        self.steps = {
            n: ChainStep(p, self.limits.for_engine(n), self.limits.global_slots, runner)
            for n, p in pools.items()
        }
        self.budgets = {n: step.budgets for n, step in self.steps.items()}
        self.max_concurrency = max_concurrency
        self.max_active_chains = max_active_chains
        self.max_failed_chains = max_failed_chains
        self.sinks = list(sinks)
        self.runner = runner
        self.finish = finish
        self.result = OrchestratorResult()
        self._fatal: JobFailedError | None = None
        self._tripped: ChainOutcome | None = None
        """The failed chain that exceeded the failure budget (its error is the one shown)."""

    async def _run_one(self, spec: ChainSpec) -> ChainOutcome:
        step = self.steps[spec.engine]
        placed = step.place(spec.replica_key or spec.chain_id, spec.route_key)
        if spec.warm_prompt:
            await step.warm(placed, spec.prompt_ids, spec.sampler, spec.seed)
        replica, view = placed.replica, placed.view
        outcome = ChainOutcome(spec, replica)
        for sink in self.sinks:
            sink.chain_started(spec, replica)
        last_queue = 0.0
        sink_error: list[Exception] = []

        def on_round(record: RoundRecord) -> None:
            nonlocal last_queue
            queued, last_queue = view.queue_s - last_queue, view.queue_s
            try:
                for sink in self.sinks:
                    sink.round_done(spec, record, queued)
            except Exception as exc:
                sink_error.append(exc)
                raise

        start = time.perf_counter()
        try:
            outcome.result = await step.run(
                placed,
                spec.prompt_ids,
                spec.sampler,
                traversal=spec.traversal,
                size=spec.size,
                seed=spec.seed,
                on_round=on_round,
                predictor=spec.predictor,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if sink_error:
                # a sink could not keep the round (the disk is full): the job stops; it is
                # not the chain's failure
                raise sink_error[0] from None
            outcome.error = _describe_error(exc)
            logger.warning("chain %s failed: %s", spec.chain_id, outcome.error)
            logger.debug("chain %s traceback", spec.chain_id, exc_info=True)
        outcome.wall_s = time.perf_counter() - start
        outcome.queue_s = view.queue_s
        if outcome.ok and self.finish is not None:
            try:
                await self.finish(outcome)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a finishing touch never fails a finished chain
                logger.warning("chain %s: finishing step failed: %s", spec.chain_id, exc)
        return outcome

    async def _worker(self, queue: deque[ChainSpec]) -> None:
        while queue:
            spec = queue.popleft()
            outcome = await self._run_one(spec)
            for sink in self.sinks:
                sink.chain_done(outcome)
            if outcome.ok:
                self.result.completed.append(outcome)
                continue
            self.result.failed.append(outcome)
            if self._fatal is not None:
                return  # the job is stopping already
            if len(self.result.failed) > self.max_failed_chains:
                queue.clear()
                self._tripped = outcome
                self._fatal = failure_budget_error(
                    len(self.result.failed), self.max_failed_chains, outcome
                )
                raise self._fatal

    async def run(self, chains: Sequence[ChainSpec]) -> OrchestratorResult:
        """Run ``chains`` (in order of start); returns what completed and what failed.

        Raises :class:`JobFailedError` when the failure budget is exceeded (other chains are
        cancelled first) and re-raises cancellation after cancelling every chain.
        """
        for spec in chains:
            if spec.engine not in self.pools:
                raise ValueError(f"chain {spec.chain_id} names unknown engine {spec.engine!r}")
        queue = deque(chains)
        active = self.max_active_chains or self.max_concurrency
        workers = [
            asyncio.create_task(self._worker(queue), name=f"presto-worker-{i}")
            for i in range(max(1, min(active, len(chains))))
        ]
        if not workers:
            return self.result
        try:
            done, _ = await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        errors = [w.exception() for w in done if not w.cancelled() and w.exception()]
        if errors:
            queue.clear()
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            if self._fatal is not None and self._tripped is not None:
                # (counted once every chain stopped: as many as the failed rows written)
                self._fatal = failure_budget_error(
                    len(self.result.failed), self.max_failed_chains, self._tripped
                )
            raise self._fatal or errors[0]  # type: ignore[misc]
        return self.result
