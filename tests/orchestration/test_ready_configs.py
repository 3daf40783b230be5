"""The ready benchmark configs (issue 37): each validates here without the network, and each one's
prompt, answer normalisation and grader are right on rows written here in its dataset's shape
(run through the same loader, pointed at a local copy as a user without the Hub would)."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest

from presto_client.cli import build_parser, main
from presto_client.cli_quick_run import load, ready_configs
from presto_client.errors import ConfigError
from presto_client.orchestration.grading import build_grader
from presto_client.orchestration.planned import Prompt
from presto_client.orchestration.prompts.prompt_rows import load_prompts

READY = ["aime2024", "aime2025", "gpqa_diamond", "gsm8k", "math500"]
RWS_SUFFIX = " Please reason step by step, and put your final answer within \\boxed{}."


def test_the_ready_configs_are_found() -> None:
    assert sorted(ready_configs()) == READY


@pytest.mark.parametrize("name", READY)
def test_each_validates_without_the_network(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = io.StringIO()
    assert main(["validate", name, "-o", str(tmp_path / "run")], out=out) == 0
    text = out.getvalue()
    assert f"{name}: valid" in text
    assert "block_size=192 num_blocks=16 K=10" in text and "alpha=4.0" in text
    assert "stop_at_eos=true" in text
    assert "is not cached here: it will be downloaded when the job runs" in text


def ready(name: str, rows: list[dict[str, Any]], tmp_path: Path, *flags: str) -> list[Prompt]:
    """The ready config ``name`` on a local copy of its dataset (``--dataset FILE``)."""
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parser = build_parser()
    args = parser.parse_args(["run", name, "--dataset", str(path), *flags])
    return load_prompts(load(args, []))


def grade(name: str, completion: str, reference: str) -> bool:
    args = build_parser().parse_args(["run", name])
    cfg = load(args, [])
    assert cfg.grader is not None
    return build_grader(cfg.grader)(completion, reference).correct


def test_math500(tmp_path: Path) -> None:
    rows = [
        {
            "problem": "Convert the point $(0,3)$ to polar coordinates.",
            "solution": "... $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
            "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
            "subject": "Precalculus",
            "level": 2,
            "unique_id": "test/precalculus/807.json",
        }
    ]
    (p,) = ready("math500", rows, tmp_path)
    assert p.text == (
        "Can you solve the following math problem? Convert the point $(0,3)$ to polar "
        "coordinates." + RWS_SUFFIX
    )
    assert p.answer == rows[0]["answer"]
    assert grade("math500", "So it is \\boxed{(3, \\frac{\\pi}{2})}.", p.answer)
    assert not grade("math500", "So it is \\boxed{(3, \\pi)}.", p.answer)


def test_gsm8k(tmp_path: Path) -> None:
    rows = [
        {
            "question": "Natalia sold clips to 48 of her friends in April, and then she sold "
            "half as many clips in May. How many clips did Natalia sell altogether?",
            "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
            "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
        }
    ]
    (p,) = ready("gsm8k", rows, tmp_path)
    assert p.text == rows[0]["question"] + "\n" + RWS_SUFFIX.lstrip()
    assert p.answer is not None and p.answer.endswith("#### 72")
    assert grade("gsm8k", "48 + 24 = 72, so \\boxed{72}", p.answer)
    assert not grade("gsm8k", "\\boxed{24}", p.answer)


@pytest.mark.parametrize("name", ["aime2024", "aime2025"])
def test_aime(name: str, tmp_path: Path) -> None:
    # HuggingFaceH4/aime_2024 holds answers as text ("033"); MathArena/aime_2025 as integers
    rows = [
        {"id": 60, "problem": "Find $m+n$.", "answer": "033", "url": "x", "year": "2024"},
        {"problem_idx": 1, "problem": "Find the sum of all bases.", "answer": 70},
    ]
    got = ready(name, rows, tmp_path)
    assert got[0].text == "Can you solve the following math problem? Find $m+n$." + RWS_SUFFIX
    assert [p.answer for p in got] == ["033", "70"]
    assert grade(name, "... \\boxed{33}", "033") and grade(name, "\\boxed{070}", "70")
    assert not grade(name, "\\boxed{33.5}", "033") and not grade(name, "\\boxed{71}", "70")


def test_gpqa_diamond(tmp_path: Path) -> None:
    rows = [
        {
            "Question": f"Which particle is a lepton? ({i})",
            "Correct Answer": "electron",
            "Incorrect Answer 1": "proton",
            "Incorrect Answer 2": "neutron",
            "Incorrect Answer 3": "pion",
            "Subdomain": "Physics",
        }
        for i in range(8)
    ]
    got = ready("gpqa_diamond", rows, tmp_path)
    head = (
        "Answer the following multiple choice question. The last line of your response should "
        "be of the following format: '\\boxed{$LETTER}' (without quotes) where LETTER is one of "
        "ABCD (ex. '\\boxed{A}'). Think step by step before answering.\n\n"
    )
    letters = set()
    for i, p in enumerate(got):
        assert p.text is not None and p.text.startswith(head + f"Which particle is a lepton? ({i})")
        options = p.text.split("\n\n")[-1].split("\n")
        assert [o[:3] for o in options] == ["A) ", "B) ", "C) ", "D) "]
        assert f"{p.answer}) electron" in options
        letters.add(p.answer)
        assert p.answer is not None
        assert grade("gpqa_diamond", f"... so \\boxed{{{p.answer}}}", p.answer)
        wrong = next(x for x in "ABCD" if x != p.answer)
        assert not grade("gpqa_diamond", f"\\boxed{{{wrong}}}", p.answer)
    assert len(letters) > 1  # the options are shuffled
    assert [p.text for p in ready("gpqa_diamond", rows, tmp_path)] == [p.text for p in got]


def test_flags_change_a_ready_config(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "run",
            "math500",
            "--base-url",
            "http://gpu:8000",
            "--model",
            "Qwen/Qwen2.5-Math-7B",
            "--num-prompts",
            "50",
            "--alpha",
            "2",
            "--traversal",
            "sequential,stream",
            "--chat-template",
        ]
    )
    cfg = load(args, ["sampler.steps_per_block=4"])
    engine: Any = cfg.engines[0]
    assert engine.base_url == "http://gpu:8000" and engine.model == "Qwen/Qwen2.5-Math-7B"
    assert cfg.prompts.limit == 50 and cfg.prompts.chat_template
    assert cfg.sampler.alpha == 2 and cfg.sampler.traversals == ["sequential", "stream"]
    assert cfg.sampler.steps_per_block == 4 and cfg.sampler.block_size == 192
    assert cfg.prompts.dataset is not None and cfg.prompts.dataset.name == "HuggingFaceH4/MATH-500"


def test_a_hub_dataset_with_a_ready_config_runs_it() -> None:
    args = build_parser().parse_args(["run", "--dataset", "openai/gsm8k", "--base-url", "http://g"])
    cfg = load(args, [])
    assert cfg.name == "gsm8k" and cfg.grader is not None and cfg.grader.kind == "gsm8k"
    assert cfg.prompts.dataset is not None and cfg.prompts.dataset.config == "main"


def test_unknown_names_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"nor a ready benchmark config \(ready: aime2024"):
        load(build_parser().parse_args(["run", "math600"]), [])
    with pytest.raises(ConfigError, match="give a CONFIG"):
        load(argparse.Namespace(config=None, dataset=None), [])


def test_a_researchers_first_commands_mean_what_they_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 46: a relative ``--dataset`` is where the user is (it was the packaged config's
    folder); ``--field`` over a ready config's template replaces it, saying so (the template
    won silently); ``--set prompts.template={problem}`` is text (YAML read a mapping)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g2.jsonl").write_text(json.dumps({"question": "What is 2+2?", "answer": "4"}))
    parser = build_parser()
    args = parser.parse_args(["run", "gsm8k", "--dataset", "g2.jsonl", "--field", "question"])
    with caplog.at_level("INFO", logger="presto_client.progress"):
        prompts = load_prompts(load(args, []))
    assert [p.text for p in prompts] == ["What is 2+2?"]
    assert "--field question replaces the config's prompts.template" in caplog.text
    args = parser.parse_args(["run", "gsm8k", "--dataset", "g2.jsonl"])
    cfg = load(args, ["prompts.template=Q: {question}"])
    assert load_prompts(cfg)[0].text == "Q: What is 2+2?"
    cfg = load(args, ["prompts.template={question}"])
    assert cfg.prompts.template == "{question}" and load_prompts(cfg)[0].text == "What is 2+2?"


def test_samples_auto_matches_one_mh_chains_compute() -> None:
    """Issue 50: the ready configs' ``samples: 8`` is ~5x less compute than one MH chain of their
    shape (T 3,072 in 16 blocks of 192, K 10: 3,072 + 10 x 96 x (1 + ... + 16) = 133,632
    tokens without EOS); ``samples: auto`` sizes best-of-N, majority vote and Power-SMC to it."""
    cfg = load(build_parser().parse_args(["run", "math500"]), ["sampler.samples=auto"])
    assert cfg.sampler.matched_samples() == round(133_632 / 3_072) == 44
    assert cfg.sampler.method_size("best_of_n") == cfg.sampler.method_size("power_smc") == 44
    assert cfg.sampler.method_size("stream") is None  # (the window: engine-sized)
    with pytest.raises(ConfigError, match="samples"):
        load(build_parser().parse_args(["run", "math500"]), ["sampler.samples=many"])
