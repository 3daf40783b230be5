"""The summary of a run (summary.json/.csv), computed from its directory's files only.

Tables and plots of it are in :mod:`presto_client.reporting` (never re-running a job).

The summary has one row per arm (engine × traversal): chains, calls, transitions per call,
requests used/issued, acceptance rate, ε-certain share, model-call time, the engine's prefix-cache
hit rate, and, when the engine also ran the ``sequential`` baseline, the speedup over it, paired
per (prompt, chain): ``baseline model-call time / arm model-call time`` (same seed, so with
``crn`` the same chain: identical work). Median and range over pairs are reported, with how many
paired chains ended in the same response as the baseline. Beside it, the end-to-end speedup
(``speedup_wall_*``): the same pairs' ``stats.chain_wall_s``, everything from the chain's start to
its final state (its own generation included): what a user waits for. A run directory written
before chains recorded ``chain_wall_s`` has no end-to-end figure (``None``), never a guess.

Output equivalence (method §6): for the same pairs, the final response's mean token
log-likelihood (``final_mean_logp0``) and, where the sampler keeps entropies, its confidence
(``final_mean_neg_entropy``) of the arm and of the baseline are compared by a paired TOST: the 90%
t interval of the mean paired difference must lie within ±0.2 × the baseline values' SD
(α = 0.05 per side). ``equivalence_pooled`` pools the pairs of every arm (settings) per metric.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from presto_client.core.methods import METHODS, SEQUENTIAL, replaying_names, traversal_names
from presto_client.orchestration.results.engine_health import (
    EngineHealth,
    as_number,
    engine_health,
    ratio,
)
from presto_client.orchestration.run_dir.rundir import RunDir, latest_by_chain

logger = logging.getLogger(__name__)

BASELINE = SEQUENTIAL
"""Traversals that use the transition-keyed draws, so replay the baseline's chain exactly."""

_SUM_KEYS = (
    "transitions",
    "rounds",
    "extend_calls",
    "tighten_calls",
    "requests_issued",
    "requests_used",
    "sequences_issued",
    "tokens_generated",
    "accepts",
    "eps_certain",
    "ambiguous",
    "requests_cancelled",
    "early_rejects",
    "tokens_saved_early",
    "budget_wait_s",
    "rewrite_wait_s",
    "floor_wait_s",
    "budget_refusals",
    "slot_refusals",
    "unmeasured_refusals",
    "model_call_time_s",
    "extend_time_s",
)


EQUIVALENCE_METRICS: tuple[tuple[str, str], ...] = (
    ("final_mean_logp0", "likelihood"),
    ("final_mean_neg_entropy", "confidence"),
)
EQUIVALENCE_MARGIN_SD = 0.2
EQUIVALENCE_ALPHA = 0.05


def _finite(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def paired_tost(
    pairs: Sequence[tuple[float, float]],
    *,
    margin_sd: float = EQUIVALENCE_MARGIN_SD,
    alpha: float = EQUIVALENCE_ALPHA,
    baseline_values: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Paired TOST of ``(arm value, baseline value)`` pairs.

    The margin is ``margin_sd`` × the sample SD of the baseline values (those of the pairs, or
    ``baseline_values`` when given, e.g. pooled over settings without repeating a baseline
    chain). Equivalent iff the ``1 − 2·alpha`` t interval of the mean difference (arm − baseline)
    lies strictly within ±margin (both one-sided tests reject at ``alpha``). Differences that are
    all exactly 0 are equivalent, interval [0, 0]. With fewer than 2 pairs, or a baseline SD of
    0, the verdict is ``"n/a"`` with the ``reason``.
    """
    n = len(pairs)
    diffs = [a - b for a, b in pairs]
    base = list(baseline_values) if baseline_values is not None else [b for _, b in pairs]
    out: dict[str, Any] = {
        "n": n,
        "mean_diff": statistics.fmean(diffs) if diffs else None,
        "ci_low": None,
        "ci_high": None,
        "ci_level": 1 - 2 * alpha,
        "baseline_sd": None,
        "margin": None,
        "margin_sd": margin_sd,
        "p_tost": None,
        "verdict": "n/a",
        "reason": None,
    }
    if n < 2:
        out["reason"] = "n<2"
        return out
    sd_base = statistics.stdev(base) if len(base) >= 2 else 0.0
    out["baseline_sd"] = sd_base
    margin = margin_sd * sd_base
    out["margin"] = margin
    if all(d == 0 for d in diffs):
        out.update(mean_diff=0.0, ci_low=0.0, ci_high=0.0, p_tost=0.0, verdict="equivalent")
        return out
    if not sd_base > 0:
        out["reason"] = "baseline SD=0"
        return out
    from scipy import stats as sps  # lazily: scipy is heavy and only needed here

    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(n)
    df = n - 1
    if se > 0:
        half = float(sps.t.ppf(1 - alpha, df)) * se
        p_lower = float(sps.t.sf((mean + margin) / se, df))  # H0: mean <= -margin
        p_upper = float(sps.t.cdf((mean - margin) / se, df))  # H0: mean >= +margin
        p_tost = max(p_lower, p_upper)
    else:  # every difference the same, nonzero
        half = 0.0
        p_tost = 0.0 if -margin < mean < margin else 1.0
    lo, hi = mean - half, mean + half
    out.update(
        mean_diff=mean,
        ci_low=lo,
        ci_high=hi,
        p_tost=p_tost,
        verdict="equivalent" if -margin < lo and hi < margin else "not equivalent",
    )
    return out


def _metric_pairs(
    ok: Mapping[tuple[int, int], Mapping[str, Any]],
    base: Mapping[tuple[int, int], Mapping[str, Any]],
    metric: str,
) -> tuple[list[tuple[float, float]], bool]:
    """Finite (arm, baseline) values of ``metric`` per shared key; and whether any is present."""
    pairs: list[tuple[float, float]] = []
    present = False
    for key, r in ok.items():
        b = base.get(key)
        if b is None:
            continue
        a_val = (r.get("stats") or {}).get(metric)
        b_val = (b.get("stats") or {}).get(metric)
        present = present or a_val is not None or b_val is not None
        fa, fb = _finite(a_val), _finite(b_val)
        if fa is not None and fb is not None:
            pairs.append((fa, fb))
    return pairs, present


def _arm_sort_key(arm: Mapping[str, Any], engine_order: Sequence[str]) -> tuple[int, int, str]:
    engine = str(arm.get("engine", ""))
    traversal = str(arm.get("traversal", ""))
    e = engine_order.index(engine) if engine in engine_order else len(engine_order)
    order = traversal_names()  # (baselines after, by name)
    t = order.index(traversal) if traversal in order else len(order)
    return (e, t, str(arm.get("arm")))


def prefix_cache_delta(
    before: Sequence[Mapping[str, float]], after: Sequence[Mapping[str, float]]
) -> dict[str, float]:
    """A session's prefix-cache queries and hits over an engine's replicas (each replica's
    counters after minus before), and ``restarted_replicas``: how many restarted in between.

    A replica restarted when its start time changed (``process_start_time``, where the server
    exposes it) or a counter went backwards. Its counters then count from the restart, so its
    reading after is what it served since: the figure covers only that part of the session, and
    the summary says so (``prefix_cache_after_restart``) rather than mixing two lifetimes
    (before this, a negative difference, or one that had grown past the first reading and
    looked plausible)."""
    queries = hits = 0.0
    restarted = 0
    for b, a in zip(before, after, strict=True):
        dq = a["prefix_cache_queries"] - b["prefix_cache_queries"]
        dh = a["prefix_cache_hits"] - b["prefix_cache_hits"]
        started_b, started_a = b.get("process_start_time"), a.get("process_start_time")
        moved = started_b is not None and started_a is not None and started_a != started_b
        if moved or dq < 0 or dh < 0:
            restarted += 1
            dq, dh = a["prefix_cache_queries"], a["prefix_cache_hits"]
        queries += dq
        hits += min(dh, dq)
    return {"queries": queries, "hits": hits, "restarted_replicas": restarted}


def _sizeless(traversal: str, baseline: str) -> bool:
    """Whether an arm's method takes no size parameter (its ``size`` means nothing)."""
    method = METHODS.get(traversal)
    return traversal == baseline or (method is not None and method.size == "none")


def replays(traversal: str) -> bool:
    """Whether ``traversal`` replays the sequential chain (the registry's word)."""
    return traversal in replaying_names()


def samples_power(traversal: str) -> bool:
    """Whether ``traversal`` is an MH chain (power sampling), not a baseline."""
    return traversal in traversal_names()


def _chain_wall(row: Mapping[str, Any]) -> float | None:
    """A chain's end-to-end wall time (``stats.chain_wall_s``); ``None`` for a chain recorded
    before the field existed (an older run directory: no end-to-end figure, never a guess)."""
    value = _finite((row.get("stats") or {}).get("chain_wall_s"))
    return value if value is not None and value > 0 else None


def _pair_key(row: Mapping[str, Any]) -> tuple[int, int]:
    """The (prompt, chain) a chain pairs on with the same engine's baseline chain."""
    return (int(row.get("prompt_index", -1)), int(row.get("chain_index", -1)))


def summarize(
    samples: Iterable[Mapping[str, Any]],
    metrics: Iterable[Mapping[str, Any]] = (),
    *,
    job: str | None = None,
    engine_order: Sequence[str] = (),
    baseline: str = BASELINE,
    compare_to: str | None = None,
) -> dict[str, Any]:
    """The summary of a run from its sample lines (the last line of each chain counts);
    ``compare_to``: the traversal graded arms are tested against (the job's config)."""
    latest = latest_by_chain(samples)
    metrics = list(metrics)
    engines = engine_health(metrics)
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for row in latest.values():
        by_arm.setdefault(str(row.get("arm")), []).append(row)
    ok_by_arm = {
        arm: {_pair_key(r): r for r in rows if r.get("status") == "ok"}
        for arm, rows in by_arm.items()
    }
    arms: list[dict[str, Any]] = []
    per_prompt: dict[str, dict[str, float]] = {}
    pooled = _PooledPairs()
    for arm, rows in by_arm.items():
        entry, prompt_speedups = _arm_summary(arm, rows, ok_by_arm, baseline, engines, pooled)
        if prompt_speedups is not None:
            per_prompt[arm] = prompt_speedups
        arms.append(entry)
    arms.sort(key=lambda a: _arm_sort_key(a, engine_order))
    out: dict[str, Any] = {
        "job": job,
        "chains_ok": sum(a["chains_ok"] for a in arms),
        "chains_failed": sum(a["chains_failed"] for a in arms),
        "arms": arms,
        "speedup_per_prompt": per_prompt,
        "equivalence_pooled": pooled.tests(),
    }
    # Graded runs only: summaries of ungraded runs are unchanged.
    from presto_client.orchestration.results.quality import quality_summary

    quality = quality_summary(latest.values(), baseline=baseline, compare_to=compare_to)
    if quality:
        out["quality"] = quality
    return out


def _arm_summary(
    arm: str,
    rows: Sequence[Mapping[str, Any]],
    ok_by_arm: Mapping[str, Mapping[tuple[int, int], Mapping[str, Any]]],
    baseline: str,
    engines: EngineHealth,
    pooled: _PooledPairs,
) -> tuple[dict[str, Any], dict[str, float] | None]:
    """One arm's row of the summary, and its median speedup per prompt (``None``: the arm has
    no baseline to pair with). Its equivalence pairs are added to ``pooled``."""
    first = rows[0]
    engine = str(first.get("engine"))
    traversal = str(first.get("traversal"))
    ok = ok_by_arm[arm]
    walls = [w for w in (_chain_wall(r) for r in ok.values()) if w is not None]
    base_arm = f"{engine}/{baseline}"
    base = ok_by_arm.get(base_arm) if base_arm != arm else None
    paired = _BaselinePairs.of(ok, base) if base is not None else None
    entry: dict[str, Any] = {
        "arm": arm,
        "engine": engine,
        "sampler": first.get("sampler"),
        "traversal": traversal,
        # (the chains of runs before the name was one: "n_pf" for every method's size)
        "size": None if _sizeless(traversal, baseline) else first.get("size", first.get("n_pf")),
        "chains_ok": len(ok),
        "chains_failed": sum(1 for r in rows if r.get("status") != "ok"),
        **_work_figures(ok.values()),
        "prefix_cache_hit_rate": engines.hit_rates.get(engine),
        "prefix_cache_after_restart": engine in engines.restarted,
        "drift_max_nats": engines.drift.get(engine),
        "chain_wall_s": sum(walls) if walls else None,
        "chain_wall_median_s": statistics.median(walls) if walls else None,
        **_length_figures(ok.values()),
        **_speedup_figures(base_arm, paired),
        "equivalence": None if base is None else _equivalence(ok, base, base_arm, pooled),
    }
    return entry, None if paired is None else paired.per_prompt_medians()


def _work_figures(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What an arm's finished chains did and cost: their counters summed (calls, requests,
    tokens, waits, refusals, model-call time), ratios of the sums, the worst drift."""
    totals = {k: 0.0 for k in _SUM_KEYS}
    chain_times: list[float] = []
    drifts: list[float] = []
    for r in rows:
        stats = r.get("stats") or {}
        for k in _SUM_KEYS:
            totals[k] += as_number(stats.get(k))
        chain_times.append(as_number(stats.get("model_call_time_s")))
        drift = _finite(stats.get("drift_max"))
        if drift is not None:
            drifts.append(drift)
    rounds = totals["rounds"]
    issued = totals["requests_issued"]
    return {
        "calls": int(rounds),
        "transitions": int(totals["transitions"]),
        "transitions_per_call": ratio(totals["transitions"], rounds),
        "requests_per_call": ratio(issued, rounds),
        "requests_issued": int(issued),
        "requests_used": int(totals["requests_used"]),
        "wasted_share": ratio(issued - totals["requests_used"], issued),
        "extend_calls": int(totals["extend_calls"]),
        "tighten_calls": int(totals["tighten_calls"]),
        "tokens_generated": int(totals["tokens_generated"]),
        "acceptance_rate": ratio(totals["accepts"], totals["transitions"]),
        "eps_certain_share": ratio(totals["eps_certain"], totals["transitions"]),
        "ambiguous": int(totals["ambiguous"]),
        "requests_cancelled": int(totals["requests_cancelled"]),
        "early_rejects": int(totals["early_rejects"]),
        "tokens_saved_early": int(totals["tokens_saved_early"]),
        "budget_wait_s": totals["budget_wait_s"],
        "rewrite_wait_s": totals["rewrite_wait_s"],
        "floor_wait_s": totals["floor_wait_s"],
        "budget_refusals": int(totals["budget_refusals"]),
        "slot_refusals": int(totals["slot_refusals"]),
        "unmeasured_refusals": int(totals["unmeasured_refusals"]),
        "model_call_time_s": totals["model_call_time_s"],
        "model_call_time_median_s": statistics.median(chain_times) if chain_times else None,
        "extend_time_s": totals["extend_time_s"],
        # Engine health: |log Z| at the cut seen by x and by y (same context), in nats.
        "drift_max": max(drifts) if drifts else None,
        "seconds_per_call": ratio(totals["model_call_time_s"], rounds),
    }


@dataclasses.dataclass
class _BaselinePairs:
    """An arm's finished chains against the same engine's baseline chains, paired per
    (prompt, chain): the speedups in model-call time and end to end, and how many pairs ended
    in the same response."""

    speedups: list[float] = dataclasses.field(default_factory=list)
    wall_speedups: list[float] = dataclasses.field(default_factory=list)
    identical: int = 0
    by_prompt: dict[int, list[float]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(
        cls,
        ok: Mapping[tuple[int, int], Mapping[str, Any]],
        base: Mapping[tuple[int, int], Mapping[str, Any]],
    ) -> _BaselinePairs:
        out = cls()
        for key, r in ok.items():
            b = base.get(key)
            if b is None:
                continue
            s = ratio(
                as_number((b.get("stats") or {}).get("model_call_time_s")),
                as_number((r.get("stats") or {}).get("model_call_time_s")),
            )
            out.identical += int(b.get("token_ids") == r.get("token_ids"))
            b_wall, r_wall = _chain_wall(b), _chain_wall(r)
            if b_wall is not None and r_wall is not None:
                s_wall = ratio(b_wall, r_wall)
                if s_wall is not None:
                    out.wall_speedups.append(s_wall)
            if s is not None:
                out.speedups.append(s)
                out.by_prompt.setdefault(key[0], []).append(s)
        return out

    def per_prompt_medians(self) -> dict[str, float]:
        return {str(p): statistics.median(v) for p, v in self.by_prompt.items()}


def _speedup_figures(base_arm: str, paired: _BaselinePairs | None) -> dict[str, Any]:
    """Speedup over the baseline, median and range over pairs (``None``: no baseline)."""
    speedups = paired.speedups if paired is not None else []
    walls = paired.wall_speedups if paired is not None else []
    return {
        "baseline": base_arm if paired is not None else None,
        "speedup_wall_median": statistics.median(walls) if walls else None,
        "speedup_wall_min": min(walls) if walls else None,
        "speedup_wall_max": max(walls) if walls else None,
        "speedup_median": statistics.median(speedups) if speedups else None,
        "speedup_min": min(speedups) if speedups else None,
        "speedup_max": max(speedups) if speedups else None,
        "speedup_pairs": len(speedups) if paired is not None else None,
        "identical_to_baseline": paired.identical if paired is not None else None,
    }


class _PooledPairs:
    """Every arm's (arm, baseline) pairs per equivalence metric, for the pooled test; its
    margin counts each baseline chain once, though it pairs with every arm of its engine."""

    def __init__(self) -> None:
        self.pairs: dict[str, list[tuple[float, float]]] = {}
        self.baseline: dict[str, dict[tuple[str, int, int], float]] = {}

    def add(
        self,
        metric: str,
        pairs: Sequence[tuple[float, float]],
        ok: Mapping[tuple[int, int], Mapping[str, Any]],
        base: Mapping[tuple[int, int], Mapping[str, Any]],
        base_arm: str,
    ) -> None:
        self.pairs.setdefault(metric, []).extend(pairs)
        seen = self.baseline.setdefault(metric, {})
        for key in ok:
            b_val = _finite(((base.get(key) or {}).get("stats") or {}).get(metric))
            a_val = _finite((ok[key].get("stats") or {}).get(metric))
            if b_val is not None and a_val is not None:
                seen[(base_arm, *key)] = b_val

    def tests(self) -> dict[str, dict[str, Any]]:
        return {
            metric: paired_tost(pairs, baseline_values=list(self.baseline[metric].values()))
            for metric, pairs in self.pairs.items()
        }


def _equivalence(
    ok: Mapping[tuple[int, int], Mapping[str, Any]],
    base: Mapping[tuple[int, int], Mapping[str, Any]],
    base_arm: str,
    pooled: _PooledPairs,
) -> dict[str, Any]:
    """The arm's paired TOST against its baseline per metric the chains recorded (a metric no
    chain of either recorded is left out); its pairs also go to ``pooled``."""
    equivalence: dict[str, Any] = {}
    for metric, _ in EQUIVALENCE_METRICS:
        pairs, present = _metric_pairs(ok, base, metric)
        if not present:
            continue
        equivalence[metric] = paired_tost(pairs)
        pooled.add(metric, pairs, ok, base, base_arm)
    return equivalence


def _length_figures(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """How long the arm's answers were and how much of the budget its chains ran: blocks run,
    chains stopped at an EOS before their last block (the stop rule), and the response lengths
    (final, EOS-truncated) as mean, median, 10th/90th percentile and range. Chains recorded
    before these figures existed count as absent, never as zero."""
    blocks: list[float] = []
    stopped = 0
    lengths: list[float] = []
    for r in rows:
        stats = r.get("stats") or {}
        run_blocks = _finite(stats.get("blocks_run"))
        if run_blocks is not None and run_blocks > 0:
            blocks.append(run_blocks)
            stopped += bool(stats.get("stopped_at_eos"))
        tokens = r.get("token_ids")
        if isinstance(tokens, list):
            lengths.append(float(len(tokens)))
    out: dict[str, Any] = {
        "blocks_run": int(sum(blocks)) if blocks else None,
        "blocks_run_mean": statistics.fmean(blocks) if blocks else None,
        "chains_stopped_at_eos": stopped if blocks else None,
        "response_tokens_mean": statistics.fmean(lengths) if lengths else None,
        "response_tokens_median": statistics.median(lengths) if lengths else None,
    }
    if lengths:
        ordered = sorted(lengths)
        out["response_tokens_p10"] = float(np.percentile(ordered, 10))
        out["response_tokens_p90"] = float(np.percentile(ordered, 90))
        out["response_tokens_min"] = ordered[0]
        out["response_tokens_max"] = ordered[-1]
    else:
        out.update(
            response_tokens_p10=None,
            response_tokens_p90=None,
            response_tokens_min=None,
            response_tokens_max=None,
        )
    return out


def summarize_run(run: RunDir, baseline: str = BASELINE) -> dict[str, Any]:
    """The summary of a saved run directory."""
    info = run.run_info()
    config = run.resolved_config()
    engine_order = [str(e.get("name")) for e in config.get("engines", []) if isinstance(e, dict)]
    return summarize(
        run.samples(),
        run.metrics(),
        job=info.get("job") or config.get("name"),
        engine_order=engine_order,
        baseline=baseline,
        compare_to=config.get("compare_to"),
    )


# --------------------------------------------------------------------------------------------
# The CSV rows
# --------------------------------------------------------------------------------------------


_EQUIV_CSV_FIELDS = ("verdict", "n", "mean_diff", "ci_low", "ci_high", "margin", "p_tost")


def summary_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One flat row per arm (the CSV); the equivalence tests as ``equiv_<metric>_<field>``."""
    rows = []
    for a in summary.get("arms", []):
        row = {k: v for k, v in a.items() if k != "equivalence"}
        equivalence = a.get("equivalence") or {}
        for metric, _ in EQUIVALENCE_METRICS:
            test = equivalence.get(metric) or {}
            short = metric.removeprefix("final_")
            for field in _EQUIV_CSV_FIELDS:
                row[f"equiv_{short}_{field}"] = test.get(field)
        rows.append(row)
    return rows
