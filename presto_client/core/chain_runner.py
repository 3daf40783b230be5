"""The base of every runner: one chain's engine, kernel, draws, statistics and records.

A runner drives one chain's transitions through an engine: it takes the transition draws from
:class:`~presto_client.core.rng.ChainRandomness` and every decision from
:mod:`presto_client.core.kernels`, so that runners of the same chain replay each other where their
method says so (:mod:`presto_client.core.methods`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from presto_client.core.engine_protocol import Engine, ProposalRequest, ScoredTokens, ScoreRequest
from presto_client.core.kernels import Kernel, Verdict, make_kernel
from presto_client.core.rng import ChainRandomness, TransitionDraws
from presto_client.core.settings import SamplerConfig
from presto_client.core.state import ChainState
from presto_client.core.stats import ChainStats, RoundKind, RoundRecord, TransitionRecord
from presto_client.errors import InvalidResponseError

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


class ChainRunner:
    """What every runner shares: the chain's engine, kernel, draws, statistics and records.

    A runner of a new method subclasses it and implements :meth:`_advance` (one or more
    transitions from a state), or :meth:`run` itself (a baseline without MH)."""

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
