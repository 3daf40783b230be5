"""The Ray executor against a real local Ray cluster (``ray.init(num_cpus=2)``, once per module).

The chains of a job run in two Ray actors and come back to the driver, the one writer of the run
directory: the replaying arms give the same chains token for token as the local executor on the
same seeds, a worker killed mid-run has its chains rerun by the other (nothing lost, nothing
written twice), and the bad inputs are refused before anything is written.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from orch_helpers import make_config

from presto_client.errors import ConfigError, EngineUnavailableError
from presto_client.orchestration.executors.orchestrator import ChainOutcome, ChainSpec
from presto_client.orchestration.executors.ray_executor import WORKER_NAME
from presto_client.orchestration.job import run_job
from presto_client.orchestration.planning.plan import make_plan
from presto_client.orchestration.prompts.prompt_rows import load_prompts
from presto_client.orchestration.run_dir.rundir import RunDir

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
REPLAYING = ["sequential", "crn", "stream"]


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    """One local Ray instance of 2 CPUs for the module (a start costs seconds)."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


def _config(out: Path, executor: dict[str, Any], **changes: Any) -> Any:
    return make_config(
        out,
        sampler={"traversals": REPLAYING, "n_pf": 4, "window": 4},
        executor=executor,
        **changes,
    )


def _run(cfg: Any, **kwargs: Any) -> Any:
    return run_job(make_plan(cfg, load_prompts(cfg)), **kwargs)


def _samples(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def _tokens(out: Path) -> dict[str, list[int]]:
    rows = _samples(out)
    ids = [r["chain_id"] for r in rows]
    assert len(ids) == len(set(ids)), "a chain written twice"
    assert all(r["status"] == "ok" for r in rows)
    return {r["chain_id"]: r["token_ids"] for r in rows}


def _records_once(out: Path) -> dict[str, int]:
    """Rounds per chain in records.jsonl; no round of a chain written twice."""
    keys = [(r["chain_id"], r["block"], r["round"], r["kind"]) for r in RunDir(out).records()]
    assert len(keys) == len(set(keys)), "a round written twice"
    counts: dict[str, int] = {}
    for cid, *_ in keys:
        counts[cid] = counts.get(cid, 0) + 1
    return counts


def _sequential(counts: dict[str, int]) -> dict[str, int]:
    return {c: n for c, n in counts.items() if "/sequential/" in c}


def test_the_replaying_arms_give_the_same_chains_locally_and_on_ray(tmp_path: Path) -> None:
    local = _run(_config(tmp_path / "local", {"kind": "local"}))
    on_ray = _run(_config(tmp_path / "ray", {"kind": "ray", "workers": 2}))
    assert local.completed == on_ray.completed == len(local.plan.chains) == 24
    expected = _tokens(tmp_path / "local")
    got = _tokens(tmp_path / "ray")
    assert sorted(got) == sorted(c.chain_id for c in local.plan.chains)
    assert got == expected
    # the chains ran in both workers, each its own process
    assert sorted(w["worker"] for w in on_ray.workers) == [0, 1]
    assert sum(w["chains"] for w in on_ray.workers) == 24
    assert len({w["pid"] for w in on_ray.workers}) == 2
    # every chain's rounds are in records.jsonl once (how many a speculating arm makes depends
    # on its budget: the sequential arm's are the same)
    rounds = _records_once(tmp_path / "ray")
    local_rounds = _records_once(tmp_path / "local")
    assert rounds.keys() == local_rounds.keys() == expected.keys()
    assert _sequential(rounds) == _sequential(local_rounds)
    assert on_ray.summary["arms"] and on_ray.summary.keys() == local.summary.keys()


class KillWorkerZero:
    """A sink that kills worker 0's actor once ``after`` chains have finished."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.seen = 0
        self.killed = False

    def chain_started(self, spec: ChainSpec, replica: int) -> None:
        return None

    def round_done(self, spec: ChainSpec, record: Any, queue_s: float) -> None:
        return None

    def chain_done(self, outcome: ChainOutcome) -> None:
        self.seen += 1
        if self.seen == self.after and not self.killed:
            ray.kill(ray.get_actor(WORKER_NAME.format(index=0)))
            self.killed = True


def test_a_killed_worker_has_its_chains_rerun_by_the_other(tmp_path: Path) -> None:
    slow = {"latency_s": 0.01}
    engines = [{"kind": "reference", "name": "ref", "vocab_size": 6, "max_concurrency": 4, **slow}]
    local = _run(_config(tmp_path / "local", {"kind": "local"}, engines=engines))
    killer = KillWorkerZero(after=3)
    cfg = _config(
        tmp_path / "ray",
        {"kind": "ray", "workers": 2},
        engines=engines,
        max_concurrency=4,
        max_active_chains=4,
    )
    result = _run(cfg, sinks=[killer])
    assert killer.killed
    assert result.completed == len(result.plan.chains) == 24
    assert _tokens(tmp_path / "ray") == _tokens(tmp_path / "local")
    # worker 0 is gone: only worker 1 closed in order, and it ran more than its half
    assert [w["worker"] for w in result.workers] == [1]
    assert result.workers[0]["chains"] > 12
    # records: each chain's rounds once (the dead worker's unfinished rounds never arrived)
    rounds = _records_once(tmp_path / "ray")
    local_rounds = _records_once(tmp_path / "local")
    assert rounds.keys() == local_rounds.keys()
    assert _sequential(rounds) == _sequential(local_rounds)
    assert local.completed == 24


def test_more_workers_than_the_cluster_can_place_is_a_clear_error(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = _config(
        out,
        {"kind": "ray", "workers": 3, "connect_timeout_s": 3},
    )
    with pytest.raises(ConfigError, match=r"executor.workers: .* not placed"):
        _run(cfg)
    assert not out.exists() or not any(out.iterdir())
    # and the cluster is usable afterwards (the workers that did start are gone)
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2


def test_a_worker_that_cannot_reach_its_replica_names_the_worker(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = make_config(
        out,
        engines=[{"kind": "vllm", "name": "gone", "base_url": "http://127.0.0.1:9"}],
        executor={"kind": "ray", "workers": 2},
    )
    plan = make_plan(cfg, load_prompts(cfg))
    with pytest.raises(
        EngineUnavailableError, match=r"Ray worker \d could not open .*cannot reach"
    ):
        run_job(plan)
    assert not out.exists() or not any(out.iterdir())


def test_interrupting_a_ray_job_stops_the_workers_and_keeps_what_finished(
    tmp_path: Path,
) -> None:
    """Cancellation (what Ctrl-C and SIGTERM do to ``presto run``) stops every worker, writes
    the summary of what finished, and a rerun resumes to the same chains."""
    import asyncio

    from presto_client.orchestration.job import run_job_async

    engines = [
        {
            "kind": "reference",
            "name": "ref",
            "vocab_size": 6,
            "max_concurrency": 4,
            "latency_s": 0.02,
        }
    ]
    out = tmp_path / "ray"
    cfg = _config(out, {"kind": "ray", "workers": 2}, engines=engines, max_concurrency=4)
    plan = make_plan(cfg, load_prompts(cfg))

    class CancelAfter:
        def __init__(self) -> None:
            self.seen = 0
            self.task: asyncio.Task[Any] | None = None

        def chain_started(self, spec: ChainSpec, replica: int) -> None:
            return None

        def round_done(self, spec: ChainSpec, record: Any, queue_s: float) -> None:
            return None

        def chain_done(self, outcome: ChainOutcome) -> None:
            self.seen += 1
            if self.seen == 4 and self.task is not None:
                self.task.cancel()

    stopper = CancelAfter()

    async def main() -> None:
        stopper.task = asyncio.current_task()
        await run_job_async(plan, sinks=[stopper])

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
    first = _samples(out)
    assert 4 <= len(first) < 24
    assert json.loads((out / "summary.json").read_text())
    rerun = _run(cfg)
    assert rerun.skipped == len(first)
    local = _run(_config(tmp_path / "local", {"kind": "local"}, engines=engines))
    assert local.completed == 24
    assert _tokens(out) == _tokens(tmp_path / "local")


def test_sigterm_stops_a_ray_job_cleanly_and_the_rerun_resumes(
    write_config: Callable[..., Path], tmp_path: Path
) -> None:
    """``presto run`` with the Ray executor (a local Ray instance of its own) stops on SIGTERM
    as it does locally: exit 143, what finished saved, the summary written, Ray shut down; the
    rerun (here with the local executor: the executor is no part of the fingerprint) resumes to
    every chain once."""
    from test_interrupt import Presto, _check_resumed, _check_stopped, _lines

    run_dir = tmp_path / "run"
    config = write_config(
        engines=[{"kind": "reference", "name": "ref", "vocab_size": 6, "latency_s": 0.3}],
        max_active_chains=2,
        executor={"kind": "ray", "workers": 2},
    )
    job = Presto(config)
    job.wait_for(lambda: len(_lines(run_dir / "samples.jsonl")) >= 2, "two chains on disk")
    job.stop(signal.SIGTERM)
    assert job.proc.returncode == 143, job.stderr
    assert "SIGTERM received" not in job.stderr, job.stderr  # (Ray's C handler: an abort)
    # (said at start, in one line: Ray's servers cannot be kept to loopback)
    assert "listen on every interface" in job.stderr, job.stderr
    done = _check_stopped(run_dir, job.stderr, "terminated (SIGTERM)")
    assert 2 <= len(done) < 16
    rerun = job.rerun("--set", "engines[0].latency_s=0", "--set", "executor={kind: local}")
    _check_resumed(rerun, run_dir, 16)
