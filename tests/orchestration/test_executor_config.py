"""The executor block of a job config and the workers' shares of a job's bounds (no Ray run)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from orch_helpers import make_config

from presto_client.errors import ConfigError
from presto_client.orchestration.config import executor_config
from presto_client.orchestration.config.loading import load_job_config
from presto_client.orchestration.executors.shares import deal, split, worker_shares
from presto_client.orchestration.planned import ExecutorSettings
from presto_client.orchestration.planning.plan import describe_plan, make_plan
from presto_client.orchestration.prompts.prompt_rows import load_prompts


def test_the_default_executor_is_local(tmp_path: Path) -> None:
    plan = make_plan(cfg := make_config(tmp_path), load_prompts(cfg))
    assert plan.settings.executor == ExecutorSettings()
    assert plan.settings.executor.kind == "local"


def test_set_executor_kind_ray_on_the_command_line(
    write_config: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(executor_config, "ray_installed", lambda: True)
    cfg = load_job_config(write_config(), ["executor.kind=ray", "executor.workers=4"])
    settings = cfg.executor.to_settings()
    assert (settings.kind, settings.workers, settings.address) == ("ray", 4, None)
    cfg = load_job_config(write_config(), ["executor.kind=ray"])
    assert cfg.executor.to_settings().workers == executor_config.DEFAULT_RAY_WORKERS


def test_the_executor_is_no_part_of_the_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started locally resumes on Ray and back: the executor never changes a chain."""
    monkeypatch.setattr(executor_config, "ray_installed", lambda: True)
    local = make_config(tmp_path)
    on_ray = make_config(tmp_path, executor={"kind": "ray", "workers": 2})
    assert (
        make_plan(local, load_prompts(local)).fingerprint
        == make_plan(on_ray, load_prompts(on_ray)).fingerprint
    )


@pytest.mark.parametrize(
    ("executor", "message"),
    [
        ({"kind": "ray", "workers": 0}, r"executor\.workers.*must be at least 1 \(got 0\)"),
        ({"kind": "ray", "workers": -2}, r"executor\.workers.*must be at least 1 \(got -2\)"),
        ({"kind": "local", "workers": 2}, r"executor\.workers applies to kind ray only"),
        ({"kind": "local", "address": "auto"}, r"executor\.address applies to kind ray only"),
        ({"kind": "ray", "address": "not an address"}, r"executor\.address .* is not a Ray"),
        ({"kind": "dask"}, r"executor\.kind"),
        ({"kind": "ray", "workers": 9}, r"executor\.workers = 9 exceeds max_concurrency = 8"),
    ],
)
def test_bad_executors_are_refused_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, executor: dict[str, object], message: str
) -> None:
    monkeypatch.setattr(executor_config, "ray_installed", lambda: True)
    with pytest.raises(ConfigError, match=message):
        make_config(tmp_path, executor=executor)


def test_more_workers_than_an_engine_has_slots_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(executor_config, "ray_installed", lambda: True)
    engines = [{"kind": "reference", "name": "ref", "max_concurrency": 3}]
    with pytest.raises(
        ConfigError, match=r"executor\.workers = 4 exceeds engines\[0\]\.max_concurrency = 3"
    ):
        make_config(tmp_path, engines=engines, executor={"kind": "ray", "workers": 4})
    with pytest.raises(ConfigError, match=r"exceeds max_active_chains = 2"):
        make_config(tmp_path, max_active_chains=2, executor={"kind": "ray", "workers": 4})


def test_ray_not_installed_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor_config, "ray_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"pip install 'presto-client\[ray\]'"):
        make_config(tmp_path, executor={"kind": "ray", "workers": 2})
    make_config(tmp_path, executor={"kind": "local"})  # the local executor needs no Ray


@pytest.mark.parametrize(
    ("total", "parts", "expected"),
    [(8, 2, [4, 4]), (7, 2, [4, 3]), (10, 4, [3, 3, 2, 2]), (5, 5, [1] * 5), (64, 3, [22, 21, 21])],
)
def test_a_bound_is_split_floor_first_with_the_remainder_to_the_first(
    total: int, parts: int, expected: list[int]
) -> None:
    assert split(total, parts) == expected
    assert sum(expected) == total


def test_a_bound_smaller_than_the_workers_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"executor\.workers = 3 exceeds engine e's"):
        split(2, 3, what="engine e's max_concurrency")
    with pytest.raises(ConfigError, match=r"at least 1"):
        split(2, 0)


def test_the_workers_never_exceed_an_engines_bound_together() -> None:
    shares = worker_shares(
        3,
        max_concurrency=10,
        max_active_chains=None,
        engine_concurrency={"a": 7, "b": 16},
    )
    assert [s.max_concurrency for s in shares] == [4, 3, 3]
    assert [s.engine_slots["a"] for s in shares] == [3, 2, 2]
    assert sum(s.engine_slots["b"] for s in shares) == 16
    # a replica's speculation capacity is the bound its requests run under in one process
    assert sum(s.budget_capacity["a"] for s in shares) == 7
    assert sum(s.budget_capacity["b"] for s in shares) == 10
    assert all(s.max_active_chains is None for s in shares)
    with_active = worker_shares(
        2, max_concurrency=8, max_active_chains=5, engine_concurrency={"a": 8}
    )
    assert [s.max_active_chains for s in with_active] == [3, 2]


def test_chains_are_dealt_round_robin_in_plan_order() -> None:
    assert deal(list("abcde"), [0, 1]) == {0: ["a", "c", "e"], 1: ["b", "d"]}
    # a dead worker's chains go to the workers left, in order
    assert deal(["c", "e"], [1, 2]) == {1: ["c"], 2: ["e"]}
    with pytest.raises(ValueError):
        deal(["a"], [])


def test_validate_describes_the_executor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor_config, "ray_installed", lambda: True)
    cfg = make_config(tmp_path, executor={"kind": "ray", "workers": 2, "address": "auto"})
    text = describe_plan(cfg, make_plan(cfg, load_prompts(cfg)))
    assert "executor ray: 2 worker(s) on the Ray cluster at auto" in text
    local = make_config(tmp_path)
    assert "executor" not in describe_plan(local, make_plan(local, load_prompts(local)))
