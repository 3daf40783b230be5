"""What ``presto run`` prints under its tables (issue 40): the answers' text, one chain per
prompt, and on llama.cpp as presto builds it (this machine's CPU) why PreSTO is not faster
there and the command that shows its speed-up."""

from __future__ import annotations

from typing import Any

from presto_client.reporting.answers import (
    LATENCY_MODEL_COMMAND,
    format_answers,
    format_cpu_note,
)


def _row(traversal: str, prompt: int, chain: int, text: str | None, **kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "chain_id": f"e/{traversal}/p{prompt}/c{chain}",
        "arm": f"e/{traversal}",
        "engine": "e",
        "traversal": traversal,
        "prompt_index": prompt,
        "chain_index": chain,
        "status": "ok",
        "text": text,
    }
    row.update(kw)
    return row


def test_the_answers_are_the_sequential_chains_first_then_clipped() -> None:
    long = "word " * 200
    samples = [
        _row("stream", 0, 0, "stream's answer"),
        _row("sequential", 0, 1, "second chain"),
        _row("sequential", 0, 0, "391.\n\n  Step one:   17 x 20"),
        _row("sequential", 1, 0, long),
        _row("sequential", 2, 0, None, status="failed"),
        _row("stream", 2, 0, "only the stream arm answered"),
        _row("sequential", 3, 0, "a"),
        _row("sequential", 4, 0, "b"),
    ]
    text = format_answers(samples, {0: "What is 17 times 23?", 1: "Why?"})
    lines = text.splitlines()
    assert lines[0].startswith("Answers")
    assert lines[1] == "prompt 0: What is 17 times 23?"
    assert lines[2] == "  e/sequential, chain 0: 391. Step one: 17 x 20"  # whitespace folded
    assert "prompt 1: Why?" in lines
    assert "..." in text and len(text) < 1000  # the long answer is clipped
    assert "  e/stream, chain 0: only the stream arm answered" in lines
    assert lines[-1] == "(2 more prompt(s) in samples.jsonl)"
    assert max(len(line) for line in lines) <= 100


def test_no_text_no_answers() -> None:
    assert format_answers([_row("sequential", 0, 0, None)], {}) == ""


def _arm(traversal: str, engine: str = "llamacpp", **kw: Any) -> dict[str, Any]:
    return {
        "arm": f"{engine}/{traversal}",
        "engine": engine,
        "traversal": traversal,
        "transitions_per_call": 1.0,
        **kw,
    }


def test_the_cpu_note_says_why_and_where_the_speedup_is() -> None:
    stream = _arm("stream", transitions_per_call=1.09, early_rejects=10, tokens_saved_early=22)
    summary = {"arms": [_arm("sequential"), stream, _arm("crn")]}
    note = format_cpu_note(summary, ["llamacpp"])
    said = " ".join(note.split())
    assert "compute-bound" in said and "latency-bound" in said
    assert "made 1.00-1.09 transitions per engine call" in said
    assert "10 proposals closed early, 22 tokens" in said
    assert note.splitlines()[-1].strip() == LATENCY_MODEL_COMMAND
    assert max(len(line) for line in note.splitlines()) <= 120
    alike = " ".join(format_cpu_note({"arms": [_arm("crn")]}, ["llamacpp"]).split())
    assert "made 1.00 transitions per engine call" in alike and "closed early" not in alike
    # A server of your own (base_url: maybe a GPU), or only the baseline: nothing to explain.
    assert format_cpu_note(summary, []) == ""
    assert format_cpu_note({"arms": [_arm("sequential")]}, ["llamacpp"]) == ""


def test_the_latency_model_command_parses() -> None:
    from benchmarks.bench_stream import build_parser

    args = build_parser().parse_args(LATENCY_MODEL_COMMAND.split()[3:])
    assert args.profile == "gpu" and args.T == 128 and args.K == 16


def test_the_answers_are_power_samplings_where_no_sequential_ran() -> None:
    """Issue 50: a ready config's run (stream beside the baselines, no sequential) printed
    best_of_n's answers, first by name; power sampling's come first now."""
    samples = [
        _row("best_of_n", 0, 0, "a baseline's answer"),
        _row("low_temperature", 0, 0, "another baseline's"),
        _row("stream", 0, 0, "power sampling's answer"),
    ]
    text = format_answers(samples, {0: "Q?"})
    assert "e/stream, chain 0: power sampling's answer" in text
    assert "best_of_n" not in text


def test_each_arms_graded_answer_is_printed_under_the_shown_one() -> None:
    """Issue 50: the extracted answer of each arm, as its grader read it, beside the text."""
    samples = [
        _row("stream", 0, 0, "so \\boxed{5}", grade={"correct": True, "extracted": "5"}),
        _row("best_of_n", 0, 0, "7", grade={"correct": False, "extracted": "7"}),
        _row("sample", 0, 0, "no idea", grade={"correct": False, "extracted": None}),
        _row("stream", 0, 1, "\\boxed{6}", grade={"correct": False, "extracted": "6"}),
    ]
    text = format_answers(samples, {0: "2+3?"})
    assert "answers graded: stream 5 right; best_of_n 7 wrong; sample nothing wrong" in text
    assert "6" not in text.split("answers graded:")[1]  # chain 0's, the one shown
