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
    lines = table.splitlines()
    rule = (
        next(i for i, line in enumerate(lines) if line.startswith("arm ") and "s/call" in line) + 1
    )
    assert "tokens" in lines[rule - 1] and "wasted" in lines[rule - 1]
    row = lines[rule + 1]
    assert "2.02" in row and "1234" in row and "65%" in row


def test_the_run_table_fits_100_columns_and_labels_its_ranges() -> None:
    """Issue 40: the table was 205-234 columns wide, its ``[a-b]`` ranges unlabelled; issue 47:
    every table fits 100 columns."""
    speed = {
        "speedup_median": 1.07,
        "speedup_min": 0.89,
        "speedup_max": 1.23,
        "speedup_wall_median": 1.05,
        "speedup_wall_min": 0.95,
        "speedup_wall_max": 1.13,
        "identical_to_baseline": 3,
        "speedup_pairs": 3,
    }
    arms = [
        _arm("llamacpp/sequential"),
        _arm("llamacpp/stream", **speed, budget_wait_s=9.0, budget_refusals=9),
        _arm("llamacpp/crn", **{**speed, "identical_to_baseline": 2}),
        _arm("llamacpp/predictive", **speed, requests_issued=1234, requests_used=345),
    ]
    table = format_summary_table({"arms": arms})
    assert max(len(line) for line in table.splitlines()) <= 100, table
    assert "[min-max]" in table and "the median over the" in table
    header = next(line for line in table.splitlines() if line.startswith("arm "))
    assert header.index("speedup [min-max]") < header.index("time, s")
    head = table.splitlines()[table.splitlines().index(header) - 1]
    assert head.index("end to end") < head.index("model calls")  # end to end first
    rows: dict[str, str] = {}  # the speed part's rows (the first of each arm)
    for line in table.splitlines():
        if line.startswith("llamacpp/"):
            rows.setdefault(line.split()[0], line)
    assert rows["llamacpp/stream"].endswith(
        "1.05x [0.95-1.13]  1.07x [0.89-1.23]       26.21            yes, 3/3"
    )
    assert rows["llamacpp/crn"].endswith("NO, 2/3")  # not every chain replayed: said loudly
    assert rows["llamacpp/predictive"].endswith("- (exact in law)")


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
    assert max(len(line) for line in table.splitlines()) <= 120
    waits, hints = _waits_and_hints(table)
    assert "26.21 s: 4.80 s" in waits["e"] and "12.60 s" in waits["e"] and "8.81 s" in waits["e"]
    assert "speculation_tolerance" in hints["e"]  # 4.8 s of 26.2 s: the budget binds
    assert "speculation_tolerance" not in hints.get("f", "")
    assert "g" not in hints  # no hint
    assert "slots bind" in hints["h"] and "speculation_tolerance" not in hints["h"]
    assert "speculation_probe: true" in hints["u"] and "tolerance" not in hints["u"]
    assert "e/sequential: " not in table


def _waits_and_hints(table: str) -> tuple[dict[str, str], dict[str, str]]:
    """Per engine of a ``stream`` arm: its wait sentence and its hint, each unwrapped (the wait
    line's continuations are indented by four spaces, a hint's by two)."""
    waits: dict[str, str] = {}
    hints: dict[str, str] = {}
    current = ""
    for line in table.splitlines():
        if "/stream: the walk waited" in line:
            current = line.split("/")[0]
            waits[current] = line
        elif current and line.startswith("    "):
            waits[current] += " " + line.strip()
        elif current and line.startswith("  "):
            hints[current] = (hints.get(current, "") + " " + line.strip()).strip()
        else:
            current = ""
    return waits, hints


def test_presto_compare_says_why_the_stream_walk_waited_too() -> None:
    from presto_client.reporting.compare import format_comparison

    arm = _arm("e/stream", budget_wait_s=1.2, rewrite_wait_s=20.3, budget_refusals=3)
    text = format_comparison({"arms": [_arm("e/sequential"), arm]})
    assert "e/stream: the walk waited 26.21 s: 1.20 s" in text


def test_presto_compare_fits_100_columns_whatever_the_number_of_arms() -> None:
    """Issue 47: arms are columns, so six arms made a table of ~330 columns. A wide table is
    printed as blocks of its columns, each repeating the row labels, and loses no cell."""
    from presto_client.reporting.compare import format_comparison

    names = ["sequential", "stream", "crn", "predictive", "bfs", "stream_short"]
    arms = [_arm(f"a-long-engine-name/{n}", tokens_generated=1000 + i) for i, n in enumerate(names)]
    text = format_comparison({"arms": arms})
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, text
    for i, n in enumerate(names):  # every arm's column, with its own cells
        head = next(line for line in lines if f"a-long-engine-name/{n} " in line + " ")
        block = lines[lines.index(head) :]
        row = next(line for line in block if line.startswith("tokens generated"))
        assert str(1000 + i) in row
    assert sum(line.startswith("tokens generated") for line in lines) >= 2  # blocks: labels again
