"""The stop rule on real engines: chat-templated answers that end at the model's EOS.

SmolLM2-135M-Instruct ends a short answer with ``<|im_end|>`` (id 2) within a few dozen tokens;
with a budget of 8 blocks of 16 tokens the chains stop after the block whose state holds it,
and the ``stream`` chain, which speculates the next block's extension while a block's last
transitions run, stops at the same block with the same tokens as the sequential chain. A job
whose config gives no ``eos_token_id`` finds ``<|im_end|>`` in the server's chat template
before any chain runs, records it in ``run.json`` and stops there all the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_servers import VllmServer

from presto_client.backends import EngineSpec, create_engine
from presto_client.backends.http_engine import HttpEngine
from presto_client.core.runners import ChainResult, run_chain
from presto_client.core.sampler_config import SamplerConfig
from presto_client.orchestration.config.loading import load_job_config
from presto_client.orchestration.job import run_job_async
from presto_client.orchestration.planning.plan import make_plan
from presto_client.orchestration.prompts.prompt_rows import load_prompts
from presto_client.orchestration.run_dir.rundir import read_jsonl

IM_END = 2  # SmolLM2's <|im_end|>
QUESTIONS = ["Say hello in three words.", "Explain in two sentences why the sky is blue."]
SAMPLER = SamplerConfig(
    "power_mh",
    alpha=4.0,
    block_size=16,
    num_blocks=8,
    steps_per_block=3,
    eos_token_id=IM_END,
)


def _decisions(result: ChainResult) -> list[tuple[int, int, int, bool]]:
    return [(t.block, t.k, t.cut, t.accepted) for t in result.transitions]


async def _check_stops_and_replays(eng: HttpEngine) -> list[str]:
    lines = []
    stopped = 0
    for question in QUESTIONS:
        prompt = await eng.tokenize(question, chat_template=True)
        seq = await run_chain(eng, prompt, SAMPLER, traversal="sequential", seed=3)
        stream = await run_chain(eng, prompt, SAMPLER, traversal="stream", seed=3)
        assert stream.full_token_ids == seq.full_token_ids, question
        assert _decisions(stream) == _decisions(seq), question
        assert stream.stats.blocks_run == seq.stats.blocks_run, question
        if seq.stats.stopped_at_eos:
            stopped += 1
            assert seq.token_ids[-1] == IM_END and IM_END not in seq.token_ids[:-1]
            assert len(seq.full_token_ids) == 16 * seq.stats.blocks_run < 128
        text = await eng.detokenize(list(seq.token_ids))
        lines.append(f"{question!r}: {seq.stats.blocks_run} of 8 blocks, answer {text!r}")
    assert stopped > 0, lines  # the model did end an answer within the budget
    return lines


@pytest.mark.vllm
async def test_vllm_chains_stop_at_the_models_eos(vllm_raw_server: VllmServer) -> None:
    spec: dict[str, Any] = {"model": vllm_raw_server.model, "logprob_mode": "raw"}
    eng = create_engine(
        EngineSpec(
            "vllm",
            (vllm_raw_server.base_url,),
            request_timeout_s=600.0,
            max_concurrency=16,
            **spec,
        )
    )
    try:
        print("\n" + "\n".join(await _check_stops_and_replays(eng)))
    finally:
        await eng.aclose()


@pytest.mark.vllm
async def test_vllm_job_without_eos_token_id_stops_at_the_chat_templates_eos(
    vllm_raw_server: VllmServer, tmp_path: Path
) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "engines": [
                    {
                        "kind": "vllm",
                        "name": "vllm",
                        "base_url": vllm_raw_server.base_url,
                        "model": vllm_raw_server.model,
                        "logprob_mode": "raw",
                        "request_timeout_s": 600.0,
                        "max_concurrency": 16,
                    }
                ],
                "prompts": {"texts": QUESTIONS, "chat_template": True},
                "sampler": {
                    "alpha": 4.0,
                    "block_size": 16,
                    "num_blocks": 8,
                    "steps_per_block": 3,
                    "traversals": ["sequential"],
                },
                "seed": 3,
                "output_dir": str(tmp_path / "run"),
            }
        )
    )
    cfg = load_job_config(config)
    assert cfg.engines[0].eos_token_id is None
    plan = make_plan(cfg, load_prompts(cfg))
    result = await run_job_async(plan)
    assert result.completed == len(QUESTIONS) and result.failed == 0
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["engine_identity"]["vllm"]["eos_token_id"] == IM_END
    rows = read_jsonl(tmp_path / "run" / "samples.jsonl")
    stopped = [r for r in rows if r["stats"]["stopped_at_eos"]]
    assert stopped, [r["stats"]["blocks_run"] for r in rows]
    for r in stopped:
        assert r["token_ids"][-1] == IM_END and IM_END not in r["token_ids"][:-1]
        assert r["stats"]["blocks_run"] < 8
    print(
        "\n" + "\n".join(f"{r['chain_id']}: {r['stats']['blocks_run']} of 8 blocks" for r in rows)
    )


@pytest.mark.llamacpp
async def test_llamacpp_chains_stop_at_the_models_eos(llamacpp_server: str) -> None:
    eng = create_engine(
        EngineSpec(
            "llamacpp",
            (llamacpp_server,),
            top_k=20,
            vocab_size=49152,
            request_timeout_s=600.0,
            max_concurrency=8,
        )
    )
    try:
        print("\n" + "\n".join(await _check_stops_and_replays(eng)))
    finally:
        await eng.aclose()


def _llamacpp_job(
    tmp_path: Path,
    engine: dict[str, Any],
    sampler: dict[str, Any],
    *,
    chains_per_prompt: int = 1,
    seed: int = 3,
) -> Any:
    """A job of QUESTIONS (chat-templated) on the llama-server ``engine`` names, no EOS in it,
    written as a user's YAML file and loaded as ``presto run`` loads it."""
    config = tmp_path / "job.yaml"
    job = {
        "engines": [{"kind": "llamacpp", "name": "llamacpp", **engine}],
        "prompts": {"texts": QUESTIONS, "chat_template": True},
        "sampler": {"alpha": 4.0, **sampler},
        "chains_per_prompt": chains_per_prompt,
        "seed": seed,
        "output_dir": str(tmp_path / "run"),
    }
    config.write_text(yaml.safe_dump(job))
    return load_job_config(config)


@pytest.mark.llamacpp
async def test_llamacpp_job_without_eos_token_id_stops_at_the_eos_the_server_states(
    llamacpp_server: str, tmp_path: Path
) -> None:
    """A researcher's own llama-server, no eos_token_id in the config: the EOS is the one its
    /props names (its chat template cannot tell: llama-server renders an open and a closed
    assistant turn alike), recorded in run.json, and chains stop at it."""
    cfg = _llamacpp_job(
        tmp_path,
        {"base_url": llamacpp_server, "request_timeout_s": 600.0, "max_concurrency": 4},
        {"block_size": 16, "num_blocks": 8, "steps_per_block": 2, "traversals": ["sequential"]},
    )
    assert cfg.engines[0].eos_token_id is None
    result = await run_job_async(make_plan(cfg, load_prompts(cfg)))
    assert result.completed == len(QUESTIONS) and result.failed == 0
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["engine_identity"]["llamacpp"]["eos_token_id"] == IM_END
    rows = read_jsonl(tmp_path / "run" / "samples.jsonl")
    stopped = [r for r in rows if r["stats"]["stopped_at_eos"]]
    assert stopped, [r["stats"]["blocks_run"] for r in rows]
    for r in stopped:
        assert r["token_ids"][-1] == IM_END and r["stats"]["blocks_run"] < 8


@pytest.mark.llamacpp
async def test_the_defaults_against_a_slotted_llama_server_finish_with_no_retry(
    llamacpp_server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 46: with the default max_concurrency (then 64, now 32) against a server of 4
    slots, requests waited in the server's queue, ran into their timeout and were retried onto
    the same queue.
    The client now keeps what the slots cannot take: 8 stream chains speculating at once finish
    with not one retry. (On this small model the server's queue stays short even without the
    client's gate: the test that fails without it is test_llamacpp_adapter's
    test_requests_wait_for_a_free_slot_in_the_client_not_in_the_servers_queue.)"""
    cfg = _llamacpp_job(
        tmp_path,
        {"base_url": llamacpp_server, "request_timeout_s": 30.0},
        {"block_size": 16, "num_blocks": 2, "steps_per_block": 3, "traversals": ["stream"]},
        chains_per_prompt=4,
        seed=5,
    )
    assert cfg.engines[0].max_concurrency > 4 and cfg.max_active_chains is None  # defaults
    with caplog.at_level("WARNING"):
        result = await run_job_async(make_plan(cfg, load_prompts(cfg)))
    assert result.completed == 2 * 4 and result.failed == 0
    said = [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    assert not [m for m in said if "retry" in m.lower() or "timed out" in m.lower()], said


@pytest.mark.llamacpp
async def test_llamacpp_single_answer_baselines_stop_at_eos_and_count_what_they_generate(
    llamacpp_server: str, tmp_path: Path
) -> None:
    """Issue 50: ``low_temperature`` and ``sample`` asked for the whole budget in one call and
    continued past the EOS, so their tokens per answer (the cost axis) was the budget. They run
    block by block and stop at the EOS: blocks below the budget, tokens generated about the
    tokens kept (at most the last block's rest)."""
    cfg = _llamacpp_job(
        tmp_path,
        {"base_url": llamacpp_server},
        {"block_size": 16, "num_blocks": 8, "traversals": ["low_temperature", "sample"]},
        chains_per_prompt=2,
    )
    result = await run_job_async(make_plan(cfg, load_prompts(cfg)))
    assert result.failed == 0 and result.completed == len(QUESTIONS) * 2 * 2
    rows = read_jsonl(tmp_path / "run" / "samples.jsonl")
    stopped = [r for r in rows if r["stats"]["stopped_at_eos"]]
    assert stopped, [r["stats"]["blocks_run"] for r in rows]
    for r in stopped:
        kept = len(r["token_ids"])
        assert r["token_ids"][-1] == IM_END and r["stats"]["blocks_run"] < 8
        assert kept <= r["stats"]["tokens_generated"] < kept + 16  # (the last block's rest)
