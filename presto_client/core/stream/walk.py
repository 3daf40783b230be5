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

Every decision is the kernel's (``kernels.py``), against the state the walk holds. Which
proposals are in flight is the speed policy's (:mod:`presto_client.core.stream.policy`, tuned by
:mod:`presto_client.core.stream.tuning`, sized by the engine's shared
:class:`~presto_client.core.speculation.SpeculationBudget`), up to every remaining transition of
the block; ``cap`` bounds them (``None``: no bound). The policy only proposes: it reads a snapshot
of the walk and returns a plan; this walk alone takes the engine's budget slots, is the only
writer of what is in flight, and checks the rule
(:mod:`presto_client.core.stream.rule`) when a proposal enters (:meth:`StreamRunner.propose`) and
again when it is used (:meth:`StreamRunner._take`). It changes the speed, never the chain.

The block's own generation and the head's accept branch are overlapped too (the package doc,
:mod:`presto_client.core.stream`): what they issue passes the same checks.

Statistics: a *call* of this traversal is a wait of the walk on the engine together with the
transitions decided after it without waiting (one ``stream`` record each; ``call_wall_s`` is the
time the walk spent waiting), so ``transitions_per_call`` counts transitions per wait, as for the
round-based rules.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np

from presto_client.core.chain_runner import ChainResult, ChainSetup
from presto_client.core.kernels import RejectionBound, Verdict
from presto_client.core.state import ChainState
from presto_client.core.stream import rule, tuning
from presto_client.core.stream.flight import HEAD, SPECULATIVE, InFlight, Streamed, join_chunks
from presto_client.core.stream.policy import StreamPolicy
from presto_client.core.stream.rule import StreamRuleError
from presto_client.core.stream.streams import StreamIO
from presto_client.core.stream.tuning import StreamTuning
from presto_client.core.stream.view import Origin, Plan, Proposal, WalkSnapshot, Withdrawal, ready

logger = logging.getLogger(__name__)

__all__ = ["StreamRunner"]


class StreamRunner(StreamIO):
    """PreSTO with a streaming window of in-flight proposals (see the module doc).

    The walk: the window and the accept branches are written here only, the engine's budget
    slots taken and given back here only (:meth:`_carry_out`), every proposal the policy wants
    is checked (:meth:`propose`) and every proposal used is checked again (:meth:`_take`). The
    policy is given a :meth:`snapshot` and answers with a
    :class:`~presto_client.core.stream.view.Plan`."""

    def __init__(
        self,
        setup: ChainSetup,
        *,
        early_rejection: bool = True,
        overlap: bool = True,
        accept_branch: bool | None = None,
        next_block: bool | None = None,
        tuning: StreamTuning | None = None,
    ) -> None:
        """``setup.size``: the cap, the most proposals in flight (the walk's own included);
        ``None``: as many as the budget allows, up to every remaining transition. ``overlap``:
        issue proposals while the block's extension streams in. ``accept_branch``: while
        proposals stream,
        issue the ones the walk needs if they accept, when they likely will; ``None``: unless
        the cut law depends on the state (EntropyCut: such proposals are at guessed cuts, which
        seldom hold, and measured slower). ``next_block``: issue next-block proposals whose cut
        lies in this block's response; ``None``: unless the cut law depends on the state (then
        the next extension's tokens move it). ``tuning``: the speed policy's constants."""
        chosen = tuning if tuning is not None else _default_tuning()
        super().__init__(setup, chosen)
        cap = setup.size
        if cap is not None and cap < 1:
            raise ValueError("window must be >= 1 (or None: no cap)")
        self.cap = cap
        self.early_rejection = early_rejection
        self.overlap = overlap
        self.accept_branch = (
            not self.kernel.state_dependent_cut if accept_branch is None else accept_branch
        )
        self.next_block = not self.kernel.state_dependent_cut if next_block is None else next_block
        self.policy = StreamPolicy(chosen, accept_branch=self.accept_branch)
        """What to speculate (speed only): it plans, the walk checks and issues."""
        self._usable_here = functools.partial(rule.usable, self.kernel)
        self._window: dict[int, InFlight] = {}
        """Proposals in flight for the transitions ahead of the walk (written here only)."""
        self._branches: dict[int, tuple[InFlight, dict[int, InFlight]]] = {}
        """Accept branches by the transition whose accept they assume: its proposal, and the
        proposals of later transitions issued from the state that accept would make."""
        self._block = 0
        self._at: ChainState | None = None
        """The state the walk holds at its head transition (``None`` while the block's
        extension streams: then :attr:`_partial` holds what is in)."""
        self._partial: ChainState | None = None
        self._length = 0
        """The response's length once the block's extension is complete."""
        self._head: InFlight | None = None
        self._m = 0
        """The transition the walk is at."""
        self._branch_source: tuple[InFlight, int, int, ChainState, ChainState] | None = None
        self._next: tuple[Streamed, np.ndarray] | None = None
        """The next block's extension, speculated from the state whose response it follows."""
        self._ahead: dict[int, InFlight] = {}
        """The next block's proposals in flight (block :attr:`_ahead_block`), by transition."""
        self._ahead_block = -1
        self.ahead_issued = 0
        """Next-block proposals issued, and those the next block kept (:meth:`_adopt_ahead`)."""
        self.ahead_kept = 0
        self.branch_issued = 0
        """Accept-branch proposals issued, and those the walk kept (their head accepted)."""
        self.branch_kept = 0

    # ---- the rule

    def _ready(self, cut: int, received: int) -> bool:
        """Whether a proposal at ``cut`` can be requested with ``received`` response tokens in:
        its prefix (the tokens before the cut) must all be there."""
        return ready(cut, received)

    def _usable(self, flight: InFlight, state: ChainState) -> bool:
        """Whether ``flight`` is the request the sequential chain would make from ``state``."""
        return rule.usable(self.kernel, flight, state)

    def _branch_usable(self, flight: InFlight, state: ChainState) -> bool:
        """Whether an accept-branch proposal is usable from the decided ``state``: the same
        check as every proposal's (its prefix is the realised one), whatever the predictor
        said."""
        return self._usable(flight, state)

    def _extension_usable(self, issued_after: np.ndarray, state: ChainState) -> bool:
        """Whether an extension requested after the response ``issued_after`` is the one the
        sequential chain requests from ``state`` (the same response: same prefix, same seed)."""
        return bool(np.array_equal(issued_after, state.response.token_ids))

    def _take(self, m: int, state: ChainState) -> InFlight:
        """Transition ``m``'s proposal out of the window, checked against the rule once more:
        the window keeps only usable proposals, so a failure is a bug, raised, never used."""
        flight = self._window.pop(m)
        if flight.k != m:
            raise StreamRuleError(m, f"the window holds transition {flight.k}'s proposal here")
        draws = self._transition_draws(self._block, m)
        if flight.draws is not draws and flight.draws != draws:
            raise StreamRuleError(m, "its proposal was drawn with another transition's draws")
        if any(r.num_tokens != state.length - flight.cut for r in flight.requests):
            raise StreamRuleError(m, "its proposal does not fill the response from its cut")
        if not self._usable(flight, state):
            raise StreamRuleError(
                m,
                f"its proposal (cut {flight.cut}) is not the request the sequential chain makes "
                "from the walk's state: another prefix or another cut",
            )
        return flight

    # ---- the policy's snapshot, and its plans carried out

    def snapshot(self) -> WalkSnapshot:
        """The walk as the policy sees it now: read-only, no budget to take from."""
        return WalkSnapshot(
            self.kernel,
            self.config.steps_per_block,
            self.config.block_size,
            self.cap,
            self.stats.accepts,
            self.stats.transitions,
            MappingProxyType(self._window),
            MappingProxyType(self._branches),
            MappingProxyType(self._ahead),
            self._block,
            self._transition_draws,
            self._usable_here,
            self.budget.marginal_cost,
        )

    def _in_flight(self) -> int:
        """Proposals in flight: the head, the window's, every accept branch's and the next
        block's."""
        branched = sum(len(b) for _, b in self._branches.values())
        return 1 + len(self._window) + branched + len(self._ahead)

    def _carry_out(self, plan: Plan) -> None:
        """Issue what ``plan`` wants, in order, each proposal with its slots of the engine's
        budget taken here: once one is refused (or its ``limit`` is reached) the rest of its
        group wait, noted as the budget's if the plan says so. A proposal not issued gives its
        slots back (a refusal by the rule is the policy's bug, raised; without this the slots
        would be lost to every chain on the engine)."""
        per = self.kernel.sequences_per_proposal
        stopped: int | None = None
        for step in plan.steps:
            if isinstance(step, Withdrawal):
                self._withdraw(step.base)
                continue
            if step.group == stopped:
                if plan.report_refusals:
                    self._refused_by_budget(step.k, False)
                continue
            if step.limit is not None and self._in_flight() >= step.limit:
                stopped = step.group
                continue
            if not self.budget.try_acquire(per, step.reserved, step.survival, own=per):
                stopped = step.group
                if plan.report_refusals:
                    self._refused_by_budget(step.k, True)
                continue
            issued = self.stats.requests_issued
            try:
                self.propose(step)
            except BaseException:
                if self.stats.requests_issued == issued:  # (not issued: its slots never used)
                    self.budget.release(per)
                raise

    def propose(self, proposal: Proposal) -> InFlight:
        """Issue ``proposal`` if it is the request the sequential chain makes at its transition
        from the state it names (the rule's :func:`~presto_client.core.stream.rule.
        admission_problem`); a proposal that is not is the policy's bug, raised."""
        k, steps, block = proposal.k, self.config.steps_per_block, self._block
        if proposal.origin is Origin.BRANCH:
            base = self._head if self._head is not None and self._head.k == proposal.base else None
            base = base if base is not None else self._window.get(proposal.base)
            if base is None:
                raise StreamRuleError(k, f"its accept branch's transition {proposal.base} is gone")
            if not base.k < k < steps or k in self._branches.get(base.k, (base, {}))[1]:
                raise StreamRuleError(k, f"not a free transition after {base.k}'s accept")
            if proposal.cut <= base.cut or not 0 <= proposal.candidate < len(base.chunks):
                raise StreamRuleError(k, f"not inside {base.k}'s proposal (cut {base.cut})")
            source = self._branch_state(base, proposal.candidate)
            length = self._length
        elif proposal.origin is Origin.NEXT_BLOCK:
            source = self._at
            if source is None or not 0 <= k < steps or k in self._ahead:
                raise StreamRuleError(k, "not a free transition of the next block")
            if block + 1 >= self.config.num_blocks:
                raise StreamRuleError(k, "a next-block proposal in the last block")
            block += 1
            length = source.length + self.config.block_size  # once its extension is in
        else:
            low = self._m + 1 if self._at is not None else 0
            if not low <= k < steps or k in self._window:
                raise StreamRuleError(k, "not a free transition ahead of the walk")
            if proposal.origin is Origin.STATE:
                source = self._at
                if source is None:
                    raise StreamRuleError(k, "no realised state yet: the extension streams")
            else:
                source = self._partial
                if source is None or self._at is not None:
                    raise StreamRuleError(k, "no extension streaming to take a prefix from")
            length = self._length
        draws = self._transition_draws(block, k)
        problem = rule.admission_problem(
            self.kernel,
            proposal.state,
            proposal.cut,
            source,
            source.length,
            length,
            draws.u_cut,
            self._ready,
        )
        if problem is not None:
            raise StreamRuleError(k, problem)
        flight = self._issue(source, block, k, SPECULATIVE, cut=proposal.cut, length=length)
        if proposal.origin is Origin.BRANCH:
            flight.candidate = proposal.candidate
            self._branches.setdefault(proposal.base, (base, {}))[1][k] = flight
            self.branch_issued += 1
        elif proposal.origin is Origin.NEXT_BLOCK:
            self._ahead[k] = flight
            self._ahead_block = block
            self.ahead_issued += 1
        else:
            self._window[k] = flight
        return flight

    def _withdraw(self, base: int) -> None:
        """Close the accept branch of transition ``base``."""
        entry = self._branches.pop(base, None)
        if entry is not None:
            for flight in entry[1].values():
                self._close(flight)
                self.stats.requests_cancelled += 1

    def _refused_by_budget(self, k: int, first: bool) -> None:
        """The budget refused transition ``k``'s proposal (``first``: the first refusal of this
        pass): a wait for it is counted as the budget's."""
        self._count_refusal(not first)
        self._refused.add(k)

    def _branch_state(self, base: InFlight, candidate: int) -> ChainState:
        """The state ``base``'s accept of ``candidate`` would make: the walk's prefix up to its
        cut, then the candidate's tokens received so far (kept while they do not change)."""
        current = self._at if self._at is not None else self._partial
        if current is None or not base.chunks[candidate]:
            raise StreamRuleError(base.k, "an accept branch with nothing received to follow")
        received = base.received[candidate]
        cached = self._branch_source
        if (
            cached is not None
            and cached[0] is base
            and cached[1:3] == (candidate, received)
            and cached[3] is current
        ):
            return cached[4]
        tokens = join_chunks(base.chunks[candidate])
        source = current.with_response(current.response.slice(0, base.cut).concat(tokens))
        self._branch_source = (base, candidate, received, current, source)
        return source

    # ---- the walk

    async def _run_block(self, state: ChainState, block: int) -> ChainState:
        self._enter_block(block)
        try:
            state = await self._stream_extension(state, block)
        except BaseException:
            self._close_branches(None)
            for flight in self._window.values():
                self._close(flight)
            await self._drain()
            raise
        state, _ = await self._walk(state, block, 0)
        return state

    def _enter_block(self, block: int) -> None:
        self._block = block
        self._window = {}
        self._at = self._partial = None
        self._branch_source = None
        self.policy.start_block()
        self._rewritten.clear()
        self._refused.clear()

    async def _advance(self, state: ChainState, block: int, k: int) -> tuple[ChainState, int]:
        self._enter_block(block)
        return await self._walk(state, block, k)

    async def _stream_extension(self, state: ChainState, block: int) -> ChainState:
        """The block's extension, streamed; meanwhile the policy may propose the transitions
        whose cut lies in the prefix received so far (see the module doc)."""
        request = self._extension_request(state, block)
        length = self._length = state.length + request.num_tokens
        started = time.perf_counter()
        extension = self._adopt_next(state)
        self._adopt_ahead(state, block, length)
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
                    partial = self._partial = state.extend(join_chunks(extension.chunks[0]))
                    self._carry_out(self.policy.early(self.snapshot(), partial, length))
                    if self.accept_branch:
                        self._carry_out(self.policy.scan(self.snapshot(), partial, None, 0, length))
                extension.changed.clear()
                await extension.changed.wait()
        except BaseException:
            self._close(extension)
            raise
        tokens = join_chunks(extension.chunks[0])
        self._record_extension(block, tokens, time.perf_counter() - started)
        state = state.extend(tokens)
        self._partial = None
        self._confirm(state)
        self._close_branches(self._window)  # those of proposals the extension did not confirm
        self.policy.forget()  # its predictions were made against a part of the state
        return state

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

    def _adopt_ahead(self, state: ChainState, block: int, length: int) -> None:
        """The previous block's next-block proposals join the window if they are this block's
        and follow ``state`` (:func:`~presto_client.core.stream.rule.follows`); the rule is
        checked again once the extension is in (:meth:`_confirm`) and at use (:meth:`_take`)."""
        ahead, self._ahead = self._ahead, {}
        for k, flight in ahead.items():
            if self._ahead_block == block and rule.follows(flight, state, length):
                self._window[k] = flight
                self.ahead_kept += 1
            else:
                self._close(flight)
                self.stats.requests_cancelled += 1

    def _speculate_ahead(self, state: ChainState, m: int) -> None:
        """Let the policy propose next-block proposals (:meth:`StreamPolicy.ahead`) once this
        block's from ``m`` on are all in flight, unless the chain would stop in ``state``."""
        if (
            self.next_block
            and self.overlap
            and self._block + 1 < self.config.num_blocks
            and len(self._ahead) < self.config.steps_per_block
            and not self._stops(state)
        ):
            self._carry_out(self.policy.ahead(self.snapshot(), state, m))

    def _speculate_next(self, state: ChainState, block: int, m: int, steps: int) -> None:
        """Request the next block's extension from ``state`` if the policy finds it worth it
        (it is closed if one of the transitions left accepts)."""
        if self._next is not None or block + 1 >= self.config.num_blocks or not self.overlap:
            return
        if not self._may_continue_from(state):
            return
        if not self.policy.next_extension(self.snapshot(), steps - m):
            return
        if not self.budget.try_acquire(1):
            return
        extension = Streamed(-1, [self._extension_request(state, block + 1)], SPECULATIVE)
        self._start(extension)
        self._next = (extension, state.response.token_ids.copy())

    def _may_continue_from(self, state: ChainState) -> bool:
        """Whether a next block can follow a block that ends in ``state``: not when the stop
        rule ends the chain there (one speculated from a state holding an EOS could never be
        adopted, and an accept that removed the EOS would close it anyway)."""
        return not self._stops(state)

    def _drop_next(self, state: ChainState | None) -> None:
        """Close what was speculated for the next block that ``state`` (``None``: any) no longer
        leads to: the extension unless the response is the same, a proposal unless the tokens
        before its cut are; all once ``state`` holds an EOS (the chain stops after this block
        unless a later accept removes it, which is seldom worth their tokens)."""
        if self._next is not None and (
            state is None or not self._extension_usable(self._next[1], state)
        ):
            self._close(self._next[0])
            self._next = None
        stops = state is not None and bool(self._ahead) and self._stops(state)
        for k, flight in list(self._ahead.items()):
            if state is None or stops or not rule.follows(flight, state):
                self._close(self._ahead.pop(k))
                self.stats.requests_cancelled += 1

    def _confirm(self, state: ChainState) -> None:
        """Close what the whole extension does not confirm (a restarted stream rewrote the
        prefix, or EntropyCut's realised law draws another cut); the walk re-issues it."""
        self._close_unusable(state)

    def _close_unusable(self, state: ChainState) -> None:
        """Keep the window's rule: close every proposal no longer usable from ``state``."""
        for j in [j for j, other in self._window.items() if not self._usable(other, state)]:
            self._close(self._window.pop(j))
            self._rewritten.add(j)
            self.stats.requests_cancelled += 1

    async def _walk(self, state: ChainState, block: int, k: int) -> tuple[ChainState, int]:
        """Transitions ``k``… of the block, in order, the window holding what is in flight."""
        steps = self.config.steps_per_block
        window = self._window
        head: InFlight | None = None
        start_k = m = k
        try:
            while m < steps:
                reached = m not in window  # issued only now that the walk needs it
                self._refill(state, m)
                head = self._head = self._take(m, state)
                self._promote(head)
                state = await self._transition(state, head, block, reached)
                head = self._head = None
                m += 1
        finally:
            # The walk was stopped (cancelled, or a proposal failed): the head it was waiting
            # on is out of the window but still streaming, and is closed with the rest, so
            # that the drain below waits only for cancelled streams to close, never for a
            # request to run to its end (a stalled server, a retried connection).
            self._head = None
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

    def _refill(self, state: ChainState, m: int) -> None:
        """The walk is at ``m`` in ``state``: its own request (the sequential chain's) if not in
        flight yet, then what the policy proposes ahead of it."""
        self._at, self._m, self._length = state, m, state.length
        steps = self.config.steps_per_block
        if m not in self._window:
            self._window[m] = self._issue(state, self._block, m, HEAD)
        self._carry_out(self.policy.refill(self.snapshot(), state, m))
        if all(j in self._window for j in range(m, steps)):
            self._speculate_next(state, self._block, m, steps)
            self._speculate_ahead(state, m)

    async def _transition(
        self, state: ChainState, flight: InFlight, block: int, reached: bool = False
    ) -> ChainState:
        """Decide ``flight``'s transition; ``reached``: its proposal was issued only when the
        walk got to it (see :meth:`_count_wait`)."""
        verdict, waited = await self._await_decision(state, flight)
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
                self._close_unusable(state)
                self._drop_next(state)
        self._settle_branch(state, flight, verdict.accepted)
        self.stats.requests_used += 1
        if waited is not None:  # a wait on the engine opens a new call record
            self._flush(block)
        self._open_transitions += 1
        self._open_accepts += int(verdict.accepted)
        self._open_wall += waited or 0.0
        return state

    async def _await_decision(
        self, state: ChainState, flight: InFlight
    ) -> tuple[Verdict | None, float | None]:
        """Wait until ``flight`` is complete or certainly rejected, the policy speculating
        accept branches meanwhile.

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
                plan = self.policy.scan(self.snapshot(), state, flight, flight.k, state.length)
                self._carry_out(plan)
            flight.changed.clear()
            started = time.perf_counter()
            await flight.changed.wait()
            waited = (waited or 0.0) + time.perf_counter() - started

    # ---- accept branches: kept or closed once their head is decided

    def _close_branches(self, keep: Mapping[int, InFlight] | None) -> None:
        """Close the accept branches whose proposal is no longer ``keep``'s (``None``: all)."""
        for t in list(self._branches):
            if keep is None or keep.get(t) is not self._branches[t][0]:
                self._withdraw(t)
        if keep is None:
            self.policy.forget()

    def _settle_branch(self, state: ChainState, head: InFlight, accepted: bool) -> None:
        """The head is decided: one of its accept-branch proposals replaces the window's at its
        transition if that one is gone or no longer usable and it is usable itself (the head
        accepted with the tokens it was issued after); every other one is closed. After an
        accept, the other proposals' branches go with them if they were closed, and every
        prediction is made afresh (the state they were made against has changed)."""
        window = self._window
        _, branch = self._branches.pop(head.k, (head, {}))
        self.policy.forget(head.k)
        for j, flight in branch.items():
            current = window.get(j)
            if (current is None or not self._usable(current, state)) and self._branch_usable(
                flight, state
            ):
                if current is not None:
                    self._close(current)
                    self.stats.requests_cancelled += 1
                window[j] = flight
                self.branch_kept += 1
            else:
                self._close(flight)
                self.stats.requests_cancelled += 1
        if accepted:
            self._close_branches(window)
            self.policy.forget()

    async def run(self, prompt_ids: Sequence[int]) -> ChainResult:
        try:
            return await super().run(prompt_ids)
        finally:
            self._drop_next(None)
            for task in list(self._tasks):
                task.cancel()
            await self._drain()


def _default_tuning() -> StreamTuning:
    """Looked up when a runner is made (not at import), so that a test may replace it."""
    return tuning.DEFAULT_TUNING
