"""Jobs end to end on the reference engine: run directory, resume, failures, cancellation."""

from __future__ import annotations

import asyncio
import csv
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from orch_helpers import PROMPTS, CountingEngine, make_config, reference_engine, wait_until

from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.errors import ConfigError
from presto_client.orchestration.executors.orchestrator import JobFailedError
from presto_client.orchestration.job import run_job_async
from presto_client.orchestration.planning.plan import chain_seed
from presto_client.orchestration.run_dir.rundir import RunDir, read_jsonl
from tests.support.plans import plan_of


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_consistent(run_dir: Path, planned: set[str]) -> None:
    """One ok sample per planned chain; records exactly those of the finished chains."""
    samples = lines(run_dir / "samples.jsonl")
    ids = [s["chain_id"] for s in samples]
    assert len(ids) == len(set(ids)), "a chain was recorded twice"
    assert set(ids) == planned
    assert all(s["status"] == "ok" for s in samples)
    records = lines(run_dir / "records.jsonl")
    per_chain = Counter(r["chain_id"] for r in records)
    for s in samples:
        st = s["stats"]
        assert per_chain[s["chain_id"]] == st["rounds"] + st["extend_calls"] + st["tighten_calls"]
        rounds = sorted(r["round"] for r in records if r["chain_id"] == s["chain_id"])
        assert rounds == list(range(len(rounds)))
        transitions = sum(r["transitions"] for r in records if r["chain_id"] == s["chain_id"])
        assert transitions == st["transitions"]
    assert set(per_chain) <= planned


async def test_run_writes_the_run_directory(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "run")
    plan = plan_of(cfg)
    result = await run_job_async(plan)
    run = tmp_path / "run"
    assert {p.name for p in run.iterdir()} >= {
        "config.resolved.yaml",
        "run.json",
        "records.jsonl",
        "samples.jsonl",
        "summary.json",
        "summary.csv",
    }
    assert result.completed == len(plan.chains) == 4 * 2 * 2
    check_consistent(run, {c.chain_id for c in plan.chains})
    # every chain's seed is on disk (run.json and samples), split by (prompt, chain)
    info = json.loads((run / "run.json").read_text())
    seeds = {c["chain_id"]: c["seed"] for c in info["chains"]}
    for s in lines(run / "samples.jsonl"):
        assert (
            s["seed"] == seeds[s["chain_id"]] == chain_seed(7, s["prompt_index"], s["chain_index"])
        )
        assert s["engine"] == "ref" and s["sampler"] == "power_mh"
        assert len(s["token_ids"]) == 8 and s["stats"]["transitions"] == 6
    # crn replays the sequential chain: same seed, same work, same output
    by = {
        (s["traversal"], s["prompt_index"], s["chain_index"]): s
        for s in lines(run / "samples.jsonl")
    }
    for (t, p, c), s in by.items():
        if t == "crn":
            assert s["token_ids"] == by[("sequential", p, c)]["token_ids"]


async def test_summary_json_and_csv(tmp_path: Path) -> None:
    cfg = make_config(
        tmp_path / "run",
        engines=[{"kind": "reference", "name": "ref", "vocab_size": 6, "latency_s": 0.002}],
    )
    result = await run_job_async(plan_of(cfg))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary == json.loads(json.dumps(result.summary))
    arms = {a["arm"]: a for a in summary["arms"]}
    assert list(arms) == ["ref/sequential", "ref/crn"]
    seq, crn = arms["ref/sequential"], arms["ref/crn"]
    assert seq["chains_ok"] == crn["chains_ok"] == 8
    assert seq["transitions_per_call"] == 1.0 and seq["speedup_median"] is None
    assert crn["baseline"] == "ref/sequential" and crn["speedup_pairs"] == 8
    assert crn["identical_to_baseline"] == 8
    assert crn["transitions_per_call"] > 1.0
    assert crn["speedup_min"] <= crn["speedup_median"] <= crn["speedup_max"]
    # the speedup is the median over chains of sequential's model-call time over crn's, paired
    # by (prompt, chain); a ratio of wall-clock times, so its size is left to the benchmarks
    times = {
        (s["traversal"], s["prompt_index"], s["chain_index"]): s["stats"]["model_call_time_s"]
        for s in lines(tmp_path / "run" / "samples.jsonl")
    }
    ratios = [times[("sequential", p, c)] / t for (arm, p, c), t in times.items() if arm == "crn"]
    assert crn["speedup_median"] == pytest.approx(statistics.median(ratios))
    assert crn["requests_used"] == crn["transitions"] == 48
    assert crn["requests_issued"] >= crn["requests_used"]
    assert 0 <= crn["acceptance_rate"] <= 1
    with (tmp_path / "run" / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["arm"] for r in rows] == ["ref/sequential", "ref/crn"]
    assert {
        "speedup_median",
        "speedup_min",
        "speedup_max",
        "transitions_per_call",
        "calls",
        "requests_used",
        "requests_issued",
        "acceptance_rate",
        "prefix_cache_hit_rate",
        "model_call_time_s",
    } <= set(rows[0])
    assert float(rows[1]["speedup_median"]) == pytest.approx(crn["speedup_median"])


async def test_resume_after_a_kill_duplicates_and_loses_nothing(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "run", max_active_chains=2)
    plan = plan_of(cfg)
    planned = {c.chain_id for c in plan.chains}
    slow = CountingEngine(reference_engine(), delay_s=0.003)
    task = asyncio.create_task(run_job_async(plan, engine_overrides={"ref": [slow]}))
    samples = tmp_path / "run" / "samples.jsonl"
    records_path = tmp_path / "run" / "records.jsonl"

    def mid_way() -> bool:
        # at least 5 chains done and one caught after its first round (every arm here needs two
        # or more): the state the kill must hit, waited for rather than timed. A chain whose last
        # round is on disk may still be written by the cancelled job (nothing computed is lost).
        if not (samples.exists() and records_path.exists()):
            return False
        done = {s["chain_id"] for s in read_jsonl(samples)}
        rounds = Counter(r["chain_id"] for r in read_jsonl(records_path))
        return len(done) >= 5 and any(n == 1 and c not in done for c, n in rounds.items())

    await wait_until(mid_way)
    task.cancel()  # as Ctrl-C does
    with pytest.raises(asyncio.CancelledError):
        await task
    first = lines(samples)
    assert 5 <= len(first) < len(plan.chains)
    records = lines(tmp_path / "run" / "records.jsonl")
    unfinished = {r["chain_id"] for r in records} - {s["chain_id"] for s in first}
    assert unfinished, "the kill should have caught chains mid-way"
    # a kill can also leave a half-written last line
    with samples.open("a") as fh:
        fh.write('{"chain_id": "ref/crn/p0003/c001", "status": "o')
    result = await run_job_async(plan)
    assert result.skipped == len(first)
    assert result.completed == len(plan.chains) - len(first)
    check_consistent(tmp_path / "run", planned)
    # the chains of the first session kept their lines, untouched
    again = {s["chain_id"]: s for s in lines(samples)}
    for s in first:
        assert again[s["chain_id"]] == s
    # and a third run has nothing to do
    result = await run_job_async(plan)
    assert result.completed == 0 and result.skipped == len(plan.chains)
    check_consistent(tmp_path / "run", planned)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert [s["completed"] for s in info["sessions"]] == [False, True, True]


async def test_cancellation_leaves_the_files_intact(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "run", max_active_chains=4)
    plan = plan_of(cfg)
    slow = CountingEngine(reference_engine(), delay_s=0.005)
    task = asyncio.create_task(run_job_async(plan, engine_overrides={"ref": [slow]}))
    path = tmp_path / "run" / "samples.jsonl"
    await wait_until(lambda: path.exists() and bool(read_jsonl(path)))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert slow.in_flight == 0
    run = tmp_path / "run"
    for name in ("records.jsonl", "samples.jsonl"):
        lines(run / name)  # every line parses: nothing half-written
    summary = json.loads((run / "summary.json").read_text())
    assert summary["chains_ok"] == len(lines(run / "samples.jsonl"))
    json.loads((run / "run.json").read_text())


async def test_failed_chains_recorded_and_retried_on_resume(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "run", max_failed_chains=100)
    plan = plan_of(cfg)
    flaky = CountingEngine(reference_engine(), fail_if=lambda prefix: tuple(prefix[:2]) == (4, 5))
    result = await run_job_async(plan, engine_overrides={"ref": [flaky]})
    assert result.failed == 4 and result.completed == 12
    samples = lines(tmp_path / "run" / "samples.jsonl")
    failed = [s for s in samples if s["status"] == "failed"]
    assert {s["prompt_index"] for s in failed} == {1}
    assert all("connection refused (test)" in s["error"] for s in failed)
    assert result.summary["chains_failed"] == 4
    # the engine is back: a rerun retries the failed chains only
    result = await run_job_async(plan)
    assert result.completed == 4 and result.skipped == 12 and result.failed == 0
    check_consistent(tmp_path / "run", {c.chain_id for c in plan.chains})


async def test_failure_budget_exceeded_stops_the_job_with_work_on_disk(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "run", max_failed_chains=1, max_active_chains=1)
    plan = plan_of(cfg)
    flaky = CountingEngine(reference_engine(), fail_if=lambda prefix: tuple(prefix[:2]) == (4, 5))
    with pytest.raises(JobFailedError) as err:
        await run_job_async(plan, engine_overrides={"ref": [flaky]})
    msg = str(err.value)
    assert "failure budget of 1" in msg and str(tmp_path / "run") in msg and "rerun" in msg
    samples = lines(tmp_path / "run" / "samples.jsonl")
    assert [s["status"] for s in samples].count("failed") == 2
    assert [s["status"] for s in samples].count("ok") == 4  # prompt 0 finished before
    assert (tmp_path / "run" / "summary.json").exists()


async def test_a_different_job_in_the_same_directory_is_refused(tmp_path: Path) -> None:
    await run_job_async(plan_of(make_config(tmp_path / "run")))
    other = make_config(tmp_path / "run", sampler={"alpha": 2.0})
    with pytest.raises(ConfigError, match=r"different job \(differs in: sampler\)"):
        await run_job_async(plan_of(other))
    # more arms on the same job are fine: only the new chains run
    more = make_config(tmp_path / "run", sampler={"traversals": ["sequential", "crn", "bfs"]})
    result = await run_job_async(plan_of(more))
    assert result.skipped == 16 and result.completed == 8


def test_a_non_run_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not a run directory"):
        asyncio.run(run_job_async(plan_of(make_config(tmp_path / "run"))))


def test_plan_interleaves_arms_and_shares_seeds(tmp_path: Path) -> None:
    plan = plan_of(make_config(tmp_path / "run"))
    firsts = [plan.chains[i].arm.traversal for i in range(0, len(plan.chains), 2)]
    assert firsts[:4] == ["sequential", "crn", "sequential", "crn"]  # rotating first arm
    pairs = list(zip(plan.chains[::2], plan.chains[1::2], strict=True))
    assert all(a.seed == b.seed and a.prompt_index == b.prompt_index for a, b in pairs)
    assert len({c.seed for c in plan.chains}) == 8


def test_run_dir_reads_tolerate_a_truncated_line(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a":')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    with pytest.raises(Exception, match="not a run directory"):
        RunDir(tmp_path).run_info()


async def test_one_session_at_a_time_per_directory(tmp_path: Path) -> None:
    plan = plan_of(make_config(tmp_path / "run"))
    slow = CountingEngine(reference_engine(), delay_s=0.005)
    task = asyncio.create_task(run_job_async(plan, engine_overrides={"ref": [slow]}))
    await wait_until(lambda: (tmp_path / "run" / "records.jsonl").exists())
    with pytest.raises(ConfigError, match="in use by another presto process"):
        await run_job_async(plan)
    await task  # the first session is unharmed
    result = await run_job_async(plan)  # and the lock is released when it ends
    assert result.skipped == len(plan.chains)


async def test_a_stream_arm_runs_with_its_window_and_replays_the_baseline(tmp_path: Path) -> None:
    cfg = make_config(
        tmp_path / "run",
        sampler={"traversals": ["sequential", "stream"], "n_pf": 4, "window": 3},
    )
    plan = plan_of(cfg)
    result = await run_job_async(plan)
    assert result.failed == 0
    check_consistent(tmp_path / "run", {c.chain_id for c in plan.chains})
    samples = lines(tmp_path / "run" / "samples.jsonl")
    by = {(s["traversal"], s["prompt_index"], s["chain_index"]): s for s in samples}
    for (t, p, c), s in by.items():
        if t == "stream":
            assert s["size"] == 3  # the window, not the round size
            assert s["token_ids"] == by[("sequential", p, c)]["token_ids"]
    arms = {a["arm"]: a for a in result.summary["arms"]}
    assert arms["ref/stream"]["identical_to_baseline"] == len(PROMPTS) * 2


async def test_the_failure_budgets_message_counts_every_failed_chain_written(
    tmp_path: Path,
) -> None:
    """Issue 48: chains failing together after the budget was exceeded were written as failed
    rows but not counted in the message ("2 chain(s) failed" over 4 failed rows)."""
    cfg = make_config(tmp_path / "run", max_failed_chains=1, max_active_chains=8)
    plan = plan_of(cfg)

    class _FailingTogether(ReferenceEngine):
        """Every proposal call fails, once four are in flight: chains fail together (left to
        the scheduler, two sometimes failed before the others had asked)."""

        def __init__(self) -> None:
            super().__init__(ReferenceModel(6), name="ref")
            self.waiting = 0
            self.together = asyncio.Event()

        async def generate(self, requests: Any) -> Any:
            self.waiting += 1
            if self.waiting >= 4:
                self.together.set()
            await self.together.wait()
            raise ConnectionError("the server went away")

    with pytest.raises(JobFailedError) as err:
        await run_job_async(plan, engine_overrides={"ref": [_FailingTogether()]})
    failed = [s for s in lines(tmp_path / "run" / "samples.jsonl") if s["status"] == "failed"]
    assert len(failed) > 2  # (several chains were failing together)
    assert f"{len(failed)} chain(s) failed, more than the failure budget of 1" in str(err.value)
