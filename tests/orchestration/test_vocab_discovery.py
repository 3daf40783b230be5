"""A served engine's vocabulary size, asked of its server before any chain runs
(``orchestration/engines/vocab_discovery.py``): recorded in ``run.json``, checked against the
config's ``vocab_size`` and against a resumed run's, used to refuse token-id prompts outside it, and
applied to every answer: a hostile server whose answers hold ids past the vocabulary it states
fails its chains naming the check (no sample of it is stored "ok")."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import load_job_config
from presto_client.orchestration.job import run_job_async
from presto_client.orchestration.run_dir.rundir import read_jsonl
from tests.support.plans import plan_of

emulation = pytest.importorskip("tests.support.emulation")


def write(
    tmp_path: Path, url: str, *, prompts: Any = None, tolerant: bool = False, **engine: Any
) -> Path:
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "engines": [
                    {"kind": "vllm", "name": "v", "base_url": url, "max_concurrency": 4, **engine}
                ],
                "prompts": {"token_ids": prompts or [[1, 2, 3], [4, 5]]},
                "chains_per_prompt": 2,
                "sampler": {"block_size": 4, "num_blocks": 3, "steps_per_block": 2},
                "output_dir": str(tmp_path / "run"),
                **({"max_failed_chains": 4} if tolerant else {}),
            }
        )
    )
    return config


def identity(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "run" / "run.json").read_text())["engine_identity"]["v"]


async def run(config: Path) -> Any:
    return await run_job_async(plan_of(load_job_config(config)))


async def test_the_servers_vocabulary_is_found_recorded_and_kept_on_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with emulation.EmulationServer("vllm", vocab_size=32, model_name="m") as server:
        result = await run(write(tmp_path, server.base_url))
        assert result.completed == 4 and result.failed == 0
        assert identity(tmp_path)["vocab_size"] == 32
        assert any("vocabulary of 32 tokens" in r.getMessage() for r in caplog.records)
        again = await run(write(tmp_path, server.base_url))
    assert again.skipped == 4 and identity(tmp_path)["vocab_size"] == 32


async def test_a_resume_on_a_server_with_another_vocabulary_is_refused(tmp_path: Path) -> None:
    with emulation.EmulationServer("vllm", vocab_size=32, model_name="m") as server:
        await run(write(tmp_path, server.base_url))
    kept = read_jsonl(tmp_path / "run" / "samples.jsonl")[:2]
    (tmp_path / "run" / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    with (
        emulation.EmulationServer("vllm", vocab_size=48, model_name="m") as other,
        pytest.raises(ConfigError, match=r"vocab_size 48.*ran with vocab_size 32"),
    ):
        await run(write(tmp_path, other.base_url))


async def test_a_stated_vocab_size_the_server_contradicts_is_a_config_error(
    tmp_path: Path,
) -> None:
    with (
        emulation.EmulationServer("vllm", vocab_size=32) as server,
        pytest.raises(ConfigError, match=r"vocab_size is 48 .* server's model has 32 tokens"),
    ):
        await run(write(tmp_path, server.base_url, vocab_size=48))
    assert not (tmp_path / "run" / "samples.jsonl").exists()


async def test_a_prompt_outside_the_servers_vocabulary_is_refused_at_start(
    tmp_path: Path,
) -> None:
    with (
        emulation.EmulationServer("sglang", vocab_size=32) as server,
        pytest.raises(ConfigError, match=r"token id 40, outside engine v's vocabulary of 32"),
    ):
        await run(write(tmp_path, server.base_url, kind="sglang", prompts=[[1, 2], [3, 40]]))


async def test_a_hostile_server_answering_past_its_vocabulary_fails_its_chains(
    tmp_path: Path,
) -> None:
    # It checks ids against 8 tokens (and says so when refusing one), its model has 64: its
    # answers (and their top-K rows) hold ids past 8. No vocab_size in the config: every chain
    # must fail naming the check (the probe is off: it would refuse this server first).
    with emulation.EmulationServer("vllm", vocab_size=64, checked_vocab_size=8) as server:
        config = write(
            tmp_path, server.base_url, prompts=[[1, 2], [3, 4]], tolerant=True, probe=False
        )
        result = await run(config)
    assert result.failed == 4 and result.completed == 0
    assert identity(tmp_path)["vocab_size"] == 8
    for row in read_jsonl(tmp_path / "run" / "samples.jsonl"):
        assert row["status"] == "failed" and "token_ids" not in row
        assert row["error"].startswith("[v] proposal")
        assert "outside the model's vocabulary of 8 tokens (the vocab_size check)" in row["error"]
