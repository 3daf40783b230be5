"""The ``stream`` traversal's speculation sizing and its accept branches.

Which proposals go out beside the ones the walk needs next: each transition's proposal is worth
its tokens while it is likely still to be usable at its turn (:meth:`StreamBranches._survival`:
each transition before it accepts at the chain's acceptance rate so far, or, once its proposal is
complete, as the kernel decides it), and an *accept branch* (the proposals of later
transitions issued from the state a transition's accept would make, its prefix then its
proposal's tokens received so far) while that accept is likely
(:class:`~presto_client.core.accept_branch.AcceptPredictor`). Nothing here decides: an
accept-branch proposal is used only if it passes, against the decided state, the check every
proposal passes (:meth:`~presto_client.core.stream_base.StreamBase._usable`).
"""

from __future__ import annotations

from presto_client.core.accept_branch import AcceptPredictor, Watch
from presto_client.core.state import ChainState
from presto_client.core.stream_base import SPECULATIVE, StreamBase
from presto_client.core.stream_flight import InFlight, join_chunks
from presto_client.errors import InvalidResponseError

SURVIVAL_FLOOR = 0.1
"""A speculative proposal is issued only while it is this likely to be usable at its turn
(no earlier transition of the window accepts at a smaller cut, :meth:`StreamBranches._threat`):
deeper ones with long prefixes still go out, those an earlier accept would likely rewrite wait
until the walk is nearer. On a compute-bound engine the floor is the proposal's measured
cost instead, when higher (``StreamRunner._survival_floor``). Speed only: which proposals are in
flight never changes the chain."""
BRANCH_FLOOR = 0.5
"""An accept-branch proposal is issued only while it is this likely to be used (its head
accepts and no transition between rewrites its prefix). Higher than :data:`SURVIVAL_FLOOR`:
most heads reject, and branches that looked possible at 10 % or 30 % cost a quarter and a sixth
of the sequential chain's tokens for little of the time saved (docs/benchmarks.md, issue 17
(a))."""
BRANCH_DROP = 0.3
"""The accept branch is closed once the head's predicted accept falls below this fraction of
:data:`BRANCH_FLOOR` (under the floor itself nothing new is issued: a margin against closing
and re-issuing on every chunk; at half the floor, 0.25, MultiTryMH's chain took 6 % longer)."""
BRANCH_WATCH = 4
"""Besides the head, the next proposals of the window whose accept branches are speculated."""
BRANCH_SPAN = 24
"""An accept branch holds proposals of at most this many transitions after its own."""
Threat = tuple[int, float]
"""A transition before a proposal's: its cut, and how likely it accepts."""
ACCEPT_PRIOR = (1.2, 4.0)
"""Prior of the acceptance rate (pseudo accepts, pseudo transitions) before the chain has its
own: 0.3."""


class StreamBranches(StreamBase):
    """The window's sizing rules and the accept branches (see the module doc); the walk is
    :class:`~presto_client.core.stream_runner.StreamRunner`'s."""

    window: int | None
    accept_branch: bool
    _branches: dict[int, tuple[InFlight, dict[int, InFlight]]]
    """Accept branches by the transition whose accept they assume: its proposal, and the
    proposals of later transitions issued from the state that accept would make."""
    _watches: dict[int, Watch]
    _known: dict[int, tuple[InFlight, ChainState, float]]
    """Complete proposals' decisions by transition, for sizing (:meth:`_threat`), with the
    state each was made against."""
    branch_issued: int
    """Accept-branch proposals issued, and those the walk kept (their head accepted)."""
    branch_kept: int

    def _last(self, m: int, steps: int) -> int:
        """One past the last transition the window may hold while the walk waits at ``m``."""
        return steps if self.window is None else min(m + self.window, steps)

    def _ready(self, cut: int, received: int) -> bool:
        """Whether a proposal at ``cut`` can be requested with ``received`` response tokens in:
        its prefix (the tokens before the cut) must all be there."""
        return cut <= received

    def _survival(self, threats: list[Threat], cut: int) -> float:
        """How likely a proposal at ``cut`` is still usable once the transitions before it,
        ``threats`` (their cuts and how likely each accepts), are decided: one that accepts at a
        smaller cut rewrites the prefix. (For EntropyCut an accept at a larger cut may still
        move the cut; not counted: an estimate for sizing, never a check.)"""
        survival = 1.0
        for threat_cut, odds in threats:
            if threat_cut < cut:
                survival *= 1.0 - odds
        return survival

    def _threat(self, flight: InFlight, state: ChainState) -> Threat:
        """``flight``'s transition as a threat to the proposals after it: its cut, and how likely
        it accepts if the walk reaches it in ``state``. A complete proposal is decided the
        moment the walk reaches it, so its odds are the kernel's own decision, known now
        (a rejection is no threat: without this, a run of complete rejections ahead of the walk
        held the proposals behind them back as if each might accept, and the walk, reaching
        them all at once, then waited for those); before that, the chain's acceptance rate.
        While the block's extension streams, ``state`` holds only its first tokens and nothing
        is decided. For sizing only: the walk decides again, in order."""
        rate = self._accept_rate()
        if (
            not flight.complete
            or flight.error is not None
            or flight.cut + flight.requests[0].num_tokens != state.length  # a partial state
        ):
            return flight.cut, rate
        known = self._known.get(flight.k)
        if known is None or known[0] is not flight or known[1] is not state:
            odds = rate
            if self._usable(flight, state):
                proposals = [join_chunks(c) for c in flight.chunks]
                try:
                    verdict = self.kernel.evaluate(state, flight.cut, proposals, flight.draws)
                except InvalidResponseError:
                    pass  # the walk's own decision reports it, in order
                else:
                    if verdict.decided:
                        odds = float(verdict.accepted)
            known = self._known[flight.k] = (flight, state, odds)
        return flight.cut, known[2]

    def _accept_rate(self) -> float:
        pseudo_accepts, pseudo_transitions = ACCEPT_PRIOR
        return (self.stats.accepts + pseudo_accepts) / (self.stats.transitions + pseudo_transitions)

    # ---- the accept branch

    def _branch_usable(self, flight: InFlight, state: ChainState) -> bool:
        """Whether an accept-branch proposal is usable from the decided ``state``: the same
        check as every proposal's (its prefix is the realised one), whatever the predictor
        said."""
        return self._usable(flight, state)

    def _close_branches(self, keep: dict[int, InFlight] | None) -> None:
        """Close the accept branches whose proposal is no longer ``keep``'s (``None``: all)."""
        for t in list(self._branches):
            base, branch = self._branches[t]
            if keep is None or keep.get(t) is not base:
                for flight in branch.values():
                    self._close(flight)
                    self.stats.requests_cancelled += 1
                del self._branches[t]
        if keep is None:
            self._watches.clear()

    def _settle_branch(
        self, window: dict[int, InFlight], state: ChainState, head: InFlight, accepted: bool
    ) -> None:
        """The head is decided: one of its accept-branch proposals replaces the window's at its
        transition if that one is gone or no longer usable and it is usable itself (the head
        accepted with the tokens it was issued after); every other one is closed. After an
        accept, the other proposals' branches go with them if they were closed, and every
        prediction is made afresh (the state they were made against has changed)."""
        _, branch = self._branches.pop(head.k, (head, {}))
        self._watches.pop(head.k, None)
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
            self._watches.clear()

    def _scan(
        self,
        state: ChainState,
        head: InFlight | None,
        first: int,
        window: dict[int, InFlight],
        block: int,
        length: int,
    ) -> None:
        """Feed the head's and the next proposals' new tokens to their accept predictors, and
        speculate each one's accept branch (the others' assume the transitions before them
        reject, which their branches' survival counts). ``head``: ``None`` while the block's
        extension streams (``state`` holds its first tokens, ``length`` the whole)."""
        left = self.config.steps_per_block - first

        def limit(t: int) -> int | None:
            # The head's branch is capped by the window's cap only; the others' keep all in
            # flight (the head or the extension included) below the transitions left: they
            # assume more, and are worth less.
            if head is not None and t == head.k:
                return self.window
            return left - 1 if self.window is None else min(self.window, left - 1)

        threats: list[Threat] = []
        for t in range(first, first + 1 + BRANCH_WATCH):
            flight = head if head is not None and t == head.k else window.get(t)
            if flight is None:
                continue
            watch = self._watches.get(t)
            if watch is None or watch.flight is not flight or watch.attempts != flight.attempts:
                predictor = AcceptPredictor(self.kernel, state, flight.cut, flight.draws, length)
                watch = self._watches[t] = Watch(flight, flight.attempts, predictor)
                watch.fed = [0] * len(flight.requests)
            news = False
            for i, chunks in enumerate(flight.chunks):
                while watch.fed[i] < len(chunks):
                    watch.predictor.feed(i, chunks[watch.fed[i]])
                    watch.fed[i] += 1
                    news = True
            if news and not (flight.complete and flight is head):
                # survives iff the earlier in-flight transitions at smaller cuts all reject
                prior_t = self._survival(threats, flight.cut)
                self._speculate_branch(
                    state, flight, watch.predictor, window, block, prior_t, limit(t), length
                )
            threats.append(self._threat(flight, state))

    def _speculate_branch(
        self,
        state: ChainState,
        base: InFlight,
        predictor: AcceptPredictor,
        window: dict[int, InFlight],
        block: int,
        prior: float,
        limit: int | None,
        length: int,
    ) -> None:
        """Issue, from the state ``base``'s accept would make (its prefix, then the tokens of
        the candidate it would splice received so far), the proposals of the transitions after
        it whose cut lies past ``base``'s and inside those tokens, while that accept is likely
        enough (``prior``: that ``base`` is still usable at its turn) and each proposal to
        survive the transitions between; all in flight stay under ``limit``. Those
        already issued stay until ``base`` is decided; all are closed when its accept has
        become unlikely, or the candidate changes."""
        probability, candidate = predictor.predict()
        probability *= prior
        entry = self._branches.get(base.k)
        if entry is not None and entry[0] is not base:  # left from a proposal since replaced
            self._close_branches({t: e[0] for t, e in self._branches.items() if t != base.k})
            entry = None
        branch = entry[1] if entry is not None else {}
        if branch and (
            probability < BRANCH_DROP * BRANCH_FLOOR
            or any(flight.candidate != candidate for flight in branch.values())
        ):
            for flight in branch.values():
                self._close(flight)
                self.stats.requests_cancelled += 1
            branch.clear()
        if probability < BRANCH_FLOOR or not base.chunks[candidate]:
            return
        received = join_chunks(base.chunks[candidate])
        partial = state.with_response(state.response.slice(0, base.cut).concat(received))
        steps = self.config.steps_per_block
        per = self.kernel.sequences_per_proposal
        rate = self._accept_rate()
        threats: list[Threat] = []
        last = min(self._last(base.k, steps), base.k + 1 + BRANCH_SPAN)
        for j in range(base.k + 1, last):
            flight = branch.get(j)
            if flight is not None:
                threats.append((flight.cut, rate))
                continue
            cut = self.kernel.speculative_cut(
                partial, length, self._transition_draws(block, j).u_cut
            )
            survival = probability * self._survival(threats, cut)
            threats.append((cut, rate))
            if cut <= base.cut:
                continue  # the accept leaves its prefix as it is: the window's to issue
            if not self._ready(cut, partial.length):
                continue  # its prefix is not in yet: a later chunk may bring it
            if survival < BRANCH_FLOOR:
                continue
            if limit is not None and self._in_flight(window) >= limit:
                break
            if not self.budget.try_acquire(per, used=survival, own=per):
                break
            flight = self._issue(partial, block, j, SPECULATIVE, cut=cut, length=length)
            flight.candidate = candidate
            branch[j] = flight
            self.branch_issued += 1
        if branch:
            self._branches[base.k] = (base, branch)

    def _in_flight(self, window: dict[int, InFlight]) -> int:
        """Proposals in flight: the head, the window's and every accept branch's."""
        return 1 + len(window) + sum(len(b) for _, b in self._branches.values())
