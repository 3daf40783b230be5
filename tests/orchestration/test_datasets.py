"""Datasets and prompt templates (issue 37): tiny datasets written here in every format the loader
reads (JSONL, JSON, parquet, CSV, a directory saved by ``datasets``), loaded through the same
loader into the same prompts; templates, lettered choices, chat messages, the seeded sample; a
Hub dataset that is neither cached nor reachable fails with one line that says so."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from presto_client.errors import ConfigError
from presto_client.orchestration.config.dataset_config import DatasetConfig
from presto_client.orchestration.config.loading import load_job_config
from presto_client.orchestration.config.schema import JobConfig
from presto_client.orchestration.prompts import dataset_loader
from presto_client.orchestration.prompts.dataset_loader import (
    DatasetNotLoaded,
    hub_cached,
    load_rows,
)
from presto_client.orchestration.prompts.prompt_rows import load_prompts

ROWS: list[dict[str, Any]] = [
    {"problem": "What is 1+1?", "answer": "2", "level": 1},
    {"problem": "What is 2*3?", "answer": "6", "level": 2},
    {"problem": "What is 10-4?", "answer": "6", "level": 1},
    {"problem": "What is 9/3?", "answer": "3", "level": 3},
]
TEMPLATE = "Can you solve the following math problem? {problem} Please reason step by step, and put your final answer within \\boxed{}."  # noqa: E501


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` in the format of ``path``'s suffix (a directory without one: save_to_disk)."""
    suffix = path.suffix
    if suffix in (".jsonl", ".ndjson"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".csv":
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif suffix == ".parquet":
        pa = pytest.importorskip("pyarrow")
        pq = pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        datasets = pytest.importorskip("datasets")
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def job(tmp_path: Path, prompts: dict[str, Any], **extra: Any) -> JobConfig:
    path = tmp_path / "job.yaml"
    data = {"engines": [{"kind": "vllm", "base_url": "http://a:1"}], "prompts": prompts, **extra}
    path.write_text(yaml.safe_dump(data))
    return load_job_config(path)


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.json", "rows.csv", "rows.parquet", "saved"])
def test_every_format_gives_the_same_prompts(tmp_path: Path, name: str) -> None:
    write_rows(tmp_path / name, ROWS)
    for prompts in ({"file": name}, {"dataset": {"path": name}}, {"dataset": f"./{name}"}):
        cfg = job(tmp_path, {**prompts, "template": TEMPLATE, "chat_template": True})
        got = load_prompts(cfg)
        assert [p.text for p in got] == [
            f"Can you solve the following math problem? {r['problem']} Please reason step by "
            "step, and put your final answer within \\boxed{}."
            for r in ROWS
        ]
        assert [p.answer for p in got] == ["2", "6", "6", "3"]
        assert [p.origin.row for p in got if p.origin] == [0, 1, 2, 3]


def test_a_saved_dataset_dict_needs_its_split(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(ROWS[:1]),
            "test": datasets.Dataset.from_list(ROWS[1:]),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match="has splits train, test: choose one"):
        load_prompts(job(tmp_path, {"dataset": {"path": "dd"}, "field": "problem"}))
    cfg = job(tmp_path, {"dataset": {"path": "dd", "split": "test"}, "field": "problem"})
    assert [p.text for p in load_prompts(cfg)] == [r["problem"] for r in ROWS[1:]]
    with pytest.raises(ConfigError, match="no split 'dev'; its splits are: train, test"):
        load_prompts(job(tmp_path, {"dataset": {"path": "dd", "split": "dev"}}))


def test_the_field_names_the_column(tmp_path: Path) -> None:
    write_rows(tmp_path / "rows.csv", ROWS)
    cfg = job(tmp_path, {"file": "rows.csv", "field": "problem", "answer_field": "level"})
    got = load_prompts(cfg)
    assert [p.text for p in got] == [r["problem"] for r in ROWS]
    assert [p.answer for p in got] == ["1", "2", "1", "3"]  # CSV values are text
    with pytest.raises(ConfigError, match=r"rows.csv:2: no field 'question' \(has: problem"):
        load_prompts(job(tmp_path, {"file": "rows.csv", "field": "question"}))


def test_the_template_names_fields_of_the_rows(tmp_path: Path) -> None:
    write_rows(tmp_path / "rows.jsonl", ROWS)
    cfg = job(tmp_path, {"file": "rows.jsonl", "template": "[{level}] {problem} {{x}} {}"})
    assert load_prompts(cfg)[0].text == "[1] What is 1+1? {x} {}"
    with pytest.raises(ConfigError, match=r"rows.jsonl:1: prompts.template names \{question\}"):
        load_prompts(job(tmp_path, {"file": "rows.jsonl", "template": "{question}"}))


def test_the_seeded_sample(tmp_path: Path) -> None:
    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(50)]
    write_rows(tmp_path / "rows.jsonl", rows)

    def texts(**prompts: Any) -> list[str | None]:
        return [p.text for p in load_prompts(job(tmp_path, {"file": "rows.jsonl", **prompts}))]

    assert texts(limit=5) == ["p0", "p1", "p2", "p3", "p4"]
    sample = texts(limit=5, shuffle=True)
    assert sample == texts(limit=5, shuffle=True)  # seeded: the same every time
    assert sample != texts(limit=5) and len(set(sample)) == 5
    assert sample != texts(limit=5, shuffle=True, shuffle_seed=1)
    whole = texts(shuffle=True)
    assert whole[:5] == sample and sorted(whole) == sorted(r["prompt"] for r in rows)
    # a row's answer travels with it
    got = load_prompts(job(tmp_path, {"file": "rows.jsonl", "limit": 5, "shuffle": True}))
    assert all(p.text == f"p{p.answer}" for p in got)


GPQA_FIELDS = ["Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"]


def gpqa_rows(n: int) -> list[dict[str, Any]]:
    return [
        {
            "Question": f"Question {i}?",
            "Correct Answer": f"right {i}",
            "Incorrect Answer 1": f"wrong {i}a",
            "Incorrect Answer 2": f"wrong {i}b",
            "Incorrect Answer 3": f"wrong {i}c",
        }
        for i in range(n)
    ]


def test_multiple_choice_shuffled_with_letter_answers(tmp_path: Path) -> None:
    write_rows(tmp_path / "gpqa.parquet", gpqa_rows(12))
    choices = {"fields": GPQA_FIELDS, "correct": 0, "shuffle": True, "seed": 0}
    cfg = job(
        tmp_path,
        {"file": "gpqa.parquet", "template": "{Question}\n\n{choices}", "choices": choices},
    )
    got = load_prompts(cfg)
    letters = []
    for i, p in enumerate(got):
        assert p.text is not None and p.answer is not None
        question, _, options = p.text.partition("\n\n")
        assert question == f"Question {i}?"
        lines = options.split("\n")
        assert [line[:3] for line in lines] == ["A) ", "B) ", "C) ", "D) "]
        assert sorted(line[3:] for line in lines) == sorted(
            [f"right {i}", *(f"wrong {i}{c}" for c in "abc")]
        )
        assert f"{p.answer}) right {i}" in lines  # the answer is the right option's letter
        letters.append(p.answer)
    assert len(set(letters)) > 1  # shuffled: the right option is not always first
    assert [p.text for p in load_prompts(cfg)] == [p.text for p in got]  # seeded
    reseeded = job(
        tmp_path,
        {
            "file": "gpqa.parquet",
            "template": "{Question}\n\n{choices}",
            "choices": {**choices, "seed": 1},
        },
    )
    assert [p.text for p in load_prompts(reseeded)] != [p.text for p in got]
    unshuffled = job(
        tmp_path,
        {
            "file": "gpqa.parquet",
            "template": "{Question}\nA) {A}\nB) {B}\nC) {C}\nD) {D}",
            "choices": {"fields": GPQA_FIELDS, "correct": 0},
        },
    )
    first = load_prompts(unshuffled)[0]
    assert first.text == "Question 0?\nA) right 0\nB) wrong 0a\nC) wrong 0b\nD) wrong 0c"
    assert first.answer == "A"


def test_choices_from_a_list_column(tmp_path: Path) -> None:
    rows = [
        {"question": "Pick two", "options": ["one", "two", "three"], "answer": 1},
        {"question": "Pick three", "options": ["one", "two", "three"], "answer": "C"},
        {"question": "Pick one", "options": ["one", "two", "three"], "answer": "one"},
    ]
    write_rows(tmp_path / "mc.json", rows)
    cfg = job(tmp_path, {"file": "mc.json", "field": "question", "choices": {"field": "options"}})
    got = load_prompts(cfg)
    assert got[0].text == "Pick two\n\nA) one\nB) two\nC) three"
    assert [p.answer for p in got] == ["B", "C", "A"]


def test_rows_of_chat_messages(tmp_path: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "Hi"}], "answer": "hello"},
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "3+3?"},
            ]
        },
    ]
    write_rows(tmp_path / "chat.jsonl", rows)
    prompts = {"file": "chat.jsonl", "field": "messages", "chat_template": True}
    got = load_prompts(job(tmp_path, {**prompts, "system_prompt": "You are helpful."}))
    assert got[0].messages == (("system", "You are helpful."), ("user", "Hi"))
    assert got[0].text == "Hi" and got[0].answer == "hello"
    assert got[1].messages is not None and got[1].messages[0] == ("system", "Be brief.")
    assert len(got[1].messages) == 4 and got[1].text == "3+3?"
    with pytest.raises(ConfigError, match=r"holds chat messages: set prompts\.chat_template: true"):
        load_prompts(job(tmp_path, {"file": "chat.jsonl", "field": "messages"}))


def test_row_options_need_rows(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="template, shuffle apply to the rows of a file"):
        job(tmp_path, {"texts": ["a"], "template": "{x}", "shuffle": True})
    with pytest.raises(ConfigError, match="give exactly one of texts, token_ids, file or dataset"):
        job(tmp_path, {"texts": ["a"], "dataset": "org/name"})
    with pytest.raises(ConfigError, match="config and revision apply to a Hub dataset"):
        job(tmp_path, {"dataset": {"path": "x.jsonl", "config": "c", "revision": "r"}})


def test_dataset_shorthand() -> None:
    assert DatasetConfig.model_validate("HuggingFaceH4/MATH-500").name == "HuggingFaceH4/MATH-500"
    assert DatasetConfig.model_validate("data/rows.parquet").path == Path("data/rows.parquet")
    assert DatasetConfig.model_validate("./mine").path == Path("mine")


def test_a_hub_dataset_is_not_loaded_without_the_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    spec = DatasetConfig(name="HuggingFaceH4/MATH-500", split="test")
    with pytest.raises(DatasetNotLoaded, match="is not cached here: it will be downloaded"):
        load_rows(spec, network=False)
    assert not hub_cached("HuggingFaceH4/MATH-500")
    (tmp_path / "cache" / "HuggingFaceH4___math-500" / "default").mkdir(parents=True)
    assert hub_cached("HuggingFaceH4/MATH-500")
    with pytest.raises(DatasetNotLoaded, match="is in the local cache"):
        load_rows(spec, network=False)


def test_an_unreachable_hub_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("Couldn't reach 'org/missing' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset_builder", unreachable)
    with pytest.raises(ConfigError) as err:
        dataset_loader.load_hub(DatasetConfig(name="org/missing", config="main", split="test"))
    text = str(err.value)
    assert "\n" not in text
    assert "org/missing (main, split test) is not in the local Hugging Face cache" in text
    assert "download it once where the Hub is reachable" in text and "local file" in text


def test_offline_run_of_an_uncached_dataset_says_so(tmp_path: Path) -> None:
    """The real thing: ``presto run`` with HF_DATASETS_OFFLINE=1 and an empty cache."""
    pytest.importorskip("datasets")
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "engines": [{"kind": "vllm", "base_url": "http://127.0.0.1:9"}],
                "prompts": {"dataset": {"name": "HuggingFaceH4/MATH-500", "split": "test"}},
                "output_dir": str(tmp_path / "run"),
            }
        )
    )
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_DATASETS_CACHE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "presto_client.cli", "run", str(config), "--no-probe"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("presto: error")]
    assert len(errors) == 1, proc.stderr
    assert "HuggingFaceH4/MATH-500 (split test) is not in the local Hugging Face cache" in errors[0]
    assert "HF_DATASETS_OFFLINE" in errors[0]
    assert not (tmp_path / "run").exists()


async def test_chat_message_rows_reach_the_engines_chat_template(tmp_path: Path) -> None:
    """A row's conversation is tokenized through the engine's chat template, every turn (the
    emulation renders messages as ``role: content`` lines), the system prompt first."""
    from presto_client.orchestration.job import run_job_async
    from tests.support.emulation import EmulationServer
    from tests.support.plans import plan_of

    turns = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "3+3?"},
    ]
    write_rows(tmp_path / "chat.jsonl", [{"messages": turns}, {"messages": turns[:1]}])
    with EmulationServer("vllm", vocab_size=32, tokenizer=True) as server:
        path = tmp_path / "job.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "engines": [{"kind": "vllm", "base_url": server.base_url}],
                    "prompts": {
                        "file": "chat.jsonl",
                        "field": "messages",
                        "chat_template": True,
                        "system_prompt": "Be brief.",
                    },
                    "sampler": {"block_size": 2, "num_blocks": 1, "steps_per_block": 1},
                    "output_dir": str(tmp_path / "run"),
                }
            )
        )
        result = await run_job_async(plan_of(load_job_config(path)))
        sent = [p["messages"] for p in server.stats.payloads if "messages" in p]
    assert result.completed == 2
    system = {"role": "system", "content": "Be brief."}
    assert [system, *turns] in sent and [system, turns[0]] in sent


def test_the_hub_path_of_the_loader_on_a_local_dataset_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load_hub`` through ``datasets``' own builder (what a Hub name goes through: download,
    prepare, the split, the resolved hash), offline, on a folder of data files by split."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    folder = tmp_path / "hub-like"
    folder.mkdir()
    write_rows(folder / "test.jsonl", ROWS)
    write_rows(folder / "train.jsonl", ROWS[:1])
    loaded = dataset_loader.load_hub(DatasetConfig(name=str(folder), split="test"))
    assert loaded.rows == ROWS
    assert loaded.identity.split == "test" and loaded.identity.commit
    with pytest.raises(ConfigError, match=r"has splits .*: choose one"):
        dataset_loader.load_hub(DatasetConfig(name=str(folder)))
    with pytest.raises(ConfigError, match="no split 'dev'"):
        dataset_loader.load_hub(DatasetConfig(name=str(folder), split="dev"))


def test_an_unreachable_hub_is_said_at_once_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 46: offline, ``datasets`` retried for 27 s with a dozen warnings before the error,
    which named the config field, not the flag. The Hub's host is asked first (3 s at most):
    not cached, the error comes at once and names ``--dataset FILE``; cached, the cache is read
    offline."""
    monkeypatch.setattr(dataset_loader, "hub_reachable", lambda *a, **k: False)
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # (unset: restored after the test)
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError) as err:
        dataset_loader.load_hub(DatasetConfig(name="HuggingFaceH4/MATH-500", split="test"))
    text = str(err.value)
    assert "no connection to the Hub within 3 s" in text and "--dataset FILE" in text
    assert os.environ["HF_DATASETS_OFFLINE"] == ""  # nothing changed where nothing is cached

    (tmp_path / "cache" / "HuggingFaceH4___math-500" / "default").mkdir(parents=True)
    monkeypatch.setattr(dataset_loader, "_import_datasets", lambda what: pytest.fail("stop"))
    with pytest.raises(pytest.fail.Exception):
        dataset_loader.load_hub(DatasetConfig(name="HuggingFaceH4/MATH-500", split="test"))
    assert os.environ["HF_DATASETS_OFFLINE"] == os.environ["HF_HUB_OFFLINE"] == "1"
