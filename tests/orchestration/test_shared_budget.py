"""The chains of an engine share the speculation budget its owner holds, handed in explicitly.

The orchestrator gives every chain its own bounded view of an engine; the budget of a replica is
held by the pool (made by whoever opened the engine) and passed to each chain's runner, so the
chains on one replica measure one cost curve together and nothing is found in a global.
"""

from __future__ import annotations

from typing import Any

import pytest

from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.speculation import (
    DEFAULT_TOLERANCE,
    MIN_OBSERVATIONS,
    SpeculationBudget,
)
from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import validate_job_config
from presto_client.orchestration.config.schema import ReferenceEngineConfig
from presto_client.orchestration.engines.opening import OpenedEngine
from presto_client.orchestration.executors.orchestrator import ChainSpec, EnginePool, Orchestrator

CONFIG = SamplerConfig(block_size=8, steps_per_block=6)


def _specs(n: int) -> list[ChainSpec]:
    return [
        ChainSpec(f"c{i}", "ref/stream", "ref", "stream", CONFIG, 0, i, i, (1,), size=4)
        for i in range(n)
    ]


async def test_the_chains_of_a_replica_share_the_budget_its_owner_holds() -> None:
    engine = ReferenceEngine(ReferenceModel(10, seed=3))
    budget = SpeculationBudget(4)
    seen: list[Any] = []

    async def runner(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["budget"])
        return await run_chain(*args, **kwargs)

    pool = EnginePool("ref", [engine], 4, budgets=[budget])
    await Orchestrator({"ref": pool}, max_concurrency=8, runner=runner).run(_specs(2))
    assert seen == [budget, budget]
    assert budget._fit.count > 0  # both chains' streams were measured into the one budget


async def test_a_pool_without_budgets_gets_one_per_replica_sized_from_its_bounds() -> None:
    replicas = [ReferenceEngine(ReferenceModel(10, seed=3)) for _ in range(2)]
    orchestrator = Orchestrator({"ref": EnginePool("ref", replicas, 4)}, max_concurrency=3)
    budgets = orchestrator.budgets["ref"]
    assert len(budgets) == 2 and budgets[0] is not budgets[1]
    assert all(b.capacity == 3 and b.adaptive for b in budgets)


def test_the_opened_engine_owns_one_budget_per_replica() -> None:
    e = ReferenceEngineConfig(kind="reference", name="ref", max_concurrency=5)
    replicas = [ReferenceEngine(ReferenceModel(4)) for _ in range(3)]
    opened = OpenedEngine.of(e.planned(0), replicas, job_max_concurrency=64)
    assert len(opened.budgets) == 3 and len({id(b) for b in opened.budgets}) == 3
    assert all(b.capacity == 5 for b in opened.budgets)


async def test_a_direct_call_without_a_budget_speculates_on_its_own() -> None:
    engine = ReferenceEngine(ReferenceModel(10, seed=3))
    budget = SpeculationBudget(None, adaptive=False)
    with_budget = await run_chain(engine, [1], CONFIG, traversal="stream", budget=budget)
    alone = await run_chain(engine, [1], CONFIG, traversal="stream")
    assert with_budget.token_ids == alone.token_ids  # a budget changes the speed, not the chain
    assert budget.peak_speculative > 0


def test_the_engines_speculation_tolerance_reaches_every_replicas_budget() -> None:
    """``speculation_tolerance`` (default the budget's own) sizes what the measured cost lets
    speculate: twice the tolerance, twice the speculative sequences."""
    default = ReferenceEngineConfig(kind="reference", name="ref")
    assert default.speculation_tolerance == DEFAULT_TOLERANCE
    e = ReferenceEngineConfig(kind="reference", name="ref", speculation_tolerance=2.0)
    replicas = [ReferenceEngine(ReferenceModel(4)) for _ in range(2)]
    opened = OpenedEngine.of(e.planned(0), replicas, job_max_concurrency=1000)
    assert [b.tolerance for b in opened.budgets] == [2.0, 2.0]
    low = OpenedEngine.of(default.planned(0), replicas[:1], job_max_concurrency=1000).budgets[0]
    for budget in (low, opened.budgets[0]):
        for i in range(4 * MIN_OBSERVATIONS):
            n = 1 + i % 8
            budget.observe(1, 0.010 + 0.0001 * n, n)  # a GPU-like cost: a = 100 b
    assert low.cost_limit() == pytest.approx(DEFAULT_TOLERANCE * 101)
    assert opened.budgets[0].cost_limit() == pytest.approx(2.0 * 101)


def test_a_negative_speculation_tolerance_is_refused_with_its_place() -> None:
    config = {
        "engines": [{"kind": "reference", "speculation_tolerance": -1}],
        "prompts": {"token_ids": [[1, 2]]},
    }
    with pytest.raises(ConfigError, match=r"engines\[0\]\.speculation_tolerance"):
        validate_job_config(config)


@pytest.mark.parametrize(
    ("engine", "probe"),
    [
        ({"kind": "reference"}, True),
        ({"kind": "vllm", "base_url": "http://v:8000"}, True),
        ({"kind": "llamacpp", "base_url": "http://l:8790"}, False),  # per-slot prefix caches
        ({"kind": "llamacpp"}, False),  # started by presto
        ({"kind": "llamacpp", "base_url": "http://l:8790", "speculation_probe": True}, True),
        ({"kind": "vllm", "base_url": "http://v:8000", "speculation_probe": False}, False),
    ],
)
def test_the_speculation_probe_is_off_where_prefix_caches_are_per_slot(
    engine: dict[str, Any], probe: bool
) -> None:
    job = validate_job_config({"engines": [engine], "prompts": {"token_ids": [[1, 2]]}})
    planned = job.engines[0].planned(0)
    assert planned.speculation_probe is probe
    budget = OpenedEngine.of(planned, [object()], job_max_concurrency=8).budgets[0]
    assert budget.probe is probe
