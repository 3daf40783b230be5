"""Resume refuses to mix engines (issue 10, item 2): the resolved model and the engine's identity
(version, max_model_len, logprob mode) are recorded in the run directory, and a resume against a
server that serves something else is refused, naming the difference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from orch_helpers import make_config

from presto_client.errors import ConfigError
from presto_client.orchestration.job import run_job_async
from tests.support.plans import plan_of

emulation = pytest.importorskip("tests.support.emulation")


def _config(run: Path, url: str, traversals: list[str]) -> object:
    return make_config(
        run,
        engines=[{"kind": "vllm", "name": "v", "base_url": url, "max_concurrency": 4}],
        prompts={"token_ids": [[1, 2, 3]]},
        chains_per_prompt=1,
        sampler={"traversals": traversals, "steps_per_block": 2},
    )


async def test_resume_against_another_model_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with emulation.EmulationServer("vllm", vocab_size=32, model_name="model-a") as a:
        result = await run_job_async(plan_of(_config(run, a.base_url, ["sequential"])))
    assert result.completed == 1
    info = json.loads((run / "run.json").read_text())
    identity = info["engine_identity"]["v"]
    assert identity["model"] == "model-a"
    assert identity["max_model_len"] == 1024 and identity["logprob_mode"] == "raw"
    with emulation.EmulationServer("vllm", vocab_size=32, model_name="model-b") as b:
        plan = plan_of(_config(run, b.base_url, ["sequential", "crn"]))
        with pytest.raises(ConfigError, match="model-a") as err:
            await run_job_async(plan)
    assert "model-b" in str(err.value) and "model" in str(err.value)
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 1  # nothing of model-b was run


async def test_resume_against_the_same_engine_goes_on(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with emulation.EmulationServer("vllm", vocab_size=32, model_name="model-a") as a:
        await run_job_async(plan_of(_config(run, a.base_url, ["sequential"])))
    with emulation.EmulationServer("vllm", vocab_size=32, model_name="model-a") as a2:
        result = await run_job_async(plan_of(_config(run, a2.base_url, ["sequential", "crn"])))
    assert result.completed == 1 and result.skipped == 1
