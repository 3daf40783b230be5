"""Prefix-cache counters that go backwards (the server restarted during a session) give no
negative counts in metrics.jsonl and no cache hit rate above 100% in ``presto report``."""

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
    """A reference engine whose server's counters restart between two reads."""

    def __init__(self, readings: list[tuple[float, float]]) -> None:
        super().__init__(ReferenceModel(6), name="ref")
        self.readings = list(readings)

    async def metrics(self) -> dict[str, float]:
        q, h = self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]
        return {"prefix_cache_queries": q, "prefix_cache_hits": h}


def _report(run: Path, capsys: pytest.CaptureFixture[str]) -> str:
    out = io.StringIO()
    assert main(["report", str(run), "--no-plots"], out=out) == 0, capsys.readouterr().err
    return out.getvalue()


def _percentages(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"(\d+(?:\.\d+)?)%", text)]


async def test_counters_that_went_backwards_are_not_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    cfg = make_config(run, sampler={"traversals": ["sequential"]})
    engine = RestartingServer([(1000.0, 900.0), (100.0, 90.0)])
    await run_job_async(plan_of(cfg), engine_overrides={"ref": [engine]})
    metrics = run / "metrics.jsonl"
    rows = (
        [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    )
    assert all(r["queries"] >= 0 and r["hits"] >= 0 for r in rows)
    assert "went backwards" in caplog.text
    assert all(p <= 100 for p in _percentages(_report(run, capsys)))


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
