"""The run table says why an arm is slow (issue 10, item 14): seconds per call, tokens generated
and wasted requests, as in ``presto compare``; an unpowered "not equivalent" reads as too few
prompts to tell."""

from __future__ import annotations

from presto_client.reporting.tables import equivalence_cell, format_summary_table


def _arm(name: str, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "arm": name,
        "traversal": name.split("/")[1],
        "chains_ok": 3,
        "chains_failed": 0,
        "calls": 13,
        "transitions_per_call": 1.85,
        "requests_used": 24,
        "requests_issued": 69,
        "wasted_share": 45 / 69,
        "seconds_per_call": 2.016,
        "tokens_generated": 1234,
        "acceptance_rate": 0.62,
        "eps_certain_share": 0.92,
        "model_call_time_s": 26.21,
        "prefix_cache_hit_rate": 0.97,
    }
    base.update(kw)
    return base


def test_run_table_has_the_cost_columns() -> None:
    table = format_summary_table({"arms": [_arm("e/predictive")]})
    header = table.splitlines()[0]
    assert "s/call" in header and "tokens" in header and "wasted" in header
    row = table.splitlines()[2]
    assert "2.02" in row and "1234" in row and "65%" in row


def test_an_unpowered_not_equivalent_says_too_few_prompts() -> None:
    unpowered = {
        "n": 3,
        "verdict": "not equivalent",
        "mean_diff": 0.01,
        "ci_low": -0.2,
        "ci_high": 0.22,
        "margin": 0.05,
    }
    cell = equivalence_cell(unpowered)
    assert "too few prompts to tell" in cell and "n=3" in cell
    different = {**unpowered, "mean_diff": 0.5, "ci_low": 0.3, "ci_high": 0.7}
    assert equivalence_cell(different).startswith("no ")


def test_the_table_says_why_the_stream_walk_waited_and_when_the_budget_binds() -> None:
    bound = _arm(
        "e/stream", budget_wait_s=4.8, rewrite_wait_s=12.6, floor_wait_s=0.0, budget_refusals=54
    )
    free = _arm("f/stream", budget_wait_s=0.5, rewrite_wait_s=12.6, floor_wait_s=1.0)
    # A compute-bound engine: its measured cost held most proposals back, not the tolerance.
    costly = _arm("g/stream", budget_wait_s=3.0, floor_wait_s=20.0)
    # Saturation: the heads fill the engine's slots, no tolerance would help.
    full = _arm("h/stream", budget_wait_s=20.0, budget_refusals=40, slot_refusals=39)
    # llama.cpp, one chain at a time: no probe, so nothing under load is ever measured.
    blind = _arm("u/stream", budget_wait_s=5.6, budget_refusals=24, unmeasured_refusals=24)
    arms = [_arm("e/sequential"), bound, free, costly, full, blind]
    table = format_summary_table({"arms": arms})
    lines = table.splitlines()
    e = next(i for i, line in enumerate(lines) if line.startswith("e/stream: the walk waited"))
    assert "26.21 s: 4.80 s" in lines[e] and "12.60 s" in lines[e] and "8.81 s" in lines[e]
    assert "speculation_tolerance" in lines[e + 1]  # 4.8 s of 26.2 s: the budget binds
    f = next(i for i, line in enumerate(lines) if line.startswith("f/stream: the walk waited"))
    assert "speculation_tolerance" not in lines[f + 1]
    g = next(i for i, line in enumerate(lines) if line.startswith("g/stream: the walk waited"))
    assert not lines[g + 1].startswith("  ")  # no hint
    h = next(i for i, line in enumerate(lines) if line.startswith("h/stream: the walk waited"))
    assert "slots bind" in lines[h + 1] and "speculation_tolerance" not in lines[h + 1]
    u = next(i for i, line in enumerate(lines) if line.startswith("u/stream: the walk waited"))
    assert "speculation_probe: true" in lines[u + 1] and "tolerance" not in lines[u + 1]
    assert not any(line.startswith("e/sequential:") for line in lines)


def test_presto_compare_says_why_the_stream_walk_waited_too() -> None:
    from presto_client.reporting.compare import format_comparison

    arm = _arm("e/stream", budget_wait_s=1.2, rewrite_wait_s=20.3, budget_refusals=3)
    text = format_comparison({"arms": [_arm("e/sequential"), arm]})
    assert "e/stream: the walk waited 26.21 s: 1.20 s" in text
