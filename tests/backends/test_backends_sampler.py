"""The sampler through the HTTP engines: PreSTO (crn, stream) replays the sequential chain exactly.

Same chain seed, same transition draws, same per-proposal seeds: a sequential run and a PreSTO
run against the same emulation server must produce the same chain (tokens, cuts, decisions).
"""

from __future__ import annotations

import pytest
from backend_helpers import make_engine

from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import SamplerConfig
from tests.support.emulation import EmulationServer

PROMPT = (1, 2, 3, 4)

CASES = [
    ("vllm", {"max_logprobs": -1}, "raw"),
    ("vllm", {"logprobs_mode": "processed_logprobs"}, "processed"),
    ("sglang", {"deterministic": True}, "scaled"),
    ("sglang", {"deterministic": True, "return_original_logprob": True}, "raw"),
]
SAMPLERS = [
    SamplerConfig("power_mh", alpha=4.0, block_size=4, num_blocks=2, steps_per_block=4),
    SamplerConfig("entropy_cut", alpha=4.0, block_size=4, num_blocks=2, steps_per_block=4),
    SamplerConfig(
        "multi_try_mh",
        alpha=4.0,
        block_size=4,
        num_blocks=2,
        steps_per_block=3,
        k_try=2,
        temperatures=(0.25, 0.5, 1.0),
    ),
]


@pytest.mark.parametrize("traversal", ["crn", "stream"])
@pytest.mark.parametrize(("kind", "server_kw", "mode"), CASES)
@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: s.sampler)
async def test_presto_replays_sequential_over_http(
    kind: str, server_kw: dict[str, object], mode: str, sampler: SamplerConfig, traversal: str
) -> None:
    with EmulationServer(kind, **server_kw) as server:  # type: ignore[arg-type]
        engine = make_engine(kind, server.base_url, logprob_mode=mode, vocab_size=64)
        seq = await run_chain(engine, PROMPT, sampler, traversal="sequential", seed=7)
        crn = await run_chain(engine, PROMPT, sampler, traversal=traversal, size=4, seed=7)
        await engine.aclose()
    assert crn.full_token_ids == seq.full_token_ids
    assert [(t.cut, t.accepted) for t in crn.transitions] == [
        (t.cut, t.accepted) for t in seq.transitions
    ]
    assert seq.stats.transitions == crn.stats.transitions > 0
    assert crn.stats.rounds <= seq.stats.rounds


@pytest.mark.parametrize(("kind", "server_kw", "mode"), [CASES[0], CASES[1], CASES[2]])
async def test_tightening_through_engine_score(
    kind: str, server_kw: dict[str, object], mode: str
) -> None:
    """A top-2 engine leaves many decisions ambiguous: they are settled by Engine.score (exact),
    and the PreSTO chain still replays the sequential one."""
    sampler = SAMPLERS[2]  # MultiTryMH: log q under several temperatures
    tightened = 0
    with EmulationServer(kind, **server_kw) as server:  # type: ignore[arg-type]
        engine = make_engine(kind, server.base_url, logprob_mode=mode, vocab_size=64, top_k=2)
        for seed in range(3):
            seq = await run_chain(engine, PROMPT, sampler, traversal="sequential", seed=seed)
            crn = await run_chain(engine, PROMPT, sampler, traversal="crn", size=4, seed=seed)
            assert crn.full_token_ids == seq.full_token_ids
            assert [t.accepted for t in crn.transitions] == [t.accepted for t in seq.transitions]
            tightened += seq.stats.tighten_calls + crn.stats.tighten_calls
        await engine.aclose()
    assert tightened > 0
