"""Graded jobs on the reference engine (issue 11): grades stored once, quality per arm."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import graded_helpers
import pytest
from orch_helpers import PROMPTS, make_config

from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import load_job_config
from presto_client.orchestration.job import run_job_async
from presto_client.orchestration.planned import GraderSpec
from presto_client.orchestration.prompts.prompt_rows import load_prompts
from presto_client.orchestration.results import quality
from presto_client.orchestration.results.eval_stats import pass_at_k
from presto_client.reporting.tables import format_summary_table
from tests.support.plans import plan_of

ANSWERS = ["4", "0", "1", "2"]  # the first two match the first token these chains draw


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def graded_config(out: Path, **changes: Any) -> Any:
    return make_config(
        out,
        prompts={"token_ids": PROMPTS, "answers": ANSWERS},
        grader="python: graded_helpers:first_token",
        **changes,
    )


@pytest.fixture
def grader_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the test grader counts its calls (it runs in a process of its own)."""
    path = tmp_path / "grader-calls.jsonl"
    monkeypatch.setenv(graded_helpers.CALLS_ENV, str(path))
    return path


async def test_grades_stored_once_and_summarised(tmp_path: Path, grader_calls: Path) -> None:
    cfg = graded_config(tmp_path / "run", chains_per_prompt=3)
    plan = plan_of(cfg)
    result = await run_job_async(plan)
    samples = lines(tmp_path / "run" / "samples.jsonl")
    assert len(samples) == len(plan.chains) == 4 * 3 * 2
    for s in samples:
        first = str(s["token_ids"][0])
        want = first == ANSWERS[s["prompt_index"]]
        assert s["grade"] == {"correct": want, "extracted": first}
    assert len(graded_helpers.calls()) == len(samples)

    quality = result.summary["quality"]
    assert set(quality) == {"ref/sequential", "ref/crn"}
    for arm, q in quality.items():
        mine = [s for s in samples if s["arm"] == arm]
        k = sum(s["grade"]["correct"] for s in mine)
        assert (q["correct"], q["n"], q["prompts"]) == (k, 12, 4)
        assert q["ci95_low"] < q["accuracy"] == 0.5 < q["ci95_high"]
        assert set(q["pass_at_k"]) == {"1", "2", "3"}
        by_prompt = [
            sum(s["grade"]["correct"] for s in mine if s["prompt_index"] == p) for p in range(4)
        ]
        want2 = sum(pass_at_k(3, c, 2) for c in by_prompt) / 4
        assert q["pass_at_k"]["2"] == pytest.approx(want2)
        assert q["pass_at_k"]["1"] == pytest.approx(q["accuracy"])
        assert q["tokens_per_answer"] > 0
    # crn replays the sequential chain: no discordant pair, McNemar p = 1
    m = quality["ref/crn"]["mcnemar"]
    assert (m["baseline"], m["a_only"], m["b_only"], m["n_pairs"], m["p_value"]) == (
        "ref/sequential",
        0,
        0,
        12,
        1.0,
    )
    assert quality["ref/sequential"]["mcnemar"] is None
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["quality"] == json.loads(json.dumps(quality))
    assert "Answer quality" in format_summary_table(result.summary)

    # a resume grades nothing again and keeps the grades
    grader_calls.unlink()  # noqa: ASYNC240 (a small file, in a test)
    again = await run_job_async(plan_of(graded_config(tmp_path / "run", chains_per_prompt=3)))
    assert again.skipped == len(plan.chains)
    assert graded_helpers.calls() == []
    assert lines(tmp_path / "run" / "samples.jsonl") == samples
    assert again.summary["quality"] == result.summary["quality"]


async def test_ungraded_summary_unchanged(tmp_path: Path) -> None:
    result = await run_job_async(plan_of(make_config(tmp_path / "run")))
    assert "quality" not in result.summary
    assert all("grade" not in s for s in lines(tmp_path / "run" / "samples.jsonl"))
    assert "Answer quality" not in format_summary_table(result.summary)


async def test_prompts_without_answer_are_not_graded(tmp_path: Path) -> None:
    cfg = make_config(
        tmp_path / "run",
        prompts={"token_ids": PROMPTS, "answers": ["0", None, None, None]},
        grader="python: graded_helpers:first_token",
    )
    result = await run_job_async(plan_of(cfg))
    graded = [s for s in lines(tmp_path / "run" / "samples.jsonl") if "grade" in s]
    assert {s["prompt_index"] for s in graded} == {0}
    assert result.summary["quality"]["ref/sequential"]["n"] == 2


def test_answers_from_a_jsonl_file(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text(
        json.dumps({"prompt": "What is 2+2?", "answer": 4})
        + "\n"
        + json.dumps({"prompt": "No answer"})
        + "\n"
    )
    (tmp_path / "job.yaml").write_text(
        "engines: [{kind: embedded}]\nprompts: {file: p.jsonl}\ngrader: math\n"
    )
    cfg = load_job_config(tmp_path / "job.yaml")
    assert cfg.grader is not None and cfg.grader.kind == "math"
    prompts = load_prompts(cfg)
    assert [(p.text, p.answer) for p in prompts] == [("What is 2+2?", "4"), ("No answer", None)]


def test_bad_grader_and_answers_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="answers"):
        load_prompts(make_config(tmp_path / "r", prompts={"token_ids": PROMPTS, "answers": ["1"]}))
    with pytest.raises(Exception, match="grader"):
        make_config(tmp_path / "r", grader="regex: no_group")


async def test_unimportable_python_grader_is_a_config_error(tmp_path: Path) -> None:
    cfg = make_config(
        tmp_path / "run",
        prompts={"token_ids": PROMPTS, "answers": ANSWERS},
        grader="python: no_such_module_for_grading:f",
    )
    with pytest.raises(ConfigError, match="grader"):
        await run_job_async(plan_of(cfg))


async def test_baseline_arms_in_a_graded_job(tmp_path: Path) -> None:
    traversals = ["sequential", "sample", "low_temperature", "greedy"]
    cfg = graded_config(tmp_path / "run", sampler={"traversals": traversals})
    plan = plan_of(cfg)
    result = await run_job_async(plan)
    assert result.completed == len(plan.chains) == 4 * 2 * 4
    samples = lines(tmp_path / "run" / "samples.jsonl")
    # same prompts and seeds in every arm
    seeds = {(s["arm"], s["prompt_index"], s["chain_index"]): s["seed"] for s in samples}
    for (arm, p, c), seed in seeds.items():
        assert seeds[("ref/sequential", p, c)] == seed, arm
    for s in samples:
        if s["traversal"] != "sequential":
            assert s["stats"]["rounds"] == 1 and s["stats"]["transitions"] == 0
            assert len(s["token_ids"]) == 8
    # greedy: one answer per prompt, whatever the seed
    greedy = {}
    for s in samples:
        if s["traversal"] == "greedy":
            assert greedy.setdefault(s["prompt_index"], s["token_ids"]) == s["token_ids"]
    quality = result.summary["quality"]
    assert set(quality) == {f"ref/{t}" for t in traversals}
    for t in traversals[1:]:
        m = quality[f"ref/{t}"]["mcnemar"]
        assert m["baseline"] == "ref/sequential" and m["n_pairs"] == 8
    arms = {a["arm"]: a for a in result.summary["arms"]}
    assert arms["ref/greedy"]["size"] is None
    table = format_summary_table(result.summary)
    assert "ref/low_temperature" in table.split("Answer quality")[1]


def test_the_shipped_graded_example_loads_and_its_answers_grade_right() -> None:
    root = Path(__file__).resolve().parents[2]
    cfg = load_job_config(root / "configs" / "graded.yaml")
    assert cfg.grader is not None and cfg.grader.kind == "math"
    assert {"sequential", "greedy", "low_temperature"} <= set(cfg.sampler.traversals)
    prompts = load_prompts(cfg)
    assert len(prompts) == 40 and all(p.answer is not None for p in prompts)
    from presto_client.orchestration.grading import build_grader

    grader = build_grader(cfg.grader)
    for p in prompts:
        assert p.answer is not None
        assert grader(f"The answer is {p.answer}.", p.answer).correct
        assert not grader(f"The answer is {int(p.answer) + 1}.", p.answer).correct


async def test_report_plots_accuracy_against_cost(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from presto_client.orchestration.run_dir.rundir import RunDir
    from presto_client.reporting.plots import write_plots

    cfg = graded_config(tmp_path / "run", sampler={"traversals": ["sequential", "greedy"]})
    await run_job_async(plan_of(cfg))
    files = write_plots(RunDir(tmp_path / "run"), tmp_path / "plots")
    assert tmp_path / "plots" / "accuracy_vs_cost.png" in files
    assert (tmp_path / "plots" / "accuracy_vs_cost.png").stat().st_size > 1000
    # issue 50: the plot says what it shows (benchmark, answers per arm, budget)
    from presto_client.orchestration.results.summary import summarize_run
    from presto_client.reporting.plots import _quality_title

    run = RunDir(tmp_path / "run")
    title = _quality_title(run, summarize_run(run)["quality"])
    assert title.startswith(f"{cfg.name}: n = 8 answers per arm") and "K = " in title
    # ungraded runs get no such plot
    await run_job_async(plan_of(make_config(tmp_path / "plain")))
    plain = write_plots(RunDir(tmp_path / "plain"), tmp_path / "plain_plots")
    assert all(p.name != "accuracy_vs_cost.png" for p in plain)


async def test_compare_table_shows_answer_quality(tmp_path: Path) -> None:
    from presto_client.orchestration.run_dir.rundir import RunDir
    from presto_client.reporting.compare import format_comparison

    cfg = graded_config(tmp_path / "run", sampler={"traversals": ["sequential", "low_temperature"]})
    result = await run_job_async(plan_of(cfg))
    text = format_comparison(result.summary, RunDir(tmp_path / "run").samples(), "ref/sequential")
    quality = text.split("Answer quality (graded):")[1]
    assert "ref/low_temperature" in quality and "McNemar" in quality
    plain = await run_job_async(plan_of(make_config(tmp_path / "plain")))
    assert "Answer quality" not in format_comparison(plain.summary)


async def test_a_grader_that_hangs_costs_one_grade_not_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 48, item 5: ``--grader 'regex: (.+)+\\d'`` froze a job (0 of 5 chains in 90 s):
    graders ran on the event loop. They run in a process of their own, each answer within a
    limit: a grader that hangs is stopped, its answer graded wrong saying why, and the job's
    other chains are graded as usual."""
    monkeypatch.setattr(quality, "GRADE_LIMIT_S", 1.0)
    cfg = make_config(
        tmp_path / "run",
        prompts={"token_ids": PROMPTS, "answers": ANSWERS},
        grader="python: graded_helpers:sleepy",
        sampler={"traversals": ["sequential"]},
    )
    plan = plan_of(cfg)
    result = await run_job_async(plan)
    assert result.completed == len(plan.chains) and result.failed == 0
    grades = [s["grade"] for s in lines(tmp_path / "run" / "samples.jsonl")]
    assert len(grades) == len(plan.chains)
    hung = [g for g in grades if "error" in g]
    assert hung and all("longer than 1 s" in g["error"] and not g["correct"] for g in hung)
    assert len(hung) < len(grades)  # the others were graded by a fresh process


async def test_a_backtracking_regex_leaves_the_event_loop_free() -> None:
    process = quality.GraderProcess(GraderSpec("regex", pattern=r"(.+)+\d"), limit_s=1.0)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        status, why = await process.grade("a" * 40, "7")  # 2**40 ways to fail
        assert status == "timeout" and "longer than 1 s" in why
        assert ticks > 20  # the loop ran on while the regex did
        status, grade = await process.grade("7", "7")  # a new process: graded as usual
        assert status == "ok" and "correct" in grade
    finally:
        ticker.cancel()
        process.close()


def test_baselines_are_paired_with_power_sampling_where_no_sequential_ran() -> None:
    """Issue 50: McNemar ran only against the engine's ``sequential`` arm, which the ready
    configs lack: every baseline column was empty. The reference is now the engine's power
    sampling arm (``sequential`` where it was graded)."""
    from presto_client.orchestration.results.quality import quality_summary

    def row(arm: str, prompt: int, correct: bool) -> dict[str, Any]:
        return {
            "arm": f"e/{arm}",
            "engine": "e",
            "prompt_index": prompt,
            "chain_index": 0,
            "status": "ok",
            "grade": {"correct": correct, "extracted": str(int(correct))},
            "stats": {"tokens_generated": 10, "model_call_time_s": 1.0},
        }

    stream = [row("stream", p, p < 8) for p in range(10)]
    low = [row("low_temperature", p, p < 3) for p in range(10)]
    quality = quality_summary([*stream, *low])
    versus = quality["e/low_temperature"]["mcnemar"]
    assert versus["baseline"] == "e/stream" and (versus["a_only"], versus["b_only"]) == (0, 5)
    assert quality["e/stream"]["mcnemar"] is None
    from presto_client.reporting.quality_table import format_quality_table

    table = format_quality_table(quality, ["e/stream", "e/low_temperature"])
    assert "reference: e/stream" in table and "+0/-5" in table
    quality["e/low_temperature"]["tokens_per_answer"] = 5.0  # half the MH arm's compute
    rows = format_quality_table(quality, ["e/stream", "e/low_temperature"]).splitlines()
    assert rows[1].split()[:2] == ["arm", "(e)"]  # the one engine, said once
    assert next(r for r in rows if r.startswith("stream ")).split()[-2] == "1.00x"
    assert next(r for r in rows if r.startswith("low_temperature ")).split()[-2] == "0.50x"
    assert "graded by fallback" not in table
    low[0]["grade"]["fallback"] = True  # a lenient grader's last-number answer: counted
    table = format_quality_table(quality_summary([*stream, *low]), ["e/low_temperature"])
    assert "answers graded by fallback (no \\boxed{}: the last number or letter): " in table
    assert "low_temperature 1" in table
    assert max(len(line) for line in table.splitlines()) <= 100
    seq = [row("sequential", p, True) for p in range(10)]
    with_seq = quality_summary([*stream, *low, *seq])
    assert with_seq["e/low_temperature"]["mcnemar"]["baseline"] == "e/sequential"
    assert with_seq["e/stream"]["mcnemar"]["baseline"] == "e/sequential"
    # compare_to (the job's choice) wins over sequential: each baseline against power sampling
    chosen = quality_summary([*stream, *low, *seq], compare_to="stream")
    assert chosen["e/low_temperature"]["mcnemar"]["baseline"] == "e/stream"
    assert chosen["e/sequential"]["mcnemar"]["baseline"] == "e/stream"
    assert chosen["e/stream"]["mcnemar"] is None


async def test_compare_to_chooses_the_reference_arm_and_must_be_run(tmp_path: Path) -> None:
    traversals = ["sequential", "stream", "low_temperature"]
    cfg = graded_config(tmp_path / "run", sampler={"traversals": traversals}, compare_to="stream")
    result = await run_job_async(plan_of(cfg))
    quality = result.summary["quality"]
    assert quality["ref/low_temperature"]["mcnemar"]["baseline"] == "ref/stream"
    assert quality["ref/sequential"]["mcnemar"]["baseline"] == "ref/stream"
    # `presto report` reads the run directory's config: the same reference
    from presto_client.orchestration.results.summary import summarize_run
    from presto_client.orchestration.run_dir.rundir import RunDir

    again = summarize_run(RunDir(tmp_path / "run"))["quality"]
    assert again["ref/low_temperature"]["mcnemar"]["baseline"] == "ref/stream"
    with pytest.raises(ConfigError, match=r"compare_to: 'greedy' is not among sampler\.traversals"):
        graded_config(tmp_path / "x", sampler={"traversals": traversals}, compare_to="greedy")


async def test_a_resume_with_another_grader_is_refused_naming_both(tmp_path: Path) -> None:
    """Issue 50: a resumed run took a new grader silently (old chains kept the old grades, new
    ones got the new grader's). The same grader resumes; another is refused, naming both."""
    cfg = graded_config(tmp_path / "run")
    await run_job_async(plan_of(cfg))
    again = await run_job_async(plan_of(graded_config(tmp_path / "run")))
    assert again.skipped == len(plan_of(cfg).chains)  # the same grader: resumed
    other = make_config(
        tmp_path / "run",
        prompts={"token_ids": PROMPTS, "answers": ANSWERS},
        grader="strict math",
    )
    with pytest.raises(ConfigError, match=r"graded by grader .*python.*grades with .*strict"):
        await run_job_async(plan_of(other))


async def test_report_regrade_grades_every_chain_again_and_keeps_the_grader(
    tmp_path: Path, grader_calls: Path
) -> None:
    """Issue 50: ``presto report RUN --regrade GRADER`` grades a finished run again (the way to
    change a run's grader, since a resume with another one is refused) and records it, so that
    a resume with the new grader goes on."""
    from presto_client.cli import main

    cfg = graded_config(tmp_path / "run")
    first = await run_job_async(plan_of(cfg))
    assert first.summary["quality"]
    out = io.StringIO()
    code = await asyncio.to_thread(
        main, ["report", str(tmp_path / "run"), "--no-plots", "--regrade", "exact"], out=out
    )
    assert code == 0, out.getvalue()
    n = len(plan_of(cfg).chains)
    assert f"{n} chain(s) graded again with exact" in out.getvalue()
    rows = lines(tmp_path / "run" / "samples.jsonl")
    assert all(r["grade"]["extracted"] == " ".join(map(str, r["token_ids"])) for r in rows)
    exact = make_config(
        tmp_path / "run", prompts={"token_ids": PROMPTS, "answers": ANSWERS}, grader="exact"
    )
    again = await run_job_async(plan_of(exact))  # the new grader resumes
    assert again.skipped == n


async def test_a_majority_read_by_the_fallback_is_counted_as_fallback() -> None:
    grader = quality.ChainGrader(GraderSpec("gsm8k"), {0: "7"})
    try:
        grade = await grader.grade(
            0, "so 3 + 4 = 7", [], alternatives=[("7 apples", []), ("8", [])]
        )
    finally:
        grader.close()
    assert grade is not None and grade["correct"] and grade["votes"] == 2
    assert grade["fallback"] is True  # (the table counts it under "graded by fallback")
