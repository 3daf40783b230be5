"""lm-eval's own ``local-completions`` model, pointed at ``presto serve`` on an offline local
task (no plugin): every document's answer is the one the service gives that prompt and seed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from serve_helpers import ServiceThread, load, reference_job, write_config

from tests.support.emulation import EmulationServer

REPO = Path(__file__).resolve().parents[2]


def _task(folder: Path, n: int = 3) -> None:
    rows = [{"question": f"What is {i}+1?", "answer": str(i + 1)} for i in range(n)]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "task.yaml").write_text(
        "task: presto_serve_arith\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {folder / 'data.jsonl'}\n"
        "test_split: test\n"
        "output_type: generate_until\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "generation_kwargs:\n"
        '  until: [">"]\n'
        "  max_gen_toks: 8\n"
        "metric_list:\n"
        "  - metric: exact_match\n"
        "    aggregation: mean\n"
        "    higher_is_better: true\n"
    )


def test_lm_eval_local_completions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    _task(tmp_path)
    with EmulationServer("vllm", vocab_size=64, tokenizer=True) as upstream:
        data = reference_job(tmp_path / "run")
        data["engines"] = [{"kind": "vllm", "name": "emu", "base_url": upstream.base_url}]
        config = write_config(tmp_path / "job.yaml", data)
        with ServiceThread(load(config)) as service:
            # lm-eval's local-completions model (its class: the registry's name table depends
            # on which lm-eval modules other tests imported first)
            lm = LocalCompletionsAPI.create_from_arg_string(
                f"model=emu,base_url={service.v1}/completions,tokenized_requests=False,"
                "tokenizer_backend=None,num_concurrent=1,max_retries=1"
            )
            res: Any = simple_evaluate(
                model=lm,
                tasks=["presto_serve_arith"],
                task_manager=TaskManager(include_path=str(tmp_path)),
                gen_kwargs="alpha=4.0",
                log_samples=True,
            )
            samples = res["samples"]["presto_serve_arith"]
            assert len(samples) == 3
            client = openai.OpenAI(base_url=service.v1, api_key="unused")
            for s in samples:
                prompt = s["arguments"][0][0]
                direct = client.completions.create(
                    model="emu",
                    prompt=prompt,
                    max_tokens=8,
                    stop=[">"],
                    seed=1234,  # lm-eval's default seed
                    extra_body={"alpha": 4.0},
                )
                assert s["resps"][0][0] == direct.choices[0].text != ""
    assert "exact_match,none" in res["results"]["presto_serve_arith"]


def test_lm_eval_local_chat_completions_on_the_offline_arithmetic_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lm-eval's ``local-chat-completions`` model on ``configs/lm_eval/presto_arithmetic.yaml``
    with two few-shot examples as earlier turns: every answer is the one the service gives that
    conversation and seed."""
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(REPO)  # the task's data file is relative to the repository root
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalChatCompletion
    from lm_eval.tasks import TaskManager

    with EmulationServer("vllm", vocab_size=64, tokenizer=True) as upstream:
        data = reference_job(tmp_path / "run")
        data["engines"] = [{"kind": "vllm", "name": "emu", "base_url": upstream.base_url}]
        config = write_config(tmp_path / "job.yaml", data)
        with ServiceThread(load(config)) as service:
            lm = LocalChatCompletion.create_from_arg_string(
                f"model=emu,base_url={service.v1}/chat/completions,tokenizer_backend=None,"
                "num_concurrent=1,max_retries=1"
            )
            res: Any = simple_evaluate(
                model=lm,
                tasks=["presto_arithmetic"],
                task_manager=TaskManager(include_path=str(REPO / "configs" / "lm_eval")),
                num_fewshot=2,
                fewshot_as_multiturn=True,
                apply_chat_template=True,
                gen_kwargs="alpha=4.0,max_gen_toks=8",
                limit=3,
                log_samples=True,
            )
            samples = res["samples"]["presto_arithmetic"]
            assert len(samples) == 3
            client = openai.OpenAI(base_url=service.v1, api_key="unused")
            for s in samples:
                context = s["arguments"][0][0]
                # a JsonChatStr: the conversation as JSON text
                messages = json.loads(context if isinstance(context, str) else context[0])
                assert [m["role"] for m in messages] == ["user", "assistant"] * 2 + ["user"]
                direct = client.chat.completions.create(
                    model="emu",
                    messages=messages,
                    max_tokens=8,
                    stop=["\n\n"],
                    seed=1234,  # lm-eval's default seed
                    extra_body={"alpha": 4.0},
                )
                assert s["resps"][0][0] == direct.choices[0].message.content
    assert "exact_match,last_number" in res["results"]["presto_arithmetic"]
