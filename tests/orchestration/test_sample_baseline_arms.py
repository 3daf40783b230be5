"""The sampling baselines as arms of a graded job: same prompts and seeds as the MH arms, a
majority vote scored by its majority, and the cost figures of the quality table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orch_helpers import PROMPTS, make_config

from presto_client.orchestration.job import run_job_async
from tests.support.plans import plan_of

ANSWERS = ["4", "0", "1", "2"]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_sampling_baselines_run_beside_the_mh_arms_and_are_graded(tmp_path: Path) -> None:
    cfg = make_config(
        tmp_path / "run",
        prompts={"token_ids": PROMPTS, "answers": ANSWERS},
        grader="python: graded_helpers:first_token",
        chains_per_prompt=2,
        sampler={
            "traversals": ["sequential", "best_of_n", "majority_vote", "power_smc"],
            "samples": 5,
            "num_blocks": 2,
            "block_size": 4,
        },
    )
    result = await run_job_async(plan_of(cfg))
    samples = lines(tmp_path / "run" / "samples.jsonl")
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        by_arm.setdefault(s["arm"], []).append(s)
    assert set(by_arm) == {"ref/sequential", "ref/best_of_n", "ref/majority_vote", "ref/power_smc"}
    for s in by_arm["ref/majority_vote"]:
        assert s["status"] == "ok" and len(s["alternatives"]) == 4
        answers = [s["token_ids"], *s["alternatives"]]
        firsts = [str(a[0]) for a in answers]
        top = max(set(firsts), key=lambda f: (firsts.count(f), -firsts.index(f)))
        grade = s["grade"]
        assert grade["n"] == 5 and grade["votes"] == firsts.count(top)
        assert grade["extracted"] == top
        assert grade["correct"] == (top == ANSWERS[s["prompt_index"]])
        # The stored answer is the one the grade read (issue 50: it was the first sample's).
        assert firsts[0] == grade["extracted"]
    for s in by_arm["ref/best_of_n"]:
        assert s["stats"]["requests_issued"] == 5 * 2 and "alternatives" not in s
    quality = result.summary["quality"]
    for arm in by_arm:
        q = quality[arm]
        assert q["maj_at_k"]["k"] == 2  # two chains a prompt
        if q["correct"]:
            assert q["tokens_per_correct"] == q["tokens_per_answer"] * q["n"] / q["correct"]
    # Five samples cost about five single answers: the table says so.
    sequential_tokens = quality["ref/sequential"]["tokens_per_answer"]
    assert quality["ref/best_of_n"]["tokens_per_answer"] == 5 * 8
    assert sequential_tokens > 8

    from presto_client.reporting.tables import format_summary_table

    table = format_summary_table(result.summary)
    assert "best_of_n" in table and "power_smc" in table


async def test_a_job_with_best_of_n_and_majority_vote_pays_for_one_draw(tmp_path: Path) -> None:
    def job(name: str, traversals: list[str]) -> Any:
        return make_config(
            tmp_path / name,
            prompts={"token_ids": PROMPTS, "answers": ANSWERS},
            grader="python: graded_helpers:first_token",
            chains_per_prompt=2,
            sampler={"traversals": traversals, "samples": 4, "num_blocks": 2, "block_size": 4},
        )

    await run_job_async(plan_of(job("both", ["best_of_n", "majority_vote"])))
    for arm in ("best_of_n", "majority_vote"):
        await run_job_async(plan_of(job(arm, [arm])))
    both = {
        (s["arm"], s["prompt_index"], s["chain_index"]): s
        for s in lines(tmp_path / "both" / "samples.jsonl")
    }
    calls = [r for r in lines(tmp_path / "both" / "records.jsonl") if r.get("kind") == "propose"]
    alone_calls = 0
    for arm in ("best_of_n", "majority_vote"):
        for s in lines(tmp_path / arm / "samples.jsonl"):
            mine = both[(s["arm"], s["prompt_index"], s["chain_index"])]
            assert mine["token_ids"] == s["token_ids"] and mine["grade"] == s["grade"]
            assert mine.get("alternatives") == s.get("alternatives")
            assert mine["stats"]["tokens_generated"] == s["stats"]["tokens_generated"]
        alone_calls += sum(
            r.get("kind") == "propose" for r in lines(tmp_path / arm / "records.jsonl")
        )
    # The engine calls of one draw per chain, not two; each chain's second arm read it.
    assert len(calls) * 2 == alone_calls
    shared = [s["stats"]["shared_draw"] for s in both.values()]
    assert sum(shared) == len(PROMPTS) * 2 == len(shared) // 2
    from presto_client.orchestration.results.quality import quality_summary
    from presto_client.reporting.quality_table import format_quality_table

    quality = quality_summary(both.values())
    assert (
        quality["ref/best_of_n"]["read_shared_draw"]
        + quality["ref/majority_vote"]["read_shared_draw"]
        == len(PROMPTS) * 2
    )
    assert "read one draw of N samples a chain (paid once" in format_quality_table(quality, [])
