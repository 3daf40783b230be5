"""Stopping a chain: cancellation (Ctrl-C, a job's failure budget) reaches every request in flight
at once, whatever the traversal, even a request that never answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens, ScoreRequest
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import SamplerConfig
from presto_client.errors import EngineRequestError
from presto_client.orchestration.executors.orchestrator import (
    ChainSpec,
    EnginePool,
    JobFailedError,
    Orchestrator,
)

TRAVERSALS = ("sequential", "bfs", "predictive", "crn", "stream", "sample")

STOP_WITHIN_S = 2.0
"""How long a cancelled chain may take to return (generous: a loaded machine)."""


class HangingEngine:
    """The reference engine, except that proposals (generated or streamed) never finish: a
    stalled server, or one whose stream sends only keepalives. The extension call of a block
    (the first generation) answers, so a chain gets into its transitions first.

    Counts requests open on the "server", so a test can check that cancelling released them.
    """

    def __init__(self) -> None:
        self.inner = ReferenceEngine(ReferenceModel(8, seed=1))
        self.name = "hanging"
        self.generations = 0
        self.open = 0
        self.proposals_started = asyncio.Event()

    async def _hang(self) -> None:
        self.open += 1
        self.proposals_started.set()
        try:
            await asyncio.Event().wait()  # never set
        finally:
            self.open -= 1

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        self.generations += 1
        if self.generations == 1:
            return await self.inner.generate(requests)
        await self._hang()
        raise AssertionError("unreachable")

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        await self._hang()
        yield ScoredTokens.empty(1, False)  # pragma: no cover (makes this an async generator)

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoredTokens]:
        return await self.inner.score(requests)

    async def aclose(self) -> None:
        return None


class HangingBaselineEngine(HangingEngine):
    """A baseline arm makes one generation call: that one hangs."""

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        await self._hang()
        raise AssertionError("unreachable")


@pytest.mark.parametrize("traversal", TRAVERSALS)
async def test_a_chain_whose_request_never_answers_is_cancelled_at_once(traversal: str) -> None:
    engine = HangingBaselineEngine() if traversal == "sample" else HangingEngine()
    config = SamplerConfig(block_size=8, steps_per_block=6)
    chain = asyncio.create_task(
        run_chain(engine, [1, 2], config, traversal=traversal, size=4, seed=3)
    )
    await asyncio.wait_for(engine.proposals_started.wait(), timeout=30)
    await asyncio.sleep(0.05)  # let a window or round fill up
    start = time.perf_counter()
    chain.cancel()
    done, _ = await asyncio.wait([chain], timeout=STOP_WITHIN_S)
    elapsed = time.perf_counter() - start
    if not done:  # (do not leave the test's loop hanging on it)
        chain.cancel()
    assert done, f"{traversal}: the chain did not stop within {STOP_WITHIN_S} s of cancel()"
    assert chain.cancelled(), "cancellation must propagate, never be swallowed"
    assert engine.open == 0, f"{engine.open} request(s) left open on the engine"
    assert elapsed < STOP_WITHIN_S


class FailingEngine(HangingEngine):
    """Every proposal fails with a non-retryable error, once ``after`` is set."""

    def __init__(self, after: asyncio.Event) -> None:
        super().__init__()
        self.name = "failing"
        self.after = after

    async def _fail(self) -> None:
        await self.after.wait()
        raise EngineRequestError("refused", engine=self.name)

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        self.generations += 1
        if self.generations == 1:
            return await self.inner.generate(requests)
        await self._fail()
        raise AssertionError("unreachable")

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        await self._fail()
        yield ScoredTokens.empty(1, False)  # pragma: no cover


async def test_the_failure_budget_stops_a_stream_chain_whose_head_never_answers() -> None:
    """One chain fails (budget 0) while the other's head proposal is in flight and never
    answers: the job stops at once, that proposal cancelled with it rather than waited for."""
    hanging = HangingEngine()
    failing = FailingEngine(after=hanging.proposals_started)
    config = SamplerConfig(block_size=8, steps_per_block=6)
    specs = [
        ChainSpec("hangs", "a", "hanging", "stream", config, 0, 0, 3, (1, 2), size=4),
        ChainSpec("fails", "a", "failing", "stream", config, 0, 1, 4, (1, 2), size=4),
    ]
    orchestrator = Orchestrator(
        {"hanging": EnginePool("hanging", [hanging]), "failing": EnginePool("failing", [failing])},
        max_failed_chains=0,
    )
    job = asyncio.create_task(orchestrator.run(specs))
    await asyncio.wait_for(hanging.proposals_started.wait(), timeout=30)
    start = time.perf_counter()
    done, _ = await asyncio.wait([job], timeout=STOP_WITHIN_S)
    if not done:
        job.cancel()
    assert done, f"the job did not stop within {STOP_WITHIN_S} s of a chain's failure"
    assert time.perf_counter() - start < STOP_WITHIN_S
    with pytest.raises(JobFailedError, match="refused"):
        job.result()
    assert hanging.open == 0, f"{hanging.open} request(s) left open on the engine"
