"""Answer quality per arm (issue 11): grading finished chains and summarising the grades.

A chain is graded once, when it finishes (:class:`ChainGrader`, used by the job's sink); its
``grade`` (``correct``, ``extracted``) is stored in its samples.jsonl line, so a resumed run never
grades a finished chain again. :func:`quality_summary` turns the graded lines of a run into, per
arm: accuracy with a 95 % Wilson interval, the exact McNemar test against the baseline arm of the
same engine (paired by prompt and chain), unbiased pass@k over the chains of each prompt, and
tokens and model-call time per answer. Runs without grades get no quality section.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from presto_client.orchestration.eval_stats import accuracy, mcnemar, mean_pass_at_k
from presto_client.orchestration.grading import GraderConfig, GraderFn, build_grader

log = logging.getLogger(__name__)


class ChainGrader:
    """Grades finished chains against their prompt's reference answer."""

    def __init__(self, config: GraderConfig, answers: Mapping[int, str | None]) -> None:
        self.config = config
        self.fn: GraderFn = build_grader(config)
        self.answers = dict(answers)

    def grade(
        self, prompt_index: int, text: str | None, token_ids: Sequence[int]
    ) -> dict[str, Any] | None:
        """The grade of one finished chain (None when its prompt has no reference answer).

        Engines that serve token ids only (the reference engine) have no text: the grader then
        sees the token ids joined by spaces."""
        reference = self.answers.get(prompt_index)
        if reference is None:
            return None
        answer_text = text if text is not None else " ".join(str(t) for t in token_ids)
        try:
            return self.fn(answer_text, reference).as_dict()
        except Exception as exc:  # a user grader's bug must not lose the chain
            log.warning("grader %s failed on prompt %d: %s", self.config.label(), prompt_index, exc)
            return {"correct": False, "extracted": None, "error": f"{type(exc).__name__}: {exc}"}


def _pass_ks(max_n: int) -> list[int]:
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= max_n]
    if max_n not in ks and max_n >= 1:
        ks.append(max_n)
    return ks


def quality_summary(
    rows: Iterable[Mapping[str, Any]], *, baseline: str = "sequential"
) -> dict[str, dict[str, Any]]:
    """Per arm: accuracy, Wilson CI, McNemar vs ``{engine}/{baseline}``, pass@k, cost per answer.

    ``rows`` are the latest sample line of each chain; only ok chains with a ``grade`` count.
    Empty when no chain is graded."""
    graded: dict[str, dict[tuple[int, int], Mapping[str, Any]]] = {}
    engines: dict[str, str] = {}
    for r in rows:
        if r.get("status") != "ok" or not isinstance(r.get("grade"), Mapping):
            continue
        arm = str(r.get("arm"))
        engines[arm] = str(r.get("engine"))
        key = (int(r.get("prompt_index", -1)), int(r.get("chain_index", -1)))
        graded.setdefault(arm, {})[key] = r
    out: dict[str, dict[str, Any]] = {}
    for arm, by_key in graded.items():
        correct = {k: bool(r["grade"].get("correct")) for k, r in by_key.items()}
        acc = accuracy(correct.values())
        per_prompt: dict[int, list[bool]] = {}
        for (p, _), ok in correct.items():
            per_prompt.setdefault(p, []).append(ok)
        max_n = max(len(v) for v in per_prompt.values())
        pass_at = {
            str(k): mean_pass_at_k(((len(v), sum(v)) for v in per_prompt.values()), k)
            for k in _pass_ks(max_n)
        }
        tokens = [
            float((r.get("stats") or {}).get("tokens_generated") or 0) for r in by_key.values()
        ]
        times = [
            float((r.get("stats") or {}).get("model_call_time_s") or 0) for r in by_key.values()
        ]
        base_arm = f"{engines[arm]}/{baseline}"
        versus: dict[str, Any] | None = None
        if base_arm != arm and base_arm in graded:
            base = graded[base_arm]
            keys = sorted(k for k in by_key if k in base)
            if keys:
                base_correct = [bool(base[k]["grade"].get("correct")) for k in keys]
                test = mcnemar([correct[k] for k in keys], base_correct)
                versus = {"baseline": base_arm, **test.as_dict()}
        out[arm] = {
            **acc.as_dict(),
            "prompts": len(per_prompt),
            "pass_at_k": pass_at,
            "tokens_per_answer": sum(tokens) / len(tokens),
            "model_call_time_per_answer_s": sum(times) / len(times),
            "mcnemar": versus,
        }
    return out


def format_quality_table(quality: Mapping[str, Mapping[str, Any]], arm_order: Sequence[str]) -> str:
    """The quality table (one arm a row), in ``arm_order`` then any other graded arm."""
    from presto_client.orchestration.summary import render_table

    order = [a for a in arm_order if a in quality] + [a for a in quality if a not in arm_order]
    ks = sorted({int(k) for q in quality.values() for k in q.get("pass_at_k", {})})
    header = ["arm", "graded", "accuracy [95% CI]", *(f"pass@{k}" for k in ks)]
    header += ["vs baseline (+/-, McNemar p)", "tokens/answer", "call s/answer"]
    rows = []
    for arm in order:
        q = quality[arm]
        acc = q.get("accuracy")
        acc_s = (
            "-"
            if acc is None
            else f"{100 * acc:.1f}% [{100 * q['ci95_low']:.1f}, {100 * q['ci95_high']:.1f}]"
        )
        pass_cells = []
        for k in ks:
            v = q.get("pass_at_k", {}).get(str(k))
            pass_cells.append("-" if v is None else f"{100 * v:.1f}%")
        m = q.get("mcnemar")
        vs = "-" if not m else f"+{m['a_only']}/-{m['b_only']}, p={m['p_value']:.3g}"
        rows.append(
            [
                arm,
                str(q.get("n")),
                acc_s,
                *pass_cells,
                vs,
                f"{q['tokens_per_answer']:.1f}",
                f"{q['model_call_time_per_answer_s']:.3f}",
            ]
        )
    return render_table(header, rows)


def make_chain_grader(
    config: GraderConfig | None, answers: Mapping[int, str | None]
) -> ChainGrader | None:
    """The job's grader (None without a ``grader``); raises ValueError for a bad python grader."""
    if config is None:
        return None
    if not any(a is not None for a in answers.values()):
        log.warning("grader %s is configured but no prompt has an answer", config.label())
    return ChainGrader(config, answers)


def plot_accuracy_vs_cost(
    plt: Any,
    quality: Mapping[str, Mapping[str, Any]],
    arms: Sequence[str],
    color: Mapping[str, str],
    path: Any,
) -> Any:
    """``accuracy_vs_cost.png``: one point per graded arm, accuracy (95 % Wilson interval as the
    error bar) against model-call time per answer; each point labelled with its tokens/answer."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    order = [a for a in arms if a in quality] + [a for a in quality if a not in arms]
    for arm in order:
        q = quality[arm]
        acc = q.get("accuracy")
        if acc is None:
            continue
        x = float(q["model_call_time_per_answer_s"])
        err = [[acc - q["ci95_low"]], [q["ci95_high"] - acc]]
        ax.errorbar([x], [acc], yerr=err, fmt="o", capsize=4, label=arm, color=color.get(arm, "C0"))
        ax.annotate(
            f"{q['tokens_per_answer']:.0f} tok",
            (x, acc),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize="small",
        )
    ax.set_xlabel("model-call time per answer, s")
    ax.set_ylabel("accuracy (95% Wilson interval)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Accuracy against cost")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
