"""The plan resolves what the chains run: each engine's plain sampler and each chain's size."""

from __future__ import annotations

from pathlib import Path

from presto_client.core.settings import SamplerConfig
from presto_client.orchestration.loading import validate_job_config
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
