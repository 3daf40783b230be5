"""The service's one seam to the orchestration: open the config's first engine, run chains on it.

Everything else in :mod:`presto_client.serve` sees only :class:`ServedEngine` and
:class:`ChainBatch`. The engine is opened exactly as ``presto run`` opens it
(:func:`~presto_client.orchestration.engines.opening.open_engines`); every chain runs through
the orchestrator's chain step
(:class:`~presto_client.orchestration.executors.orchestrator.ChainStep`: a bounded view, the
replica's budget, the engine's shared draws, the config's predictor), all requests sharing
one per-engine and one global :class:`FifoSemaphore`. Chains of every request therefore share the
engine's slots and, since the opened engine hands each replica's budget to every chain on it,
its speculation budget.
Seeds are the job's: chain ``j`` of prompt ``i`` of a request with seed ``s`` gets
:func:`~presto_client.orchestration.planning.plan.chain_seed` ``(s, i, j)``, the seed ``presto run``
gives it with root seed ``s``, so the same prompt, seed and config give the same tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import hashlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from presto_client.concurrency import gather_or_fail
from presto_client.core.engine_protocol import (
    ChatTokenizing,
    ContextLimited,
    Detokenizing,
    Tokenizing,
)
from presto_client.core.predictor import CertaintyPredictor
from presto_client.core.runners import ChainResult
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.stats import RoundRecord
from presto_client.errors import ConfigError
from presto_client.orchestration.config.schema import JobConfig, SamplerSettings
from presto_client.orchestration.engines.eos_discovery import discover_eos_token_id
from presto_client.orchestration.engines.opening import (
    OpenedEngine,
    engine_identities,
    open_engines,
)
from presto_client.orchestration.engines.vocab_discovery import resolve_engine_vocab
from presto_client.orchestration.executors.orchestrator import (
    ChainStep,
    EnginePool,
    FifoSemaphore,
)
from presto_client.orchestration.planning.plan import chain_seed, make_plan
from presto_client.orchestration.prompts.prompt_tokens import decode, encode
from presto_client.urls import redact_text

logger = logging.getLogger(__name__)
T = TypeVar("T")

BlockCallback = Callable[[int, int, int], None]
"""``(prompt_index, chain_index, blocks_done)``: a chain has finished the MH steps of a block."""


@dataclass(frozen=True, slots=True)
class ChainBatch:
    """One request's chains, plain data: ``n`` chains on each prompt with one sampler."""

    prompts: tuple[tuple[int, ...], ...]
    sampler: SamplerConfig
    traversal: str
    size: int | None
    """The method's size: the window of ``stream``, the round size of a round method."""
    n: int
    seed: int

    def chain_seeds(self) -> list[tuple[int, int, int]]:
        """``(prompt_index, chain_index, seed)`` of every chain, in choice order."""
        return [
            (i, j, chain_seed(self.seed, i, j))
            for i in range(len(self.prompts))
            for j in range(self.n)
        ]


def route_key(chain_key: str) -> str:
    """What a served chain's requests tell a gateway: a digest of its key (nothing of the
    client's request in clear)."""
    return hashlib.sha256(f"presto-serve\n{chain_key}".encode()).hexdigest()[:32]


def sampler_for(settings: SamplerSettings, eos_token_id: int | None) -> SamplerConfig:
    """The core's sampler for ``settings`` on the served engine (its EOS, as ``presto run``)."""
    return settings.to_sampler_config(eos_token_id)


def chain_window(settings: SamplerSettings, traversal: str) -> int | None:
    """What ``presto run`` passes as the method's size: its round size, its window, or
    ``None`` for a method without one (the methods' registry says which)."""
    return settings.method_size(traversal)


HEALTH_TTL_S = 1.0
"""How long one check of the upstream's health answers ``/health``."""
LOST_AFTER_CHECKS = 2
"""Checks in a row that find the upstream unreachable before its running requests are failed."""


class ServedEngine:
    """The config's first engine, opened, with the bounds every request's chains share."""

    def __init__(self, cfg: JobConfig, handle: OpenedEngine, identity: Mapping[str, Any]) -> None:
        self.config = cfg
        self.handle = handle
        self.name = handle.name
        self.kind = handle.kind
        self.upstream_model: str | None = (
            str(identity["model"]) if identity.get("model") is not None else None
        )
        self.eos_token_id = handle.eos_token_id
        self.told_vocab_size: int | None = None
        """The vocabulary size set on the replicas at open (the server's, else the stated)."""
        # The opened engine owns a speculation budget per replica: every request's chains on a
        # replica share it, as a job's chains do.
        self.pool = EnginePool(
            handle.name, handle.replicas, handle.max_concurrency, tuple(handle.budgets)
        )
        self.engine_slots = FifoSemaphore(handle.max_concurrency)
        self.global_slots = FifoSemaphore(cfg.max_concurrency)
        self.step = ChainStep(self.pool, self.engine_slots, self.global_slots)
        self.predictor: CertaintyPredictor | None = None
        """The config's certainty predictor (``sampler.predictor``), as a job loads it."""
        self._health: asyncio.Future[str | None] | None = None
        self._health_at = 0.0
        self.last_health: tuple[str | None] | None = None
        """The last check's answer (read from another thread too: one tuple, replaced whole)."""

    @classmethod
    async def open(
        cls,
        cfg: JobConfig,
        stack: contextlib.AsyncExitStack,
        *,
        embedded_urls: Mapping[str, str] | None = None,
        probe: bool = True,
        replicas: Sequence[Any] | None = None,
    ) -> ServedEngine:
        """Open ``cfg``'s first engine (closed with ``stack``); ``replicas`` replaces it with
        ready-made engines (tests, Python callers), as ``engine_overrides`` does for a job."""
        first = cfg.engines[0]
        name = str(first.name)
        # The service plans the engine as a job does (plain data below the config) and opens
        # it the same way; it plans no chains: each request brings its own.
        plan = make_plan(cfg, ())
        if replicas is not None:
            handle = OpenedEngine.of(plan.engines[name], replicas, cfg.max_concurrency)
        else:
            opened = await open_engines(
                plan, stack, embedded_urls=embedded_urls, only=[name], probe=probe
            )
            handle = opened[name]
        identities = await engine_identities({name: handle})
        served = cls(cfg, handle, identities.get(name, {}))
        served.predictor = plan.predictor
        # As a job does: the server's vocabulary, so an answer's ids are checked against it
        # and a client's prompt ids outside it are the client's error (400), found at open.
        served.told_vocab_size = await resolve_engine_vocab(name, handle.replicas)
        if served.eos_token_id is None and cfg.sampler.stop_at_eos and handle.takes_text:
            # As a job does: the server's end-of-turn token, asked once before any request.
            served.eos_token_id, why = await discover_eos_token_id(handle.replicas[0])
            if served.eos_token_id is None:
                logger.warning(
                    "engine %s: no EOS token known (%s): answers run to max_tokens; set "
                    "engines[].eos_token_id to stop at the end of an answer",
                    name,
                    why,
                )
            else:
                logger.info(
                    "engine %s: EOS token %d, from its chat template", name, served.eos_token_id
                )
        return served

    # ---- what the engine can do

    @property
    def _replica(self) -> Any:
        return self.handle.replicas[0]

    @property
    def can_tokenize(self) -> bool:
        return isinstance(self._replica, Tokenizing)

    @property
    def can_tokenize_chat(self) -> bool:
        """Whether the engine renders a whole conversation through its chat template."""
        return isinstance(self._replica, ChatTokenizing)

    @property
    def can_detokenize(self) -> bool:
        return isinstance(self._replica, Detokenizing)

    @property
    def max_model_len(self) -> int | None:
        limits = [
            r.max_model_len
            for r in self.handle.replicas
            if isinstance(r, ContextLimited) and r.max_model_len
        ]
        return min(limits) if limits else None

    @property
    def in_flight(self) -> int:
        """Engine requests in flight now (all chains of all requests)."""
        return self.engine_slots.in_use

    @property
    def vocab_size(self) -> int | None:
        """The vocabulary size: the server's (asked at open), else the config's or the one
        the engine is known to have."""
        if self.told_vocab_size is not None:
            return self.told_vocab_size
        first = self.config.engines[0]
        known = first.known_vocab_size()
        if known is None:
            given = getattr(first, "vocab_size", None)
            known = int(given) if given is not None else None
        return known

    async def checked_health(self, *, fresh: bool = True) -> str | None:
        """:meth:`upstream_health`, checked at most once per :data:`HEALTH_TTL_S` whoever
        asks (/health needs no key and must not become a way to load the upstream; every
        running request watches it too, :meth:`unreachable`). ``fresh=False`` (/health)
        answers at once with the last check while the next one runs: a busy upstream's slow
        health route (up to its 2 s timeout) must not make this service's own answer slow, or
        a load balancer evicts a replica that is serving."""
        check = self.renew_health()
        if not fresh and self.last_health is not None:
            return self.last_health[0]
        return await asyncio.shield(check)

    def renew_health(self) -> asyncio.Future[str | None]:
        """The upstream's health check: a new one when the last is :data:`HEALTH_TTL_S` old."""
        now = time.monotonic()
        if self._health is None or (self._health.done() and now - self._health_at >= HEALTH_TTL_S):
            self._health_at = now
            self._health = asyncio.ensure_future(self.upstream_health())
            self._health.add_done_callback(self._remember_health)
        return self._health

    def _remember_health(self, check: asyncio.Future[str | None]) -> None:
        if not check.cancelled() and check.exception() is None:
            self.last_health = (check.result(),)

    async def unreachable(self) -> str:
        """Returns once the upstream has been unreachable for :data:`LOST_AFTER_CHECKS`
        checks in a row (a refused connection: its process is gone; a slow answer is not
        enough), with what is wrong: a running request then fails at once rather than ride
        out its restart window (a minute of backoff) against a dead port."""
        misses, problem = 0, None
        while misses < LOST_AFTER_CHECKS:
            await asyncio.sleep(HEALTH_TTL_S)
            problem = await self.checked_health()
            misses = misses + 1 if problem is not None and "unreachable" in problem else 0
        return str(problem)

    async def upstream_health(self, timeout_s: float = 2.0) -> str | None:
        """``None`` when every replica's server answers its health route with 200 (or the
        engine is in-process); otherwise what is wrong, without the server's address."""
        for index, replica in enumerate(self.handle.replicas):
            transport = getattr(replica, "transport", None)
            adapter = getattr(replica, "adapter", None)
            path = getattr(getattr(adapter, "traits", None), "health_path", None)
            if transport is None or not isinstance(path, str):
                continue
            try:
                async with asyncio.timeout(timeout_s):
                    status = await transport.get_status(path)
            except TimeoutError:
                return f"replica {index}: no health answer within {timeout_s:g} s"
            except Exception as exc:  # unreachable: its error names the address, not sent
                logger.info("health of %s replica %d: %s", self.name, index, redact_text(str(exc)))
                return f"replica {index}: unreachable"
            if status != 200:
                return f"replica {index}: its health route answered HTTP {status}"
        return None

    async def tokenize(
        self, text: str, *, chat: bool, system_prompt: str | None
    ) -> tuple[int, ...]:
        return await encode(self._replica, text, chat_template=chat, system_prompt=system_prompt)

    async def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> tuple[int, ...]:
        replica = self._replica
        if not isinstance(replica, ChatTokenizing):
            raise ConfigError(f"engine {self.name} cannot apply a chat template to messages")
        return tuple(int(t) for t in await replica.tokenize_messages(messages))

    async def detokenize(self, token_ids: Sequence[int]) -> str | None:
        return await decode(self._replica, token_ids)

    # ---- running chains

    async def run(
        self, batch: ChainBatch, on_block: BlockCallback | None = None
    ) -> list[ChainResult]:
        """Every chain of ``batch`` concurrently, results in choice order.

        A failed chain cancels the others and its error is raised; cancelling the caller
        cancels every chain (their engine requests are aborted by the engine's own cancellation).
        """
        return await gather_or_fail(
            [self._one(batch, i, j, seed, on_block) for i, j, seed in batch.chain_seeds()]
        )

    async def _one(
        self, batch: ChainBatch, i: int, j: int, seed: int, on_block: BlockCallback | None
    ) -> ChainResult:
        # The chain's key: its request's seed and its place in it (a resent request with the
        # same seed goes back to the replica holding its prefixes).
        key = f"{seed}/p{i}/c{j}"
        # (no warm-up: a request runs one traversal, and warming levels the arms of a job)
        placed = self.step.place(key, route_key(key))

        def on_round(record: RoundRecord) -> None:
            # A block's extension opens it: the one before has had all of its MH steps.
            if on_block is not None and record.kind == "extend" and record.block > 0:
                on_block(i, j, record.block)

        result = await self.step.run(
            placed,
            batch.prompts[i],
            batch.sampler,
            traversal=batch.traversal,
            size=batch.size,
            seed=seed,
            on_round=on_round,
            predictor=self.predictor,
        )
        if on_block is not None:
            on_block(i, j, batch.sampler.num_blocks)
        return result


class EngineThread:
    """A :class:`ServedEngine` on an event loop of its own, in a thread of its own: the chains'
    work (streamed tokens parsed, the MH walks) runs there, and the service's loop answers
    ``/health``, admits, refuses and streams while that thread is saturated (the interpreter
    hands the service's thread a turn every switch interval, 5 ms, however busy the other is).
    Its async methods run there and are awaited here, a cancellation here cancelling them
    there; its plain attributes (names, flags, counters) are read through."""

    SWITCH_INTERVAL_S = 0.001
    """How long the chains' thread may hold the interpreter while the service's thread waits
    for it (Python's default: 5 ms a hand-over, a few per /health answer). Measured alone it
    made no clear difference (p99 103 ms at 5 ms, 95 ms at 1 ms, both before the collector's
    passes were made rarer); kept as the bound on each hand-over."""

    FULL_COLLECTION_EVERY = 30
    """Passes of the collector's middle generation between two full ones (Python's: 10)."""

    def __init__(self) -> None:
        sys.setswitchinterval(min(sys.getswitchinterval(), self.SWITCH_INTERVAL_S))
        self.engine: ServedEngine | None = None
        self.loop = asyncio.new_event_loop()
        self._stack = contextlib.AsyncExitStack()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="presto-serve-chains", daemon=True
        )
        self._thread.start()

    @classmethod
    async def open(cls, cfg: JobConfig, **kwargs: Any) -> EngineThread:
        """:meth:`ServedEngine.open` (its keyword arguments) on the thread's loop."""
        self = cls()
        try:
            self.engine = await self._there(ServedEngine.open(cfg, self._stack, **kwargs))
            # (a first check: /health answers from the last one, never waiting for the thread)
            await self._there(self.engine.checked_health())
        except BaseException:
            await self.aclose()
            raise
        # The collector's full passes hold every thread: over the chains of a loaded service
        # one took 100-500 ms, the tail of /health's latency (p99 45-114 ms at the defaults'
        # bounds). What is loaded by now lives as long as the service (out of those passes),
        # and a full pass is considered every 30 passes of the middle generation rather than
        # every 10 (p99 9 ms; at 100 the memory after each burst grew 202, 220, 248 MB, at 30
        # 200, 206, 216); one runs whenever the service goes idle (return_memory).
        gc.freeze()
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, self.FULL_COLLECTION_EVERY)
        return self

    async def aclose(self) -> None:
        try:
            await self._there(self._stack.aclose())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            await asyncio.to_thread(self._thread.join, 10.0)
            if not self._thread.is_alive():
                self.loop.close()

    def return_memory(self) -> None:
        """Once no request runs: a full collection and the C allocator's free pages handed back
        to the system (glibc's ``malloc_trim``), on the thread's loop. Without it the memory a
        burst of chains took stayed taken (107 MB idle, 195 MB after a 15 s burst)."""
        self.loop.call_soon_threadsafe(_return_memory)

    async def _there(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` run on the thread's loop, awaited here. Cancelled here, it is cancelled
        there and waited for: a request's slot is free once its chains have ended (their
        upstream requests aborted), not when they were told to."""
        here = asyncio.get_running_loop()
        outcome: asyncio.Future[T] = here.create_future()
        task: list[asyncio.Task[T]] = []

        def start() -> None:  # (on the thread's loop)
            task.append(self.loop.create_task(work))
            task[0].add_done_callback(
                lambda done: here.call_soon_threadsafe(_settle, outcome, done)
            )

        self.loop.call_soon_threadsafe(start)
        try:
            return await asyncio.shield(outcome)
        except asyncio.CancelledError:
            self.loop.call_soon_threadsafe(lambda: task[0].cancel())  # (after start: in order)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await outcome
            raise

    def __getattr__(self, name: str) -> Any:  # (the engine's plain attributes, read through)
        if name == "engine" or self.engine is None:
            raise AttributeError(name)
        return getattr(self.engine, name)

    @property
    def served(self) -> ServedEngine:
        assert self.engine is not None, "the engine is not open"
        return self.engine

    async def run(
        self, batch: ChainBatch, on_block: BlockCallback | None = None
    ) -> list[ChainResult]:
        here = asyncio.get_running_loop()

        def relay(i: int, j: int, blocks: int) -> None:  # (a block's end, told on this loop)
            assert on_block is not None
            here.call_soon_threadsafe(on_block, i, j, blocks)

        return await self._there(self.served.run(batch, relay if on_block else None))

    async def checked_health(self, *, fresh: bool = True) -> str | None:
        last = self.served.last_health
        if not fresh and last is not None:
            # (read here: the thread's loop may be a full iteration of chain work away; the
            # next check is started there, unwaited)
            self.loop.call_soon_threadsafe(self.served.renew_health)
            return last[0]
        return await self._there(self.served.checked_health(fresh=fresh))

    async def unreachable(self) -> str:
        """:meth:`ServedEngine.unreachable`, watched from here: each running request reads
        the checks the thread makes (one a :data:`HEALTH_TTL_S`, started from here), no task
        of its own there (a request's hops to the thread cost it 2 ms)."""
        misses, problem = 0, None
        while misses < LOST_AFTER_CHECKS:
            self.loop.call_soon_threadsafe(self.served.renew_health)
            await asyncio.sleep(HEALTH_TTL_S)
            last = self.served.last_health
            problem = last[0] if last is not None else None
            misses = misses + 1 if problem is not None and "unreachable" in problem else 0
        return str(problem)

    async def tokenize(
        self, text: str, *, chat: bool, system_prompt: str | None
    ) -> tuple[int, ...]:
        return await self._there(self.served.tokenize(text, chat=chat, system_prompt=system_prompt))

    async def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> tuple[int, ...]:
        return await self._there(self.served.tokenize_messages(messages))

    async def detokenize(self, token_ids: Sequence[int]) -> str | None:
        return await self._there(self.served.detokenize(token_ids))


def _settle(outcome: asyncio.Future[T], done: asyncio.Task[T]) -> None:
    """``outcome`` (here) as ``done`` (a task of the engine's thread) ended."""
    if outcome.done():
        return
    if done.cancelled():
        outcome.cancel()
    elif (error := done.exception()) is not None:
        outcome.set_exception(error)
    else:
        outcome.set_result(done.result())


def _return_memory() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # (glibc only)
        ctypes.CDLL("libc.so.6").malloc_trim(0)


ServingEngine = ServedEngine | EngineThread
"""What the service's handlers hold: the engine, on their loop or on a thread of its own."""


def first_engine_config(cfg: JobConfig) -> Any:
    if not cfg.engines:
        raise ConfigError("the config names no engine to serve")
    return cfg.engines[0]
