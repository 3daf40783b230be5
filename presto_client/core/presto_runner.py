"""PreSTO's round runner: a round of prefetched proposals, then a walk along the realised path.

Every proposal of a round (planned by a tree rule of :mod:`presto_client.core.tree`) goes out at
once, and the walk takes the original MH decisions as the proposals arrive. Every ``log A`` is
computed during the walk against the state the walk actually holds at that node, never against
the round's root.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

from presto_client.core.chain_runner import ChainRunner, ChainSetup
from presto_client.core.engine_protocol import ScoredTokens
from presto_client.core.settings import ROUND_SIZE
from presto_client.core.state import ChainState
from presto_client.core.tree import (
    TRAVERSAL_RULES,
    PlanContext,
    PlannedProposal,
    PlanRule,
    RoundPlan,
)

logger = logging.getLogger(__name__)


class PrestoRunner(ChainRunner):
    """PreSTO: one batched call per round, then a walk along the realised path."""

    def __init__(self, setup: ChainSetup, *, traversal: str, rule: PlanRule | None = None) -> None:
        """``rule`` plans each round (default: the built-in rule named ``traversal``); the
        name keys the round-value statistics of the budget. ``setup.size``: ``n_pf``, the most
        proposals a round (default :data:`ROUND_SIZE`)."""
        super().__init__(setup)
        if rule is None:
            if traversal not in TRAVERSAL_RULES:
                raise ValueError(
                    f"unknown tree rule {traversal!r}; the built-in rules are "
                    f"{sorted(TRAVERSAL_RULES)} (pass rule= for another)"
                )
            rule = TRAVERSAL_RULES[traversal]
        n_pf = ROUND_SIZE if setup.size is None else setup.size
        if n_pf < 1:
            raise ValueError("n_pf must be >= 1")
        self.rule = rule
        self.traversal = traversal
        self.n_pf = n_pf
        self.predictor = setup.predictor
        self._cancelled: list[asyncio.Future[list[ScoredTokens]]] = []

    def _round_size(self) -> int:
        """``N_pf`` for this round: the root's proposal plus what the engine's budget allows.

        ``n_pf`` is a cap; on an engine whose measured cost says that extra sequences slow the
        others (a CPU), or whose slots the chains' roots need, the round shrinks towards the
        sequential chain's single request.
        """
        per = self.kernel.sequences_per_proposal
        extra = min(self.n_pf - 1, self.budget.available() // per)
        return 1 + max(extra, 0)

    def _sized(self, plan: RoundPlan) -> RoundPlan:
        """Keep the prefix of the plan that maximises expected transitions per second.

        Only plans whose proposals carry predicted reach probabilities (``predictive``: selected
        best-first by reach, so every prefix is a subtree, the best of its size) can be sized
        by value; the others keep what the budget allowed. Never changes a decision: which
        proposals are prefetched only changes where the next round starts.
        """
        if plan.per_depth or len(plan.proposals) <= 1:
            return plan
        reach = [p.reach for p in plan.proposals]
        if all(r == 1.0 for r in reach):
            return plan  # no predicted values (bfs)
        # The predictor's promise, scaled by what the walks on this engine realised.
        scale = self.budget.value_scale(self.traversal)
        expected = [1.0 + scale * (e - 1.0) for e in itertools.accumulate(reach)]
        lengths = [max(r.num_tokens for r in p.requests) for p in plan.proposals]
        m = self.budget.best_size(expected, self.kernel.sequences_per_proposal, lengths)
        if logger.isEnabledFor(logging.DEBUG):  # (the fit is solved for the message only)
            logger.debug(
                "%s round: %d of %d proposals (expected %.2f of %.2f transitions, value scale "
                "%.2f, cost fit %s)",
                self.traversal,
                m,
                len(plan.proposals),
                expected[m - 1],
                expected[-1],
                scale,
                self.budget.fitted(),
            )
        if m == len(plan.proposals):
            return plan
        return RoundPlan(plan.proposals[:m], per_depth=False)

    async def _advance(self, root: ChainState, block: int, k: int) -> tuple[ChainState, int]:
        ctx = PlanContext(
            self.kernel,
            self.randomness,
            root,
            block,
            k,
            self.config.steps_per_block - k,
            self.predictor,
        )
        plan = self._sized(self.rule(ctx, self._round_size()))
        requests = plan.requests()
        per = self.kernel.sequences_per_proposal
        speculative = (len(plan.proposals) - 1) * per
        self.budget.add_head(per)
        self.budget.try_acquire(speculative)  # within what _round_size saw available
        self.stats.rounds += 1
        self.stats.requests_issued += len(plan.proposals)
        self.stats.sequences_issued += len(requests)
        # Every proposal of the round goes out at once (one engine call each, concurrently), and
        # the walk takes each as it arrives: the round no longer waits for suffixes it cannot
        # use, and requests of subtrees the walk has left are cancelled (the server aborts them).
        start = time.perf_counter()
        tighten_before = self.stats.tighten_wall_s
        pending = {id(p): asyncio.ensure_future(self._generate_proposal(p)) for p in plan.proposals}
        tokens = 0

        # The walk: every decision against the state realised at that node.
        state, held = root, root.length
        path: tuple[bool, ...] = ()
        done = accepts = 0
        try:
            while k + done < self.config.steps_per_block:
                planned = plan.lookup(path)
                if planned is None or planned.cut > held:
                    break  # no usable proposal here: this node roots the next round
                if self.kernel.state_dependent_cut and (
                    self.kernel.cut(state, planned.draws.u_cut) != planned.cut
                ):
                    break  # the cut was speculated under the root's law; this state disagrees
                planned.results = await pending.pop(id(planned))
                tokens += sum(len(r) for r in planned.results)
                verdict = await self._decide(
                    state, planned.cut, planned.results, planned.draws, block, k + done
                )
                done += 1
                if verdict.accepted:
                    accepts += 1
                    state = self.kernel.accept(state, planned.cut, planned.results, verdict)
                    held = planned.cut
                path = (*path, verdict.accepted)
                self._cancel_unreachable(plan, pending, path, held)
        finally:
            tokens += await self._close_round(pending)
            self.budget.remove_head(per)
            self.budget.release(speculative)
        wall = time.perf_counter() - start - (self.stats.tighten_wall_s - tighten_before)
        if done > 0 and any(p.reach != 1.0 for p in plan.proposals):  # (predictive)
            predicted = sum(p.reach for p in plan.proposals)
            self.budget.record_round_value(self.traversal, predicted - 1.0, done - 1.0)
        self.stats.call_wall_s.append(wall)
        self.stats.tokens_generated += tokens
        self.stats.requests_used += done
        self._emit(
            block=block,
            kind="propose",
            requests=len(plan.proposals),
            sequences=len(requests),
            used=done,
            transitions=done,
            accepts=accepts,
            wall_s=wall,
            tokens=tokens,
        )
        return state, done

    async def _generate_proposal(self, planned: PlannedProposal) -> list[ScoredTokens]:
        in_flight = self.budget.in_flight
        results, wall = await self._generate(planned.requests)
        # The engine's cost as seen by one whole request (the stream traversal sees it per
        # chunk): seconds per token at the load it started under.
        self.budget.observe(planned.requests[0].num_tokens, wall, in_flight)
        return results

    def _cancel_unreachable(
        self,
        plan: RoundPlan,
        pending: dict[int, asyncio.Future[list[ScoredTokens]]],
        path: tuple[bool, ...],
        held: int,
    ) -> None:
        """Cancel the requests the walk can no longer reach from the node at ``path``."""
        depth = len(path)
        for p in plan.proposals:
            future = pending.get(id(p))
            if future is None:
                continue
            if p.path is None:  # crn: one proposal per depth, usable while its cut is held
                reachable = p.depth >= depth and p.cut <= held
            else:
                reachable = len(p.path) >= depth and p.path[:depth] == path
            if not reachable and not future.done():  # a finished one is counted at the end
                del pending[id(p)]
                future.cancel()
                self._cancelled.append(future)
                self.stats.requests_cancelled += 1

    async def _close_round(self, pending: dict[int, asyncio.Future[list[ScoredTokens]]]) -> int:
        """Cancel what the walk did not use; tokens of the unused proposals that did arrive."""
        tokens = 0
        for future in pending.values():
            if future.done():
                if not future.cancelled() and future.exception() is None:
                    tokens += sum(len(r) for r in future.result())
            else:
                future.cancel()
                self.stats.requests_cancelled += 1
        closing = [*pending.values(), *self._cancelled]
        self._cancelled.clear()
        if closing:  # let cancelled requests finish closing (their connections released)
            await asyncio.gather(*closing, return_exceptions=True)
        return tokens
