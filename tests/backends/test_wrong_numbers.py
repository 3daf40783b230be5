"""Wrong numbers from an engine must not pass as results (issue 38 item 4): logprob rows that
belong to another position fail the chain, naming the engine and the check that caught them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from presto_client.backends import EngineSpec, create_engine
from presto_client.core.engine_protocol import FloatArray, ScoreSpec
from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.scoring import TokenLogprobs, check_rows_match_tokens, scored_from_raw
from presto_client.errors import InvalidResponseError
from tests.support.emulation import EmulationServer


class ShiftedRows(EmulationServer):
    """Each position reports the next position's distribution, the sampled token's logprob
    included (the row and the value agree with each other: only the normaliser betrays it)."""

    def sample(
        self, prefix: Sequence[int], n: int, temperature: float, seed: int | None, top_k: int = 0
    ) -> tuple[list[int], FloatArray]:
        ids, rows = super().sample(prefix, n, temperature, seed, top_k)
        shifted = rows.copy()
        for i in range(n):
            shifted[i] = self.row([*prefix, *ids[: i + 1]])
        return ids, shifted


async def test_rows_of_the_next_position_fail_the_chain_naming_the_engine() -> None:
    config = SamplerConfig(block_size=8, num_blocks=1, steps_per_block=6)
    with ShiftedRows("vllm") as server:
        engine = create_engine(EngineSpec("vllm", (server.base_url,), name="shifty"))
        try:
            with pytest.raises(InvalidResponseError, match=r"\[shifty\].*normaliser.*nats"):
                await run_chain(engine, [1, 2, 3], config, traversal="sequential", seed=0)
        finally:
            await engine.aclose()


async def test_the_same_chain_on_an_honest_server_finishes() -> None:
    config = SamplerConfig(block_size=8, num_blocks=1, steps_per_block=6)
    with EmulationServer("vllm") as server:
        engine = create_engine(EngineSpec("vllm", (server.base_url,), name="honest"))
        try:
            result = await run_chain(engine, [1, 2, 3], config, traversal="sequential", seed=0)
        finally:
            await engine.aclose()
    assert result.stats.drift_max < 1e-6


def _rows(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n + 1, 32))
    rows = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    order = np.argsort(-rows, axis=1)[:, :k]
    tokens = order[:, 0].copy()  # the most likely token of each position: always in its row
    return rows, order, tokens


def test_a_token_whose_value_disagrees_with_its_row_is_refused() -> None:
    rows, order, tokens = _rows(6, 5, seed=1)
    n = 6
    own = TokenLogprobs(
        tokens[:n],
        rows[np.arange(n), tokens[:n]],
        order[:n],
        np.take_along_axis(rows[:n], order[:n], axis=1),
    )
    check_rows_match_tokens(own)  # consistent: passes
    scored_from_raw(own, ScoreSpec((0.25,)))
    # The values are the tokens' own, the rows the next position's.
    shifted = TokenLogprobs(
        own.token_ids,
        own.logprobs,
        order[1 : n + 1],
        np.take_along_axis(rows[1 : n + 1], order[1 : n + 1], axis=1),
    )
    with pytest.raises(InvalidResponseError, match=r"token \d+ at position \d+ has logprob"):
        scored_from_raw(shifted, ScoreSpec((0.25,)))
