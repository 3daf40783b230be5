"""End-to-end time as the headline: each chain records ``chain_wall_s`` (its start to its final
state, its own generation included), the summary pairs it into ``speedup_wall_*`` beside the
model-call speedup, the tables show it first, and a run directory written before the field
existed is still summarised and reported (without an end-to-end figure)."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from presto_client.cli import main
from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import SamplerConfig
from presto_client.orchestration.results.summary import summarize, summarize_run
from presto_client.orchestration.run_dir.rundir import RunDir
from presto_client.reporting.compare import format_comparison
from presto_client.reporting.tables import (
    format_compact_side_by_side,
    format_runs_table,
    format_side_by_side,
    format_summary_table,
    runs_table_rows,
)

ROOT = Path(__file__).resolve().parents[2]


class _SlowExtension(ReferenceEngine):
    """The reference engine whose whole-block extensions take 30 ms (proposals are instant),
    generated or streamed."""

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        if any(_extension(r) for r in requests):
            await asyncio.sleep(0.03)
        return await super().generate(requests)

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        if _extension(request):
            await asyncio.sleep(0.03)
        async for chunk in super().stream(request):
            yield chunk


def _extension(request: ProposalRequest) -> bool:
    return request.num_tokens == 8 and len(request.prefix) == 1


async def test_chain_wall_holds_the_chains_own_generation() -> None:
    model = ReferenceModel(10, seed=2)
    config = SamplerConfig(block_size=8, steps_per_block=4)
    for traversal in ("sequential", "crn", "stream", "sample"):
        result = await run_chain(_SlowExtension(model), [1], config, traversal=traversal)
        stats = result.stats
        assert stats.chain_wall_s >= 0.03, traversal  # the extension is in it
        assert stats.chain_wall_s >= stats.model_call_time_s
        assert stats.as_dict()["chain_wall_s"] == stats.chain_wall_s


def _row(arm: str, prompt: int, model_s: float, wall_s: float | None) -> dict[str, Any]:
    stats: dict[str, Any] = {"model_call_time_s": model_s, "transitions": 4, "rounds": 2}
    if wall_s is not None:
        stats["chain_wall_s"] = wall_s
    return {
        "chain_id": f"{arm}-{prompt}",
        "arm": f"e/{arm}",
        "engine": "e",
        "traversal": arm,
        "n_pf": 8,
        "prompt_index": prompt,
        "chain_index": 0,
        "status": "ok",
        "token_ids": [1, 2],
        "stats": stats,
    }


def test_summary_pairs_the_end_to_end_times_beside_the_model_call_times() -> None:
    samples = [
        _row("sequential", 0, 8.0, 10.0),
        _row("sequential", 1, 8.0, 12.0),
        _row("stream", 0, 1.0, 2.0),
        _row("stream", 1, 2.0, 4.0),
    ]
    summary = summarize(samples)
    stream = next(a for a in summary["arms"] if a["traversal"] == "stream")
    assert stream["speedup_median"] == 6.0  # model calls: 8/1, 8/2
    assert stream["speedup_wall_median"] == 4.0  # end to end: 10/2, 12/4
    assert (stream["speedup_wall_min"], stream["speedup_wall_max"]) == (3.0, 5.0)
    assert stream["chain_wall_s"] == 6.0 and stream["chain_wall_median_s"] == 3.0
    # The tables show the end-to-end figure first.
    run_table = format_summary_table(summary)
    head = next(line for line in run_table.splitlines() if "model calls " in line)
    assert head.index("end to end") < head.index("model calls")  # its columns
    side_by_side = format_side_by_side(summary)
    assert side_by_side.index("end to end") < side_by_side.index("speedup vs sequential")
    for table in (run_table, side_by_side):
        assert "4.00x [3.00-5.00]" in table
    compact = format_compact_side_by_side(summary)
    assert compact.index("speedup end to end") < compact.index("speedup vs sequential")
    runs = format_runs_table(runs_table_rows(Path("r"), summary))
    assert runs.splitlines()[0].index("end to end") < runs.splitlines()[0].index("speedup")
    assert "4.00x" in runs and "6.00x" in runs
    paired = format_comparison(summary, samples, baseline="e/sequential")
    assert paired.index("end to end, paired median") < paired.index("model calls, paired median")


def test_a_run_recorded_without_chain_wall_has_no_end_to_end_figure() -> None:
    samples = [_row("sequential", 0, 8.0, None), _row("stream", 0, 2.0, None)]
    summary = summarize(samples)
    stream = next(a for a in summary["arms"] if a["traversal"] == "stream")
    assert stream["speedup_median"] == 4.0
    assert stream["speedup_wall_median"] is None and stream["chain_wall_s"] is None
    assert "-" in format_summary_table(summary)
    format_compact_side_by_side(summary)
    format_comparison(summary, samples, baseline="e/sequential")


def _strip_chain_wall(run: RunDir) -> None:
    """Rewrite a run directory's samples as an older release wrote them (no ``chain_wall_s``)."""
    path = run.path / "samples.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        (row.get("stats") or {}).pop("chain_wall_s", None)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_an_older_run_directory_resumes_and_reports(tmp_path: Path) -> None:
    config = str(ROOT / "configs" / "reference.yaml")
    out_dir = tmp_path / "r"
    args = ["--output", str(out_dir), "--no-progress", "--set", "chains_per_prompt=1"]
    assert main(["run", config, *args], out=io.StringIO()) == 0
    summary = summarize_run(RunDir(out_dir))
    assert all(a["speedup_wall_median"] is not None for a in summary["arms"][1:])
    _strip_chain_wall(RunDir(out_dir))
    out = io.StringIO()
    assert main(["run", config, *args], out=out) == 0  # resumes: nothing to run
    assert "0 chain(s) run, 12 already finished" in out.getvalue()
    old = summarize_run(RunDir(out_dir))
    assert all(a["speedup_wall_median"] is None for a in old["arms"])
    assert all(a["speedup_median"] is not None for a in old["arms"][1:])
    report = io.StringIO()
    assert main(["report", str(out_dir), "--no-plots"], out=report) == 0
    assert "speedup vs sequential" in report.getvalue()
