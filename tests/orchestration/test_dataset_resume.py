"""The rows a run used are recorded (issue 37): run.json's fingerprint holds the dataset's name,
split, revision, commit and a digest of the rows and of the answers; a resume against other rows
(or other answers, or another revision) is refused, naming the difference; the same rows resume.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import load_job_config
from presto_client.orchestration.job import run_job_async
from presto_client.orchestration.run_dir.rundir import fingerprint_conflicts
from tests.support.plans import plan_of

emulation = pytest.importorskip("tests.support.emulation")

ROWS = [
    {"prompt": "one", "answer": "a", "id": 0},
    {"prompt": "two", "answer": "b", "id": 1},
    {"prompt": "three", "answer": "c", "id": 2},
]


@pytest.fixture
def server() -> Iterator[Any]:
    with emulation.EmulationServer("vllm", vocab_size=32, tokenizer=True) as s:
        yield s


def write(tmp_path: Path, rows: list[dict[str, Any]], url: str, **prompts: Any) -> Path:
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "engines": [{"kind": "vllm", "name": "v", "base_url": url, "max_concurrency": 4}],
                "prompts": {"file": "rows.jsonl", **prompts},
                "sampler": {"block_size": 4, "num_blocks": 1, "steps_per_block": 2},
                "output_dir": str(tmp_path / "run"),
            }
        )
    )
    return config


async def run(config: Path) -> Any:
    return await run_job_async(plan_of(load_job_config(config)))


async def test_the_rows_are_recorded_and_the_same_rows_resume(tmp_path: Path, server: Any) -> None:
    config = write(tmp_path, ROWS, server.base_url, limit=2)
    assert (await run(config)).completed == 2
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["fingerprint"]["dataset"]
    assert recorded["rows"] == 2 and recorded["path"] == str(tmp_path / "rows.jsonl")
    assert recorded["name"] is None and len(recorded["digest"]) == 16
    again = await run(config)
    assert again.skipped == 2 and again.completed == 0
    # a row past the limit may change: it is not used
    write(tmp_path, [*ROWS[:2], {**ROWS[2], "prompt": "four"}], server.base_url, limit=2)
    assert (await run(config)).skipped == 2


async def test_a_resume_against_other_rows_is_refused(tmp_path: Path, server: Any) -> None:
    config = write(tmp_path, ROWS, server.base_url)
    await run(config)
    write(
        tmp_path, [ROWS[0], {**ROWS[1], "id": 7}, ROWS[2]], server.base_url
    )  # another column of one row
    with pytest.raises(ConfigError) as err:
        await run(config)
    text = str(err.value)
    assert "differs in: dataset.digest" in text
    assert "rows: 3 row(s) of" in text and "rows.jsonl" in text
    samples = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 3  # nothing ran on the other rows


async def test_other_answers_or_order_are_refused(tmp_path: Path, server: Any) -> None:
    config = write(tmp_path, ROWS, server.base_url)
    await run(config)
    write(tmp_path, [ROWS[0], ROWS[1], {**ROWS[2], "answer": "z"}], server.base_url)
    with pytest.raises(ConfigError, match=r"dataset\.answers, dataset\.digest"):
        await run(config)
    write(tmp_path, ROWS, server.base_url, shuffle=True)  # the same rows in another order
    with pytest.raises(ConfigError, match=r"dataset\.digest"):
        await run(config)


def test_the_revision_and_name_are_compared_the_commit_and_path_recorded() -> None:
    old = {"dataset": {"name": "o/d", "revision": "v1", "commit": "c1", "path": None, "rows": 3}}
    assert fingerprint_conflicts(old, {"dataset": {**old["dataset"], "revision": "v2"}}) == [
        "dataset.revision"
    ]
    assert fingerprint_conflicts(old, {"dataset": {**old["dataset"], "name": "o/e"}}) == [
        "dataset.name"
    ]
    moved = {"dataset": {**old["dataset"], "commit": "c2", "path": "/elsewhere"}}
    assert fingerprint_conflicts(old, moved) == []
    # a run recorded before datasets were: its prompts' digest guards it
    assert fingerprint_conflicts({"seed": 0}, {"seed": 0, **old}) == []
    assert fingerprint_conflicts(old, {}) != []


async def test_a_run_recorded_before_datasets_resumes(tmp_path: Path, server: Any) -> None:
    config = write(tmp_path, ROWS, server.base_url)
    await run(config)
    info_path = tmp_path / "run" / "run.json"
    info = json.loads(info_path.read_text())
    del info["fingerprint"]["dataset"]
    info_path.write_text(json.dumps(info))
    assert (await run(config)).skipped == 3
