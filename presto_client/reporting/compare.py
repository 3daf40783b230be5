"""``presto compare``: the same prompts and seeds on several engines and/or traversals.

A comparison is a job whose arms are chosen on the command line (or the config's engines ×
traversals). Its chains are planned like any job's: for every (prompt, chain) all arms run one
after another, with the first arm rotating, so that machine drift hits all arms alike; every arm
of a (prompt, chain) has the same seed. The result is a side-by-side table (arms as columns), with
paired time ratios against a chosen baseline arm (by default each engine's ``sequential`` arm).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from presto_client.errors import ConfigError
from presto_client.orchestration.config.schema import JobConfig, Prompt
from presto_client.orchestration.planning.plan import Arm, JobPlan, make_plan
from presto_client.orchestration.results.summary import as_number
from presto_client.orchestration.run_dir.rundir import latest_by_chain
from presto_client.reporting.tables import (
    format_compact_side_by_side,
    format_equivalence_details,
    format_speedup_per_prompt,
    format_stream_waits,
)
from presto_client.reporting.text_table import render_table


def compare_plan(
    cfg: JobConfig,
    prompts: Sequence[Prompt],
    *,
    engines: Sequence[str] | None = None,
    traversals: Sequence[str] | None = None,
) -> JobPlan:
    """The plan of a comparison; at least two arms."""
    plan = make_plan(cfg, prompts, engines=engines, traversals=traversals)
    if len(plan.arms) < 2:
        raise ConfigError(
            f"compare needs at least two arms, the job has {len(plan.arms)} "
            f"({', '.join(a.arm for a in plan.arms)}): list several engines in the config, or "
            "several traversals (--traversals sequential,crn)"
        )
    return plan


def check_baseline(arms: Sequence[Arm], baseline: str | None) -> None:
    if baseline is not None and baseline not in {a.arm for a in arms}:
        raise ConfigError(
            f"--baseline {baseline!r} is not an arm of this comparison; arms: "
            f"{', '.join(a.arm for a in arms)}"
        )


def paired_ratios(
    samples: Iterable[Mapping[str, Any]],
    baseline_arm: str,
    metric: str = "model_call_time_s",
) -> dict[str, dict[str, float | int]]:
    """Per arm: ``baseline time / arm time`` over (prompt, chain) pairs both finished ok, by the
    chains' ``metric`` (``model_call_time_s``, or ``chain_wall_s``: end to end; chains recorded
    without it are left out)."""
    ok = [r for r in latest_by_chain(samples).values() if r.get("status") == "ok"]
    by_arm: dict[str, dict[tuple[int, int], float]] = {}
    for r in ok:
        key = (int(r.get("prompt_index", -1)), int(r.get("chain_index", -1)))
        t = as_number((r.get("stats") or {}).get(metric))
        by_arm.setdefault(str(r.get("arm")), {})[key] = t
    base = by_arm.get(baseline_arm, {})
    out: dict[str, dict[str, float | int]] = {}
    for arm, times in by_arm.items():
        ratios = [base[k] / t for k, t in times.items() if k in base and t > 0]
        if ratios:
            out[arm] = {
                "median": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
                "pairs": len(ratios),
            }
    return out


def format_comparison(
    summary: Mapping[str, Any],
    samples: Iterable[Mapping[str, Any]] = (),
    baseline: str | None = None,
) -> str:
    """Side-by-side table; with ``baseline``, a row of paired speedups against that arm."""
    parts = [format_compact_side_by_side(summary)]
    details = format_equivalence_details(summary)
    if details:
        parts.append(details)
    if baseline is not None:
        samples = list(samples)
        arms = [str(a["arm"]) for a in summary.get("arms", [])]
        rows = []
        for label, metric in (("end to end", "chain_wall_s"), ("model calls", "model_call_time_s")):
            ratios = paired_ratios(samples, baseline, metric)
            medians, ranges = [], []
            for arm in arms:
                r = ratios.get(arm)
                medians.append("-" if r is None else f"{r['median']:.2f}x")
                ranges.append("-" if r is None else f"{r['min']:.2f}-{r['max']:.2f}")
            rows += [[f"{label}, paired median", *medians], ["  range", *ranges]]
        parts.append(render_table([f"speedup vs {baseline}", *arms], rows))
    per_prompt = format_speedup_per_prompt(summary)
    if per_prompt:
        parts.append(per_prompt)
    waits = format_stream_waits(summary.get("arms", []))
    if waits:
        parts.append(waits)
    shown = [str(a["arm"]) for a in summary.get("arms", [])]
    quality = {a: q for a, q in (summary.get("quality") or {}).items() if a in shown}
    if quality:  # graded runs only
        from presto_client.reporting.quality_table import format_quality_table

        parts.append("Answer quality (graded):\n" + format_quality_table(quality, shown))
    parts.append("Every figure per arm and more: the run's summary.json and summary.csv.")
    return "\n\n".join(parts)
