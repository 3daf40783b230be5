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

So is the head's accept branch. While the head's proposal (cut ``c``) streams in, the state its
accept would make is the head's prefix followed by the tokens received so far; a later
transition whose cut lies past ``c`` and inside them can have its proposal issued from that
state (the draws are the transition's: it is the request the sequential chain makes if the head
accepts). Most heads reject, so this is done only while the head is likely to accept
(:class:`~presto_client.core.accept_branch.AcceptPredictor`, from its partial ``log A`` and the
transition's known uniform) and the engine's budget allows. Once the head is decided, an
accept-branch proposal is kept iff it passes the same check as every proposal against the
decided state (after a reject its prefix holds the head's tokens, so it is closed); the
predictor only decides what is issued.

Statistics: a *call* of this traversal is a wait of the walk on the engine together with the
transitions decided after it without waiting (one ``stream`` record each; ``call_wall_s`` is the
time the walk spent waiting), so ``transitions_per_call`` counts transitions per wait, as for the
round-based rules.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from presto_client.core.accept_branch import Watch
from presto_client.core.chain_runner import ChainResult, RoundCallback
from presto_client.core.engine_protocol import Engine
from presto_client.core.kernels import RejectionBound, Verdict
from presto_client.core.settings import SamplerConfig
from presto_client.core.speculation import SpeculationBudget
from presto_client.core.state import ChainState
from presto_client.core.stream_base import HEAD, SPECULATIVE, STREAM_RETRIES
from presto_client.core.stream_branches import (
    ACCEPT_PRIOR,
    SURVIVAL_FLOOR,
    StreamBranches,
    Threat,
)
from presto_client.core.stream_flight import InFlight, Streamed, join_chunks

logger = logging.getLogger(__name__)

__all__ = [
    "ACCEPT_PRIOR",
    "HEAD",
    "SPECULATIVE",
    "STREAM_RETRIES",
    "SURVIVAL_FLOOR",
    "StreamRunner",
]


class StreamRunner(StreamBranches):
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
        accept_branch: bool | None = None,
    ) -> None:
        """``window``: the most proposals in flight (the walk's own included); ``None``: as many
        as the budget allows, up to every remaining transition. ``overlap``: issue proposals
        while the block's extension streams in. ``accept_branch``: while proposals stream,
        issue the ones the walk needs if they accept, when they likely will; ``None``: unless
        the cut law depends on the state (EntropyCut: such proposals are at guessed cuts, which
        seldom hold, and measured slower)."""
        super().__init__(engine, sampler, seed, on_round, budget)
        if window is not None and window < 1:
            raise ValueError("window must be >= 1 (or None: no cap)")
        self.window = window
        self.early_rejection = early_rejection
        self.overlap = overlap
        self.accept_branch = (
            not self.kernel.state_dependent_cut if accept_branch is None else accept_branch
        )
        self._next: tuple[Streamed, np.ndarray] | None = None
        """The next block's extension, speculated from the state whose response it follows."""
        self._open_transitions = 0
        self._open_accepts = 0
        self._open_wall = 0.0
        self._rewritten: set[int] = set()
        """Transitions of the block whose in-flight proposal an accept (or a restarted
        extension) made unusable: if the walk then waits for them, the wait is a rewrite's."""
        self._refused: set[int] = set()
        """Transitions of the block that a refill would have issued but the engine's budget
        refused: a wait for them is the budget's."""
        self._branches: dict[int, tuple[InFlight, dict[int, InFlight]]] = {}
        """Accept branches by the transition whose accept they assume: its proposal, and the
        proposals of later transitions issued from the state that accept would make."""
        self._watches: dict[int, Watch] = {}
        self._known: dict[int, tuple[InFlight, ChainState, float]] = {}
        self.branch_issued = 0
        """Accept-branch proposals issued, and those the walk kept (their head accepted)."""
        self.branch_kept = 0

    # ---- the walk

    async def _run_block(self, state: ChainState, block: int) -> ChainState:
        window: dict[int, InFlight] = {}
        self._known.clear()
        self._rewritten.clear()
        self._refused.clear()
        try:
            state = await self._stream_extension(state, block, window)
        except BaseException:
            self._close_branches(None)
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
                    if self.accept_branch:
                        partial = state.extend(join_chunks(extension.chunks[0]))
                        self._scan(partial, None, 0, window, block, length)
                extension.changed.clear()
                await extension.changed.wait()
        except BaseException:
            self._close(extension)
            raise
        tokens = join_chunks(extension.chunks[0])
        self._record_extension(block, tokens, time.perf_counter() - started)
        state = state.extend(tokens)
        self._confirm(window, state)
        self._close_branches(window)  # those of proposals the whole extension did not confirm
        self._watches.clear()  # predicted against a part of the state
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
        if not self._may_continue_from(state):
            return
        if (1.0 - self._accept_rate()) ** (steps - m) < self._survival_floor(1):
            return  # an accept among the transitions left would likely rewrite the response
        if not self.budget.try_acquire(1):
            return
        extension = Streamed(-1, [self._extension_request(state, block + 1)], SPECULATIVE)
        self._start(extension)
        self._next = (extension, state.response.token_ids.copy())

    def _may_continue_from(self, state: ChainState) -> bool:
        """Whether a next block can follow a block that ends in ``state``: not when the stop
        rule ends the chain there. The next block's extension speculated from ``state`` is
        adopted only if the block ends in exactly this state (any accept closes it:
        :meth:`_drop_next`), so one speculated from a state that holds an EOS could never be
        used; were a later transition to remove the EOS, it would be by an accept, which closes
        what was speculated from here anyway. Hence nothing is speculated from such a state."""
        return not self._stops(state)

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
            self._rewritten.add(j)
            self.stats.requests_cancelled += 1

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
        floor = self._survival_floor(per)
        rate = self._accept_rate()
        threats: list[Threat] = []
        reserved = 0
        refused = False
        for j in range(last):
            flight = window.get(j)
            if flight is not None:
                threats.append((flight.cut, rate))  # nothing is decided before the extension
                continue
            cut = self.kernel.speculative_cut(
                partial, length, self._transition_draws(block, j).u_cut
            )
            survival = self._survival(threats, cut)
            threats.append((cut, rate))
            if survival < floor:
                continue
            if not self._ready(cut, partial.length):
                # Its prefix is not in yet: a later chunk brings it. Its slots are kept for it,
                # since the walk needs it before every later transition.
                reserved += per
                continue
            if refused or not self.budget.try_acquire(per, reserved, survival, own=per):
                # The engine's budget is spent: nothing more goes out; what would have is
                # noted, so that a wait for it is counted as the budget's.
                self._count_refusal(refused)
                refused = True
                self._refused.add(j)
                continue
            window[j] = self._issue(partial, block, j, SPECULATIVE, cut=cut, length=length)

    def _survival_floor(self, sequences: int) -> float:
        """How likely a speculative proposal of ``sequences`` must be to be used for it to be
        issued: :data:`SURVIVAL_FLOOR`, or what it costs the sequences in flight if more
        (:meth:`SpeculationBudget.marginal_cost`: on a compute-bound engine a proposal an
        earlier accept likely rewrites slows the walk's head for nothing)."""
        return max(SURVIVAL_FLOOR, self.budget.marginal_cost(sequences))

    async def _walk(
        self, state: ChainState, block: int, k: int, window: dict[int, InFlight]
    ) -> tuple[ChainState, int]:
        """Transitions ``k``… of the block, in order, ``window`` holding what is in flight."""
        steps = self.config.steps_per_block
        head: InFlight | None = None
        start_k = m = k
        try:
            while m < steps:
                reached = m not in window  # issued only now that the walk needs it
                self._refill(window, state, block, m, steps)
                head = window.pop(m)
                self._promote(head)
                state = await self._transition(state, head, block, window, reached)
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
            branched = bool(self._branches)
            self._close_branches(None)
            for flight in window.values():
                self._close(flight)
            if window or branched:
                await self._drain()
            self._flush(block)
        return state, steps - start_k

    def _refill(
        self, window: dict[int, InFlight], state: ChainState, block: int, m: int, steps: int
    ) -> None:
        if m not in window:
            window[m] = self._issue(state, block, m, HEAD)
        per_proposal = self.kernel.sequences_per_proposal
        floor = self._survival_floor(per_proposal)
        rate = self._accept_rate()
        threats = [self._threat(window[m], state)]
        refused = False
        for j in range(m + 1, self._last(m, steps)):
            flight = window.get(j)
            if flight is not None:
                threats.append(self._threat(flight, state))
                continue
            cut = self.kernel.cut(state, self._transition_draws(block, j).u_cut)
            survival = self._survival(threats, cut)
            threats.append((cut, rate))
            if survival < floor:
                continue  # likely rewritten before its turn: issued when the walk is nearer
            if refused or not self.budget.try_acquire(
                per_proposal, used=survival, own=per_proposal
            ):
                # The engine's budget is spent: speculate less, never out of order; what would
                # have gone out is noted, so that a wait for it is counted as the budget's.
                self._count_refusal(refused)
                refused = True
                self._refused.add(j)
                continue
            window[j] = self._issue(state, block, j, SPECULATIVE, cut=cut)
        if all(j in window for j in range(m, steps)):
            self._speculate_next(state, block, m, steps)

    async def _transition(
        self,
        state: ChainState,
        flight: InFlight,
        block: int,
        window: dict[int, InFlight],
        reached: bool = False,
    ) -> ChainState:
        """Decide ``flight``'s transition; ``reached``: its proposal was issued only when the
        walk got to it (see :meth:`_count_wait`)."""
        verdict, waited = await self._await_decision(state, flight, block, window)
        if waited is not None:
            self._count_wait(flight.k, waited, reached)
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
                    self._rewritten.add(j)
                    self.stats.requests_cancelled += 1
                self._drop_next(state)
        self._settle_branch(window, state, flight, verdict.accepted)
        self.stats.requests_used += 1
        if waited is not None:  # a wait on the engine opens a new call record
            self._flush(block)
        self._open_transitions += 1
        self._open_accepts += int(verdict.accepted)
        self._open_wall += waited or 0.0
        return state

    def _count_refusal(self, already: bool) -> None:
        """A refill cut short by the engine's budget (once per refill)."""
        if not already:
            self.stats.budget_refusals += 1
            self.stats.slot_refusals += self.budget.refused_for_slots
            self.stats.unmeasured_refusals += self.budget.refused_unmeasured

    def _count_wait(self, k: int, waited: float, reached: bool) -> None:
        """Why the walk waited ``waited`` seconds for transition ``k``'s proposal: an earlier
        accept rewrote the one in flight (only an accept branch avoids that); the engine's
        budget refused it at a refill (a user can buy that back with the engine's
        ``speculation_tolerance`` where the engine is latency-bound); it was held back as
        unlikely to be used until the walk reached it (the survival floor); or it was in flight
        in time and still generating (the rest of ``call_wall_s``)."""
        if k in self._rewritten:
            self.stats.rewrite_wait_s += waited
        elif k in self._refused:
            self.stats.budget_wait_s += waited
        elif reached:
            self.stats.floor_wait_s += waited

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
        self, state: ChainState, flight: InFlight, block: int, window: dict[int, InFlight]
    ) -> tuple[Verdict | None, float | None]:
        """Wait until ``flight`` is complete or certainly rejected, speculating accept branches
        meanwhile (:meth:`_scan`).

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
            if self.accept_branch:
                self._scan(state, flight, flight.k, window, block, state.length)
            flight.changed.clear()
            started = time.perf_counter()
            await flight.changed.wait()
            waited = (waited or 0.0) + time.perf_counter() - started

    async def run(self, prompt_ids: Sequence[int]) -> ChainResult:
        try:
            return await super().run(prompt_ids)
        finally:
            self._drop_next(None)
            for task in list(self._tasks):
                task.cancel()
            await self._drain()
