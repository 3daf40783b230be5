"""The tables of a run's summary, as text: per arm, side by side, speedup per prompt."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from presto_client.orchestration.results.summary import BASELINE, EQUIVALENCE_METRICS, replays
from presto_client.reporting.quality_table import format_quality_table
from presto_client.reporting.text_table import render_table


def _fmt(value: Any, kind: str = "") -> str:
    if value is None:
        return "-"
    if kind == "pct":
        return f"{100 * float(value):.0f}%"
    if kind == "x":
        return f"{float(value):.2f}x"
    if kind == "e":
        return f"{float(value):.1e}"
    if kind == "s":
        return f"{float(value):.2f}"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _speedup_cell(arm: Mapping[str, Any]) -> str:
    if arm.get("speedup_median") is None:
        return "-" if arm.get("traversal") != BASELINE else "1.00x (base)"
    return f"{arm['speedup_median']:.2f}x [{arm['speedup_min']:.2f}-{arm['speedup_max']:.2f}]"


def _wall_speedup_cell(arm: Mapping[str, Any]) -> str:
    if arm.get("speedup_wall_median") is None:
        return "-" if arm.get("traversal") != BASELINE else "1.00x (base)"
    return (
        f"{arm['speedup_wall_median']:.2f}x "
        f"[{arm['speedup_wall_min']:.2f}-{arm['speedup_wall_max']:.2f}]"
    )


def _same_cell(arm: Mapping[str, Any]) -> str:
    """Whether the arm's chains are the sequential chain's, token for token: ``yes, 3/3`` (every
    paired chain), ``NO, 2/3``; only the replaying methods (crn, stream) run the baseline's
    chain, the trees (bfs, predictive) are exact in law only."""
    identical, pairs = arm.get("identical_to_baseline"), arm.get("speedup_pairs")
    if identical is None or arm.get("traversal") == BASELINE:
        return "-"
    if not replays(str(arm.get("traversal"))):
        return "- (exact in law)"
    drift = arm.get("drift_max_nats") or 0.0
    if identical != pairs and drift > 0:  # (a server that drifts with the batch: not claimed)
        return f"not expected, {identical}/{pairs}"
    return f"{'yes' if identical == pairs else 'NO'}, {identical}/{pairs}"


_SPEED_COLUMNS: tuple[tuple[str, str], ...] = (
    ("arm", "arm"),
    ("chains", "chains"),
    ("end to end\nspeedup [min-max]", "speedup_wall"),
    ("model calls\nspeedup [min-max]", "speedup"),
    ("model-call\ntime, s", "model_call_time_s"),
    ("replays sequential\n(token for token)", "same"),
)
"""The run table's first part: how fast each arm is, and whether it replays the baseline."""

_WORK_COLUMNS: tuple[tuple[str, str], ...] = (
    ("arm", "arm"),
    ("calls", "calls"),
    ("s/call", "seconds_per_call"),
    ("trans/\ncall", "transitions_per_call"),
    ("requests\nused/issued", "requests"),
    ("wasted", "wasted_share"),
    ("tokens", "tokens_generated"),
    ("accept", "acceptance_rate"),
    ("eps-\ncertain", "eps_certain_share"),
    ("prefix\ncache hit", "prefix_cache_hit_rate"),
)
"""Its second part: what each arm's time went on (why an arm is slow), the same arms in the same
order. Two parts of about 100 columns each rather than one line of 230."""

SPEED_LEGEND = (
    "Each arm's speedup vs sequential, chains paired by prompt and seed: the median over the\n"
    "pairs, [min-max] their range. End to end: each chain's wall time, what you wait for; model\n"
    "calls: its time in engine calls only."
)
RESTART_MARK = "*"
"""Marks a prefix-cache hit rate that covers only the part of a run after a server restart."""
WORK_LEGEND = "Where the time went (trans/call: MH transitions per engine call):"


def _cells(arm: Mapping[str, Any]) -> dict[str, str]:
    failed = arm.get("chains_failed") or 0
    return {
        "arm": str(arm.get("arm")),
        "chains": f"{arm.get('chains_ok')}" + (f" (+{failed} failed)" if failed else ""),
        "calls": _fmt(arm.get("calls")),
        "seconds_per_call": _fmt(arm.get("seconds_per_call"), "s"),
        "transitions_per_call": _fmt(arm.get("transitions_per_call")),
        "requests": f"{arm.get('requests_used')}/{arm.get('requests_issued')}",
        "wasted_share": _fmt(arm.get("wasted_share"), "pct"),
        "tokens_generated": _fmt(arm.get("tokens_generated")),
        "acceptance_rate": _fmt(arm.get("acceptance_rate"), "pct"),
        "eps_certain_share": _fmt(arm.get("eps_certain_share"), "pct"),
        "model_call_time_s": _fmt(arm.get("model_call_time_s"), "s"),
        "speedup": _speedup_cell(arm),
        "speedup_wall": _wall_speedup_cell(arm),
        "same": _same_cell(arm),
        "prefix_cache_hit_rate": _fmt(arm.get("prefix_cache_hit_rate"), "pct")
        + (RESTART_MARK if arm.get("prefix_cache_after_restart") else ""),
    }


def format_summary_table(summary: Mapping[str, Any]) -> str:
    """The per-arm summary (``presto run``, ``presto report``): how fast each arm is and whether
    it replays the baseline, then what its time went on, one arm a row in each."""
    arms = summary.get("arms", [])
    if not arms:
        return "(no finished chains)"
    parts = []
    for legend, columns in ((SPEED_LEGEND, _SPEED_COLUMNS), (WORK_LEGEND, _WORK_COLUMNS)):
        rows = []
        for arm in arms:
            cells = _cells(arm)
            rows.append([cells[k] for _, k in columns])
        parts.append(legend + "\n" + render_table([h for h, _ in columns], rows))
    table = "\n\n".join(parts)
    restarted = sorted({str(a.get("engine")) for a in arms if a.get("prefix_cache_after_restart")})
    if restarted:
        table += (
            f"\n{RESTART_MARK} the server of {', '.join(restarted)} restarted during the run: "
            "its prefix-cache hit rate covers only what it served after the restart."
        )
    drifting = {str(a.get("engine")): a["drift_max_nats"] for a in arms if a.get("drift_max_nats")}
    for engine, drift in sorted(drifting.items()):
        table += (
            f"\nreplay not expected on {engine}: its logprobs drift with the batch by up to "
            f"{drift:.3g} nats per token (the probe's measure); serve it batch-invariant to "
            "replay the sequential chain token for token."
        )
    waits = format_stream_waits(arms)
    if waits:
        table += "\n\n" + waits
    quality = summary.get("quality")
    if quality:
        table += "\n\nAnswer quality (graded):\n" + format_quality_table(
            quality, [str(a["arm"]) for a in arms]
        )
    return table


BUDGET_WAIT_HINT_SHARE = 0.1
"""Above this share of a ``stream`` arm's waits spent on proposals the engine's budget refused
(and more than on proposals held back as unlikely), the summary suggests a higher
``speculation_tolerance``."""


def format_stream_waits(arms: Sequence[Mapping[str, Any]]) -> str:
    """Why each ``stream`` arm's walk waited (see ``StreamRunner._count_wait``), with a hint
    when the engine's speculation budget caused much of it: a latency-bound engine (a GPU) can
    take more speculation than the default tolerance allows, a compute-bound one cannot."""
    lines: list[str] = []
    for arm in arms:
        waited = float(arm.get("model_call_time_s") or 0.0)
        if arm.get("traversal") != "stream" or waited <= 0:
            continue
        causes = {
            key: float(arm.get(key) or 0.0)
            for key in ("budget_wait_s", "rewrite_wait_s", "floor_wait_s")
        }
        in_flight = max(waited - sum(causes.values()), 0.0)
        lines.extend(
            _wrap(
                f"{arm.get('arm')}: the walk waited {waited:.2f} s: "
                f"{causes['budget_wait_s']:.2f} s for proposals the engine's speculation budget "
                f"refused, {causes['rewrite_wait_s']:.2f} s for proposals an earlier accept "
                f"rewrote, {causes['floor_wait_s']:.2f} s for proposals held back as unlikely, "
                f"{in_flight:.2f} s for proposals still generating",
                "    ",
            )
        )
        # More waited for what the budget refused than for what the survival floor (on a
        # compute-bound engine, the measured cost of a proposal) held back: the tolerance, not
        # the engine's cost, is what binds.
        budget = causes["budget_wait_s"]
        if budget < BUDGET_WAIT_HINT_SHARE * waited or budget <= causes["floor_wait_s"]:
            continue
        refusals = int(arm.get("budget_refusals") or 0)
        if 2 * int(arm.get("unmeasured_refusals") or 0) > refusals:
            hint = (
                "nothing under load is measured yet and the engine sends no probe "
                "(speculation_probe off, the default on llama.cpp): its chains speculate once "
                "several run at once (max_active_chains above 1: one chain at a time never "
                "measures it). Where speculation pays (a GPU) set speculation_probe: true; "
                "on a CPU it would not (a speculative request costs the compute of the chain's "
                "own)"
            )
        elif 2 * int(arm.get("slot_refusals") or 0) > refusals:
            hint = (
                "the engine's slots bind (its max_concurrency, after what the chains' own "
                "requests take): more requests in flight would help only if the server has "
                "room for them"
            )
        else:
            hint = (
                "the budget binds: on a latency-bound engine (a GPU) a higher "
                "speculation_tolerance on the engine buys this back; on a compute-bound one "
                "(a CPU) more speculation slows every chain"
            )
        lines.extend(_wrap(hint, "  ", "  "))
    return "\n".join(lines)


WRAP_WIDTH = 100
"""Where the lines under the tables wrap."""


def _wrap(text: str, indent: str, first: str = "") -> list[str]:
    return textwrap.wrap(
        text, WRAP_WIDTH, initial_indent=first, subsequent_indent=indent, break_long_words=False
    )


def _decimals(*values: float | None) -> int:
    """Decimals that show the smallest nonzero magnitude with two significant digits (>= 3)."""
    small = [abs(v) for v in values if v is not None and v != 0 and math.isfinite(v)]
    if not small:
        return 3
    return max(3, min(8, 1 - math.floor(math.log10(min(small)))))


def equivalence_cell(test: Mapping[str, Any] | None) -> str:
    """``yes d=+0.003 [-0.010, 0.016] +/-0.050`` / ``no ...`` / ``too few prompts to tell (...)``
    (not shown equivalent, but the interval holds 0: unpowered) / ``n/a (reason)`` / ``-``.

    ``d``: mean paired difference (arm - baseline), then its 90% interval and the margin. ASCII
    only, like the rest of the printed tables (a terminal's encoding may not have Δ or ±).
    """
    if not test:
        return "-"
    verdict = test.get("verdict")
    if verdict not in ("equivalent", "not equivalent"):
        return f"n/a ({test.get('reason') or 'no pairs'})"
    margin = float(test["margin"])
    d = _decimals(margin)
    if verdict == "not equivalent" and test["ci_low"] <= 0.0 <= test["ci_high"]:
        # Equivalence not shown, but no difference shown either: the interval is too wide.
        return (
            f"too few prompts to tell (n={test.get('n')}: d={test['mean_diff']:+.{d}f} "
            f"[{test['ci_low']:.{d}f}, {test['ci_high']:.{d}f}] +/-{margin:.{d}f})"
        )
    word = "yes" if verdict == "equivalent" else "no"
    return (
        f"{word} d={test['mean_diff']:+.{d}f} [{test['ci_low']:.{d}f}, {test['ci_high']:.{d}f}] "
        f"+/-{margin:.{d}f}"
    )


def _equivalence_rows(arms: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for metric, label in EQUIVALENCE_METRICS:
        tests = [(a.get("equivalence") or {}).get(metric) for a in arms]
        if not any(tests):
            continue
        cells = [
            "(base)" if a.get("traversal") == BASELINE and not t else equivalence_cell(t)
            for a, t in zip(arms, tests, strict=True)
        ]
        rows.append([f"{label} equiv. (TOST)", *cells])
    return rows


def format_side_by_side(summary: Mapping[str, Any]) -> str:
    """Arms as columns, metrics as rows (``presto compare``)."""
    arms = summary.get("arms", [])
    if not arms:
        return "(no finished chains)"
    header = ["", *(str(a["arm"]) for a in arms)]
    rows: list[list[str]] = []
    for label, key, kind in _SIDE_BY_SIDE:
        row = [label]
        for arm in arms:
            cells = _cells(arm)
            if kind in ("speedup", "speedup_wall", "same", "requests"):
                row.append(cells[kind])
            else:
                row.append(_fmt(arm.get(key), kind))
        rows.append(row)
    rows.extend(_equivalence_rows(arms))
    return render_table(header, rows)


def short_equivalence_cell(test: Mapping[str, Any] | None) -> str:
    """:func:`equivalence_cell`'s verdict alone (``yes``, ``no``, ``too few (n=6)``, ``n/a``)."""
    full = equivalence_cell(test)
    if full.startswith("too few prompts to tell"):
        return f"too few (n={(test or {}).get('n')})"
    return full.split(" ", 1)[0]


_COMPACT: tuple[tuple[str, str, str], ...] = (
    ("chains ok", "", "chains"),
    ("speedup end to end", "", "wall"),
    ("  range", "", "wall_range"),
    ("model-call time, s", "model_call_time_s", "s"),
    ("speedup vs sequential (model calls)", "", "speedup"),
    ("  range over prompts", "", "range"),
    ("replays baseline", "", "same"),
    ("calls", "calls", ""),
    ("transitions per call", "transitions_per_call", ""),
    ("requests used/issued", "", "requests"),
    ("wasted requests", "wasted_share", "pct"),
    ("acceptance rate", "acceptance_rate", "pct"),
    ("eps-certain decisions", "eps_certain_share", "pct"),
    ("tokens generated", "tokens_generated", ""),
    ("prefix-cache hit rate", "prefix_cache_hit_rate", "pct"),
    ("max drift, nats", "drift_max", "e"),
)
"""The rows of ``presto compare``'s table: what decides between arms, short enough that the table
fits ~100 columns; every field is in summary.json / summary.csv."""


def _compact_cell(arm: Mapping[str, Any], key: str, kind: str) -> str:
    if kind == "chains":
        failed = arm.get("chains_failed") or 0
        return f"{arm.get('chains_ok')}" + (f" (+{failed} failed)" if failed else "")
    if kind == "speedup":
        if arm.get("speedup_median") is None:
            return "base" if arm.get("traversal") == BASELINE else "-"
        return f"{arm['speedup_median']:.2f}x"
    if kind == "range":
        if arm.get("speedup_median") is None:
            return "-"
        return f"{arm['speedup_min']:.2f}-{arm['speedup_max']:.2f}"
    if kind == "wall":
        if arm.get("speedup_wall_median") is None:
            return "base" if arm.get("traversal") == BASELINE else "-"
        return f"{arm['speedup_wall_median']:.2f}x"
    if kind == "wall_range":
        if arm.get("speedup_wall_median") is None:
            return "-"
        return f"{arm['speedup_wall_min']:.2f}-{arm['speedup_wall_max']:.2f}"
    if kind == "same":
        return _same_cell(arm)
    if kind == "requests":
        return f"{arm.get('requests_used')}/{arm.get('requests_issued')}"
    return _fmt(arm.get(key), kind)


def format_compact_side_by_side(summary: Mapping[str, Any]) -> str:
    """``presto compare``'s table: arms as columns, the deciding metrics as rows, equivalence
    verdicts only (:func:`format_equivalence_details` gives their numbers)."""
    arms = summary.get("arms", [])
    if not arms:
        return "(no finished chains)"
    header = ["", *(str(a["arm"]) for a in arms)]
    rows = [[label, *(_compact_cell(a, key, kind) for a in arms)] for label, key, kind in _COMPACT]
    for metric, label in EQUIVALENCE_METRICS:
        tests = [(a.get("equivalence") or {}).get(metric) for a in arms]
        if any(tests):
            cells = [
                "(base)" if a.get("traversal") == BASELINE and not t else short_equivalence_cell(t)
                for a, t in zip(arms, tests, strict=True)
            ]
            rows.append([f"{label} equiv. (TOST)", *cells])
    return render_table(header, rows)


def format_equivalence_details(summary: Mapping[str, Any]) -> str:
    """One line per arm and metric: the TOST's paired difference, 90% interval and margin."""
    lines = []
    for metric, label in EQUIVALENCE_METRICS:
        for arm in summary.get("arms", []):
            test = (arm.get("equivalence") or {}).get(metric)
            if test:
                lines.append(f"  {arm['arm']}, {label}: {equivalence_cell(test)}")
    if not lines:
        return ""
    head = "Equivalence (TOST of the mean paired difference d, arm - baseline; 90% CI, margin):"
    return "\n".join([head, *lines])


def format_speedup_per_prompt(summary: Mapping[str, Any]) -> str:
    """Median speedup per prompt (rows) and arm (columns), in model-call time (the summary's
    ``speedup_per_prompt``; the legend says so); empty when no baseline ran."""
    per_prompt: Mapping[str, Mapping[str, float]] = summary.get("speedup_per_prompt", {})
    order = [str(a["arm"]) for a in summary.get("arms", [])]
    arms = [a for a in order if per_prompt.get(a)]
    if not arms:
        return ""
    prompts = sorted({int(p) for a in arms for p in per_prompt[a]})
    rows = [[f"prompt {p}", *(_fmt(per_prompt[a].get(str(p)), "x") for a in arms)] for p in prompts]
    return PER_PROMPT_LEGEND + "\n" + render_table(["model-call speedup", *arms], rows)


PER_PROMPT_LEGEND = (
    "Speedup vs sequential per prompt, in model-call time (the time in engine calls, not end to "
    "end),\nmedian over the prompt's chains:"
)


_SIDE_BY_SIDE: tuple[tuple[str, str, str], ...] = (
    ("engine", "engine", ""),
    ("traversal", "traversal", ""),
    ("chains ok", "chains_ok", ""),
    ("chains failed", "chains_failed", ""),
    ("speedup end to end", "", "speedup_wall"),
    ("end to end, median per chain, s", "chain_wall_median_s", "s"),
    ("model-call time, s", "model_call_time_s", "s"),
    ("median per chain, s", "model_call_time_median_s", "s"),
    ("speedup vs sequential (model calls)", "", "speedup"),
    ("replays baseline (crn, stream)", "", "same"),
    ("calls", "calls", ""),
    ("transitions per call", "transitions_per_call", ""),
    ("requests per call", "requests_per_call", ""),
    ("requests used/issued", "", "requests"),
    ("wasted requests", "wasted_share", "pct"),
    ("seconds per call", "seconds_per_call", "s"),
    ("acceptance rate", "acceptance_rate", "pct"),
    ("eps-certain decisions", "eps_certain_share", "pct"),
    ("tokens generated", "tokens_generated", ""),
    ("prefix-cache hit rate", "prefix_cache_hit_rate", "pct"),
    ("normaliser drift (max), nats", "drift_max", "e"),
)


def runs_table_rows(path: Path, summary: Mapping[str, Any]) -> list[list[str]]:
    """One run's arms as rows of :func:`format_runs_table` (``presto report`` of several runs)."""
    rows = []
    for arm in summary["arms"]:
        med = arm.get("speedup_median")
        wall = arm.get("speedup_wall_median")
        tpc = arm.get("transitions_per_call")
        rows.append(
            [
                str(path),
                str(arm["arm"]),
                str(arm["chains_ok"]),
                "-" if wall is None else f"{wall:.2f}x",
                "-" if tpc is None else f"{tpc:.2f}",
                f"{arm['model_call_time_s']:.2f}",
                "-" if med is None else f"{med:.2f}x",
            ]
        )
    return rows


def format_runs_table(rows: Sequence[Sequence[str]]) -> str:
    """The arms of several runs side by side."""
    return render_table(
        ["run", "arm", "chains", "end to end", "trans/call", "model time s", "model-call speedup"],
        rows,
    )
