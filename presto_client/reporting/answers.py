"""What ``presto run`` prints under its tables: the answers themselves (an excerpt per prompt),
and, where the engine cannot show PreSTO's speed-up, why and where to see it (issue 40)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from presto_client.orchestration.results.summary import BASELINE, samples_power
from presto_client.orchestration.run_dir.rundir import latest_by_chain

ANSWER_CHARS = 240
"""Characters of each answer shown (the rest is in samples.jsonl)."""
ANSWER_PROMPTS = 3
"""Prompts whose answer is shown."""
WIDTH = 100

LATENCY_MODEL_COMMAND = (
    "python -m benchmarks.bench_stream --T 128 --K 16 --prompts 3 "
    "--arms sequential,stream,crn --n-pf auto"
)
"""PreSTO against the latency model of a GPU engine (benchmarks/latency_server.py, ``gpu``
profile): ~25 s on a loaded 2-core machine, stream ~2.9x and crn ~1.8x end to end."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _clip(text: str, limit: int) -> str:
    text = _one_line(text)
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _rank(row: Mapping[str, Any]) -> int:
    """Whose answer is shown first: sequential's, then power sampling's, then a baseline's."""
    traversal = str(row.get("traversal"))
    return 0 if traversal == BASELINE else 1 if samples_power(traversal) else 2


def _extracted(rows: Iterable[Mapping[str, Any]], prompt: int, chain: int) -> list[str]:
    """``arm: answer right|wrong`` of every graded arm's chain ``chain`` of ``prompt``."""
    out = []
    for row in sorted(rows, key=lambda r: (_rank(r), str(r.get("arm")))):
        grade = row.get("grade")
        if row.get("prompt_index") != prompt or row.get("chain_index") != chain:
            continue
        if isinstance(grade, Mapping):
            found = grade.get("extracted")
            shown = "nothing" if found is None else _clip(str(found), 24)
            name = str(row.get("arm")).rpartition("/")[2]
            out.append(f"{name} {shown} {'right' if grade.get('correct') else 'wrong'}")
    return out


def format_answers(
    samples: Iterable[Mapping[str, Any]],
    prompts: Mapping[int, str],
    *,
    limit: int = ANSWER_PROMPTS,
) -> str:
    """The first chain's answer to each of the first ``limit`` prompts, from the sequential arm
    (the one every replaying arm reproduces), else a power-sampling arm (an MH traversal), else
    the first baseline that answered; ``""`` when no chain has text (an engine that does not
    detokenize)."""
    ok = [r for r in latest_by_chain(samples).values() if r.get("status") == "ok"]
    chosen: dict[int, Mapping[str, Any]] = {}
    for row in sorted(
        ok,
        key=lambda r: (_rank(r), int(r.get("chain_index", 0) or 0), str(r.get("arm"))),
    ):
        if isinstance(row.get("text"), str):
            chosen.setdefault(int(row.get("prompt_index", -1)), row)
    if not chosen:
        return ""
    indices = sorted(chosen)
    lines = ["Answers (one chain per prompt; every chain's text is in samples.jsonl):"]
    for i in indices[:limit]:
        row = chosen[i]
        asked = prompts.get(i)
        head = f"prompt {i}" + (f": {_clip(asked, WIDTH - 12)}" if asked else "")
        lines.append(head)
        answer = _clip(str(row["text"]), ANSWER_CHARS) or "(empty)"
        lines.extend(
            textwrap.wrap(
                f"{row.get('arm')}, chain {row.get('chain_index')}: {answer}",
                WIDTH,
                initial_indent="  ",
                subsequent_indent="    ",
                break_long_words=True,
            )
        )
        graded = _extracted(ok, i, int(row.get("chain_index", 0) or 0))
        if graded:  # (each arm's answer to it, as its grader read it)
            lines.extend(
                textwrap.wrap(
                    "answers graded: " + "; ".join(graded),
                    WIDTH,
                    initial_indent="  ",
                    subsequent_indent="    ",
                    break_long_words=True,
                )
            )
    if len(indices) > limit:
        lines.append(f"({len(indices) - limit} more prompt(s) in samples.jsonl)")
    return "\n".join(lines)


def format_cpu_note(summary: Mapping[str, Any], cpu_engines: Sequence[str]) -> str:
    """Why PreSTO's arms cannot beat the sequential chain on ``cpu_engines`` (engines that compute
    on this machine's CPU: llama.cpp as presto builds it), with what they did instead, and the
    command that shows the speed-up where it exists; ``""`` when no PreSTO arm ran on one."""
    arms = [
        a
        for a in summary.get("arms", [])
        if a.get("engine") in cpu_engines and a.get("traversal") != BASELINE
    ]
    if not arms:
        return ""
    rates = [float(a["transitions_per_call"]) for a in arms if a.get("transitions_per_call")]
    did = ""
    if rates:
        low, high = min(rates), max(rates)
        span = f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"
        did = (
            f" (here PreSTO's arms made {span} transitions per engine call, the sequential "
            "chain 1.00, so their speed-ups above are mostly run-to-run noise"
        )
        saved = sum(int(a.get("tokens_saved_early") or 0) for a in arms)
        rejects = sum(int(a.get("early_rejects") or 0) for a in arms)
        if rejects:
            did += (
                f", plus what early rejection saved: {rejects} proposals closed early, "
                f"{saved} tokens"
            )
        did += ")"
    text = (
        "Why no speed-up here: llama.cpp on this machine's CPU is compute-bound, so a "
        "speculative proposal costs as much compute as the chain's own request and slows it; "
        "the engine's speculation budget, which prices that cost, lets few or none go out"
        f"{did}. PreSTO's speed-up needs a latency-bound engine (a GPU, where a decode step "
        "costs about the same for 1 or 64 sequences). To see it without one, run the same "
        "traversals against a model of a GPU engine's latency (benchmarks/latency_server.py; "
        "about 30 s, from the repository):"
    )
    return "\n".join(
        [*textwrap.wrap(text, WIDTH, break_long_words=False), f"  {LATENCY_MODEL_COMMAND}"]
    )
