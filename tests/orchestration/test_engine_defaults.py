"""An engine's defaults are the same on every path that opens it (issue 7: a real drift).

The embedded engine's EOS (SmolLM2's ``<|im_end|>``) was applied when presto started the engine,
but dropped when a caller handed ready-made replicas through ``engine_overrides``: the chains
then ran without EOS truncation.
"""

from __future__ import annotations

from pathlib import Path

from orch_helpers import make_config, reference_engine

from presto_client.core.stats import RoundRecord
from presto_client.orchestration.executors.orchestrator import ChainOutcome, ChainSpec
from presto_client.orchestration.job import run_job_async
from tests.support.plans import plan_of


class SeenEos:
    def __init__(self) -> None:
        self.eos: set[int | None] = set()

    def chain_started(self, spec: ChainSpec, replica: int) -> None:
        self.eos.add(spec.sampler.eos_token_id)

    def round_done(self, spec: ChainSpec, record: RoundRecord, queue_s: float) -> None:
        return None

    def chain_done(self, outcome: ChainOutcome) -> None:
        return None


async def test_engine_overrides_keep_the_embedded_eos_default(tmp_path: Path) -> None:
    cfg = make_config(
        tmp_path / "run",
        engines=[{"kind": "embedded", "name": "emb"}],
        sampler={"traversals": ["sequential"]},
        chains_per_prompt=1,
    )
    seen = SeenEos()
    result = await run_job_async(
        plan_of(cfg), engine_overrides={"emb": [reference_engine("emb", 6)]}, sinks=[seen]
    )
    assert result.failed == 0 and result.completed > 0
    assert seen.eos == {2}  # SmolLM2's <|im_end|>, as when presto starts the engine itself


async def test_an_explicit_eos_wins_over_the_default(tmp_path: Path) -> None:
    cfg = make_config(
        tmp_path / "run",
        engines=[{"kind": "embedded", "name": "emb", "eos_token_id": 5}],
        sampler={"traversals": ["sequential"]},
        chains_per_prompt=1,
    )
    seen = SeenEos()
    await run_job_async(
        plan_of(cfg), engine_overrides={"emb": [reference_engine("emb", 6)]}, sinks=[seen]
    )
    assert seen.eos == {5}
