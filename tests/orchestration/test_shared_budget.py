"""The chains of a job share their engine's speculation budget (issue 9, item 3).

The orchestrator gives every chain its own bounded view of an engine; a budget keyed by the view
would be one per chain, blind to the others' load and never measured across chains (the demo's
predictive rounds ran at full size because of it).
"""

from __future__ import annotations

from presto_client.core.engine_protocol import ConcurrencyBounded, EngineView
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.speculation import budget_for
from presto_client.orchestration.orchestrator import FifoSemaphore, LimitedEngine


async def test_views_of_one_engine_share_one_budget_sized_from_its_slots() -> None:
    engine = ReferenceEngine(ReferenceModel(10, seed=3))
    slots, global_slots = FifoSemaphore(4), FifoSemaphore(8)
    views = [LimitedEngine(engine, slots, global_slots) for _ in range(2)]
    assert all(isinstance(v, EngineView) and v.shared_engine is engine for v in views)
    assert all(isinstance(v, ConcurrencyBounded) and v.max_concurrency == 4 for v in views)
    config = SamplerConfig(block_size=8, steps_per_block=6)
    for seed, view in enumerate(views):
        await run_chain(view, [1], config, traversal="stream", n_pf=4, seed=seed)
    budget = budget_for(engine, None)
    assert budget.capacity == 4 and budget.adaptive  # sized from the engine's slots
    assert budget._fit.count > 0  # both chains' streams were measured into the one budget
    assert budget_for(views[0], None) is not budget  # (what the views would have had alone)
