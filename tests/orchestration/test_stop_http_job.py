"""Stopping a ``stream`` job over HTTP while its chains' proposals are in flight: against a
server whose streams never end (keepalive comments only) and against a server that went down
(its requests retried for ``restart_window_s``), cancelling the job returns within a couple of
seconds (the last ``/metrics`` read included), with the session closed; a rerun resumes."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from orch_helpers import make_config

from presto_client.orchestration.job import JobResult, run_job_async
from tests.support.plans import plan_of

emulation = pytest.importorskip("tests.support.emulation")

STOP_WITHIN_S = 2.5
"""Cancel to return: the chains' cleanup and the brief last metrics read (a loaded machine)."""


@pytest.fixture
def server() -> Iterator[Any]:
    with emulation.EmulationServer("vllm", vocab_size=32, block_size=4) as s:
        yield s


def _config(run_dir: Path, base_url: str) -> Any:
    return make_config(
        run_dir,
        engines=[
            {
                "kind": "vllm",
                "name": "vllm",
                "base_url": base_url,
                "max_concurrency": 8,
                "restart_window_s": 20,
            }
        ],
        prompts={"token_ids": [[1, 2, 3], [4, 5, 6, 7]]},
        # Long enough that no chain can finish before the test stalls the streams, however late a
        # loaded machine lets it look (six steps once finished first: nothing was left to stall).
        sampler={"traversals": ["stream"], "window": 4, "steps_per_block": 64},
        chains_per_prompt=1,
    )


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "records.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


async def _until(condition: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def _cancel_and_time(job: asyncio.Task[JobResult]) -> float:
    start = time.perf_counter()
    job.cancel()
    done, _ = await asyncio.wait([job], timeout=STOP_WITHIN_S)
    elapsed = time.perf_counter() - start
    if not done:  # (do not leave the loop waiting on it)
        job.cancel()
        await asyncio.wait([job], timeout=120)
    assert done, f"the job did not stop within {STOP_WITHIN_S} s of its cancellation"
    assert job.cancelled(), "cancellation must propagate, never be swallowed"
    return elapsed


def _last_session(run_dir: Path) -> dict[str, Any]:
    session: dict[str, Any] = json.loads((run_dir / "run.json").read_text())["sessions"][-1]
    return session


async def _rerun_finishes(run_dir: Path, base_url: str) -> None:
    result = await asyncio.wait_for(run_job_async(plan_of(_config(run_dir, base_url))), 120)
    assert result.failed == 0 and result.completed + result.skipped == 2
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert sorted(s["chain_id"] for s in samples if s["status"] == "ok") == sorted(
        c.chain_id for c in result.plan.chains
    )


async def test_a_job_whose_streams_never_end_is_cancelled_at_once(
    tmp_path: Path, server: Any
) -> None:
    run_dir = tmp_path / "run"
    job = asyncio.create_task(run_job_async(plan_of(_config(run_dir, server.base_url))))
    await _until(
        lambda: any(r["kind"] == "extend" for r in _records(run_dir)), "a chain's first call"
    )
    server.faults.stall_streams = True  # from now on every stream sends only keepalives
    # Each chain's next request stalls (neither can finish: 64 steps). Counted on the server,
    # not as requests sent after this point: on a loaded machine a chain may have sent its next
    # proposal already, and how many it sends besides depends on the engine's measured cost.
    await _until(lambda: server.stats.stalled_streams >= 2, "both chains' proposals to stall")
    elapsed = await _cancel_and_time(job)
    assert elapsed < STOP_WITHIN_S
    session = _last_session(run_dir)
    assert session["finished"] is not None and session["completed"] is False
    await _until(lambda: server.stats.aborted_streams > 0, "the server to see streams closed", 5)

    server.faults.stall_streams = False
    await _rerun_finishes(run_dir, server.base_url)


async def test_a_job_on_a_server_gone_down_is_cancelled_at_once(
    tmp_path: Path, server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The server stops while stream proposals are in flight: the head proposal's connection
    is retried (``restart_window_s`` 20, for each of the stream's retries) and the last
    ``/metrics`` read finds no server; neither holds the stop."""
    run_dir = tmp_path / "run"
    server.faults.delay_s = 0.02  # streams in flight long enough to be cut by the stop
    job = asyncio.create_task(run_job_async(plan_of(_config(run_dir, server.base_url))))
    await _until(
        lambda: any(r["kind"] == "extend" for r in _records(run_dir)), "a chain's first call"
    )
    with caplog.at_level(logging.WARNING, logger="presto_client.backends.transport"):
        server.stop()
        await _until(
            lambda: any("restart_window_s" in r.getMessage() for r in caplog.records),
            "a request retried on the stopped server",
        )
        elapsed = await _cancel_and_time(job)
    assert elapsed < STOP_WITHIN_S
    session = _last_session(run_dir)
    assert session["finished"] is not None and session["completed"] is False

    with emulation.EmulationServer("vllm", vocab_size=32, block_size=4) as again:
        await _rerun_finishes(run_dir, again.base_url)
