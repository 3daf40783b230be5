"""Plots of a run (PNG), made from its saved files only (never re-running the job)."""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from presto_client.errors import PrestoError
from presto_client.orchestration.config.schema import JobConfig
from presto_client.orchestration.prompts.prompt_rows import load_prompts
from presto_client.orchestration.results.summary import as_number, summarize_run
from presto_client.orchestration.run_dir.rundir import RunDir, iter_chain_records, latest_by_chain

log = logging.getLogger(__name__)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PrestoError(
            "plots need matplotlib: pip install 'presto-client[plots]' (tables were still printed)"
        ) from None
    return plt


def cumulative_curves(
    records: Iterable[Mapping[str, Any]], samples: Iterable[Mapping[str, Any]]
) -> dict[str, tuple[list[int], list[float]]]:
    """Per arm: mean cumulative model-call time (s) to complete n transitions, n = 0..N.

    Extension calls are left out (they are counted apart, as in the summary); the mean is over
    the chains of the arm that finished ok.
    """
    ok = {cid: row for cid, row in latest_by_chain(samples).items() if row.get("status") == "ok"}
    per_arm: dict[str, list[list[float]]] = {}
    for cid, rows in iter_chain_records(records, set(ok)):
        arm = str(ok[cid].get("arm"))
        time_at: list[float] = [0.0]  # time_at[n]: time when n transitions were done
        elapsed = 0.0
        done = 0
        for r in sorted(rows, key=lambda r: int(r.get("round", 0))):
            if r.get("kind") == "extend":
                continue
            elapsed += as_number(r.get("wall_s"))
            step = int(as_number(r.get("transitions")))
            for _ in range(step):
                done += 1
                time_at.append(elapsed)
        per_arm.setdefault(arm, []).append(time_at)
    curves: dict[str, tuple[list[int], list[float]]] = {}
    for arm, series in per_arm.items():
        n = min(len(s) for s in series)
        xs = list(range(n))
        ys = [statistics.fmean(s[i] for s in series) for i in xs]
        curves[arm] = (xs, ys)
    return curves


def arm_colors(arms: Sequence[str]) -> dict[str, str]:
    """One colour per arm, the same in every plot (matplotlib's default cycle, in table order)."""
    return {arm: f"C{i % 10}" for i, arm in enumerate(arms)}


PROMPT_LABEL_CHARS = 28
"""How much of a prompt's text labels its bars (the whole prompt is in the run's files)."""


def excerpt(text: str, limit: int = PROMPT_LABEL_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def prompt_labels(run: RunDir, indices: Sequence[int]) -> dict[int, str]:
    """``"i: start of the prompt"`` per prompt index, from the run's resolved config (its text,
    or its token ids); ``"prompt i"`` where the prompts cannot be read back (a moved file)."""
    labels = {i: f"prompt {i}" for i in indices}
    try:
        cfg = JobConfig.model_validate(run.resolved_config())
        prompts = load_prompts(cfg, network=False)  # (a Hub dataset: no labels, no download)
    except (PrestoError, ValueError, OSError) as exc:
        log.debug("prompt labels: prompts not readable from %s (%s)", run.path, exc)
        return labels
    for p in prompts:
        if p.index in labels:
            shown = p.text if p.text is not None else str(list(p.token_ids or ()))
            labels[p.index] = f"{p.index}: {excerpt(shown)}"
    return labels


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    # "tight": a legend placed outside the axes is kept in the picture
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def write_plots(run: RunDir, out_dir: Path | None = None) -> list[Path]:
    """PNG plots of a saved run; returns the files written."""
    plt = _pyplot()
    out = out_dir or (run.path / "plots")
    out.mkdir(parents=True, exist_ok=True)
    samples = run.samples()
    records = run.records()
    summary = summarize_run(run)
    arms = [str(a["arm"]) for a in summary["arms"]]
    color = arm_colors(arms)
    written: list[Path] = []

    curves = cumulative_curves(records, samples)
    if curves:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for arm in arms:
            if arm in curves and len(curves[arm][0]) and max(curves[arm][0]) > 0:
                xs, ys = curves[arm]  # (arms without transitions, the baselines: nothing to draw)
                ax.step(xs, ys, where="post", label=arm, color=color[arm])
        ax.set_xlabel("completed transitions")
        ax.set_ylabel("cumulative model-call time, s (mean over chains)")
        ax.set_title("Model-call time (engine calls only) against completed transitions")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
        path = out / "cumulative_time.png"
        written.append(_save(plt, fig, path))

    ok = [r for r in latest_by_chain(samples).values() if r.get("status") == "ok"]
    per_arm_tpc: dict[str, list[float]] = {}
    for r in ok:
        tpc = (r.get("stats") or {}).get("transitions_per_call")
        if tpc is not None:
            per_arm_tpc.setdefault(str(r.get("arm")), []).append(as_number(tpc))
    if per_arm_tpc:
        labels = [a for a in arms if a in per_arm_tpc]
        fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(labels) + 2), 4.5))
        ax.boxplot([per_arm_tpc[a] for a in labels])
        ax.set_xticks(range(1, len(labels) + 1), labels, rotation=20, ha="right")
        means = [statistics.fmean(per_arm_tpc[a]) for a in labels]
        ax.plot(range(1, len(labels) + 1), means, "o", label="mean")
        ax.set_ylabel("transitions per call (per chain)")
        ax.set_title("Transitions per engine call")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3, axis="y")
        path = out / "transitions_per_call.png"
        written.append(_save(plt, fig, path))

    per_prompt: Mapping[str, Mapping[str, float]] = summary.get("speedup_per_prompt", {})
    sp_arms = [a for a in arms if per_prompt.get(a)]
    if sp_arms:
        prompts = sorted({int(p) for a in sp_arms for p in per_prompt[a]})
        labels_by_prompt = prompt_labels(run, prompts)
        fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(prompts) * len(sp_arms) + 3), 4.5))
        width = 0.8 / len(sp_arms)
        for j, arm in enumerate(sp_arms):
            bar_x = [i + (j - (len(sp_arms) - 1) / 2) * width for i in range(len(prompts))]
            bar_y = [per_prompt[arm].get(str(p), float("nan")) for p in prompts]
            ax.bar(bar_x, bar_y, width=width, label=arm, color=color[arm])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(
            range(len(prompts)),
            [labels_by_prompt[p] for p in prompts],
            rotation=20 if len(prompts) > 1 else 0,
            ha="right" if len(prompts) > 1 else "center",
            fontsize="small",
        )
        ax.set_xlabel("prompt")
        ax.set_ylabel("speedup over sequential, model-call time\n(median over chains)")
        ax.set_title("Speedup per prompt, in model-call time (not end to end)")
        # outside the axes, right of them: inside, it covers the bars of the first prompts
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), title="arm")
        ax.grid(alpha=0.3, axis="y")
        path = out / "speedup_per_prompt.png"
        written.append(_save(plt, fig, path))
    quality = summary.get("quality")
    if quality:  # graded runs only
        title = _quality_title(run, quality)
        written.append(
            plot_accuracy_vs_cost(plt, quality, arms, color, out / "accuracy_vs_cost.png", title)
        )
    return written


def _quality_title(run: RunDir, quality: Mapping[str, Mapping[str, Any]]) -> str:
    """What a reader of the plot must know: benchmark, answers graded, model, the MH budget."""
    config = run.resolved_config()
    sampler = config.get("sampler") or {}
    models = {
        str(i.get("model")).rpartition("/")[2]
        for i in (run.run_info().get("engine_identity") or {}).values()
        if isinstance(i, Mapping) and i.get("model")
    }
    graded = sorted({int(q.get("n") or 0) for q in quality.values()})
    n = str(graded[0]) if len(graded) == 1 else f"{graded[0]}-{graded[-1]}"
    budget = (
        f"T = {sampler.get('block_size', '?')} x {sampler.get('num_blocks', '?')}, "
        f"K = {sampler.get('steps_per_block', '?')}, alpha = {sampler.get('alpha', '?')}"
    )
    model = ", ".join(sorted(models)) or "model unknown"
    return f"{config.get('name') or run.path.name}: n = {n} answers per arm; {model}; {budget}"


def plot_accuracy_vs_cost(
    plt: Any,
    quality: Mapping[str, Mapping[str, Any]],
    arms: Sequence[str],
    color: Mapping[str, str],
    path: Any,
    title: str = "",
) -> Any:
    """``accuracy_vs_cost.png``: one point per graded arm, accuracy (95 % Wilson interval as the
    error bar) against compute, the tokens generated per answer (log scale: a baseline's one
    sample and an MH chain differ a hundredfold), each point named; points of nearly equal cost
    are moved apart a little so that none hides another. (Seconds per answer are not a cost
    here: arms sharing a server's slots measure their queueing.)"""
    fig, ax = plt.subplots(figsize=(8, 5))
    order = [a for a in arms if a in quality] + [a for a in quality if a not in arms]
    placed: list[float] = []
    labelled: list[tuple[float, float]] = []
    for arm in order:
        q = quality[arm]
        acc, tokens = q.get("accuracy"), q.get("tokens_per_answer")
        if acc is None or not tokens:
            continue
        x = float(tokens)
        while any(abs(x / p - 1) < DODGE for p in placed):
            x *= 1 + DODGE
        placed.append(x)
        err = [[acc - q["ci95_low"]], [q["ci95_high"] - acc]]
        name = arm.rpartition("/")[2] + (" (approximate)" if arm.endswith("/power_smc") else "")
        ax.errorbar([x], [acc], yerr=err, fmt="o", capsize=4, label=arm, color=color.get(arm, "C0"))
        near = sum(abs(acc - a) < 0.06 and abs(math.log(x / p)) < 0.25 for p, a in labelled)
        labelled.append((x, acc))  # (names of nearby points stacked, not overlaid)
        ax.annotate(
            name, (x, acc), textcoords="offset points", xytext=(6, 4 + 12 * near), fontsize="small"
        )
    ax.set_xscale("log")
    plain = plt.FuncFormatter(lambda v, _: f"{v:,.0f}")  # (not 4x10^1)
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.set_xlabel("tokens generated per answer (log scale)")
    ax.set_ylabel("accuracy (95% Wilson interval)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3, which="both")
    ax.set_title("Accuracy against compute, one point per arm" + (f"\n{title}" if title else ""))
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), title="arm")
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


DODGE = 0.04
"""Points whose costs are within this share of each other are moved apart by it."""
