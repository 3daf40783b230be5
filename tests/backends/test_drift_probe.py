"""The probe measures how far a server's logprobs move with the batch a request shares (issue
45): the same context scored alone, again, and in the middle of batches of other generations,
up to the engine's concurrency. Against the emulation of a bf16 server without batch invariance
(its logits moved by a function of the context and of the requests in flight) and of one with
it (no move)."""

from __future__ import annotations

from pathlib import Path

import pytest

from presto_client.backends import EngineSpec, create_engine
from presto_client.orchestration.job import run_job_async
from presto_client.reporting.tables import format_summary_table
from tests.orchestration.orch_helpers import make_config
from tests.support.emulation import EmulationServer
from tests.support.plans import plan_of

BF16_NATS = 2.0**-7
"""About bf16's rounding of a logit of magnitude 1-2 (8 bits of mantissa)."""


async def _probe(server: EmulationServer, concurrency: int = 16) -> object:
    engine = create_engine(EngineSpec("vllm", (server.base_url,), max_concurrency=concurrency))
    try:
        return await engine.probe()  # type: ignore[attr-defined]
    finally:
        await engine.aclose()


async def test_a_batch_invariant_server_is_measured_at_zero_drift() -> None:
    with EmulationServer("vllm", vocab_size=32, deterministic=True) as server:
        report = await _probe(server)
    details = report.details  # type: ignore[attr-defined]
    assert details["drift_max_nats"] == 0.0 and details["drift_median_nats"] == 0.0
    assert details["drift_batch_max"] == 16  # up to the engine's concurrency
    assert not [w for w in report.warnings if "batch" in w]  # type: ignore[attr-defined]


@pytest.mark.parametrize("drift", [BF16_NATS, 0.5])
async def test_a_drifting_server_is_measured_and_said_once(drift: float) -> None:
    with EmulationServer("vllm", vocab_size=32, deterministic=True, drift_nats=drift) as server:
        report = await _probe(server)
        sent = server.stats.requests.get("/v1/completions", 0)
    details = report.details  # type: ignore[attr-defined]
    # (each answer's logits moved by up to d: a logprob by up to 2d, so two answers of different
    # batches by up to 4d; which batches the probe's requests share depends on their timing)
    assert 0.0 < details["drift_max_nats"] <= 4 * drift
    assert details["drift_median_nats"] <= details["drift_max_nats"]
    said = [w for w in report.warnings if "change with the batch" in w]  # type: ignore[attr-defined]
    assert len(said) == 1 and "not expected" in said[0] and "VLLM_BATCH_INVARIANT=1" in said[0]
    assert sent < 60  # the probe's cost: 2 + 2 + 8 + 16 requests, and the other checks'


async def test_a_job_on_a_drifting_server_runs_warns_once_and_claims_no_replay(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A drifting server is run, not refused: one warning naming the fix, every chain
    finished, the drift in the run's metrics and summary, and the table saying the replay is
    not expected rather than ``NO``; on a batch-invariant one, the replay holds."""
    for drift, claimed in ((BF16_NATS, "replay not expected on emu"), (0.0, None)):
        with EmulationServer("vllm", vocab_size=32, deterministic=True, drift_nats=drift) as s:
            config = make_config(
                tmp_path / f"run{drift}",
                engines=[{"kind": "vllm", "name": "emu", "base_url": s.base_url}],
                prompts={"token_ids": [[1, 2, 3], [4, 5, 6, 7], [8, 9]]},
                sampler={"traversals": ["sequential", "stream"]},
                chains_per_prompt=2,
            )
            caplog.clear()
            with caplog.at_level("WARNING"):
                result = await run_job_async(plan_of(config))
        assert result.failed == 0 and result.completed == 12
        said = [r for r in caplog.records if "change with the batch" in r.getMessage()]
        stream = next(a for a in result.summary["arms"] if a["traversal"] == "stream")
        table = format_summary_table(result.summary)
        if claimed:
            assert len(said) == 1
            assert stream["drift_max_nats"] > 0 and claimed in table
        else:
            assert not said and stream["drift_max_nats"] == 0.0
            assert stream["identical_to_baseline"] == stream["speedup_pairs"] == 6
            assert "replay not expected" not in table and "yes, 6/6" in table
