"""Answer quality per arm: grading finished chains and summarising the grades.

A chain is graded once, when it finishes (:class:`ChainGrader`, used by the job's sink); its
``grade`` (``correct``, ``extracted``) is stored in its samples.jsonl line, so a resumed run never
grades a finished chain again. A grader is user code (a regex, a python function, math-verify on
any text a model wrote): it runs in a process of its own (:class:`GraderProcess`), one answer at a
time within :data:`GRADE_LIMIT_S`, so the job's event loop never waits on it and a grader that
hangs costs one answer's grade, not the job. :func:`quality_summary` turns the graded lines of a
run into, per arm: accuracy with a 95 % Wilson interval, the exact McNemar test against the
baseline arm of the same engine (paired by prompt and chain), unbiased pass@k over the chains of
each prompt, and tokens and model-call time per answer. Runs without grades get no quality section.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from collections.abc import Iterable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

from presto_client.core.methods import traversal_names
from presto_client.orchestration.grading import GraderFn, build_grader
from presto_client.orchestration.planned import GraderSpec
from presto_client.orchestration.results.eval_stats import (
    accuracy,
    mcnemar,
    mean_pass_at_k,
    paired_bootstrap,
)
from presto_client.orchestration.run_dir.rundir import RunDir

log = logging.getLogger(__name__)


GRADE_LIMIT_S = 10.0
"""The longest one answer's grading may take; past it the grader's process is killed (a regex
that backtracks for ever, a function that hangs) and the answer graded wrong, saying why."""


GRADER_START_S = 120.0
"""How long the grader's process may take to start (a loaded machine, math-verify's imports)."""


def _grader_worker(config: GraderSpec, conn: Connection) -> None:
    """The grader's process: (text, reference) in, ``("ok", grade)`` or ``("error", why)`` out."""
    fn = build_grader(config)
    conn.send(("ready", None))
    while True:
        try:
            text, reference = conn.recv()
        except EOFError:  # the job closed its end
            return
        try:
            conn.send(("ok", fn(text, reference).as_dict()))
        except Exception as exc:  # a user grader's bug must not lose the chain
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class GraderProcess:
    """A grader in a process of its own, one answer at a time, each within ``limit_s``.

    Not a thread: a backtracking regex holds the GIL (and so the event loop) for as long as it
    runs, and a thread cannot be stopped. The process starts at the first answer (spawned: a
    fork would copy the job's event loop and threads) and again after one is killed."""

    def __init__(self, config: GraderSpec, limit_s: float | None = None) -> None:
        self.config = config
        self.limit_s = GRADE_LIMIT_S if limit_s is None else limit_s
        self._proc: Any = None
        self._conn: Connection | None = None
        self._lock = asyncio.Lock()

    async def grade(self, text: str, reference: str) -> tuple[str, Any]:
        """``("ok", grade dict)``, ``("error", why)`` or ``("timeout", why)``."""
        async with self._lock:
            if self._conn is None or not self._proc.is_alive():
                problem = await self._start()
                if problem is not None:
                    return "error", problem
            conn = self._conn
            assert conn is not None
            try:
                conn.send((text, reference))
                # (the wait in a thread: the loop goes on meanwhile)
                ready = await asyncio.to_thread(conn.poll, self.limit_s)
                if ready:
                    status, value = conn.recv()
                    return str(status), value
            except asyncio.CancelledError:
                self.close()  # (its answer would be read as the next one's)
                raise
            except (EOFError, OSError) as exc:  # the process died under the answer
                self.close()
                return "error", f"the grader's process ended: {exc or type(exc).__name__}"
            self.close()
            return "timeout", f"grading took longer than {self.limit_s:g} s: stopped"

    async def _start(self) -> str | None:
        """Start the process and wait until its grader is built (its start, imports included,
        is no part of an answer's limit); what went wrong, or ``None``."""
        ctx = multiprocessing.get_context("spawn")
        here, there = ctx.Pipe()
        self._proc = ctx.Process(
            target=_grader_worker, args=(self.config, there), daemon=True, name="presto-grader"
        )
        self._proc.start()
        there.close()
        self._conn = here
        try:
            if await asyncio.to_thread(here.poll, GRADER_START_S) and here.recv()[0] == "ready":
                return None
        except asyncio.CancelledError:
            self.close()
            raise
        except (EOFError, OSError):
            pass
        self.close()
        return f"the grader's process did not start within {GRADER_START_S:g} s"

    def close(self) -> None:
        """Stop the process (a later answer starts another)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None


class ChainGrader:
    """Grades finished chains against their prompt's reference answer (in :attr:`process`)."""

    def __init__(self, config: GraderSpec, answers: Mapping[int, str | None]) -> None:
        self.config = config
        self.fn: GraderFn = build_grader(config)  # (here too: a bad grader is refused at start)
        self.answers = dict(answers)
        self.process = GraderProcess(config)

    def close(self) -> None:
        self.process.close()

    async def grade(
        self,
        prompt_index: int,
        text: str | None,
        token_ids: Sequence[int],
        alternatives: Sequence[tuple[str | None, Sequence[int]]] = (),
    ) -> dict[str, Any] | None:
        """The grade of one finished chain (None when its prompt has no reference answer).

        Engines that serve token ids only (the reference engine) have no text: the grader then
        sees the token ids joined by spaces. With ``alternatives`` (a ``majority_vote`` chain's
        other samples) every answer is graded and the chain is scored by the majority of the
        extracted answers (maj@N; a tie goes to the answer seen first, an answer that extracts
        nothing does not vote); ``votes`` and ``n`` say how it went, ``answer_index`` which answer
        (0: the first, i: alternative i - 1) is the majority's."""
        reference = self.answers.get(prompt_index)
        if reference is None:
            return None
        first = await self._grade_one(prompt_index, text, token_ids, reference)
        if not alternatives:
            return first
        grades = [first] + [
            await self._grade_one(prompt_index, t, ids, reference) for t, ids in alternatives
        ]
        winner = majority(grades)
        if not winner:
            return {**first, "votes": 0, "n": len(grades)}
        return {
            "correct": bool(winner[0].get("correct")),
            "extracted": winner[0].get("extracted"),
            "votes": len(winner),
            "n": len(grades),
            "any_correct": any(bool(g.get("correct")) for g in grades),
            **({"fallback": True} if winner[0].get("fallback") else {}),
            "answer_index": next(i for i, g in enumerate(grades) if g is winner[0]),
        }

    async def _grade_one(
        self, prompt_index: int, text: str | None, token_ids: Sequence[int], reference: str
    ) -> dict[str, Any]:
        answer_text = text if text is not None else " ".join(str(t) for t in token_ids)
        status, value = await self.process.grade(answer_text, reference)
        if status == "ok":
            return dict(value)
        log.warning("grader %s failed on prompt %d: %s", self.config.label(), prompt_index, value)
        return {"correct": False, "extracted": None, "error": str(value)}


def answers_of(
    token_ids: Sequence[Sequence[int]], texts: Sequence[str | None] | None
) -> list[tuple[str | None, Sequence[int]]]:
    """A chain's further answers as ``(text, token ids)`` pairs for its grader."""
    return [
        (texts[i] if texts is not None and i < len(texts) else None, ids)
        for i, ids in enumerate(token_ids)
    ]


def graded_answer_first(row: dict[str, Any]) -> None:
    """A sample line whose grade read another of its answers (a majority vote's majority) holds
    that answer as its ``text`` and ``token_ids``, the first among its alternatives instead: the
    stored answer is the one graded."""
    index = int((row.get("grade") or {}).get("answer_index") or 0)
    if not index:
        return
    i = index - 1
    row["token_ids"], row["alternatives"][i] = row["alternatives"][i], row["token_ids"]
    texts = row.get("alternative_texts")
    if texts is not None:
        row["text"], texts[i] = texts[i], row["text"]


async def regrade_run(run: RunDir, grader: str) -> int:
    """Grade every finished chain of ``run`` again with ``grader`` (against the answers of its
    config's prompts) and record that grader in its config, so that a resume keeps it; returns
    how many chains were graded (``presto report --regrade``)."""
    from presto_client.orchestration.config.loading import load_job_data
    from presto_client.orchestration.grading import GraderConfig
    from presto_client.orchestration.prompts.prompt_rows import load_prompts

    spec = GraderConfig.model_validate(grader)
    data = {**run.resolved_config(), "grader": spec.model_dump(mode="json")}
    cfg = load_job_data(dict(data), source=str(run.path), base=run.path, name=run.path.name)
    chain_grader = ChainGrader(spec.to_spec(), {p.index: p.answer for p in load_prompts(cfg)})
    rows = run.samples()
    graded = 0
    try:
        for row in rows:
            if row.get("status") != "ok" or "token_ids" not in row:
                continue
            alternatives = answers_of(row.get("alternatives") or (), row.get("alternative_texts"))
            grade = await chain_grader.grade(
                int(row["prompt_index"]), row.get("text"), row["token_ids"], alternatives
            )
            row.pop("grade", None)
            if grade is not None:
                row["grade"] = grade
                graded_answer_first(row)
                graded += 1
    finally:
        chain_grader.close()
    run.rewrite_samples(rows, data)
    return graded


def _pass_ks(max_n: int) -> list[int]:
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= max_n]
    if max_n not in ks and max_n >= 1:
        ks.append(max_n)
    return ks


def quality_summary(
    rows: Iterable[Mapping[str, Any]],
    *,
    baseline: str = "sequential",
    compare_to: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Per arm: accuracy, Wilson CI, McNemar vs the engine's reference arm, pass@k, cost per
    answer. The reference is ``{engine}/{compare_to}`` (the job's choice), else
    ``{engine}/{baseline}`` where it was graded, else the engine's first power-sampling arm (an
    MH traversal): the ready configs run ``stream`` beside the baselines and no ``sequential``
    (which ``stream`` replays token for token), so each baseline is tested against power
    sampling, paired by prompt and chain.

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
    mh = set(traversal_names())
    reference: dict[str, str] = {}  # engine -> its reference arm
    for arm in graded:
        engine, traversal = engines[arm], arm.rpartition("/")[2]
        if compare_to is not None:
            if traversal == compare_to:
                reference[engine] = arm
        elif traversal == baseline or (traversal in mh and engine not in reference):
            reference[engine] = arm
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
        base_arm = reference.get(engines[arm], "")
        versus: dict[str, Any] | None = None
        if base_arm != arm and base_arm in graded:
            base = graded[base_arm]
            keys = sorted(k for k in by_key if k in base)
            if keys:
                base_correct = [bool(base[k]["grade"].get("correct")) for k in keys]
                mine = [correct[k] for k in keys]
                test = mcnemar(mine, base_correct)
                diff, low, high = paired_bootstrap(mine, base_correct)
                versus = {"baseline": base_arm, **test.as_dict(), "diff": diff}
                versus.update(diff_ci95_low=low, diff_ci95_high=high)
        n_correct = sum(correct.values())
        fallback = sum(bool(r["grade"].get("fallback")) for r in by_key.values())
        out[arm] = {
            **acc.as_dict(),
            "prompts": len(per_prompt),
            "pass_at_k": pass_at,
            "maj_at_k": _majority_over_chains(by_key) if max_n > 1 else None,
            "tokens_per_answer": sum(tokens) / len(tokens),
            "model_call_time_per_answer_s": sum(times) / len(times),
            "tokens_per_correct": sum(tokens) / n_correct if n_correct else None,
            "model_call_time_per_correct_s": sum(times) / n_correct if n_correct else None,
            "mcnemar": versus,
            "graded_by_fallback": fallback,
            "read_shared_draw": sum(
                bool((r.get("stats") or {}).get("shared_draw")) for r in by_key.values()
            ),
        }
    return out


def majority(grades: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The grades of the most frequent extracted answer (a tie goes to the answer seen first;
    a grade that extracted nothing does not vote); empty when none extracted anything."""
    votes: dict[str, list[Mapping[str, Any]]] = {}
    for grade in grades:
        if grade.get("extracted") is not None:
            votes.setdefault(str(grade["extracted"]), []).append(grade)
    return max(votes.values(), key=len) if votes else []  # max keeps the first of equals


def _majority_over_chains(by_key: Mapping[tuple[int, int], Mapping[str, Any]]) -> dict[str, Any]:
    """maj@k over the chains of each prompt: the share of prompts whose most frequent extracted
    answer among their chains is correct (a tie goes to the answer of the lowest chain index;
    chains that extract nothing do not vote; a prompt where none extracts counts as wrong)."""
    prompts: dict[int, list[tuple[int, Mapping[str, Any]]]] = {}
    for (p, c), r in by_key.items():
        prompts.setdefault(p, []).append((c, r["grade"]))
    right = 0
    k = 0
    for chains in prompts.values():
        chains.sort(key=lambda item: item[0])
        k = max(k, len(chains))
        winner = majority([grade for _, grade in chains])
        if winner:
            right += bool(winner[0].get("correct"))
    return {"k": k, "accuracy": right / len(prompts) if prompts else None}


def make_chain_grader(
    config: GraderSpec | None, answers: Mapping[int, str | None]
) -> ChainGrader | None:
    """The job's grader (None without a ``grader``); raises ValueError for a bad python grader."""
    if config is None:
        return None
    if not any(a is not None for a in answers.values()):
        log.warning("grader %s is configured but no prompt has an answer", config.label())
    return ChainGrader(config, answers)
