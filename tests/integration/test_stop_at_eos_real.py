"""The stop rule on real engines: chat-templated answers that end at the model's EOS.

SmolLM2-135M-Instruct ends a short answer with ``<|im_end|>`` (id 2) within a few dozen tokens;
with a budget of 8 blocks of 16 tokens the chains stop after the block whose state holds it,
and the ``stream`` chain, which speculates the next block's extension while a block's last
transitions run, stops at the same block with the same tokens as the sequential chain.
"""

from __future__ import annotations

from typing import Any

import pytest
from vllm_servers import VllmServer

from presto_client.backends import EngineSpec, create_engine
from presto_client.backends.http_engine import HttpEngine
from presto_client.core.runners import ChainResult, run_chain
from presto_client.core.sampler_config import SamplerConfig

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
