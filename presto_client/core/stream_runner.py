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

Every decision is the kernel's (``kernels.py``), against the state the walk holds. How many
proposals are in flight at once is set by the engine's shared
:class:`~presto_client.core.speculation.SpeculationBudget` (its measured cost and the slots the
chains' heads need), up to every remaining transition of the block; ``window`` is an optional cap
(``None``: none). It changes the speed, never the chain.

The block's own generation is overlapped too. The extension streams in, and a transition whose
cut lies inside the prefix already received can have its proposal issued at once: those tokens
are the state's (a stream that breaks and restarts may rewrite them, which the walk's token check
catches), and the draws are the transition's, so it is the request the sequential chain will make
(for EntropyCut the cut is a guess from the received entropies, used only if the realised state
draws it). Decisions still wait for the whole extension: ``log A`` needs the state's suffix.

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

import numpy as np

from presto_client.core.chain_runner import ChainResult, ChainRunner, RoundCallback
from presto_client.core.engine_protocol import Engine, ProposalRequest
from presto_client.core.kernels import RejectionBound, Verdict
from presto_client.core.rng import TransitionDraws
from presto_client.core.settings import SamplerConfig
from presto_client.core.speculation import SpeculationBudget
from presto_client.core.state import ChainState
from presto_client.core.stream_flight import InFlight, Streamed, join_chunks
from presto_client.errors import EngineError, InvalidResponseError

logger = logging.getLogger(__name__)

STREAM_RETRIES = 2
"""A broken stream (connection lost midway) is re-requested this many times (same seed)."""

HEAD = "head"
SPECULATIVE = "speculative"

SURVIVAL_FLOOR = 0.1
"""A speculative proposal is issued only while it is this likely to be usable at its turn
(no earlier transition of the window accepts at a smaller cut, by the chain's acceptance rate so
far): deeper ones with long prefixes still go out, those an earlier accept would likely rewrite
wait until the walk is nearer. Speed only: which proposals are in flight never changes the
chain."""
ACCEPT_PRIOR = (1.2, 4.0)
"""Prior of the acceptance rate (pseudo accepts, pseudo transitions) before the chain has its
own: 0.3."""


class StreamRunner(ChainRunner):
    """PreSTO with a streaming window of in-flight proposals (see the module doc)."""

    def __init__(
        self,
        engine: Engine,
        sampler: SamplerConfig,
        seed: int,
        on_round: RoundCallback | None,
        *,
        window: int | None = None,
        budget: SpeculationBudget | None = None,
        early_rejection: bool = True,
        overlap: bool = True,
    ) -> None:
        """``window``: the most proposals in flight (the walk's own included); ``None``: as many
        as the budget allows, up to every remaining transition. ``overlap``: issue proposals
        while the block's extension streams in."""
        super().__init__(engine, sampler, seed, on_round)
        if window is not None and window < 1:
            raise ValueError("window must be >= 1 (or None: no cap)")
        self.window = window
        self.budget = budget if budget is not None else SpeculationBudget(None, adaptive=False)
        self.early_rejection = early_rejection
        self.overlap = overlap
        self._tasks: set[asyncio.Task[None]] = set()
        self._draws: dict[tuple[int, int], TransitionDraws] = {}
        self._next: tuple[Streamed, np.ndarray] | None = None
        """The next block's extension, speculated from the state whose response it follows."""
        self._issued_since = 0
        self._sequences_since = 0
        self._tokens_since = 0
        self._open_transitions = 0
        self._open_accepts = 0
        self._open_wall = 0.0

    # ---- issuing and cancelling

    def _transition_draws(self, block: int, k: int) -> TransitionDraws:
        """Transition ``k``'s draws, computed once (the overlap asks for them per chunk)."""
        key = (block, k)
        draws = self._draws.get(key)
        if draws is None:
            if self._draws and next(iter(self._draws))[0] != block:
                self._draws.clear()  # a new block: the previous one's draws are done with
            draws = self._draws[key] = self.randomness.transition(block, k)
        return draws

    def _start(self, flight: Streamed) -> None:
        n = len(flight.requests)
        flight.chunks = [[] for _ in range(n)]
        flight.received = [0] * n
        flight.finished = [False] * n
        flight.active = [True] * n
        if flight.role == HEAD:
            self.budget.add_head(n)
        for i in range(n):
            task = asyncio.create_task(self._consume(flight, i))
            flight.tasks.append(task)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _issue(
        self,
        state: ChainState,
        block: int,
        k: int,
        role: str,
        *,
        cut: int | None = None,
        length: int | None = None,
    ) -> InFlight:
        """Transition ``k``'s proposal from ``state`` (the cut the kernel draws on it, unless
        given; ``length``: the response's length once complete, if ``state`` is a prefix)."""
        draws = self._transition_draws(block, k)
        if cut is None:
            cut = self.kernel.cut(state, draws.u_cut)
        length = state.length if length is None else length
        requests = self.kernel.requests(state.prefix(cut), length - cut, draws)
        flight = InFlight(
            k,
            requests,
            role,
            draws=draws,
            cut=cut,
            response_prefix=state.response.token_ids[:cut].copy(),
        )
        self._start(flight)
        n = len(requests)
        self.stats.requests_issued += 1
        self.stats.sequences_issued += n
        self._issued_since += 1
        self._sequences_since += n
        return flight

    def _leave(self, flight: Streamed, index: int) -> None:
        """Sequence ``index`` no longer runs on the engine: give its slot back."""
        if not flight.active[index]:
            return
        flight.active[index] = False
        if flight.role == HEAD:
            self.budget.remove_head(1)
        else:
            self.budget.release(1)

    def _promote(self, flight: InFlight) -> None:
        """A speculative proposal becomes the head: its running sequences move budgets."""
        if flight.role == HEAD:
            return
        running = sum(flight.active)
        self.budget.release(running)
        self.budget.add_head(running)
        flight.role = HEAD

    def _close(self, flight: Streamed) -> int:
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

    async def _consume(self, flight: Streamed, index: int) -> None:
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
                        "[%s] %s: stream broke after %d tokens (%s); retry %d/%d",
                        self.engine.name,
                        flight.what,
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

    async def _stream_once(self, flight: Streamed, index: int, request: ProposalRequest) -> None:
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
                f"{flight.what}: asked for {request.num_tokens} tokens, the stream "
                f"delivered {flight.received[index]}",
                engine=self.engine.name,
            )
        flight.finished[index] = True
        flight.changed.set()

    # ---- usability

    def _usable(self, flight: InFlight, state: ChainState) -> bool:
        """Whether ``flight`` is the request the sequential chain would make from ``state``."""
        current = state.response.token_ids[: flight.cut]
        if not np.array_equal(current, flight.response_prefix):
            return False
        if self.kernel.state_dependent_cut:
            return self.kernel.cut(state, flight.draws.u_cut) == flight.cut
        return True

    # ---- the walk

    def _last(self, m: int, steps: int) -> int:
        """One past the last transition the window may hold while the walk waits at ``m``."""
        return steps if self.window is None else min(m + self.window, steps)

    async def _run_block(self, state: ChainState, block: int) -> ChainState:
        window: dict[int, InFlight] = {}
        try:
            state = await self._stream_extension(state, block, window)
        except BaseException:
            for flight in window.values():
                self._close(flight)
            await self._drain()
            raise
        state, _ = await self._walk(state, block, 0, window)
        return state

    async def _advance(self, state: ChainState, block: int, k: int) -> tuple[ChainState, int]:
        return await self._walk(state, block, k, {})

    async def _stream_extension(
        self, state: ChainState, block: int, window: dict[int, InFlight]
    ) -> ChainState:
        """The block's extension, streamed; meanwhile the proposals whose cut lies in the prefix
        received so far are issued into ``window`` (see the module doc)."""
        request = self._extension_request(state, block)
        length = state.length + request.num_tokens
        started = time.perf_counter()
        extension = self._adopt_next(state)
        if extension is None:
            extension = Streamed(-1, [request], HEAD)
            self._start(extension)
        seen = (-1, -1)
        try:
            while not extension.complete:
                if extension.error is not None:
                    raise extension.error
                mark = (extension.attempts, extension.received[0])
                if self.overlap and mark != seen and extension.received[0] > 0:
                    seen = mark
                    self._issue_early(window, state, extension, length, block)
                extension.changed.clear()
                await extension.changed.wait()
        except BaseException:
            self._close(extension)
            raise
        tokens = join_chunks(extension.chunks[0])
        self._record_extension(block, tokens, time.perf_counter() - started)
        state = state.extend(tokens)
        self._confirm(window, state)
        return state

    def _extension_usable(self, issued_after: np.ndarray, state: ChainState) -> bool:
        """Whether an extension requested after the response ``issued_after`` is the one the
        sequential chain requests from ``state`` (the same response: same prefix, same seed)."""
        return bool(np.array_equal(issued_after, state.response.token_ids))

    def _adopt_next(self, state: ChainState) -> Streamed | None:
        """The speculated extension of this block if the previous block ended in the state it
        was requested from (it becomes the walk's head); otherwise it is closed."""
        if self._next is None:
            return None
        extension, issued_after = self._next
        self._next = None
        if not self._extension_usable(issued_after, state) or extension.error is not None:
            self._close(extension)
            return None
        running = sum(extension.active)
        self.budget.release(running)
        self.budget.add_head(running)
        extension.role = HEAD
        return extension

    def _speculate_next(self, state: ChainState, block: int, m: int, steps: int) -> None:
        """Request the next block's extension from ``state`` once the transitions left in this
        block (``m`` onwards) are likely all to reject (it is closed if one accepts)."""
        if self._next is not None or block + 1 >= self.config.num_blocks or not self.overlap:
            return
        if (1.0 - self._accept_rate()) ** (steps - m) < SURVIVAL_FLOOR:
            return  # an accept among the transitions left would likely rewrite the response
        if not self.budget.try_acquire(1):
            return
        extension = Streamed(-1, [self._extension_request(state, block + 1)], SPECULATIVE)
        self._start(extension)
        self._next = (extension, state.response.token_ids.copy())

    def _drop_next(self, state: ChainState | None) -> None:
        """Close the speculated extension if ``state`` (``None``: any) no longer matches it."""
        if self._next is not None and (
            state is None or not self._extension_usable(self._next[1], state)
        ):
            self._close(self._next[0])
            self._next = None

    def _confirm(self, window: dict[int, InFlight], state: ChainState) -> None:
        """Close what the whole extension does not confirm (a restarted stream rewrote the
        prefix, or EntropyCut's realised law draws another cut); the walk re-issues it."""
        for j in [j for j, other in window.items() if not self._usable(other, state)]:
            self._close(window.pop(j))
            self.stats.requests_cancelled += 1

    def _ready(self, cut: int, received: int) -> bool:
        """Whether a proposal at ``cut`` can be requested with ``received`` response tokens in:
        its prefix (the tokens before the cut) must all be there."""
        return cut <= received

    def _issue_early(
        self,
        window: dict[int, InFlight],
        state: ChainState,
        extension: Streamed,
        length: int,
        block: int,
    ) -> None:
        """Issue the transitions whose cut lies in the extension's prefix received so far.

        All are speculative (the walk waits for the extension): budget first, in transition
        order; with a cap ``W`` at most ``W − 1`` of them, as when the walk waits for a head.
        """
        steps = self.config.steps_per_block
        last = steps if self.window is None else min(self.window - 1, steps)
        per = self.kernel.sequences_per_proposal
        partial = state.extend(join_chunks(extension.chunks[0]))
        threats: list[int] = []
        for j in range(last):
            flight = window.get(j)
            if flight is not None:
                threats.append(flight.cut)
                continue
            cut = self.kernel.speculative_cut(
                partial, length, self._transition_draws(block, j).u_cut
            )
            survival = self._survival(threats, cut)
            threats.append(cut)
            if not self._ready(cut, partial.length):
                continue  # its prefix is not in yet: a later chunk may bring it
            if survival < SURVIVAL_FLOOR:
                continue
            if not self.budget.try_acquire(per):
                break  # the engine's budget is spent
            window[j] = self._issue(partial, block, j, SPECULATIVE, cut=cut, length=length)

    async def _walk(
        self, state: ChainState, block: int, k: int, window: dict[int, InFlight]
    ) -> tuple[ChainState, int]:
        """Transitions ``k``… of the block, in order, ``window`` holding what is in flight."""
        steps = self.config.steps_per_block
        head: InFlight | None = None
        start_k = m = k
        try:
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
            if m < steps:  # stopped early: the next block will not come
                self._drop_next(None)
            for flight in window.values():
                self._close(flight)
            if window:
                await self._drain()
            self._flush(block)
        return state, steps - start_k

    def _survival(self, threats: list[int], cut: int) -> float:
        """How likely a proposal at ``cut`` is still usable once the transitions before it, at
        ``threats`` (their cuts), are decided: each accepts with the chain's rate so far, and
        one that accepts at a smaller cut rewrites the prefix. (For EntropyCut an accept at a
        larger cut may still move the cut; not counted: an estimate for sizing, never a check.)
        """
        return float((1.0 - self._accept_rate()) ** sum(1 for c in threats if c < cut))

    def _accept_rate(self) -> float:
        pseudo_accepts, pseudo_transitions = ACCEPT_PRIOR
        return (self.stats.accepts + pseudo_accepts) / (self.stats.transitions + pseudo_transitions)

    def _refill(
        self, window: dict[int, InFlight], state: ChainState, block: int, m: int, steps: int
    ) -> None:
        if m not in window:
            window[m] = self._issue(state, block, m, HEAD)
        per_proposal = self.kernel.sequences_per_proposal
        threats = [window[m].cut]
        for j in range(m + 1, self._last(m, steps)):
            flight = window.get(j)
            if flight is not None:
                threats.append(flight.cut)
                continue
            cut = self.kernel.cut(state, self._transition_draws(block, j).u_cut)
            survival = self._survival(threats, cut)
            threats.append(cut)
            if survival < SURVIVAL_FLOOR:
                continue  # likely rewritten before its turn: issued when the walk is nearer
            if not self.budget.try_acquire(per_proposal):
                break  # the engine's budget is spent: speculate less, never out of order
            window[j] = self._issue(state, block, j, SPECULATIVE, cut=cut)
        if all(j in window for j in range(m, steps)):
            self._speculate_next(state, block, m, steps)

    async def _transition(
        self, state: ChainState, flight: InFlight, block: int, window: dict[int, InFlight]
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
                self._drop_next(state)
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
        self, state: ChainState, flight: InFlight, block: int
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
            self._drop_next(None)
            for task in list(self._tasks):
                task.cancel()
            await self._drain()
