"""The plan resolves what the chains run: each engine's plain sampler and each chain's size."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from presto_client.core.settings import SamplerConfig
from presto_client.orchestration.config.loading import validate_job_config
from presto_client.orchestration.planned import Prompt
from presto_client.orchestration.planning.plan import make_plan
from tests.support.plans import plan_of


def test_the_plan_holds_each_engines_sampler_and_each_chains_size(tmp_path: Path) -> None:
    cfg = validate_job_config(
        {
            "engines": [
                {"kind": "reference", "name": "ref", "eos_token_id": 3},
                {"kind": "embedded"},
            ],
            "prompts": {"token_ids": [[1, 2]]},
            "sampler": {"traversals": ["sequential", "crn", "stream", "greedy"], "n_pf": 5},
            "output_dir": str(tmp_path / "run"),
        }
    )
    plan = plan_of(cfg)
    assert all(type(s) is SamplerConfig for s in plan.samplers.values())
    assert plan.samplers["ref"].eos_token_id == 3
    assert plan.samplers["embedded"].eos_token_id == 2  # the embedded model's own EOS
    sizes = {c.arm.traversal: c.size for c in plan.chains}
    assert sizes == {"sequential": None, "crn": 5, "stream": cfg.sampler.window, "greedy": None}
    assert all("size" not in c.as_dict() for c in plan.chains)  # run.json's chains unchanged


def test_the_plan_reads_no_file_and_is_frozen(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.jsonl"  # never created: the plan must not read it
    cfg = validate_job_config(
        {
            "engines": [{"kind": "vllm", "name": "ref", "base_url": "http://127.0.0.1:9"}],
            "prompts": {"file": str(missing)},
            "output_dir": str(tmp_path / "run"),
            "max_failed_chains": 3,
        }
    )
    prompts = [Prompt(0, text="a"), Prompt(1, text="b")]
    plan = make_plan(cfg, prompts)
    assert not missing.exists()
    assert plan.prompts == tuple(prompts) and len(plan.chains) == 2
    assert plan.settings.failure_budget == 3 and plan.output_dir == tmp_path / "run"
    assert plan.engines["ref"].takes_text and plan.engines["ref"].kind == "vllm"
    assert all(c.sampler is plan.samplers["ref"] for c in plan.chains)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.settings = plan.settings  # type: ignore[misc]
