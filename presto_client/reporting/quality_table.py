"""The answer-quality table of a graded run: per arm, accuracy, pass@k, maj@k, the paired test
against the reference arm, and the cost of an answer (from
:func:`presto_client.orchestration.results.quality.quality_summary`)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from presto_client.reporting.text_table import MAX_TABLE_WIDTH, render_table


def _maj_k(quality: Mapping[str, Mapping[str, Any]]) -> str:
    ks = {int(q["maj_at_k"]["k"]) for q in quality.values() if q.get("maj_at_k")}
    return str(ks.pop()) if len(ks) == 1 else "k"


def format_quality_table(quality: Mapping[str, Mapping[str, Any]], arm_order: Sequence[str]) -> str:
    """The quality table (one arm a row), in ``arm_order`` then any other graded arm."""

    order = [a for a in arm_order if a in quality] + [a for a in quality if a not in arm_order]
    # (pass@1 is the accuracy; the engine, where all arms share one, is said once)
    ks = sorted({int(k) for q in quality.values() for k in q.get("pass_at_k", {})} - {1})
    engines = {a.rpartition("/")[0] for a in order}
    prefix = f"{engines.pop()}/" if len(engines) == 1 else ""
    header = [f"arm ({prefix[:-1]})" if prefix else "arm", "n", "accuracy\n[95% CI]"]
    header += [f"pass@{k}" for k in ks]
    majority = any(q.get("maj_at_k") for q in quality.values())
    header += [f"maj@{_maj_k(quality)}"] if majority else []
    header += [
        "vs reference\n(+/-, McNemar p)",
        "tokens/\nanswer",
        "compute\nvs ref",
        "call s/\nanswer",
    ]
    reference_of = {a: q["mcnemar"]["baseline"] for a, q in quality.items() if q.get("mcnemar")}
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
        maj = q.get("maj_at_k")
        maj_cells = [] if not majority else ["-" if not maj else f"{100 * maj['accuracy']:.1f}%"]
        ref = quality.get(reference_of.get(arm, arm if arm in reference_of.values() else ""))
        ratio = (
            f"{q['tokens_per_answer'] / ref['tokens_per_answer']:.2f}x"
            if ref and ref.get("tokens_per_answer")
            else "-"
        )
        rows.append(
            [
                arm.removeprefix(prefix),
                str(q.get("n")),
                acc_s,
                *pass_cells,
                *maj_cells,
                vs,
                f"{q['tokens_per_answer']:.1f}",
                ratio,
                f"{q['model_call_time_per_answer_s']:.3f}",
            ]
        )
    references = sorted(
        {str(q["mcnemar"]["baseline"]) for q in quality.values() if q.get("mcnemar")}
    )
    legend = (
        f"\nreference: {', '.join(references)}, paired by prompt and chain (+: right where the "
        "reference\nis wrong, -: the other way); compute vs ref: tokens generated per answer"
        if references
        else ""
    )
    diffs = [
        f"\n  {a}: {100 * q['mcnemar']['diff']:+.1f} [{100 * q['mcnemar']['diff_ci95_low']:+.1f}, "
        f"{100 * q['mcnemar']['diff_ci95_high']:+.1f}]"
        for a in order
        if (q := quality[a]).get("mcnemar") and "diff" in q["mcnemar"]
    ]
    if diffs:
        legend += "\naccuracy vs reference, in points (paired bootstrap, 95%):" + "".join(diffs)
    fell_back = [
        f"{a.removeprefix(prefix)} {q['graded_by_fallback']}"
        for a in order
        if (q := quality[a]).get("graded_by_fallback")
    ]
    notes = []
    if fell_back:
        notes.append(
            "answers graded by fallback (no \\boxed{}: the last number or letter): "
            f"{', '.join(fell_back)}; the grader's strict form ('strict math', ...) reads only "
            "what the reference evaluations read"
        )
    if any(quality[a].get("read_shared_draw") for a in order):
        notes.append(
            "best_of_n and majority_vote read one draw of N samples a chain (paid once; "
            "tokens/answer is the draw's)"
        )
    for note in notes:
        legend += "\n" + "\n".join(textwrap.wrap(note, MAX_TABLE_WIDTH, subsequent_indent="  "))
    return render_table(header, rows) + legend
