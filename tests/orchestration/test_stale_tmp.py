"""A kill during an atomic write leaves ``.summary.json.<pid>.tmp``; the next session cleans it
(issue 10, item 11)."""

from __future__ import annotations

from pathlib import Path

from orch_helpers import make_config

from presto_client.orchestration.job import run_job_async
from tests.support.plans import plan_of


async def test_stale_temporaries_are_removed_on_the_next_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = make_config(run, chains_per_prompt=1)
    await run_job_async(plan_of(cfg))
    stale = [run / ".summary.json.99999.tmp", run / ".samples.jsonl.123.tmp"]
    for f in stale:
        f.write_text("{half")
    keep = run / "notes.tmp"
    keep.write_text("mine")
    await run_job_async(plan_of(cfg))
    assert not any(f.exists() for f in stale)
    assert keep.exists()
    assert (run / "summary.json").exists()
