"""The virtual-time replay of the demo: its decisions are a function of the engine's cost curve
(so that two checkouts can be compared by it), and it sees what the shared budget does."""

from __future__ import annotations

import time
from typing import Any

import pytest

from benchmarks.budget_replay import CURVES, DEMO_CONFIG, PROMPTS, demo_job, replay
from presto_client.core.runners import run_chain
from presto_client.orchestration.executors.orchestrator import Orchestrator


def test_a_replay_depends_on_the_cost_curve_alone() -> None:
    clock = time.perf_counter
    first = replay("mixed", *CURVES["mixed"])
    assert replay("mixed", *CURVES["mixed"]) == first
    assert time.perf_counter is clock  # the real clock is back


def test_the_sequential_arm_issues_one_request_per_transition() -> None:
    sampler = demo_job(DEMO_CONFIG.parent)["sampler"]
    figures = replay("flat", *CURVES["flat"])
    assert figures.issued["sequential"] == (
        sampler["steps_per_block"] * sampler["num_blocks"] * len(PROMPTS)
    )


def test_a_flat_engine_lets_every_presto_arm_speculate_more_than_a_compute_bound_one() -> None:
    flat = replay("flat", *CURVES["flat"])
    bound = replay("compute-bound", *CURVES["compute-bound"])
    for arm in ("stream", "crn", "predictive"):
        assert flat.issued[arm] > bound.issued[arm], arm


def test_the_replay_tells_a_budget_per_chain_from_the_engines_shared_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = replay("compute-bound", *CURVES["compute-bound"])

    async def own_budget(*args: Any, **kwargs: Any) -> Any:
        kwargs["budget"] = None  # every chain starts from an empty cost fit
        return await run_chain(*args, **kwargs)

    original = Orchestrator.__init__

    def init(self: Orchestrator, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **{**kwargs, "runner": own_budget})

    monkeypatch.setattr(Orchestrator, "__init__", init)
    alone = replay("compute-bound", *CURVES["compute-bound"])
    assert alone.digest != shared.digest
    assert sum(alone.issued.values()) > sum(shared.issued.values())


TOLERANCE = 0.02
"""End-to-end time an arm may lose to the sequential chain where speculation does not pay."""


@pytest.mark.parametrize("curve", ["cpu", "compute-bound"])
def test_on_a_compute_bound_engine_no_arm_is_slower_than_the_sequential_chain(curve: str) -> None:
    figures = replay(curve, *CURVES[curve])
    sequential = figures.wall["sequential"]
    for arm, wall in figures.wall.items():
        assert wall <= sequential * (1 + TOLERANCE), (arm, wall, sequential)
    if curve == "cpu":  # each extra sequence costs a whole one: the round rules speculate nothing
        steps = figures.issued["sequential"]
        assert figures.issued["crn"] == figures.issued["predictive"] == steps


def test_on_a_flat_engine_every_presto_arm_keeps_its_gain() -> None:
    figures = replay("flat", *CURVES["flat"])
    for arm in ("stream", "crn", "predictive"):
        assert figures.speedup_wall[arm] > 1.1, arm
        assert figures.wall[arm] < figures.wall["sequential"], arm
