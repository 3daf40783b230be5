"""The ``stream`` traversal's plumbing: proposals issued as streams, consumed into their
:class:`~presto_client.core.stream.flight.Streamed` records, closed, and the engine's shared
budget kept in step with the sequences that hold a batch slot.

:class:`StreamIO` holds neither law nor policy: which proposals go out is the policy's
(:mod:`presto_client.core.stream.policy`), whether one goes out and is used is the walk's
(:mod:`presto_client.core.stream.walk`, by the rule of :mod:`presto_client.core.stream.rule`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from presto_client.core.chain_runner import ChainRunner, ChainSetup
from presto_client.core.engine_protocol import ProposalRequest
from presto_client.core.rng import TransitionDraws
from presto_client.core.state import ChainState
from presto_client.core.stream.flight import HEAD, InFlight, Streamed
from presto_client.core.stream.tuning import StreamTuning
from presto_client.errors import EngineError, InvalidResponseError

logger = logging.getLogger(__name__)


class StreamIO(ChainRunner):
    """Issues, streams and closes one chain's proposals (see the module doc)."""

    def __init__(self, setup: ChainSetup, tuning: StreamTuning) -> None:
        super().__init__(setup)
        self.tuning = tuning
        self._tasks: set[asyncio.Task[None]] = set()
        self._draws: dict[tuple[int, int], TransitionDraws] = {}
        self._issued_since = 0
        self._sequences_since = 0
        self._tokens_since = 0
        self._open_transitions = 0
        self._open_accepts = 0
        self._open_wall = 0.0
        self._rewritten: set[int] = set()
        """Transitions of the block whose in-flight proposal an accept (or a restarted
        extension) made unusable: if the walk then waits for them, the wait is a rewrite's."""
        self._refused: set[int] = set()
        """Transitions of the block that a refill would have issued but the engine's budget
        refused: a wait for them is the budget's."""

    # ---- issuing and cancelling

    def _transition_draws(self, block: int, k: int) -> TransitionDraws:
        """Transition ``k``'s draws, computed once (the overlap asks for them per chunk). A
        block's and the next one's are asked in turn (the next block's proposals go out before
        it starts), so only blocks further away are dropped."""
        key = (block, k)
        draws = self._draws.get(key)
        if draws is None:
            for old in [old for old in self._draws if abs(old[0] - block) > 1]:
                del self._draws[old]
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
        limit = self.tuning.stream_retries
        try:
            while True:
                try:
                    await self._stream_once(flight, index, request)
                    return
                except EngineError as exc:
                    if not exc.retryable or retries >= limit:
                        raise
                    retries += 1
                    logger.info(
                        "[%s] %s: stream broke after %d tokens (%s); retry %d/%d",
                        self.engine.name,
                        flight.what,
                        flight.received[index],
                        exc,
                        retries,
                        limit,
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
        start = time.perf_counter()
        load = budget.in_flight
        previous: float | None = None
        async with contextlib.aclosing(self.engine.stream(request)) as chunks:
            async for chunk in chunks:
                n = len(chunk)
                if n == 0:
                    continue
                now = time.perf_counter()
                if previous is not None:  # the first chunk carries queueing and prefill
                    budget.observe(n, now - previous, budget.in_flight)
                elif n == request.num_tokens:
                    # The whole proposal in one chunk (an engine that does not stream: SGLang,
                    # scaled modes): measured as one request, as the round runners measure theirs.
                    # Without this the budget never learns such an engine's cost, and a chain
                    # speculates up to every free slot of a compute-bound server.
                    budget.observe(n, now - start, load)
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

    # ---- records

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

    async def _drain(self) -> None:
        """Wait for closed streams to finish closing (their HTTP connections released), not
        for those still running: what was speculated for the next block streams on."""
        pending = [task for task in self._tasks if task.cancelling()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
