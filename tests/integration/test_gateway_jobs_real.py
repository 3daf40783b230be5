"""presto's own client path through the real gateways: jobs with and without a routing key.

Each job runs through ``smg`` or ``vllm-router`` in front of two emulation servers, on the
route of that gateway that carries token ids (SGLang's ``/generate`` through ``smg``, vLLM's
``/v1/completions`` through ``vllm-router``). A chain is told apart on the workers by its
prompt's first token (one chain per prompt, its arms sharing its key), so what each worker
received says which chains it served.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gateways import GatewayPair

from presto_client.backends import EngineSpec, create_engine
from presto_client.errors import ProbeError
from presto_client.orchestration.config.loading import validate_job_config
from presto_client.orchestration.job import run_job_async
from tests.support.emulation import EmulationServer
from tests.support.plans import plan_of

pytestmark = pytest.mark.gateway

PROMPTS = 12
"""Chains, one per prompt (all on one of two workers by chance: 2 in 2**12)."""
FIRST = 40
"""The first token of prompt i is FIRST + i (the probe's prompt starts with 1)."""

ROUTES = {
    # gateway: (policy reading the key, dialect and kind, header, field of the token ids)
    "vllm-router": ("consistent_hash", "vllm", "x-session-id", "prompt"),
    "smg": ("consistent_hashing", "sglang", "x-smg-routing-key", "input_ids"),
}


def _config(tmp_path: Path, kind: str, url: str, header: str | None) -> Any:
    engine: dict[str, Any] = {
        "kind": kind,
        "name": "gw",
        "base_url": url,
        "vocab_size": 64,
        "max_concurrency": 8,
        "routing_key_header": header,
    }
    return validate_job_config(
        {
            "name": "gateway",
            "engines": [engine],
            "prompts": {"token_ids": [[FIRST + i, 9, 10, 11] for i in range(PROMPTS)]},
            "sampler": {
                "alpha": 4.0,
                "block_size": 6,
                "num_blocks": 2,
                "steps_per_block": 2,
                "traversals": ["sequential", "crn"],
                "n_pf": 3,
            },
            "chains_per_prompt": 1,
            "seed": 3,
            "output_dir": str(tmp_path),
            "max_concurrency": 8,
        }
    )


def _workers_of_chains(workers: list[EmulationServer], field: str) -> dict[int, set[int]]:
    """Chain (prompt index) -> the workers that served any of its requests."""
    out: dict[int, set[int]] = {}
    for w, server in enumerate(workers):
        for payload in server.stats.payloads:
            ids = payload.get(field)
            if isinstance(ids, list) and ids and FIRST <= ids[0] < FIRST + PROMPTS:
                out.setdefault(ids[0] - FIRST, set()).add(w)
    return out


@pytest.mark.parametrize("gateway_kind", ["vllm-router", "smg"])
async def test_with_the_key_each_chain_stays_on_one_worker_without_it_chains_split(
    gateway_pair: GatewayPair, tmp_path: Path, gateway_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    policy, kind, header, field = ROUTES[gateway_kind]
    with gateway_pair(gateway_kind, policy, kind, deterministic=True) as (gateway, workers):
        plan = plan_of(_config(tmp_path / "keyed", kind, gateway.base_url, header))
        result = await run_job_async(plan)
        assert result.failed == 0 and result.completed == 2 * PROMPTS
        chains = _workers_of_chains(workers, field)
        assert sorted(chains) == list(range(PROMPTS))
        assert all(len(w) == 1 for w in chains.values()), chains
        assert set().union(*chains.values()) == {0, 1}
        assert "no routing_key_header is set" not in caplog.text

        # The same job without the key, on the same workers (what they received counted anew).
        for w in workers:
            w.stats.payloads.clear()
        plan = plan_of(_config(tmp_path / "unkeyed", kind, gateway.base_url, None))
        result = await run_job_async(plan)
        assert result.failed == 0
        chains = _workers_of_chains(workers, field)
        # vllm-router hashes the body (a chain's prompt grows), smg picks at random
        # (how many: 6 to 12 of 12 in four runs; benchmarks/gateway_routing.py measures it)
        assert any(len(w) > 1 for w in chains.values()), chains
        assert "no routing_key_header is set" in caplog.text

        # A header this gateway does not read is refused by the probe, naming the right one.
        wrong = "x-session-id" if gateway_kind == "smg" else "x-smg-routing-key"
        spec = EngineSpec(kind, (gateway.base_url,), name="gw", routing_key_header=wrong)
        engine = create_engine(spec)
        try:
            with pytest.raises(ProbeError, match=f"does not read it.*{header}"):
                await engine.probe()
        finally:
            await engine.aclose()


async def test_smg_with_completions_is_refused_before_any_chain_runs(
    gateway_pair: GatewayPair, tmp_path: Path
) -> None:
    with gateway_pair("smg", "consistent_hashing", "vllm") as (gateway, workers):
        plan = plan_of(_config(tmp_path / "run", "vllm", gateway.base_url, "x-smg-routing-key"))
        with pytest.raises(
            ProbeError, match=r"(?s)smg .*refuses token-id prompts.*kind: sglang.*vllm-router"
        ):
            await run_job_async(plan)
        assert sum(w.stats.requests.get("/v1/completions", 0) for w in workers) == 0
    assert not (tmp_path / "run").exists()


async def test_sglang_through_vllm_router_is_refused(gateway_pair: GatewayPair) -> None:
    with gateway_pair("vllm-router", "consistent_hash", "sglang") as (gateway, workers):
        spec = EngineSpec("sglang", (gateway.base_url,), name="gw")
        engine = create_engine(spec)
        try:
            with pytest.raises(ProbeError, match=r"vllm-router .*drops top_logprobs_num"):
                await engine.probe()
        finally:
            await engine.aclose()
        assert sum(w.stats.requests.get("/generate", 0) for w in workers) == 0
