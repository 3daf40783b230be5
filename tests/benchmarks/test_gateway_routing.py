"""The gateway benchmark's presto part, small: it runs, and its figures hang together."""

from __future__ import annotations

import pytest

from benchmarks.gateway_routing import JobShape, run_jobs
from tests.support.gateways import GATEWAY_HOME, gateway_binary

pytestmark = pytest.mark.gateway


def test_presto_jobs_through_smg_keyed_match_one_replica() -> None:
    if gateway_binary("smg") is None:
        pytest.skip(f"smg is not set up in {GATEWAY_HOME}: run `bash scripts/gateways.sh setup`")
    shape = JobShape(chains=5, prefix=16, block_size=8, num_blocks=2, concurrency=8, seed=2)
    alone, keyed, unkeyed = run_jobs(shape, ("smg",), {"smg": ("consistent_hashing",)})
    assert (alone.policy, keyed.keyed, unkeyed.keyed) == ("(one replica, no gateway)", True, False)
    assert len(alone.per_replica) == 1 and len(keyed.per_replica) == 2
    assert keyed.split_chains == 0 and keyed.hit_rate == pytest.approx(alone.hit_rate, abs=0.01)
    assert unkeyed.split_chains > 0 and unkeyed.hit_rate < keyed.hit_rate
