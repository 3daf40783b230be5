"""The sequential chain: draw, generate, decide; one engine call per transition (the baseline
every PreSTO traversal is measured against, and the chain ``crn`` and ``stream`` replay)."""

from __future__ import annotations

from presto_client.core.chain_runner import ChainRunner
from presto_client.core.state import ChainState


class SequentialRunner(ChainRunner):
    """The baseline chain: draw, generate, decide; one engine call per transition.

    With a :class:`SpeculationBudget` it never speculates, but it reports its calls to the
    budget (in flight, and their seconds per token): the single-sequence end of the engine's
    cost curve that PreSTO chains on the same engine size their speculation from.
    """

    async def _advance(self, state: ChainState, block: int, k: int) -> tuple[ChainState, int]:
        draws = self.randomness.transition(block, k)
        cut = self.kernel.cut(state, draws.u_cut)
        requests = self.kernel.requests(state.prefix(cut), state.length - cut, draws)
        in_flight = self.budget.in_flight + len(requests)
        self.budget.add_head(len(requests))
        try:
            proposals, wall = await self._generate(requests)
        finally:
            self.budget.remove_head(len(requests))
        self.budget.observe(requests[0].num_tokens, wall, in_flight)
        tokens = sum(len(p) for p in proposals)
        self.stats.rounds += 1
        self.stats.call_wall_s.append(wall)
        self.stats.requests_issued += 1
        self.stats.requests_used += 1
        self.stats.sequences_issued += len(requests)
        self.stats.tokens_generated += tokens
        verdict = await self._decide(state, cut, proposals, draws, block, k)
        self._emit(
            block=block,
            kind="propose",
            requests=1,
            sequences=len(requests),
            used=1,
            transitions=1,
            accepts=int(verdict.accepted),
            wall_s=wall,
            tokens=tokens,
        )
        if verdict.accepted:
            state = self.kernel.accept(state, cut, proposals, verdict)
        return state, 1
