"""A server restarted during a session (its start time changed, or its prefix-cache counters
went backwards): no negative counts in metrics.jsonl, no hit rate above 100% in ``presto
report``, no difference of two counter lifetimes passed off as the session's, and the report
says that the rate covers only what the server served after its restart."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from orch_helpers import make_config

from presto_client.cli import main
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.orchestration.job import run_job_async
from tests.support.plans import plan_of


class RestartingServer(ReferenceEngine):
    """A reference engine whose server's counters (and start time, when given) change between
    two reads as a restart would change them."""

    def __init__(self, readings: list[tuple[float, ...]]) -> None:
        super().__init__(ReferenceModel(6), name="ref")
        self.readings = list(readings)

    async def metrics(self) -> dict[str, float]:
        reading = self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]
        out = {"prefix_cache_queries": reading[0], "prefix_cache_hits": reading[1]}
        if len(reading) > 2:
            out["process_start_time"] = reading[2]
        return out


def _report(run: Path, capsys: pytest.CaptureFixture[str]) -> str:
    out = io.StringIO()
    assert main(["report", str(run), "--no-plots"], out=out) == 0, capsys.readouterr().err
    return out.getvalue()


def _percentages(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"(\d+(?:\.\d+)?)%", text)]


async def test_counters_that_went_backwards_count_from_the_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    cfg = make_config(run, sampler={"traversals": ["sequential"]})
    engine = RestartingServer([(1000.0, 900.0), (100.0, 45.0)])
    await run_job_async(plan_of(cfg), engine_overrides={"ref": [engine]})
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == [
        {
            "session": rows[0]["session"],
            "engine": "ref",
            "queries": 100.0,
            "hits": 45.0,
            "restarted_replicas": 1,
        }
    ]
    assert "restarted during this session" in caplog.text
    report = _report(run, capsys)
    assert all(p <= 100 for p in _percentages(report))
    assert "45.0%*" in report or "45%*" in report, report
    assert "covers only what it served after the restart" in report


async def test_a_changed_start_time_is_a_restart_even_when_counters_grew_past(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The case counters alone cannot tell: after the restart the server served more than it
    had before, so after minus before (5000-1000 queries) looks like a plausible session."""
    run = tmp_path / "run"
    cfg = make_config(run, sampler={"traversals": ["sequential"]})
    engine = RestartingServer([(1000.0, 900.0, 1.7e9), (5000.0, 1000.0, 1.7e9 + 60)])
    await run_job_async(plan_of(cfg), engine_overrides={"ref": [engine]})
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert (row["queries"], row["hits"], row["restarted_replicas"]) == (5000.0, 1000.0, 1)
    report = _report(run, capsys)
    assert "20.0%*" in report or "20%*" in report, report


async def test_an_unchanged_start_time_gives_the_plain_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    cfg = make_config(run, sampler={"traversals": ["sequential"]})
    engine = RestartingServer([(1000.0, 900.0, 1.7e9), (1400.0, 1000.0, 1.7e9)])
    await run_job_async(plan_of(cfg), engine_overrides={"ref": [engine]})
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert (row["queries"], row["hits"], row["restarted_replicas"]) == (400.0, 100.0, 0)
    report = _report(run, capsys)
    assert ("25.0%" in report or "25%" in report) and "%*" not in report, report
    assert "restarted during the run" not in report


async def test_a_negative_delta_written_by_an_older_run_is_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    cfg = make_config(run, sampler={"traversals": ["sequential"]})
    engine = RestartingServer([(0.0, 0.0), (400.0, 100.0)])
    await run_job_async(plan_of(cfg), engine_overrides={"ref": [engine]})
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps({"session": 1, "engine": "ref", "queries": -500, "hits": -550}) + "\n")
    summary = _report(run, capsys)
    assert "25.0%" in summary or "25%" in summary, summary
    assert all(p <= 100 for p in _percentages(summary))
