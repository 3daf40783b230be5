"""The Ray executor's driver loop against stand-in actors (no Ray): each chain kept once, a dead
worker's unfinished chains dealt to the others, the failure budget counted over all workers."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path
from typing import Any

import pytest
from orch_helpers import make_config
from test_orchestrator import MemorySink, specs

from presto_client.core.stats import RoundRecord
from presto_client.errors import EngineUnavailableError
from presto_client.orchestration.executors.orchestrator import (
    ChainOutcome,
    ChainSpec,
    JobFailedError,
)
from presto_client.orchestration.executors.ray_executor import RayExecutor, RaySession
from presto_client.orchestration.executors.ray_worker import ChainReport
from presto_client.orchestration.planned import ExecutorSettings, JobSettings
from presto_client.orchestration.planning.plan import make_plan
from presto_client.orchestration.prompts.prompt_rows import load_prompts


class ActorDied(Exception):
    """Stands in for ``ray.exceptions.RayActorError``."""


class FakeRay:
    class exceptions:
        RayActorError = ActorDied


def _report(spec: ChainSpec, *, error: str | None = None) -> ChainReport:
    from presto_client.core.chain_runner import ChainResult
    from presto_client.core.stats import ChainStats

    result = None
    if error is None:
        result = ChainResult(spec.prompt_ids, (1, 2), (1, 2), None, ChainStats(), [])  # type: ignore[arg-type]
    record = RoundRecord(0, 0, "propose", 1, 1, 1, 1, 1, 0.0, 2)  # type: ignore[arg-type]
    return ChainReport(ChainOutcome(spec, 0, result, error), ((record, 0.0, 0.0),))


class FakeActor:
    """Runs its chunks by reporting each chain; dies after ``dies_after`` chains, reports
    ``twice`` chains twice, fails the chains of ``failing``."""

    def __init__(
        self, dies_after: int | None = None, twice: bool = False, failing: bool = False
    ) -> None:
        self.dies_after = dies_after
        self.twice = twice
        self.failing = failing
        self.ran: list[str] = []
        self.run = self

    def remote(self, chunk: Sequence[ChainSpec]) -> AsyncIterator[Awaitable[list[ChainReport]]]:
        return self._stream(list(chunk))

    async def _stream(self, chunk: list[ChainSpec]) -> AsyncIterator[Awaitable[list[ChainReport]]]:
        for spec in chunk:
            await asyncio.sleep(0)
            if self.dies_after is not None and len(self.ran) >= self.dies_after:
                raise ActorDied("the actor died unexpectedly")
            self.ran.append(spec.chain_id)
            reports = [_report(spec, error="boom" if self.failing else None)]
            if self.twice:
                reports.append(reports[0])
            yield _ready(reports)


async def _ready(value: list[ChainReport]) -> list[ChainReport]:
    return value


def _settings(tmp_path: Path, failure_budget: int = 100) -> JobSettings:
    cfg = make_config(tmp_path)
    return dataclasses.replace(
        make_plan(cfg, load_prompts(cfg)).settings, failure_budget=failure_budget
    )


def _executor(actors: dict[int, FakeActor]) -> RayExecutor:
    executor = RayExecutor(RaySession(FakeRay, started=False), ExecutorSettings(kind="ray"))
    executor.actors = dict(actors)
    return executor


async def _run(executor: RayExecutor, chains: list[ChainSpec], settings: JobSettings) -> Any:
    sink = MemorySink()
    result = await executor.run(chains, pools={}, sinks=[sink], finish=None, settings=settings)
    return result, sink


async def test_chains_are_dealt_round_robin_and_each_reported_once(tmp_path: Path) -> None:
    chains = specs("e")
    actors = {0: FakeActor(), 1: FakeActor(twice=True)}
    result, sink = await _run(_executor(actors), chains, _settings(tmp_path))
    assert actors[0].ran == [c.chain_id for c in chains[0::2]]
    assert actors[1].ran == [c.chain_id for c in chains[1::2]]
    done = [o.spec.chain_id for o in sink.done]
    assert sorted(done) == sorted(c.chain_id for c in chains)  # the twice-reported kept once
    assert len(result.completed) == len(chains)
    assert len(sink.rounds) == len(chains)


async def test_a_dead_workers_unfinished_chains_go_to_the_others(tmp_path: Path) -> None:
    chains = specs("e")  # 16 chains: 8 each
    actors = {0: FakeActor(dies_after=3), 1: FakeActor(), 2: FakeActor()}
    result, sink = await _run(_executor(actors), chains, _settings(tmp_path))
    done = [o.spec.chain_id for o in sink.done]
    assert len(done) == len(set(done)) == len(chains)
    assert len(result.completed) == len(chains)
    mine = [c.chain_id for c in chains[0::3]]
    assert actors[0].ran == mine[:3]
    left = mine[3:]
    # in plan order, round robin over the workers left
    assert actors[1].ran[-len(left[0::2]) :] == left[0::2]
    assert actors[2].ran[-len(left[1::2]) :] == left[1::2]


async def test_every_worker_dead_is_an_error_not_a_hang(tmp_path: Path) -> None:
    actors = {0: FakeActor(dies_after=1), 1: FakeActor(dies_after=1)}
    with pytest.raises(EngineUnavailableError, match="every Ray worker died"):
        await _run(_executor(actors), specs("e"), _settings(tmp_path))


async def test_the_failure_budget_is_the_jobs_over_every_worker(tmp_path: Path) -> None:
    """Each worker fails its 3 chains: neither alone exceeds a budget of 3, both together do."""
    actors = {0: FakeActor(failing=True), 1: FakeActor(failing=True)}
    with pytest.raises(
        JobFailedError, match=r"4 chain\(s\) failed, more than the failure budget of 3"
    ):
        await _run(_executor(actors), specs("e")[:6], _settings(tmp_path, failure_budget=3))
