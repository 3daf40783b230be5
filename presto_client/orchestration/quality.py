"""Answer quality per arm: grading finished chains and summarising the grades.

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
from presto_client.orchestration.grading import GraderFn, build_grader
from presto_client.orchestration.planned import GraderSpec

log = logging.getLogger(__name__)


class ChainGrader:
    """Grades finished chains against their prompt's reference answer."""

    def __init__(self, config: GraderSpec, answers: Mapping[int, str | None]) -> None:
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


def make_chain_grader(
    config: GraderSpec | None, answers: Mapping[int, str | None]
) -> ChainGrader | None:
    """The job's grader (None without a ``grader``); raises ValueError for a bad python grader."""
    if config is None:
        return None
    if not any(a is not None for a in answers.values()):
        log.warning("grader %s is configured but no prompt has an answer", config.label())
    return ChainGrader(config, answers)
