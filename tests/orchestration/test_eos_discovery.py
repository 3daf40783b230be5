"""A served engine's EOS, asked of its chat template when the config gives none.

The vLLM emulation's toy chat template closes every turn with an end-of-turn token; presto
tokenizes a short conversation with the assistant's turn closed and left open, takes the first
token of the closing sequence as the EOS, fixes it for the job (``run.json``'s engine identity)
and its chains stop at it. The config's ``eos_token_id`` always wins; a server without a chat
template leaves the EOS unknown with one warning naming the field.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from presto_client.backends import EngineSpec, create_engine
from presto_client.core.settings import SamplerConfig
from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import load_job_config
from presto_client.orchestration.engines.eos_discovery import (
    check_eos_ids,
    closing_token,
    discover_eos_token_id,
)
from presto_client.orchestration.job import run_job_async
from presto_client.orchestration.run_dir.rundir import read_jsonl
from tests.support.plans import plan_of

emulation = pytest.importorskip("tests.support.emulation")

EOT = 2  # (ChatML's <|im_end|> in SmolLM2, the emulation's end-of-turn here)
BLOCK, BLOCKS = 4, 16


@pytest.fixture
def server() -> Iterator[Any]:
    with emulation.EmulationServer(
        "vllm", vocab_size=32, tokenizer=True, end_of_turn_token_id=EOT
    ) as s:
        yield s


def write(tmp_path: Path, url: str, **engine: Any) -> Path:
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "engines": [
                    {"kind": "vllm", "name": "v", "base_url": url, "max_concurrency": 4, **engine}
                ],
                "prompts": {"texts": ["one", "two", "three"], "chat_template": True},
                "chains_per_prompt": 2,
                "sampler": {"block_size": BLOCK, "num_blocks": BLOCKS, "steps_per_block": 2},
                "output_dir": str(tmp_path / "run"),
            }
        )
    )
    return config


def samples(tmp_path: Path) -> list[dict[str, Any]]:
    return read_jsonl(tmp_path / "run" / "samples.jsonl")


def identity(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "run" / "run.json").read_text())["engine_identity"]["v"]


def test_the_closing_token_is_the_first_one_the_closed_turn_adds() -> None:
    assert closing_token([5, 6, 2, 9], [5, 6]) == 2
    assert closing_token([5, 6], [5, 6]) is None  # closed and open alike: no template
    assert closing_token([5, 7, 2], [5, 6]) is None  # not an extension


async def test_the_emulations_chat_template_names_its_end_of_turn(server: Any) -> None:
    eng = create_engine(EngineSpec("vllm", (server.base_url,)))
    try:
        assert await discover_eos_token_id(eng) == (EOT, "")
    finally:
        await eng.aclose()


async def test_a_job_without_eos_token_id_stops_at_the_servers_eos(
    tmp_path: Path, server: Any
) -> None:
    result = await run_job_async(plan_of(load_job_config(write(tmp_path, server.base_url))))
    assert result.completed == 6 and result.failed == 0
    assert identity(tmp_path)["eos_token_id"] == EOT
    rows = samples(tmp_path)
    stopped = [r for r in rows if r["stats"]["stopped_at_eos"]]
    assert stopped, [r["stats"]["blocks_run"] for r in rows]
    for r in stopped:
        ids = r["token_ids"]
        assert ids[-1] == EOT and EOT not in ids[:-1]
        assert r["stats"]["blocks_run"] < BLOCKS
    # resumed: the recorded EOS, every chain already finished
    again = await run_job_async(plan_of(load_job_config(write(tmp_path, server.base_url))))
    assert again.skipped == 6 and identity(tmp_path)["eos_token_id"] == EOT


async def test_the_configs_eos_token_id_wins(tmp_path: Path, server: Any) -> None:
    config = write(tmp_path, server.base_url, eos_token_id=7)
    await run_job_async(plan_of(load_job_config(config)))
    assert "eos_token_id" not in identity(tmp_path)  # nothing asked of the server
    for r in samples(tmp_path):
        if r["stats"]["stopped_at_eos"]:
            assert r["token_ids"][-1] == 7


async def test_a_server_without_a_chat_template_runs_every_block_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with emulation.EmulationServer("vllm", vocab_size=32, tokenizer=True) as plain:
        caplog.set_level(logging.WARNING)
        await run_job_async(plan_of(load_job_config(write(tmp_path, plain.base_url))))
    warnings = [r.getMessage() for r in caplog.records if "eos_token_id" in r.getMessage()]
    assert len(warnings) == 1 and "engines[].eos_token_id" in warnings[0]
    assert identity(tmp_path)["eos_token_id"] is None
    assert all(r["stats"]["blocks_run"] == BLOCKS for r in samples(tmp_path))


def test_validate_probe_names_the_servers_eos(tmp_path: Path, server: Any) -> None:
    from presto_client.orchestration.engines.opening import probe_job

    lines = probe_job(plan_of(load_job_config(write(tmp_path, server.base_url))))
    assert f"  v: EOS token {EOT}, as the server states it" in lines


async def test_a_resume_keeps_the_recorded_eos(tmp_path: Path, server: Any) -> None:
    await run_job_async(plan_of(load_job_config(write(tmp_path, server.base_url))))
    kept = samples(tmp_path)[:3]
    (tmp_path / "run" / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    # the same model behind a server whose template now ends turns with another token
    with emulation.EmulationServer(
        "vllm", vocab_size=32, tokenizer=True, end_of_turn_token_id=5
    ) as other:
        again = await run_job_async(plan_of(load_job_config(write(tmp_path, other.base_url))))
    assert again.skipped == 3 and again.completed == 3
    assert identity(tmp_path)["eos_token_id"] == EOT
    rerun = [r for r in samples(tmp_path) if r["chain_id"] not in {k["chain_id"] for k in kept}]
    assert len(rerun) == 3
    for r in rerun:  # (the prompts differ: the template's end-of-turn is in them)
        ids = r["token_ids"]
        if r["stats"]["stopped_at_eos"]:
            assert ids[-1] == EOT and EOT not in ids[:-1]
        else:
            assert EOT not in ids and len(ids) == BLOCK * BLOCKS


# ---- an EOS id checked like every other token id (issue 48, item 1)


@pytest.mark.parametrize("eos", [32, 100_000])
async def test_an_eos_id_outside_the_vocabulary_is_refused_naming_it(
    tmp_path: Path, server: Any, eos: int
) -> None:
    # Never sampled, it would turn the stop at EOS off: every chain would run its whole budget.
    config = write(tmp_path, server.base_url, eos_token_id=eos)
    with pytest.raises(ConfigError) as err:
        await run_job_async(plan_of(load_job_config(config)))
    message = str(err.value)
    assert (
        f"engines[0].eos_token_id={eos} is outside the model's vocabulary of 32 tokens" in message
    )
    assert "stop at EOS would never fire" in message
    assert not (tmp_path / "run").exists()  # nothing ran, nothing kept


async def test_a_negative_eos_id_is_refused(tmp_path: Path, server: Any) -> None:
    with pytest.raises(ConfigError, match=r"eos_token_id=-1 is negative, not a token id"):
        await run_job_async(
            plan_of(load_job_config(write(tmp_path, server.base_url, eos_token_id=-1)))
        )


def test_an_eos_id_that_cannot_be_checked_is_said(caplog: pytest.LogCaptureFixture) -> None:
    # A server that cannot tell its vocabulary size (and no vocab_size stated): the id is
    # taken, with one warning naming it and the field that would let it be checked.
    sampler = SamplerConfig(eos_token_id=5)
    caplog.set_level(logging.WARNING)
    check_eos_ids({"v": sampler}, ["v"], {}, {"v": None})
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "engines[0].eos_token_id=5 cannot be checked" in said[0]
    assert "engines[].vocab_size" in said[0]
    check_eos_ids({"v": sampler}, ["v"], {}, {"v": 6})  # inside: nothing said
    assert len(caplog.records) == 1
