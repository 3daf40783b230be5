"""The ``stream`` traversal's speed policy: which proposals to ask the walk for, and when.

Nothing here decides, issues or holds a slot. Each pass is given a read-only
:class:`~presto_client.core.stream.view.WalkSnapshot` and returns a
:class:`~presto_client.core.stream.view.Plan` (the proposals it wants, in order, with how likely
each is used); the walk takes their slots of the engine's budget, checks each against the rule
(:mod:`presto_client.core.stream.rule`) before it issues it, and again before it uses it. So
every heuristic here can change without re-arguing the law: a wrong one costs tokens or time,
or is caught by the walk's check, and never changes a sample. What the policy keeps between
passes is memoised reads (accept predictors fed chunk by chunk, complete proposals' decisions),
dropped when the walk says the state they were read against has changed.

What is proposed: each transition's proposal beside the one the walk needs next while it is
likely still to be usable at its turn (:meth:`StreamPolicy.survival`: each transition before it
accepts at the chain's acceptance rate so far, or, once its proposal is complete, as the kernel
decides it) and the engine's budget allows; while the block's extension streams, those whose cut
lies in the prefix received (:meth:`StreamPolicy.early`); the next block's extension once this
block's last transitions likely all reject (:meth:`StreamPolicy.next_extension`), and the
next block's proposals whose cut lies in this block's response (:meth:`StreamPolicy.ahead`);
and *accept branches*: the proposals of later transitions from the state a transition's
accept would make, while that accept is likely (:meth:`StreamPolicy.scan`, with
:class:`~presto_client.core.stream.predictor.AcceptPredictor`). Its constants are the
:class:`~presto_client.core.stream.tuning.StreamTuning` it is given.
"""

from __future__ import annotations

from presto_client.core.state import ChainState
from presto_client.core.stream.flight import InFlight, join_chunks
from presto_client.core.stream.predictor import AcceptPredictor, Watch
from presto_client.core.stream.tuning import StreamTuning
from presto_client.core.stream.view import Origin, Plan, Proposal, WalkSnapshot, Withdrawal, ready
from presto_client.errors import InvalidResponseError

Threat = tuple[int, float]
"""A transition before a proposal's: its cut, and how likely it accepts."""


class StreamPolicy:
    """Proposes what the walk should have in flight (see the module doc); speed only."""

    def __init__(self, tuning: StreamTuning, *, accept_branch: bool) -> None:
        self.tuning = tuning
        self.accept_branch = accept_branch
        self._watches: dict[int, Watch] = {}
        """Accept predictors of the proposals whose branches are speculated, by transition."""
        self._known: dict[int, tuple[InFlight, ChainState, float]] = {}
        """Complete proposals' decisions by transition, for sizing (:meth:`threat`), with the
        state each was made against."""

    # ---- what the walk tells it (its own caches only)

    def start_block(self) -> None:
        self._known.clear()

    def forget(self, k: int | None = None) -> None:
        """Drop the accept predictions of transition ``k`` (``None``: all): the state they were
        made against has changed."""
        if k is None:
            self._watches.clear()
        else:
            self._watches.pop(k, None)

    # ---- sizing

    def accept_rate(self, view: WalkSnapshot) -> float:
        pseudo_accepts, pseudo_transitions = self.tuning.accept_prior
        return (view.accepts + pseudo_accepts) / (view.transitions + pseudo_transitions)

    @staticmethod
    def survival(threats: list[Threat], cut: int) -> float:
        """How likely a proposal at ``cut`` is still usable once the transitions before it,
        ``threats`` (their cuts and how likely each accepts), are decided: one that accepts at a
        smaller cut rewrites the prefix. (For EntropyCut an accept at a larger cut may still
        move the cut; not counted: an estimate for sizing, never a check.)"""
        survival = 1.0
        for threat_cut, odds in threats:
            if threat_cut < cut:
                survival *= 1.0 - odds
        return survival

    def survival_floor(self, view: WalkSnapshot, sequences: int) -> float:
        """How likely a speculative proposal of ``sequences`` must be to be used for it to be
        proposed: the tuning's floor, or what it costs the sequences in flight if more
        (:meth:`SpeculationBudget.marginal_cost`: on a compute-bound engine a proposal an
        earlier accept likely rewrites slows the walk's head for nothing)."""
        return max(self.tuning.survival_floor, view.marginal_cost(sequences))

    def threat(self, view: WalkSnapshot, flight: InFlight, state: ChainState) -> Threat:
        """``flight``'s transition as a threat to the proposals after it: its cut, and how likely
        it accepts if the walk reaches it in ``state``. A complete proposal is decided the
        moment the walk reaches it, so its odds are the kernel's own decision, known now
        (a rejection is no threat: without this, a run of complete rejections ahead of the walk
        held the proposals behind them back as if each might accept, and the walk, reaching
        them all at once, then waited for those); before that, the chain's acceptance rate.
        While the block's extension streams, ``state`` holds only its first tokens and nothing
        is decided. For sizing only: the walk decides again, in order."""
        rate = self.accept_rate(view)
        if (
            not flight.complete
            or flight.error is not None
            or flight.cut + flight.requests[0].num_tokens != state.length  # a partial state
        ):
            return flight.cut, rate
        known = self._known.get(flight.k)
        if known is None or known[0] is not flight or known[1] is not state:
            odds = rate
            if view.usable(flight, state):
                proposals = [join_chunks(c) for c in flight.chunks]
                try:
                    verdict = view.kernel.evaluate(state, flight.cut, proposals, flight.draws)
                except InvalidResponseError:
                    pass  # the walk's own decision reports it, in order
                else:
                    if verdict.decided:
                        odds = float(verdict.accepted)
            known = self._known[flight.k] = (flight, state, odds)
        return flight.cut, known[2]

    @staticmethod
    def _last(view: WalkSnapshot, m: int) -> int:
        """One past the last transition the window may hold while the walk waits at ``m``."""
        cap, steps = view.cap, view.steps
        return steps if cap is None else min(m + cap, steps)

    # ---- what to propose

    def refill(self, view: WalkSnapshot, state: ChainState, m: int) -> Plan:
        """The walk is at ``m`` in ``state`` (its own proposal in flight): those ahead worth
        their tokens, in transition order. The walk issues them while the engine's budget
        allows: never out of order, and what would have gone out is noted, so that a wait for
        it is counted as the budget's."""
        window = view.window
        floor = self.survival_floor(view, view.kernel.sequences_per_proposal)
        rate = self.accept_rate(view)
        threats = [self.threat(view, window[m], state)]
        plan = Plan(report_refusals=True)
        for j in range(m + 1, self._last(view, m)):
            flight = window.get(j)
            if flight is not None:
                threats.append(self.threat(view, flight, state))
                continue
            cut = view.kernel.cut(state, view.draws(j).u_cut)
            survival = self.survival(threats, cut)
            threats.append((cut, rate))
            if survival >= floor:  # (else likely rewritten first: proposed when nearer)
                plan.steps.append(Proposal(j, cut, state, survival=survival))
        return plan

    def early(self, view: WalkSnapshot, partial: ChainState, length: int) -> Plan:
        """The block's extension is in up to ``partial`` (``length`` once complete): the
        transitions whose cut lies in it. All are speculative (the walk waits for the
        extension): budget first, in transition order; with a cap ``W`` at most ``W − 1`` of
        them, as when the walk waits for a head."""
        window = view.window
        steps, cap = view.steps, view.cap
        last = steps if cap is None else min(cap - 1, steps)
        per = view.kernel.sequences_per_proposal
        floor = self.survival_floor(view, per)
        rate = self.accept_rate(view)
        threats: list[Threat] = []
        reserved = 0
        plan = Plan(report_refusals=True)
        for j in range(last):
            flight = window.get(j)
            if flight is not None:
                threats.append((flight.cut, rate))  # nothing is decided before the extension
                continue
            cut = view.kernel.speculative_cut(partial, length, view.draws(j).u_cut)
            survival = self.survival(threats, cut)
            threats.append((cut, rate))
            if survival < floor:
                continue
            if not ready(cut, partial.length):
                # Its prefix is not in yet: a later chunk brings it. Its slots are kept for it,
                # since the walk needs it before every later transition.
                reserved += per
                continue
            plan.steps.append(
                Proposal(j, cut, partial, Origin.EXTENSION, survival=survival, reserved=reserved)
            )
        return plan

    def next_extension(self, view: WalkSnapshot, left: int) -> bool:
        """Whether the next block's extension is wanted now, ``left`` transitions before this
        block ends: only once they likely all reject (an accept closes it); the walk requests
        it if the budget allows."""
        # (else an accept among the transitions left would likely rewrite it)
        return (1.0 - self.accept_rate(view)) ** left >= self.survival_floor(view, 1)

    def ahead(self, view: WalkSnapshot, state: ChainState, m: int) -> Plan:
        """The walk is at ``m`` in ``state`` with this block's proposals from ``m`` on in flight:
        next-block proposals whose cut lies in ``state``'s response.

        The next block's walk ends no sooner than its longest proposal, the one at the
        smallest cut, which would otherwise go out only when that block starts; its prefix,
        though, is this state's, and stays so unless an accept at a smaller cut rewrites it
        before this block ends (the walk then closes it). So such proposals go out while they
        are likely to survive this block's transitions left and the next block's before them,
        the longest first, as the engine's budget allows (on a compute-bound engine its
        marginal cost raises the floor, as for every speculative proposal). On the job's shape
        (16 blocks of 192, K = 10) this took stream from 3.85x to 4.47x the sequential chain
        for MultiTryMH and from 4.94x to 7.72x for PowerMH, in virtual time on the `gpu` cost
        curve (docs/benchmarks.md, "The job's shape")."""
        window, ahead = view.window, view.ahead
        floor = self.survival_floor(view, view.kernel.sequences_per_proposal)
        rate = self.accept_rate(view)
        length = state.length + view.block_size
        threats = [self.threat(view, window[j], state) for j in range(m, view.steps)]
        chosen: list[tuple[int, int, float]] = []
        for j in range(view.steps):
            flight = ahead.get(j)
            if flight is not None:
                threats.append((flight.cut, rate))
                continue
            cut = view.kernel.speculative_cut(state, length, view.next_draws(j).u_cut)
            survival = self.survival(threats, cut)
            threats.append((cut, rate))
            if ready(cut, state.length) and survival >= floor:
                chosen.append((cut, j, survival))
        steps: list[Proposal | Withdrawal] = [
            Proposal(j, cut, state, Origin.NEXT_BLOCK, survival=survival, limit=view.cap)
            for cut, j, survival in sorted(chosen)
        ]
        return Plan(steps)

    def scan(
        self,
        view: WalkSnapshot,
        state: ChainState,
        head: InFlight | None,
        first: int,
        length: int,
    ) -> Plan:
        """Feed the head's and the next proposals' new tokens to their accept predictors, and
        want each one's accept branch (the others' assume the transitions before them reject,
        which their branches' survival counts). ``head``: ``None`` while the block's extension
        streams (``state`` holds its first tokens, ``length`` the whole)."""
        cap = view.cap
        left = view.steps - first
        window = view.window

        def limit(t: int) -> int | None:
            # The head's branch is capped by the window's cap only; the others' keep all in
            # flight (the head or the extension included) below the transitions left: they
            # assume more, and are worth less.
            if head is not None and t == head.k:
                return cap
            return left - 1 if cap is None else min(cap, left - 1)

        threats: list[Threat] = []
        plan = Plan()
        for t in range(first, first + 1 + self.tuning.branch_watch):
            flight = head if head is not None and t == head.k else window.get(t)
            if flight is None:
                continue
            watch = self._watches.get(t)
            if watch is None or watch.flight is not flight or watch.attempts != flight.attempts:
                predictor = AcceptPredictor(
                    view.kernel, state, flight.cut, flight.draws, length, self.tuning.prior_tokens
                )
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
                prior_t = self.survival(threats, flight.cut)
                plan.steps.extend(
                    self._branch(view, state, flight, watch.predictor, prior_t, limit(t), length)
                )
            threats.append(self.threat(view, flight, state))
        return plan

    def _branch(
        self,
        view: WalkSnapshot,
        state: ChainState,
        base: InFlight,
        predictor: AcceptPredictor,
        prior: float,
        limit: int | None,
        length: int,
    ) -> list[Proposal | Withdrawal]:
        """Want, from the state ``base``'s accept would make (its prefix, then the tokens of
        the candidate it would splice received so far), the proposals of the transitions after
        it whose cut lies past ``base``'s and inside those tokens, while that accept is likely
        enough (``prior``: that ``base`` is still usable at its turn) and each proposal to
        survive the transitions between; all in flight stay under ``limit``. Those already in
        flight stay until ``base`` is decided; all are withdrawn when its accept has become
        unlikely, or the candidate changes. The proposals form one group: the walk stops at
        the first the budget refuses or ``limit`` holds back."""
        tuning = self.tuning
        probability, candidate = predictor.predict()
        probability *= prior
        steps: list[Proposal | Withdrawal] = []
        entry = view.branches.get(base.k)
        if entry is not None and entry[0] is not base:  # left from a proposal since replaced
            steps.append(Withdrawal(base.k))
            entry = None
        branch = entry[1] if entry is not None else {}
        if branch and (
            probability < tuning.branch_drop * tuning.branch_floor
            or any(flight.candidate != candidate for flight in branch.values())
        ):
            steps.append(Withdrawal(base.k))
            branch = {}
        if probability < tuning.branch_floor or not base.chunks[candidate]:
            return steps
        received = join_chunks(base.chunks[candidate])
        partial = state.with_response(state.response.slice(0, base.cut).concat(received))
        rate = self.accept_rate(view)
        threats: list[Threat] = []
        last = min(self._last(view, base.k), base.k + 1 + tuning.branch_span)
        for j in range(base.k + 1, last):
            flight = branch.get(j)
            if flight is not None:
                threats.append((flight.cut, rate))
                continue
            cut = view.kernel.speculative_cut(partial, length, view.draws(j).u_cut)
            survival = probability * self.survival(threats, cut)
            threats.append((cut, rate))
            if cut <= base.cut:
                continue  # the accept leaves its prefix as it is: the window's to propose
            if not ready(cut, partial.length):
                continue  # its prefix is not in yet: a later chunk may bring it
            if survival < tuning.branch_floor:
                continue
            steps.append(
                Proposal(
                    j,
                    cut,
                    partial,
                    Origin.BRANCH,
                    base=base.k,
                    candidate=candidate,
                    survival=survival,
                    limit=limit,
                    group=base.k,
                )
            )
        return steps
