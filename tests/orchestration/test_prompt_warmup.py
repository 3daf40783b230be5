"""The prompt warm-up of jobs with several arms: each (prompt, chain)'s prompt is prefilled once
on its replica before the first of its arms runs, outside every chain's timings, so the arm run
first no longer pays the prompt's prefill for the others; the chains are unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.sampler_config import SamplerConfig
from presto_client.orchestration.executors.orchestrator import ChainSpec, EnginePool, Orchestrator

CONFIG = SamplerConfig(block_size=8, steps_per_block=4)


class _Recording(ReferenceEngine):
    """The reference engine, recording every generate call's requests in order."""

    def __init__(self) -> None:
        super().__init__(ReferenceModel(10, seed=3))
        self.calls: list[tuple[tuple[int, ...], int]] = []

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        self.calls.extend((r.prefix, r.num_tokens) for r in requests)
        await asyncio.sleep(0)
        return await super().generate(requests)


PROMPTS = ((1, 2), (1, 3))


def _is_warm_up(call: tuple[tuple[int, ...], int]) -> bool:
    """A 1-token request of the bare prompt (a chain's proposals carry its response's prefix,
    its extension the block's tokens)."""
    return call[0] in PROMPTS and call[1] == 1


def _specs(warm: bool) -> list[ChainSpec]:
    return [
        ChainSpec(
            f"{traversal}/p{p}",
            traversal,
            "ref",
            traversal,
            CONFIG,
            p,
            0,
            11 + p,
            (1, 2 + p),
            size=4,
            replica_key=f"p{p}/c0",
            warm_prompt=warm,
        )
        for p in range(2)
        for traversal in ("sequential", "crn")
    ]


async def _run(warm: bool, active: int) -> tuple[_Recording, list[tuple[int, ...]]]:
    engine = _Recording()
    pool = EnginePool("ref", [engine], 4)
    result = await Orchestrator({"ref": pool}, max_active_chains=active).run(_specs(warm))
    done = sorted(result.completed, key=lambda o: o.spec.chain_id)
    return engine, [tuple(o.result.full_token_ids) for o in done if o.result is not None]


async def test_each_prompt_is_prefilled_once_before_its_first_chain() -> None:
    for active in (1, 4):  # one chain at a time, and every chain at once
        engine, chains = await _run(True, active)
        warmups = [c for c in engine.calls if _is_warm_up(c)]
        assert sorted(warmups) == [((1, 2), 1), ((1, 3), 1)], engine.calls
        for prompt in PROMPTS:
            first_use = next(i for i, c in enumerate(engine.calls) if c[0][:2] == prompt)
            assert engine.calls[first_use] == (prompt, 1)  # the warm-up came first
        cold, unwarmed = await _run(False, active)
        assert not [c for c in cold.calls if _is_warm_up(c)]  # off: no extra request
        assert chains == unwarmed and len(chains) == 4  # the chains are the same


async def test_a_failed_warm_up_leaves_the_chain_to_report_the_error() -> None:
    class Failing(_Recording):
        async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
            if _is_warm_up((requests[0].prefix, requests[0].num_tokens)):
                raise RuntimeError("the server is gone")
            return await super().generate(requests)

    engine = Failing()
    pool = EnginePool("ref", [engine], 4)
    result = await Orchestrator({"ref": pool}, max_active_chains=1).run(_specs(True))
    assert len(result.completed) == 4  # the chains ran; the warm-up's failure cost nothing
