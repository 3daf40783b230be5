"""Run one chain: the method's runner, looked up in :mod:`presto_client.core.methods`.

The runners themselves live one concept a module: the base (:mod:`.chain_runner`), the
sequential chain (:mod:`.sequential_runner`), PreSTO's rounds (:mod:`.presto_runner`), the
streaming window (:mod:`.stream`) and the baselines (:mod:`.baseline_runners`).
"""

from __future__ import annotations

from collections.abc import Sequence

from presto_client.core.chain_runner import ChainResult, ChainRunner, ChainSetup, RoundCallback
from presto_client.core.engine_protocol import Engine
from presto_client.core.methods import get_method
from presto_client.core.predictor import CertaintyPredictor
from presto_client.core.presto_runner import PrestoRunner
from presto_client.core.sequential_runner import SequentialRunner
from presto_client.core.settings import SamplerConfig
from presto_client.core.shared_draws import SharedDraws
from presto_client.core.speculation import SpeculationBudget

__all__ = [
    "ChainResult",
    "ChainRunner",
    "PrestoRunner",
    "RoundCallback",
    "SequentialRunner",
    "SharedDraws",
    "chain_budget",
    "run_chain",
]


def chain_budget(engine: Engine) -> SpeculationBudget:
    """A budget of one chain's own, for a caller that holds none for the engine
    (:meth:`SpeculationBudget.for_engine`)."""
    return SpeculationBudget.for_engine(engine)


async def run_chain(
    engine: Engine,
    prompt_ids: Sequence[int],
    sampler: SamplerConfig,
    *,
    traversal: str = "stream",
    size: int | None = None,
    seed: int = 0,
    on_round: RoundCallback | None = None,
    predictor: CertaintyPredictor | None = None,
    budget: SpeculationBudget | None = None,
    draws: SharedDraws | None = None,
) -> ChainResult:
    """Run one chain of the method ``traversal`` (``sequential``, a PreSTO rule, a baseline).

    ``size`` is the method's size: the round size (``n_pf``) of a round method, the window of
    ``stream``, the samples of a sample baseline (ignored by a method without one); ``None``:
    the method's default. ``budget`` is the speculation budget of the engine, shared by the
    chains on it (its owner, the one who opened the engine, hands it in); ``None``: a budget of
    this chain's own. ``draws``: the engine's :class:`SharedDraws`, through which a job's
    ``best_of_n`` and ``majority_vote`` read one draw.
    """
    method = get_method(traversal)
    if size is None or method.size == "none":
        size = method.default_size()
    setup = ChainSetup(
        engine,
        sampler,
        seed,
        on_round,
        size,
        budget if budget is not None else chain_budget(engine),
        predictor,
        draws,
    )
    return await method.make_runner(setup).run(prompt_ids)
