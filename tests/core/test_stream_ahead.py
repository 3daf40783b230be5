"""The ``stream`` traversal's next-block proposals: issued while a block's last transitions are
still in flight, for the next block's transitions whose cut lies in this block's response.

Such a proposal is the sequential chain's request only if the block ends in a state with the
tokens it was issued after (and, for a state-dependent cut law, the next state draws its cut):
the walk adopts it only then, checks the rule again once the next extension is in and where it
uses it. Replay over several blocks with the stop rule, for every sampler (EntropyCut with the
speculation forced on: its cuts are guesses, caught by the walk's checks); the negative controls
show that each of those checks, removed in turn, is caught.
"""

from __future__ import annotations

import math

import pytest

from presto_client.core import chain_runner
from presto_client.core.chain_runner import ChainSetup
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import ChainResult, run_chain
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.state import ChainState
from presto_client.core.stream.flight import InFlight
from presto_client.core.stream.rule import StreamRuleError
from presto_client.core.stream.walk import StreamRunner
from tests.core.test_stream import _walk

SAMPLERS = ("power_mh", "entropy_cut", "multi_try_mh")
EOS = 7


def _config(sampler: str) -> SamplerConfig:
    return SamplerConfig(
        sampler=sampler, block_size=8, num_blocks=4, steps_per_block=8, eos_token_id=EOS
    )


async def _replays(sampler: str, seeds: range, tidy: bool = True) -> tuple[bool, dict[str, int]]:
    """Whether the stream chains (next-block proposals on) replayed the sequential chains."""
    model = ReferenceModel(10, seed=3)
    config = _config(sampler)
    totals = {"issued": 0, "kept": 0, "blocks": 0, "stopped": 0}
    same = True
    for seed in seeds:
        baseline = await run_chain(
            ReferenceEngine(model), [2], config, traversal="sequential", seed=seed
        )
        runner = StreamRunner(ChainSetup(ReferenceEngine(model), config, seed), next_block=True)
        stream: ChainResult = await runner.run([2])
        same = same and (
            stream.full_token_ids == baseline.full_token_ids
            and _walk(stream) == _walk(baseline)
            and stream.stats.blocks_run == baseline.stats.blocks_run
        )
        # Nothing is left in flight after the run (a stop included).
        assert all(task.done() for task in runner._tasks)
        assert not (tidy and runner._ahead)
        totals["issued"] += runner.ahead_issued
        totals["kept"] += runner.ahead_kept
        totals["blocks"] += stream.stats.blocks_run
        totals["stopped"] += int(stream.stats.stopped_at_eos)
    return same, totals


@pytest.mark.parametrize("sampler", SAMPLERS)
async def test_next_block_proposals_replay_the_sequential_chain(sampler: str) -> None:
    same, totals = await _replays(sampler, range(8))
    assert same
    # The scenario exercised what it claims to: next-block proposals went out, some were used
    # by the next block, some were dropped (an accept rewrote their prefix, or the chain
    # stopped), and chains stopped at an EOS before the budget's last block.
    assert totals["kept"] > 0
    assert totals["issued"] > totals["kept"]
    assert totals["stopped"] > 0


def test_by_default_only_a_cut_law_of_the_length_alone_speculates_the_next_block() -> None:
    model = ReferenceModel(10, seed=3)
    on = {
        s: StreamRunner(ChainSetup(ReferenceEngine(model), _config(s), 0)).next_block
        for s in SAMPLERS
    }
    assert on == {"power_mh": True, "entropy_cut": False, "multi_try_mh": True}


async def test_a_cap_of_one_speculates_nothing_for_the_next_block() -> None:
    model = ReferenceModel(10, seed=3)
    runner = StreamRunner(ChainSetup(ReferenceEngine(model), _config("power_mh"), 1, size=1))
    await runner.run([2])
    assert runner.ahead_issued == 0


# ---- negative controls: each check of a next-block proposal, removed, is caught


def _adopt_all(self: StreamRunner, state: ChainState, block: int, length: int) -> None:
    """Adoption without its check: every next-block proposal joins the window."""
    ahead, self._ahead = self._ahead, {}
    self._window.update(ahead)


def _unchecked_take(self: StreamRunner, m: int, state: ChainState) -> InFlight:
    return self._window.pop(m)


async def test_each_check_of_a_next_block_proposal_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The replay itself must catch it: the engine-health check (a normaliser gap between two
    # scorings of one context) would stop most such chains first.
    monkeypatch.setattr(chain_runner, "DRIFT_LIMIT", math.inf)
    # Dropped neither on an accept nor at adoption: the check once the extension is in
    # (_confirm) still closes what no longer follows the state, and the chain replays.
    monkeypatch.setattr(StreamRunner, "_adopt_ahead", _adopt_all)
    monkeypatch.setattr(StreamRunner, "_drop_next", lambda self, state: None)
    same, totals = await _replays("multi_try_mh", range(16), tidy=False)
    assert same and totals["issued"] > 0
    # Without that check too, the walk's check at use refuses to sample from one.
    monkeypatch.setattr(StreamRunner, "_confirm", lambda self, state: None)
    with pytest.raises(StreamRuleError, match="transition"):
        await _replays("multi_try_mh", range(16), tidy=False)
    # Without the check at use as well, the replay check catches it.
    monkeypatch.setattr(StreamRunner, "_take", _unchecked_take)
    same, _ = await _replays("multi_try_mh", range(16), tidy=False)
    assert not same
