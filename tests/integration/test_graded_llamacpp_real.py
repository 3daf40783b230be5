"""A graded comparison end to end on a real engine (llama.cpp serving SmolLM2-135M-Instruct):
the MH arms beside the compute-matched baselines (best-of-N, majority vote, Power-SMC) on a few
short problems this test writes itself. SmolLM2's accuracies are a smoke test, not a result:
what is checked is that every arm finishes, that each is graded as its kind says (a majority
vote by its votes), and that the quality table and the accuracy-against-compute plot come out."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from presto_client.cli import main

pytestmark = pytest.mark.llamacpp

PROBLEMS = [
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "7"),
    ("What is 5 plus 5?", "10"),
]
ARMS = ["sequential", "stream", "best_of_n", "majority_vote", "power_smc"]


def test_a_graded_comparison_with_the_baselines_on_llamacpp(
    llamacpp_server: str, tmp_path: Path
) -> None:
    rows = tmp_path / "problems.jsonl"
    rows.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in PROBLEMS))
    config = {
        "name": "graded-llamacpp",
        "engines": [
            {"kind": "llamacpp", "name": "smol", "base_url": llamacpp_server, "max_concurrency": 4}
        ],
        "prompts": {
            "file": str(rows),
            "field": "question",
            "template": "{question} Answer with just the number.",
            "chat_template": True,
        },
        "grader": "math",
        "sampler": {
            "sampler": "power_mh",
            "alpha": 4.0,
            "block_size": 8,
            "num_blocks": 2,
            "steps_per_block": 2,
            "traversals": ARMS,
            "samples": 3,
        },
        "chains_per_prompt": 2,
        "seed": 0,
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    out = io.StringIO()
    assert main(["run", str(path), "--no-progress"], out=out) == 0, out.getvalue()
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    assert len(samples) == len(ARMS) * len(PROBLEMS) * 2
    assert all(s["status"] == "ok" for s in samples)
    for s in samples:
        assert isinstance(s["grade"]["correct"], bool)
        if s["traversal"] == "majority_vote":
            assert len(s["alternatives"]) == 2 and s["grade"]["n"] == 3
            assert 0 <= s["grade"]["votes"] <= 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    quality = summary["quality"]
    assert set(quality) == {f"smol/{arm}" for arm in ARMS}
    for q in quality.values():
        assert q["n"] == 2 * len(PROBLEMS) and q["maj_at_k"]["k"] == 2
        assert q["tokens_per_answer"] > 0
    # stream replays sequential on this server: the same answers, the same grades
    by = {(s["traversal"], s["prompt_index"], s["chain_index"]): s for s in samples}
    for p in range(len(PROBLEMS)):
        for c in range(2):
            assert by[("stream", p, c)]["token_ids"] == by[("sequential", p, c)]["token_ids"]
    printed = out.getvalue()
    assert "Answer quality" in printed and "power_smc" in printed
    report = io.StringIO()
    assert main(["report", str(tmp_path / "run")], out=report) == 0, report.getvalue()
    assert (tmp_path / "run" / "plots" / "accuracy_vs_cost.png").stat().st_size > 10_000
