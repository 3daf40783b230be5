"""The ``stream`` traversal: a window of in-flight proposals, walked as their tokens arrive.

Rounds (``bfs``, ``predictive``, ``crn``) wait for their longest suffix and cannot start the
next round before the walk is done. With transition-keyed draws (method §4, "common random
numbers") neither wait is needed. The chain keeps the proposals of its next ``W`` transitions in
flight, each with that transition's own draws and each requested from the freshest state held
when it was issued. The walk takes transitions in order:

* transition ``m`` is decided as soon as its proposal has fully arrived, or earlier when the
  kernel's :class:`~presto_client.core.kernels.RejectionBound` shows that it is certainly rejected
  (its stream is then closed: early rejection, method §5);
* a proposal issued from state ``S`` is usable at ``m`` iff the walk's state still has ``S``'s
  tokens before its cut (for EntropyCut the cut must also be the one the realised state's law
  draws from the transition's uniform). Then the request is exactly the one the sequential chain
  makes at ``m`` (same prefix, same seed), which is why the chain is the sequential chain's,
  token for token. Checking the tokens (rather than "no accept below the cut") also keeps
  proposals whose prefix an accept rewrote to the same tokens;
* the moment an accept makes an in-flight proposal unusable its stream is closed (the server
  aborts it and frees the batch slot) and it is re-issued from the new state; after every
  transition the window is refilled from the current state.

Every decision is the kernel's (``kernels.py``), against the state the walk holds. How many of the
``W`` proposals are in flight at once is set by the engine's shared
:class:`~presto_client.core.speculation.SpeculationBudget`; it changes the speed, never the chain.

Statistics: a *call* of this traversal is a wait of the walk on the engine together with the
transitions decided after it without waiting (one ``stream`` record each; ``call_wall_s`` is the
time the walk spent waiting), so ``transitions_per_call`` counts transitions per wait, as for the
round-based rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from presto_client.core.chain_runner import ChainResult, ChainRunner, RoundCallback
from presto_client.core.engine_protocol import Engine, ProposalRequest, ScoredTokens
from presto_client.core.kernels import RejectionBound, Verdict
from presto_client.core.rng import TransitionDraws
from presto_client.core.settings import SamplerConfig
from presto_client.core.speculation import SpeculationBudget
from presto_client.core.state import ChainState
from presto_client.errors import EngineError, InvalidResponseError

logger = logging.getLogger(__name__)

STREAM_RETRIES = 2
"""A broken stream (connection lost midway) is re-requested this many times (same seed)."""

HEAD = "head"
SPECULATIVE = "speculative"


def join_chunks(chunks: Sequence[ScoredTokens]) -> ScoredTokens:
    """One :class:`ScoredTokens` from a stream's chunks (one concatenation, not one per chunk)."""
    if len(chunks) == 1:
        return chunks[0]
    first = chunks[0]
    entropy = None
    if first.entropy is not None:
        parts = [c.entropy for c in chunks]
        if any(p is None for p in parts):
            raise ValueError("cannot join scores with and without entropy")
        entropy = np.concatenate([p for p in parts if p is not None])
    return ScoredTokens(
        token_ids=np.concatenate([c.token_ids for c in chunks]),
        logp0=np.concatenate([c.logp0 for c in chunks]),
        logq_lo=np.concatenate([c.logq_lo for c in chunks]),
        logq_hi=np.concatenate([c.logq_hi for c in chunks]),
        entropy=entropy,
    )


@dataclass(slots=True, eq=False)
class _InFlight:
    """One transition's proposal in flight: its draws, cut, prefix and streamed sequences."""

    k: int
    draws: TransitionDraws
    cut: int
    response_prefix: np.ndarray
    """The response tokens before the cut that the proposal was requested after."""
    requests: list[ProposalRequest]
    role: str
    chunks: list[list[ScoredTokens]] = field(default_factory=list)
    received: list[int] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)
    active: list[bool] = field(default_factory=list)
    """Sequences still holding a slot of the budget (streaming, not yet finished or closed)."""
    attempts: int = 0
    """Restarts after broken streams: the walk rebuilds its rejection bound when it changes."""
    closed: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    error: BaseException | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def complete(self) -> bool:
        return all(self.finished)

    @property
    def tokens(self) -> int:
        return sum(self.received)


class StreamRunner(ChainRunner):
    """PreSTO with a streaming window of ``window`` in-flight proposals (see the module doc)."""

    def __init__(
        self,
        engine: Engine,
        sampler: SamplerConfig,
        seed: int,
        on_round: RoundCallback | None,
        *,
        window: int,
        budget: SpeculationBudget | None = None,
        early_rejection: bool = True,
    ) -> None:
        super().__init__(engine, sampler, seed, on_round)
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self.budget = budget if budget is not None else SpeculationBudget(None, adaptive=False)
        self.early_rejection = early_rejection
        self._tasks: set[asyncio.Task[None]] = set()
        self._issued_since = 0
        self._sequences_since = 0
        self._tokens_since = 0
        self._open_transitions = 0
        self._open_accepts = 0
        self._open_wall = 0.0

    # ---- issuing and cancelling

    def _issue(self, state: ChainState, block: int, k: int, role: str) -> _InFlight:
        draws = self.randomness.transition(block, k)
        cut = self.kernel.cut(state, draws.u_cut)
        requests = self.kernel.requests(state.prefix(cut), state.length - cut, draws)
        n = len(requests)
        flight = _InFlight(
            k=k,
            draws=draws,
            cut=cut,
            response_prefix=state.response.token_ids[:cut].copy(),
            requests=requests,
            role=role,
            chunks=[[] for _ in range(n)],
            received=[0] * n,
            finished=[False] * n,
            active=[True] * n,
        )
        if role == HEAD:
            self.budget.add_head(n)
        for i in range(n):
            task = asyncio.create_task(self._consume(flight, i))
            flight.tasks.append(task)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.stats.requests_issued += 1
        self.stats.sequences_issued += n
        self._issued_since += 1
        self._sequences_since += n
        return flight

    def _leave(self, flight: _InFlight, index: int) -> None:
        """Sequence ``index`` no longer runs on the engine: give its slot back."""
        if not flight.active[index]:
            return
        flight.active[index] = False
        if flight.role == HEAD:
            self.budget.remove_head(1)
        else:
            self.budget.release(1)

    def _promote(self, flight: _InFlight) -> None:
        """A speculative proposal becomes the head: its running sequences move budgets."""
        if flight.role == HEAD:
            return
        running = sum(flight.active)
        self.budget.release(running)
        self.budget.add_head(running)
        flight.role = HEAD

    def _close(self, flight: _InFlight) -> int:
        """Close every stream of ``flight`` (the server aborts them); tokens not generated.

        Closing twice is a no-op (the walk's cleanup closes whatever is still open)."""
        if flight.closed:
            return 0
        flight.closed = True
        for task in flight.tasks:
            task.cancel()
        for i in range(len(flight.requests)):
            self._leave(flight, i)
        self.stats.tokens_generated += flight.tokens
        self._tokens_since += flight.tokens
        return sum(r.num_tokens for r in flight.requests) - flight.tokens

    async def _consume(self, flight: _InFlight, index: int) -> None:
        """Stream sequence ``index`` into ``flight``; errors are kept for the walk to raise."""
        request = flight.requests[index]
        retries = 0
        try:
            while True:
                try:
                    await self._stream_once(flight, index, request)
                    return
                except EngineError as exc:
                    if not exc.retryable or retries >= STREAM_RETRIES:
                        raise
                    retries += 1
                    logger.info(
                        "[%s] transition %d: stream broke after %d tokens (%s); retry %d/%d",
                        self.engine.name,
                        flight.k,
                        flight.received[index],
                        exc,
                        retries,
                        STREAM_RETRIES,
                    )
                    # A fresh sample replaces the broken one: whether a stream breaks does not
                    # depend on its tokens, so the kernel is unchanged.
                    flight.chunks[index] = []
                    flight.received[index] = 0
                    flight.attempts += 1
                    flight.changed.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handed to the walk, which raises it if it needs this proposal
            flight.error = exc
            flight.changed.set()
        finally:
            self._leave(flight, index)

    async def _stream_once(self, flight: _InFlight, index: int, request: ProposalRequest) -> None:
        budget = self.budget
        previous: float | None = None
        async with contextlib.aclosing(self.engine.stream(request)) as chunks:
            async for chunk in chunks:
                n = len(chunk)
                if n == 0:
                    continue
                now = time.perf_counter()
                if previous is not None:  # the first chunk carries queueing and prefill
                    budget.observe(n, now - previous, budget.in_flight)
                previous = now
                flight.chunks[index].append(chunk)
                flight.received[index] += n
                flight.changed.set()
        if flight.received[index] != request.num_tokens:
            raise InvalidResponseError(
                f"transition {flight.k}: asked for {request.num_tokens} tokens, the stream "
                f"delivered {flight.received[index]}",
                engine=self.engine.name,
            )
        flight.finished[index] = True
        flight.changed.set()

    # ---- usability

    def _usable(self, flight: _InFlight, state: ChainState) -> bool:
        """Whether ``flight`` is the request the sequential chain would make from ``state``."""
        current = state.response.token_ids[: flight.cut]
        if not np.array_equal(current, flight.response_prefix):
            return False
        if self.kernel.state_dependent_cut:
            return self.kernel.cut(state, flight.draws.u_cut) == flight.cut
        return True

    # ---- the walk

    async def _advance(self, state: ChainState, block: int, k: int) -> tuple[ChainState, int]:
        steps = self.config.steps_per_block
        window: dict[int, _InFlight] = {}
        head: _InFlight | None = None
        start_k = k
        try:
            m = k
            while m < steps:
                self._refill(window, state, block, m, steps)
                head = window.pop(m)
                self._promote(head)
                state = await self._transition(state, head, block, window)
                head = None
                m += 1
        finally:
            # The walk was stopped (cancelled, or a proposal failed): the head it was waiting
            # on is out of the window but still streaming, and is closed with the rest, so
            # that the drain below waits only for cancelled streams to close, never for a
            # request to run to its end (a stalled server, a retried connection).
            if head is not None and not head.complete:
                window[head.k] = head
            for flight in window.values():
                self._close(flight)
            if window:
                await self._drain()
            self._flush(block)
        return state, steps - start_k

    def _refill(
        self, window: dict[int, _InFlight], state: ChainState, block: int, m: int, steps: int
    ) -> None:
        if m not in window:
            window[m] = self._issue(state, block, m, HEAD)
        per_proposal = self.kernel.sequences_per_proposal
        for j in range(m + 1, min(m + self.window, steps)):
            if j in window:
                continue
            if not self.budget.try_acquire(per_proposal):
                break  # the engine's budget is spent: speculate less, never out of order
            window[j] = self._issue(state, block, j, SPECULATIVE)

    async def _transition(
        self, state: ChainState, flight: _InFlight, block: int, window: dict[int, _InFlight]
    ) -> ChainState:
        verdict, waited = await self._await_decision(state, flight, block)
        if verdict is not None:  # early rejection: close the rest of the proposal
            saved = self._close(flight)
            self.stats.early_rejects += 1
            self.stats.tokens_saved_early += saved
            self._record_decision(verdict, flight.cut, block, flight.k, False)
        else:
            self.stats.tokens_generated += flight.tokens
            self._tokens_since += flight.tokens
            proposals = [join_chunks(c) for c in flight.chunks]
            verdict = await self._decide(
                state, flight.cut, proposals, flight.draws, block, flight.k
            )
            if verdict.accepted:
                state = self.kernel.accept(state, flight.cut, proposals, verdict)
                for j in [j for j, other in window.items() if not self._usable(other, state)]:
                    self._close(window.pop(j))
                    self.stats.requests_cancelled += 1
        self.stats.requests_used += 1
        if waited is not None:  # a wait on the engine opens a new call record
            self._flush(block)
        self._open_transitions += 1
        self._open_accepts += int(verdict.accepted)
        self._open_wall += waited or 0.0
        return state

    def _flush(self, block: int) -> None:
        """Record the open call: one wait of the walk and the transitions decided after it
        without waiting (so ``rounds`` counts waits and ``transitions_per_call`` transitions
        per wait, as for the round-based rules)."""
        if self._open_transitions == 0:
            return
        self.stats.rounds += 1
        self.stats.call_wall_s.append(self._open_wall)
        self._emit(
            block=block,
            kind="stream",
            requests=self._issued_since,
            sequences=self._sequences_since,
            used=self._open_transitions,
            transitions=self._open_transitions,
            accepts=self._open_accepts,
            wall_s=self._open_wall,
            tokens=self._tokens_since,
        )
        self._issued_since = self._sequences_since = self._tokens_since = 0
        self._open_transitions = self._open_accepts = 0
        self._open_wall = 0.0

    async def _await_decision(
        self, state: ChainState, flight: _InFlight, block: int
    ) -> tuple[Verdict | None, float | None]:
        """Wait until ``flight`` is complete or certainly rejected.

        Returns the early rejection's verdict (``None`` when the proposal completed) and the time
        the walk waited (``None`` when it did not wait at all).
        """
        bound: RejectionBound | None = None
        fed: list[int] = []
        attempts = -1
        waited: float | None = None
        while True:
            if flight.error is not None:
                raise flight.error
            if self.early_rejection and not flight.complete:
                if attempts != flight.attempts:  # first look, or a stream restarted: rebuild
                    attempts = flight.attempts
                    bound = self.kernel.rejection_bound(state, flight.cut, flight.draws)
                    fed = [0] * len(flight.requests)
                if bound is not None:
                    for i, chunks in enumerate(flight.chunks):
                        while fed[i] < len(chunks):
                            bound.feed(i, chunks[fed[i]])
                            fed[i] += 1
                    if bound.rejects():
                        return bound.verdict(), waited
            if flight.complete:
                return None, waited
            flight.changed.clear()
            started = time.perf_counter()
            await flight.changed.wait()
            waited = (waited or 0.0) + time.perf_counter() - started

    async def _drain(self) -> None:
        """Wait for closed streams to finish closing (their HTTP connections released)."""
        pending = list(self._tasks)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def run(self, prompt_ids: Sequence[int]) -> ChainResult:
        try:
            return await super().run(prompt_ids)
        finally:
            for task in list(self._tasks):
                task.cancel()
            await self._drain()
