"""``presto run`` without a YAML file (issue 37): the flags make the job, the run directory holds it
whole (config.resolved.yaml), and running that file again gives the same chains token for token.
On the vLLM emulation with its toy tokenizer (text prompts), seeds honoured."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from presto_client.cli import main

emulation = pytest.importorskip("tests.support.emulation")

ROWS = [
    {"problem": "What is 1+1?", "answer": "2"},
    {"problem": "What is 2*3?", "answer": "6"},
    {"problem": "What is 10-4?", "answer": "6"},
]


@pytest.fixture
def server() -> Iterator[Any]:
    with emulation.EmulationServer("vllm", vocab_size=32, tokenizer=True, deterministic=True) as s:
        yield s


def samples(run: Path) -> dict[str, dict[str, Any]]:
    rows = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    return {r["chain_id"]: r for r in rows}


def test_a_run_without_a_config_file_reruns_from_its_resolved_config(
    tmp_path: Path, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    flags = [
        "run",
        "--base-url",
        server.base_url,
        "--dataset",
        "rows.jsonl",
        "--template",
        "Q: {problem}\nA:",
        "--grader",
        "math",
        "--num-prompts",
        "2",
        "--alpha",
        "2",
        "--traversal",
        "sequential,stream",
        "--block-size",
        "3",
        "--num-blocks",
        "2",
        "--steps-per-block",
        "2",
        "--no-progress",
    ]
    assert main(flags, out=io.StringIO()) == 0
    (first,) = list((tmp_path / "runs").iterdir())
    assert first.name.startswith("rows-")
    resolved = yaml.safe_load((first / "config.resolved.yaml").read_text())
    assert resolved["engines"][0]["base_url"] == server.base_url
    assert resolved["prompts"]["dataset"]["path"] == str(tmp_path / "rows.jsonl")
    assert resolved["prompts"]["template"] == "Q: {problem}\nA:"
    assert resolved["sampler"]["alpha"] == 2 and resolved["prompts"]["limit"] == 2
    done = samples(first)
    assert len(done) == 4 and all(r["status"] == "ok" for r in done.values())
    assert {r["grade"]["correct"] is not None for r in done.values()} == {True}
    # the same flags again: the same directory, resumed (nothing to run)
    out = io.StringIO()
    assert main(flags, out=out) == 0
    assert "4 already finished" in out.getvalue()
    # the resolved config, elsewhere: the same job, the same chains
    again = tmp_path / "again"
    rerun = ["run", str(first / "config.resolved.yaml"), "-o", str(again), "--no-progress"]
    assert main(rerun, out=io.StringIO()) == 0
    redone = samples(again)
    assert set(redone) == set(done)
    for cid, row in done.items():
        assert redone[cid]["token_ids"] == row["token_ids"], cid
        assert redone[cid]["seed"] == row["seed"]
    old = json.loads((first / "run.json").read_text())["fingerprint"]
    new = json.loads((again / "run.json").read_text())["fingerprint"]
    assert old == new


def test_other_flags_go_to_another_directory(
    tmp_path: Path, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.csv").write_text("problem,answer\nWhat is 1+1?,2\n")
    base = ["run", "--base-url", server.base_url, "--dataset", "rows.csv", "--field", "problem"]
    small = ["--block-size", "2", "--num-blocks", "1", "--steps-per-block", "1", "--no-progress"]
    assert main([*base, *small, "--traversal", "sequential"], out=io.StringIO()) == 0
    assert main([*base, *small, "--traversal", "sequential", "--alpha", "2"]) == 0
    assert len(list((tmp_path / "runs").iterdir())) == 2


def test_without_config_or_dataset_it_says_what_to_give(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "--base-url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "give a CONFIG" in err and "--dataset NAME|FILE" in err and "math500" in err
