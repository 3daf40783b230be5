"""The base of every runner: one chain's engine, kernel, draws, statistics and records.

A runner drives one chain's transitions through an engine: it takes the transition draws from
:class:`~presto_client.core.rng.ChainRandomness` and every decision from
:mod:`presto_client.core.kernels`, so that runners of the same chain replay each other where their
method says so (:mod:`presto_client.core.methods`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from presto_client.core.engine_protocol import Engine, ProposalRequest, ScoredTokens, ScoreRequest
from presto_client.core.kernels import Kernel, Verdict, make_kernel
from presto_client.core.predictor import CertaintyPredictor
from presto_client.core.rng import ChainRandomness, TransitionDraws
from presto_client.core.settings import SamplerConfig
from presto_client.core.shared_draws import SharedDraws
from presto_client.core.speculation import SpeculationBudget
from presto_client.core.state import ChainState
from presto_client.core.stats import ChainStats, RoundKind, RoundRecord, TransitionRecord
from presto_client.errors import InvalidResponseError

RoundCallback = Callable[[RoundRecord], None]

DRIFT_LIMIT = 0.5
"""Nats: the most the normalisers ``log Z_τ`` that the state's token at a cut and a proposal's
first token certify (both scored after the same context) may lie apart
(:func:`normaliser_gap`). Numerical noise is far below it (fp32 engines ~1e-5, a bf16 KV cache
0.1-0.4 at τ = 1/4); rows shifted by a position give 1-4 nats."""


def normaliser_gap(
    x: ScoredTokens, position: int, y: ScoredTokens, temperatures: Sequence[float]
) -> float:
    """How far apart the normalisers ``log Z_τ`` that ``x`` at ``position`` and ``y`` at 0
    certify are, in nats (0 when their intervals meet). Both tokens were scored after the same
    context, so both intervals hold the one true ``log Z_τ`` of that row: a gap means the
    engine's rows do not belong to their positions (or differ between requests)."""
    worst = 0.0
    for m, tau in enumerate(temperatures):
        x_lo = x.logp0[position] / tau - x.logq_hi[position, m]
        x_hi = x.logp0[position] / tau - x.logq_lo[position, m]
        y_lo = y.logp0[0] / tau - y.logq_hi[0, m]
        y_hi = y.logp0[0] / tau - y.logq_lo[0, m]
        worst = max(worst, float(x_lo - y_hi), float(y_lo - x_hi))
    return worst


def first_eos(state: ChainState, eos_token_id: int | None) -> int | None:
    """The position of the state's first EOS in its response (``None``: none, or no EOS)."""
    if eos_token_id is None:
        return None
    hits = np.flatnonzero(state.response.token_ids == eos_token_id)
    return int(hits[0]) if hits.size else None


@dataclass(slots=True)
class ChainResult:
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    """The final response, truncated after the first EOS."""
    full_token_ids: tuple[int, ...]
    final_state: ChainState
    stats: ChainStats
    transitions: list[TransitionRecord]
    alternatives: tuple[tuple[int, ...], ...] = ()
    """Further answers of the chain, EOS-truncated (``majority_vote``: the other samples, which
    a graded job grades too and scores by their majority); empty for every other method."""


@dataclass(frozen=True, slots=True)
class ChainSetup:
    """What every runner is made from: one chain on one engine (a method's own options, such as
    a baseline's temperature, are its runner's keywords)."""

    engine: Engine
    sampler: SamplerConfig
    seed: int = 0
    on_round: RoundCallback | None = None
    size: int | None = None
    """The method's size: a round method's ``n_pf``, ``stream``'s window (``None``: the
    budget sizes it), a sample baseline's ``N``; ``None`` for a method without one."""
    budget: SpeculationBudget = field(default_factory=SpeculationBudget.unmeasured)
    """The speculation budget of the chain's engine, shared by the chains on it (the default:
    one of this chain's own, unmeasured; ``run_chain`` hands one sized for the engine)."""
    predictor: CertaintyPredictor | None = None
    draws: SharedDraws | None = None
    """The sample draws of the chain's engine that arms reading the same samples share."""


class ChainRunner:
    """What every runner shares: the chain's engine, kernel, draws, statistics and records.

    A runner of a new method subclasses it and implements :meth:`_advance` (one or more
    transitions from a state), :meth:`_run_block` (a block's extension and transitions
    together), or :meth:`run` itself (a baseline without MH)."""

    def __init__(self, setup: ChainSetup) -> None:
        self.setup = setup
        self.engine = setup.engine
        self.config = sampler = setup.sampler
        self.kernel: Kernel = make_kernel(sampler)
        self.randomness = ChainRandomness(
            setup.seed,
            k_try=self.kernel.sequences_per_proposal,
            num_temperatures=len(sampler.temperatures),
        )
        self.budget = setup.budget
        self.stats = ChainStats()
        self.transitions: list[TransitionRecord] = []
        self._on_round = setup.on_round
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
        started = time.perf_counter()
        state = ChainState(
            tuple(int(t) for t in prompt_ids),
            ScoredTokens.empty(
                len(self.kernel.score_spec.temperatures), self.kernel.score_spec.entropy
            ),
        )
        for block in range(self.config.num_blocks):
            state = await self._run_block(state, block)
            self.stats.blocks_run += 1
            if self._stops(state):
                self.stats.stopped_at_eos = block + 1 < self.config.num_blocks
                break
        self.stats.chain_wall_s = time.perf_counter() - started
        return self._result(state)

    def _stops(self, state: ChainState) -> bool:
        """The stop rule (method §2 step 3), read at the end of a block: the state holds an
        EOS. It reads nothing but that state, so it is part of the sequential chain, and every
        runner that replays the chain stops at the same block."""
        return self.config.stop_at_eos and first_eos(state, self.config.eos_token_id) is not None

    def _result(self, state: ChainState) -> ChainResult:
        """The chain's result: its response truncated after the first EOS."""
        full = state.token_ids
        final = self._truncated(state)
        self.stats.response_tokens = len(final)
        self.stats.record_final_response(state.response.slice(0, len(final)))
        return ChainResult(state.prompt, final, full, state, self.stats, self.transitions)

    def _truncated(self, state: ChainState) -> tuple[int, ...]:
        """The state's response, truncated after its first EOS."""
        full = state.token_ids
        eos_at = first_eos(state, self.config.eos_token_id)
        return full if eos_at is None else full[: eos_at + 1]

    async def _run_block(self, state: ChainState, block: int) -> ChainState:
        """One block: its extension, then its ``K`` transitions (:meth:`_advance`)."""
        state = await self._extend(state, block)
        k = 0
        while k < self.config.steps_per_block:
            state, done = await self._advance(state, block, k)
            k += done
        return state

    def _extension_request(self, state: ChainState, block: int) -> ProposalRequest:
        return self.kernel.extension_request(
            state.prefix(state.length), self.randomness.extension_seed(block)
        )

    def _record_extension(self, block: int, extension: ScoredTokens, wall: float) -> None:
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

    async def _extend(self, state: ChainState, block: int) -> ChainState:
        """The block's fixed-length extension from ``q_τ`` (one engine call)."""
        (extension,), wall = await self._generate([self._extension_request(state, block)])
        self._record_extension(block, extension, wall)
        return state.extend(extension)

    async def _advance(self, state: ChainState, block: int, k: int) -> tuple[ChainState, int]:
        raise NotImplementedError(f"{type(self).__name__} implements neither _advance nor run")

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
            if len(proposal) == 0:
                continue
            gap = normaliser_gap(state.response, cut, proposal, self.kernel.score_spec.temperatures)
            if not gap <= DRIFT_LIMIT:
                raise InvalidResponseError(
                    f"the normaliser at cut {cut} differs by {gap:.3g} nats between two requests "
                    f"of the same context (limit {DRIFT_LIMIT:g}; float noise is below 1e-3): the "
                    "engine's logprob rows do not belong to their positions (shifted by one?) or "
                    "differ between requests; the chain is failed rather than decided on them",
                    engine=self.engine.name,
                )
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
                math.nan if verdict.early else verdict.log_accept,
                verdict.eps_certain,
                tightened,
                verdict.log_accept_hi if verdict.early else math.nan,
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
