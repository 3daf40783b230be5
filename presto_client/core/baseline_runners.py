"""Baseline arms that need no Metropolis–Hastings: what power sampling is compared with.

* ``sample``: one plain sample of the whole response at temperature 1 (the base model ``p0``).
* ``low_temperature``: one sample at ``τ = 1/α`` (per position ``∝ p0^α``, normalised token by
  token: the comparator of the power-sampling papers, which is *not* ``π_α``).
* ``greedy``: the argmax token at every position (temperature 0, greedy on every engine).

Each is seeded from the chain's seed (the same prompts and seeds as the MH arms of the job):
block by block where the stop rule applies (an EOS known), stopping after the block that holds
an EOS as the MH chains do, else one engine call of ``block_size × num_blocks`` tokens; truncated
after the first EOS like them, and scored with the sampler's score spec so the final-response
statistics are comparable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from presto_client.core.chain_runner import ChainResult, ChainRunner, ChainSetup
from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens
from presto_client.core.settings import SamplerConfig
from presto_client.core.state import ChainState

Temperature = Callable[[SamplerConfig], float]
"""A baseline arm's sampling temperature as a function of the sampler (0: greedy)."""

BASELINE_TEMPERATURES: Mapping[str, Temperature] = MappingProxyType(
    {
        "sample": lambda sampler: 1.0,
        "low_temperature": lambda sampler: 1.0 / sampler.alpha,
        "greedy": lambda sampler: 0.0,
    }
)
"""The built-in baseline arms (each registered as a method by :mod:`presto_client.core.methods`)."""


def baseline_temperature(traversal: str, sampler: SamplerConfig) -> float:
    """The sampling temperature of a built-in baseline arm (0: greedy)."""
    temperature = BASELINE_TEMPERATURES.get(traversal)
    if temperature is None:
        raise ValueError(
            f"unknown baseline traversal {traversal!r}; baselines are "
            f"{tuple(BASELINE_TEMPERATURES)}"
        )
    return temperature(sampler)


class BaselineRunner(ChainRunner):
    """One plain sample (or the greedy path) of the whole response in one engine call."""

    def __init__(self, setup: ChainSetup, *, temperature: float) -> None:
        super().__init__(setup)
        self.temperature = temperature

    async def run(self, prompt_ids: Sequence[int]) -> ChainResult:
        prompt = tuple(int(t) for t in prompt_ids)
        spec = self.kernel.score_spec
        state = ChainState(prompt, ScoredTokens.empty(len(spec.temperatures), spec.entropy))
        config = self.config
        # With the stop rule (an EOS known), block by block, stopping after the block that
        # holds an EOS, as the MH chains do: the tokens counted are the work done, not the
        # budget (one call of the whole budget generated 5,120 tokens for 3,897 kept). The law
        # is the same: each block is sampled given the tokens before it.
        stops = config.stop_at_eos and config.eos_token_id is not None
        parts = [config.block_size] * config.num_blocks if stops else [config.response_length]
        for block, length in enumerate(parts):
            request = ProposalRequest(
                state.prefix(state.length),
                length,
                self.temperature,
                self.randomness.extension_seed(block),
                spec,
            )
            (response,), wall = await self._generate([request])
            self._count(block, len(response), wall)
            state = state.extend(response)
            self.stats.blocks_run += length // config.block_size
            if self._stops(state):
                self.stats.stopped_at_eos = block + 1 < len(parts)
                break
        self.stats.chain_wall_s = sum(self.stats.call_wall_s)
        return self._result(state)

    def _count(self, block: int, tokens: int, wall: float) -> None:
        self.stats.rounds += 1
        self.stats.call_wall_s.append(wall)
        self.stats.requests_issued += 1
        self.stats.requests_used += 1
        self.stats.sequences_issued += 1
        self.stats.tokens_generated += tokens
        self._emit(
            block=block,
            kind="propose",
            requests=1,
            sequences=1,
            used=1,
            transitions=0,
            accepts=0,
            wall_s=wall,
            tokens=tokens,
        )
