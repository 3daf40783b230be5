"""bench_stream end to end on a fast in-process latency server (a smoke test, not a timing)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_stream import bench, build_parser, markdown, plot
from benchmarks.latency_server import CostProfile, LatencyServer, ServerThread

FAST = CostProfile("test-fast", 0.5e-3, 0.01e-3, 0.0, 64)


async def test_bench_runs_the_arms_side_by_side(tmp_path: Path) -> None:
    argv = [
        "--T",
        "16",
        "--K",
        "4",
        "--prompts",
        "2",
        "--arms",
        "sequential,crn,stream,nope",
        "--n-pf",
        "2,4",
    ]
    args = build_parser().parse_args([*argv, "--out", str(tmp_path)])
    with ServerThread(LatencyServer(FAST)) as server:
        result = await bench(args, server.base_url)
    rows = {r["arm"]: r for r in result["rows"]}
    assert set(rows) == {"sequential", "crn@2", "crn@4", "stream@2", "stream@4"}
    assert rows["sequential"]["speedup_calls"]["median"] == 1.0
    # crn and stream replay the sequential chain token for token (deterministic server).
    assert rows["crn@4"]["replays_sequential"] == "2/2"
    assert rows["stream@4"]["replays_sequential"] == "2/2"
    assert rows["crn@4"]["transitions_per_call"] > 1.0
    assert all(r["server_peak_running"] >= 1 for r in rows.values())
    table = markdown(result["rows"], "title")
    assert "| stream@4 |" in table
    plot(result["rows"], tmp_path / "speedup.png", "t")
