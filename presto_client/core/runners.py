"""Runners: drive one chain's transitions through an engine.

* :class:`SequentialRunner` is the baseline: one engine call per transition, each waiting for
  the previous decision.
* :class:`PrestoRunner` generates a round of prefetched proposals in one batched call, then walks
  the realised path with the original MH rule. Every ``log A`` is computed during the walk against
  the state the walk actually holds at that node, never against the round's root.

Both take the transition draws from :class:`~presto_client.core.rng.ChainRandomness` and decisions
from :mod:`presto_client.core.kernels`, so ``sequential`` and ``crn`` replay the same chain.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from presto_client.core.engine_protocol import (
    ConcurrencyBounded,
    Engine,
    EngineView,
    ProposalRequest,
    ScoredTokens,
    ScoreRequest,
)
from presto_client.core.kernels import Kernel, Verdict, make_kernel
from presto_client.core.predictor import CertaintyPredictor
from presto_client.core.rng import ChainRandomness, TransitionDraws
from presto_client.core.sampler_config import (
    BASELINE_TRAVERSALS,
    SamplerConfig,
    arm_traversal_names,
    traversal_names,
)
from presto_client.core.speculation import SpeculationBudget, budget_for
from presto_client.core.state import ChainState
from presto_client.core.stats import ChainStats, RoundKind, RoundRecord, TransitionRecord
from presto_client.core.tree import TRAVERSAL_RULES, PlanContext, PlannedProposal, RoundPlan
from presto_client.errors import InvalidResponseError

logger = logging.getLogger(__name__)

RoundCallback = Callable[[RoundRecord], None]


@dataclass(slots=True)
class ChainResult:
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    """The final response, truncated after the first EOS."""
    full_token_ids: tuple[int, ...]
    final_state: ChainState
    stats: ChainStats
    transitions: list[TransitionRecord]


class _Runner:
    """What both runners share: the chain's engine, kernel, draws, statistics and records."""

    def __init__(
        self,
        engine: Engine,
        sampler: SamplerConfig,
        seed: int,
        on_round: RoundCallback | None,
    ) -> None:
        self.engine = engine
        self.config = sampler
        self.kernel: Kernel = make_kernel(sampler)
        self.randomness = ChainRandomness(
            seed,
            k_try=self.kernel.sequences_per_proposal,
            num_temperatures=len(sampler.temperatures),
        )
        self.stats = ChainStats()
        self.transitions: list[TransitionRecord] = []
        self._on_round = on_round
        self._round_index = 0

    def _emit(
        self,
        *,
        block: int,
        kind: RoundKind,
        requests: int,
        sequences: int,
        used: int,
        transitions: int,
        accepts: int,
        wall_s: float,
        tokens: int,
    ) -> None:
        """Number the engine call and hand its :class:`RoundRecord` to the callback."""
        record = RoundRecord(
            block=block,
            round=self._round_index,
            kind=kind,
            requests=requests,
            sequences=sequences,
            used=used,
            transitions=transitions,
            accepts=accepts,
            wall_s=wall_s,
            tokens=tokens,
        )
        self._round_index += 1
        if self._on_round is not None:
            self._on_round(record)

    async def _generate(self, requests: list[ProposalRequest]) -> tuple[list[ScoredTokens], float]:
        start = time.perf_counter()
        results = await self.engine.generate(requests)
        wall = time.perf_counter() - start
        if len(results) != len(requests):
            raise InvalidResponseError(
                f"asked for {len(requests)} proposals, got {len(results)}", engine=self.engine.name
            )
        for request, result in zip(requests, results, strict=True):
            if len(result) != request.num_tokens:
                raise InvalidResponseError(
                    f"asked for {request.num_tokens} tokens, got {len(result)}",
                    engine=self.engine.name,
                )
        return results, wall

    async def run(self, prompt_ids: Sequence[int]) -> ChainResult:
        state = ChainState(
            tuple(int(t) for t in prompt_ids),
            ScoredTokens.empty(
                len(self.kernel.score_spec.temperatures), self.kernel.score_spec.entropy
            ),
        )
        for block in range(self.config.num_blocks):
            request = self.kernel.extension_request(
                state.prefix(state.length), self.randomness.extension_seed(block)
            )
            (extension,), wall = await self._generate([request])
            self.stats.extend_calls += 1
            self.stats.extend_wall_s += wall
            self.stats.tokens_generated += len(extension)
            self._emit(
                block=block,
                kind="extend",
                requests=1,
                sequences=1,
                used=1,
                transitions=0,
                accepts=0,
                wall_s=wall,
                tokens=len(extension),
            )
            state = state.extend(extension)
            k = 0
            while k < self.config.steps_per_block:
                state, done = await self._advance(state, block, k)
                k += done
        full = state.token_ids
        eos = self.config.eos_token_id
        final = full[: full.index(eos) + 1] if eos is not None and eos in full else full
        self.stats.record_final_response(state.response.slice(0, len(final)))
        return ChainResult(state.prompt, final, full, state, self.stats, self.transitions)

    async def _advance(self, state: ChainState, block: int, k: int) -> tuple[ChainState, int]:
        raise NotImplementedError

    async def _decide(
        self,
        state: ChainState,
        cut: int,
        proposals: list[ScoredTokens],
        draws: TransitionDraws,
        block: int,
        k: int,
    ) -> Verdict:
        """The kernel's decision; tightens interval scores when they cannot settle it."""
        verdict = self.kernel.evaluate(state, cut, proposals, draws)
        tightened = False
        if not verdict.decided:
            tightened = True
            self.stats.ambiguous += 1
            exact_state, exact_proposals = await self._tighten(state, cut, proposals, block)
            verdict = self.kernel.evaluate(exact_state, cut, exact_proposals, draws)
            if not verdict.decided:
                raise AssertionError("exact scores must decide every transition")
        for proposal in proposals:
            self.stats.record_drift(self.kernel.normaliser_drift(state, cut, proposal))
        self._record_decision(verdict, cut, block, k, tightened)
        return verdict

    def _record_decision(
        self, verdict: Verdict, cut: int, block: int, k: int, tightened: bool
    ) -> None:
        self.stats.transitions += 1
        self.stats.accepts += int(verdict.accepted)
        self.stats.eps_certain += int(verdict.eps_certain)
        self.transitions.append(
            TransitionRecord(
                block,
                k,
                cut,
                verdict.accepted,
                verdict.selected,
                verdict.log_accept,
                verdict.eps_certain,
                tightened,
            )
        )

    async def _tighten(
        self, state: ChainState, cut: int, proposals: list[ScoredTokens], block: int
    ) -> tuple[ChainState, list[ScoredTokens]]:
        """Exact ``log q`` for the current suffix and every proposal (one scoring call)."""
        prefix = state.prefix(cut)
        current = state.response.slice(cut)
        spec = self.kernel.score_spec
        requests = [
            ScoreRequest(prefix, tuple(int(t) for t in s.token_ids), spec)
            for s in (current, *proposals)
        ]
        start = time.perf_counter()
        exact = await self.engine.score(requests)
        wall = time.perf_counter() - start
        self.stats.tighten_calls += 1
        self.stats.tighten_wall_s += wall
        self._emit(
            block=block,
            kind="tighten",
            requests=len(requests),
            sequences=len(requests),
            used=0,
            transitions=0,
            accepts=0,
            wall_s=wall,
            tokens=0,
        )
        tightened = [
            s.with_exact_logq(e.logq_lo) for s, e in zip((current, *proposals), exact, strict=True)
        ]
        return state.splice(cut, tightened[0]), tightened[1:]


class SequentialRunner(_Runner):
    """The baseline chain: draw, generate, decide; one engine call per transition.

    With a :class:`SpeculationBudget` it never speculates, but it reports its calls to the
    budget (in flight, and their seconds per token): the single-sequence end of the engine's
    cost curve that PreSTO chains on the same engine size their speculation from.
    """

    def __init__(
        self,
        engine: Engine,
        sampler: SamplerConfig,
        seed: int,
        on_round: RoundCallback | None,
        *,
        budget: SpeculationBudget | None = None,
    ) -> None:
        super().__init__(engine, sampler, seed, on_round)
        self.budget = budget

    async def _advance(self, state: ChainState, block: int, k: int) -> tuple[ChainState, int]:
        draws = self.randomness.transition(block, k)
        cut = self.kernel.cut(state, draws.u_cut)
        requests = self.kernel.requests(state.prefix(cut), state.length - cut, draws)
        if self.budget is None:
            proposals, wall = await self._generate(requests)
        else:
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


class PrestoRunner(_Runner):
    """PreSTO: one batched call per round, then a walk along the realised path."""

    def __init__(
        self,
        engine: Engine,
        sampler: SamplerConfig,
        seed: int,
        on_round: RoundCallback | None,
        *,
        traversal: str,
        n_pf: int,
        predictor: CertaintyPredictor | None = None,
        budget: SpeculationBudget | None = None,
    ) -> None:
        super().__init__(engine, sampler, seed, on_round)
        if traversal not in TRAVERSAL_RULES:
            raise ValueError(
                f"unknown traversal {traversal!r}; valid traversals are {sorted(TRAVERSAL_RULES)}"
            )
        if n_pf < 1:
            raise ValueError("n_pf must be >= 1")
        self.rule = TRAVERSAL_RULES[traversal]
        self.traversal = traversal
        self.n_pf = n_pf
        self.predictor = predictor
        self.budget = budget if budget is not None else SpeculationBudget(None, adaptive=False)
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
        m = self.budget.best_size(expected, self.kernel.sequences_per_proposal)
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


async def run_chain(
    engine: Engine,
    prompt_ids: Sequence[int],
    sampler: SamplerConfig,
    *,
    traversal: str = "stream",
    n_pf: int = 8,
    seed: int = 0,
    on_round: RoundCallback | None = None,
    predictor: CertaintyPredictor | None = None,
) -> ChainResult:
    """Run one chain: ``traversal="sequential"`` is the baseline, the others are PreSTO.

    ``n_pf`` is the round size of ``bfs``/``predictive``/``crn`` and the window (the cap of
    proposals in flight) of ``stream``.
    """
    if traversal in BASELINE_TRAVERSALS:  # no MH: one plain sample (issue 11)
        from presto_client.core.baseline_runners import BaselineRunner  # it imports this module

        return await BaselineRunner(engine, sampler, seed, on_round, traversal=traversal).run(
            prompt_ids
        )
    if traversal not in traversal_names():
        raise ValueError(
            f"unknown traversal {traversal!r}; valid traversals are {arm_traversal_names()}"
        )
    runner: _Runner
    # Chains that share an engine share one speculation budget (presto_client.core.speculation).
    # (the orchestrator gives each chain its own view of an engine: the budget is the engine's)
    capacity = engine.max_concurrency if isinstance(engine, ConcurrencyBounded) else None
    shared = engine.shared_engine if isinstance(engine, EngineView) else engine
    budget = budget_for(shared, capacity)
    if traversal == "sequential":
        runner = SequentialRunner(engine, sampler, seed, on_round, budget=budget)
    else:
        if traversal == "stream":
            from presto_client.core.stream_runner import StreamRunner  # it imports this module

            runner = StreamRunner(engine, sampler, seed, on_round, window=n_pf, budget=budget)
        else:
            runner = PrestoRunner(
                engine,
                sampler,
                seed,
                on_round,
                traversal=traversal,
                n_pf=n_pf,
                predictor=predictor,
                budget=budget,
            )
    return await runner.run(prompt_ids)
