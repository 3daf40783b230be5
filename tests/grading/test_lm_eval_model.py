"""presto as an lm-evaluation-harness model (issue 11): a local-data task, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from presto_client.lm_eval_model import cut_at_stops

ROOT = Path(__file__).resolve().parents[2]


def test_cut_at_stops() -> None:
    assert cut_at_stops("12\nmore", ["\n"]) == "12"
    assert cut_at_stops("a. b\nc", ["\n", "."]) == "a"
    assert cut_at_stops("abc", []) == "abc"
    assert cut_at_stops("abc", [""]) == "abc"


def write_task(folder: Path, n: int = 4) -> None:
    rows = [{"question": f"What is {i}+1?", "answer": str(i + 1)} for i in range(n)]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "task.yaml").write_text(
        "task: presto_arith\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {folder / 'data.jsonl'}\n"
        "test_split: test\n"
        "output_type: generate_until\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "generation_kwargs:\n"
        '  until: ["\\n"]\n'
        "metric_list:\n"
        "  - metric: exact_match\n"
        "    aggregation: mean\n"
        "    higher_is_better: true\n"
    )


def test_local_task_end_to_end_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    from presto_client import lm_eval_model

    cls = lm_eval_model.register()
    assert lm_eval_model.register() is cls
    assert get_model("presto") is cls
    write_task(tmp_path)
    seen: dict[str, Any] = {}

    def fake(cfg: Any, contexts: Sequence[str], **kwargs: Any) -> list[str]:
        seen["contexts"], seen["kwargs"] = list(contexts), kwargs
        out = []
        for i, c in enumerate(contexts):
            right = str(int(c.split()[2].split("+")[0]) + 1)
            out.append("wrong" if i == 3 else right + ("\nand more" if i % 2 else ""))
        return out

    monkeypatch.setattr(lm_eval_model, "generate_texts", fake)
    lm = cls.create_from_arg_string(
        f"config={ROOT / 'configs' / 'graded.yaml'},traversal=greedy,output_dir={tmp_path / 'run'}"
    )
    res = simple_evaluate(
        model=lm, tasks=["presto_arith"], task_manager=TaskManager(include_path=str(tmp_path))
    )
    assert res is not None
    assert res["results"]["presto_arith"]["exact_match,none"] == pytest.approx(0.75)
    assert len(seen["contexts"]) == 4
    assert seen["kwargs"] == {"traversal": "greedy", "output_dir": tmp_path / "run"}
    with pytest.raises(NotImplementedError):
        lm.loglikelihood([])


def test_shipped_offline_task_and_end_markers_stripped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """configs/lm_eval's task loads offline; returned text stops at the chat end token."""
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(ROOT)  # the task's data file is relative to the repository root
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from presto_client import lm_eval_model

    answers = {
        json.loads(line)["prompt"]: json.loads(line)["answer"]
        for line in (ROOT / "configs" / "arithmetic.jsonl").open()
    }
    seen: list[str] = []

    def fake(cfg: Any, contexts: Sequence[str], **kwargs: Any) -> list[str]:
        # what a chat model's chain returns: the answer, the end-of-turn token, then whatever
        # the block went on to draw (here a wrong number that grading must never see)
        seen.extend(contexts)
        return [f"It is {answers[c]}.<|im_end|>\nsay 999" for c in contexts]

    monkeypatch.setattr(lm_eval_model, "generate_texts", fake)
    lm = lm_eval_model.register().create_from_arg_string(f"config={ROOT / 'configs/graded.yaml'}")
    res = simple_evaluate(
        model=lm,
        tasks=["presto_arithmetic"],
        task_manager=TaskManager(include_path=str(ROOT / "configs" / "lm_eval")),
        limit=5,
        log_samples=True,
    )
    assert res is not None
    assert len(seen) == 5 and all(c in answers for c in seen)
    assert res["results"]["presto_arithmetic"]["exact_match,last_number"] == pytest.approx(1.0)
    responses = [s["resps"][0][0] for s in res["samples"]["presto_arithmetic"]]
    assert responses and all(r.endswith(".") and "<|im_end|>" not in r for r in responses)


@pytest.mark.embedded
def test_cli_with_the_embedded_engine(tmp_path: Path) -> None:
    """`python -m presto_client.lm_eval_model --model presto ...` on the embedded engine."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("torch")
    write_task(tmp_path, n=2)
    (tmp_path / "job.yaml").write_text(
        "engines: [{kind: embedded, dtype: float32}]\n"
        "prompts: {texts: [unused], chat_template: true}\n"
        "sampler: {alpha: 4.0, block_size: 8, steps_per_block: 2, traversals: [sequential]}\n"
    )
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "presto_client.lm_eval_model",
            "--model",
            "presto",
            "--model_args",
            f"config={tmp_path / 'job.yaml'},output_dir={tmp_path / 'run'}",
            "--tasks",
            "presto_arith",
            "--include_path",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "presto_arith" in proc.stdout
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    assert len(samples) == 2 and all(s["status"] == "ok" for s in samples)
    assert all(s["traversal"] == "sequential" for s in samples)
