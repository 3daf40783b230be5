"""bench_stream end to end on a fast in-process latency server (a smoke test, not a timing)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.bench_stream import (
    bench,
    build_parser,
    markdown,
    markdown_stop,
    plot,
    resummarise,
)
from benchmarks.fast_model import EosHazard
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


async def test_multi_block_job_stops_at_eos_and_replays(tmp_path: Path) -> None:
    """The job's shape, tiny: blocks, an EOS model, the stop rule on and off (not a timing)."""
    argv = [
        *("--T", "64", "--blocks", "4", "--K", "3", "--prompts", "3"),
        *("--sampler", "power_mh,entropy_cut,multi_try_mh"),
        *("--arms", "sequential,crn,predictive,stream", "--n-pf", "auto"),
        *("--eos-median", "20", "--stop-at-eos", "both", "--every-block-arms", "sequential,stream"),
    ]
    args = build_parser().parse_args([*argv, "--out", str(tmp_path)])
    eos = EosHazard.from_median(63, 20, temperature=0.25)
    with ServerThread(LatencyServer(FAST, model="windowed", eos=eos, max_logprobs=-1)) as server:
        result = await bench(args, server.base_url)
    rows = {(r["sampler"], r["arm"]): r for r in result["rows"]}
    arms = {"sequential", "crn@auto", "predictive@auto", "stream@auto"}
    every = {"sequential/every", "stream@auto/every"}
    for sampler in ("power_mh", "entropy_cut", "multi_try_mh"):
        assert {a for s, a in rows if s == sampler} == arms | every
        for arm in arms | every:
            if not arm.startswith("predictive"):  # exact in law, not token for token
                assert rows[sampler, arm]["replays_sequential"] == "3/3", (sampler, arm)
        for arm in ("sequential", "stream@auto"):
            stop, all_blocks = rows[sampler, arm], rows[sampler, f"{arm}/every"]
            assert all_blocks["blocks_run_mean"] == 4
            assert stop["blocks_run_mean"] < 4 and stop["stopped_at_eos"] >= 1
            assert stop["tokens_per_chain"] < all_blocks["tokens_per_chain"]
    ratios = {(r["sampler"], r["arm"]): r for r in result["stop_ratios"]}
    assert set(ratios) == {
        (s, a)
        for s in ("power_mh", "entropy_cut", "multi_try_mh")
        for a in ("sequential", "stream@auto")
    }
    assert all(r["ratio_tokens"]["median"] > 1 for r in ratios.values())
    # A saved run's tables are rendered again from its results.json alone.
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(result))
    _, again = resummarise(saved)
    assert json.dumps(again["rows"]) == json.dumps(result["rows"])
    assert json.dumps(again["stop_ratios"]) == json.dumps(result["stop_ratios"])
    table = markdown(result["rows"], "title") + markdown_stop(result["stop_ratios"])
    assert "| stream@auto/every |" in table and "| power_mh | sequential |" in table
