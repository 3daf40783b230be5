"""How much speculation an engine can afford: one budget shared by the chains of an engine.

The ``stream`` traversal keeps up to ``W`` proposals of a chain in flight. The first of them (the
*head*: the transition the walk waits for) is what the sequential chain would request anyway; the
others are *speculative*. Speculation is free on a latency-bound engine (a GPU decode step costs
nearly the same for 1 or 64 sequences) and costly on a compute-bound one (every sequence in a CPU
step slows the others), and when many chains saturate an engine, speculative sequences take batch
slots from other chains' heads. So the chains of an engine share one :class:`SpeculationBudget`,
held by whoever opened the engine (the job's engines,
:mod:`presto_client.orchestration.engines.opening`) and handed to each chain's runner:

* **capacity**: speculative sequences never take the slots that the chains' heads need
  (``capacity − heads``, capacity being the engine's concurrency bound);
* **cost**: the budget fits the engine's per-token latency as a function of the sequences in
  flight, ``step(n) = a + b·n`` (least squares over the inter-token times of the streams, with
  forgetting), and allows speculative sequences only while they slow a step by at most
  ``tolerance`` relative to the heads alone: ``n_spec ≤ tolerance·step(heads)/b``.

Until the cost is measured, speculation grows with the evidence of what it costs: one
speculative sequence (none on an engine whose prefix caches are per slot, ``probe=False``: there
the first speculative request prefills its whole prompt on another slot, which on llama.cpp's
CPU thread costs more than the proposal saves; its chains speculate once loads they make
themselves have measured the cost), plus one per observation made with more than one
sequence in flight (a slow start: a compute-bound engine shows its cost before a chain fills
its slots, and a
latency-bound one yields dozens of such observations in its first tokens; observations of a
lone sequential chain say nothing about the slope). The slow start is also capped by a
provisional fit of the few observations so far, so a compute-bound engine whose first loaded
steps already cost several times a lone one stops it there (llama.cpp on one thread: 100-250 ms
a token with 2-4 sequences against 25 ms alone, while the count alone let a chain's window grow
to 6). A flat fit opens the bound; a steep one pulls speculation back towards the sequential
chain. The window in the config stays a cap.

The fit also prices each speculative proposal (:meth:`SpeculationBudget.marginal_cost`): the
stream traversal issues one only while it is at least that likely to be used. Past the
tolerance, a proposal still goes out when its expected saving to its chain pays for what it
costs the heads of every chain on the engine
(:meth:`SpeculationBudget.worth_past_the_tolerance`): a lone chain on a GPU is then no longer
held to the tolerance (MultiTryMH, four sequences a proposal), while many chains sharing the
engine, or a compute-bound one, keep it.
Nothing here changes a decision: which proposals are in flight never affects the law of the
chain (method §4), only its speed.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from presto_client.core.engine_protocol import ConcurrencyBounded, Engine

logger = logging.getLogger(__name__)

DEFAULT_TOLERANCE = 0.5
"""Speculation may slow a decode step by this fraction over the heads alone."""
MIN_OBSERVATIONS = 16
"""Samples (inter-chunk times of streams, whole requests of the other runners) before the cost
fit is trusted; it also needs them at more than one load."""
PROVISIONAL_OBSERVATIONS = 4
"""Samples (at more than one load) before the fit may cap the slow start (never open it)."""
FORGETTING = 0.995
"""Per-sample decay of the least-squares sums (recent load counts most)."""
ROUND_VALUE_FORGETTING = 0.95
"""Per-round decay of the predicted/realised transition sums of the round rules."""
RESERVE_SHARE = 0.5
"""At most this share of the speculative sequences still available may be held for proposals
that come first but cannot be issued yet (:meth:`SpeculationBudget.try_acquire`)."""


@dataclass(slots=True)
class _CostFit:
    """Exponentially weighted least squares of ``seconds per token = a + b·n``."""

    w: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    count: int = 0

    def add(self, n: float, seconds: float, weight: float = 1.0) -> None:
        decay = FORGETTING
        self.w = self.w * decay + weight
        self.sx = self.sx * decay + weight * n
        self.sy = self.sy * decay + weight * seconds
        self.sxx = self.sxx * decay + weight * n * n
        self.sxy = self.sxy * decay + weight * n * seconds
        self.count += 1

    def coefficients(self, minimum: int = MIN_OBSERVATIONS) -> tuple[float, float] | None:
        """``(a, b)``, or ``None`` before ``minimum`` samples or while they cannot separate
        them."""
        if self.count < minimum or self.w <= 0:
            return None
        mean_x = self.sx / self.w
        var_x = self.sxx / self.w - mean_x * mean_x
        if var_x <= 1e-9:
            return None  # every sample at the same load: the slope is unknown
        b = (self.sxy / self.w - mean_x * self.sy / self.w) / var_x
        a = self.sy / self.w - b * mean_x
        return a, b


class SpeculationBudget:
    """The speculative sequences an engine's chains may keep in flight together."""

    @classmethod
    def unmeasured(cls) -> SpeculationBudget:
        """The budget of a chain that holds none for its engine and has nothing to measure
        (an in-process engine computes on the event loop: its timings say nothing of a
        server's cost): no capacity, no adaptation, so its chains speculate up to their caps."""
        return cls(None, adaptive=False)

    @classmethod
    def per_replica(
        cls,
        replicas: int,
        capacity: int,
        *,
        tolerance: float = DEFAULT_TOLERANCE,
        probe: bool = True,
    ) -> list[SpeculationBudget]:
        """The budgets of an engine's replicas, one each (one server, one cost curve, shared
        by the chains on it), sized from the bound its requests run under. Made where the
        engine opens (a job, a Ray worker, the service), and handed down."""
        return [cls(capacity, tolerance=tolerance, probe=probe) for _ in range(replicas)]

    @classmethod
    def for_engine(cls, engine: Engine) -> SpeculationBudget:
        """A budget of one chain's own for ``engine``: measured (adaptive) when the engine
        states a concurrency bound (a served engine), else :meth:`unmeasured`."""
        if not isinstance(engine, ConcurrencyBounded):
            return cls.unmeasured()
        return cls(engine.max_concurrency)

    def __init__(
        self,
        capacity: int | None = None,
        *,
        tolerance: float = DEFAULT_TOLERANCE,
        adaptive: bool = True,
        probe: bool = True,
    ) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError("capacity must be >= 1")
        if tolerance < 0:
            raise ValueError("tolerance must be >= 0")
        self.capacity = capacity
        self.tolerance = tolerance
        self.adaptive = adaptive
        self.probe = probe
        """Whether the slow start begins with one speculative proposal before anything under
        load is measured (its probe)."""
        self.heads = 0
        """Sequences of head proposals in flight (what sequential chains would run)."""
        self.speculative = 0
        """Sequences of speculative proposals in flight."""
        self._fit = _CostFit()
        self._loaded_observations = 0
        """Observations made with more than one sequence in flight (the slow start's evidence)."""
        self.peak_speculative = 0
        self.refused_for_slots = False
        """Whether the last refusal of :meth:`try_acquire` was for lack of the engine's slots
        (its concurrency bound, after the heads' share) rather than the cost tolerated."""
        self.refused_unmeasured = False
        """Whether the last refusal came before any cost under load was measured, with no probe
        to measure it (:attr:`probe` off)."""
        self._value: dict[str, tuple[float, float]] = {}
        """Per rule: decayed sums of predicted and realised extra transitions per round."""

    @property
    def in_flight(self) -> int:
        return self.heads + self.speculative

    def cost_limit(self) -> float:
        """Speculative sequences the measured cost allows (see the module doc: a slow start
        until it is measured, ``inf`` on a flat engine)."""
        if not self.adaptive:
            return math.inf
        fit = self._fit.coefficients()
        if fit is None:
            slow_start = float(int(self.probe) + self._loaded_observations)
            early = self._fit.coefficients(PROVISIONAL_OBSERVATIONS)
            return slow_start if early is None else min(slow_start, self._tolerated(*early))
        return self._tolerated(*fit)

    def _tolerated(self, a: float, b: float) -> float:
        if b <= 0:
            return math.inf  # flat (latency-bound): speculation costs the others nothing
        base = max(a + b * max(self.heads, 1), 1e-12)
        return self.tolerance * base / b

    def marginal_cost(self, sequences: int = 1) -> float:
        """How much ``sequences`` more slow each decode step, relative to a step of what is in
        flight now (at least one sequence): ``b·sequences / step(in flight)``; 0 until the cost
        is measured, and on a flat engine.

        It is the least probability of being used at which a speculative proposal pays for
        itself: each of its steps makes every sequence in flight that much slower, while it
        saves its own time only if the walk uses it. On a GPU this is ~0 (every proposal the
        window holds is worth sending); on a compute-bound engine serving one chain it is large
        (llama.cpp on one thread: ~0.45), and only proposals no earlier transition is likely to
        rewrite go out."""
        fit = self._fit.coefficients() if self.adaptive else None
        if fit is None or fit[1] <= 0:
            return 0.0
        a, b = fit
        return b * sequences / max(a + b * max(self.in_flight, 1), 1e-12)

    def best_size(
        self, expected: list[float], per: int = 1, lengths: list[int] | None = None
    ) -> int:
        """The number of proposals ``m`` (1 ≤ m ≤ ``len(expected)``) that maximises a round's
        expected transitions per second,
        ``expected[m−1] / (longest(m) · step(others + m·per))``.

        ``expected[m−1]`` is the expected number of transitions a round of its first ``m``
        proposals completes (1 for the root alone: the sequential chain). A round lasts as many
        decode steps as its longest proposal (``lengths``: tokens per proposal; without them,
        as many whatever its size), each costing ``step(n) = a + b·n`` with ``n`` the sequences
        in flight on the engine, so on a compute-bound engine (a CPU: ``b`` large against ``a``)
        extra proposals must each be likely to be used to pay for themselves, and a proposal cut
        earlier than the others also for the steps it adds to the round; the round shrinks
        towards the sequential chain's. On a flat (latency-bound) engine, or before the cost is
        measured, every proposal is kept.
        """
        if not expected:
            raise ValueError("expected must not be empty")
        if lengths is not None and len(lengths) != len(expected):
            raise ValueError("lengths must give one length per proposal")
        fit = self._fit.coefficients() if self.adaptive else None
        if fit is None or fit[1] <= 0:
            return len(expected)
        a, b = fit
        others = self.in_flight
        best, best_rate = 1, -math.inf
        longest = 1
        for m, e in enumerate(expected, start=1):
            if lengths is not None:
                longest = max(longest, lengths[m - 1], 1)
            rate = e / (longest * max(a + b * (others + m * per), 1e-12))
            if rate > best_rate * (1 + 1e-9):
                best, best_rate = m, rate
        return best

    def record_round_value(self, rule: str, predicted_extra: float, realised_extra: float) -> None:
        """A round of ``rule`` was planned to complete ``1 + predicted_extra`` transitions
        (its summed reach) and completed ``1 + realised_extra``."""
        p, r = self._value.get(rule, (0.0, 0.0))
        decay = ROUND_VALUE_FORGETTING
        self._value[rule] = (p * decay + max(predicted_extra, 0.0), r * decay + realised_extra)

    def value_scale(self, rule: str) -> float:
        """How the predicted extra transitions of ``rule``'s rounds compare with what the walks
        realised on this engine (1 until measured): a predictor fitted elsewhere (the paper's
        coefficients) can promise more than the chains here accept, and rounds sized on its
        promise would lose to the sequential chain."""
        p, r = self._value.get(rule, (0.0, 0.0))
        if p < 1.0:  # not one predicted transition's worth of evidence yet
            return 1.0
        return min(max(r / p, 0.05), 2.0)

    def available(self) -> int:
        """How many more speculative sequences may start now."""
        limit = self.cost_limit() - self.speculative
        free = min(self._room(), limit)
        return 0 if free <= 0 else (int(free) if math.isfinite(free) else 1 << 30)

    def try_acquire(
        self,
        sequences: int,
        reserved: int = 0,
        used: float | None = None,
        own: int | None = None,
    ) -> bool:
        """Take ``sequences`` speculative slots, leaving ``reserved`` of those available for
        proposals that come first but cannot be issued yet (see :meth:`StreamPolicy.early`).
        ``used``: how likely the proposal is to be used; past the tolerance it still goes out
        if that pays (:meth:`worth_past_the_tolerance`).
        The reservation holds only once the cost is measured (before that, the slow start grows
        only with proposals in flight), and for at most :data:`RESERVE_SHARE` of the sequences
        still available. The proposals that can start now are the early-cut ones, the longest,
        which gain most from an early start: the reservation binds where the budget has many
        slots to spare (MultiTryMH on a GPU, ten proposals of four sequences, where later
        transitions took them all), never over the last slots of a budget of one or two
        sequences, which it would keep idle until a short late-cut proposal could go (a
        compute-bound engine: ``benchmarks/budget_replay.py``'s mixed curve, stream 1.27x held
        whole against 1.38x)."""
        available = self.available()
        if self._fit.coefficients() is None:
            reserved = 0
        reserved = min(reserved, int(available * RESERVE_SHARE))
        if (
            available - reserved < sequences
            and not self._slow_start_opens(sequences)
            and not (used is not None and self.worth_past_the_tolerance(sequences, used, own))
        ):
            self.refused_for_slots = self._room() - reserved < sequences
            self.refused_unmeasured = (
                self.adaptive and not self.probe and self._loaded_observations == 0
            )
            return False
        self.speculative += sequences
        self.peak_speculative = max(self.peak_speculative, self.speculative)
        return True

    def worth_past_the_tolerance(self, sequences: int, used: float, own: int | None = None) -> bool:
        """Whether a speculative proposal of ``sequences`` that is ``used`` likely to be used
        is worth its cost although the tolerance is spent. Needs the fitted cost and free slots.

        ``own``: the head sequences of the chain that asks (its proposal's). The proposal then
        goes out iff its expected saving to that chain pays for what it costs every chain with
        a head in flight: ``used ≥ (heads/own)·b·sequences/step(heads)``. If it is used, its
        chain no longer waits for its ``L`` tokens at about ``step(heads)`` each; whether used
        or not, it makes each of the ``heads/own`` chains' heads ``L·b·sequences`` slower.
        The step is the heads' alone, as the tolerance's: priced against the loaded step, each
        proposal would make the next look cheaper. A lone chain thus pays only its own head's
        share: MultiTryMH on a GPU (5 %) is no longer held to the tolerance's ten proposals,
        while on a compute-bound engine (``b`` near ``a``) only proposals at least about half
        likely to be used go out, and beside many chains hardly any.

        Without ``own`` (a caller that does not say whose it is): count every proposal in
        flight as certain to be used, so adding this one raises the engine's expected useful
        work per second iff ``used ≥ b·n/step(n)``, ``n`` the sequences in flight with it."""
        fit = self._fit.coefficients() if self.adaptive else None
        if fit is None or self._room() < sequences:
            return False
        a, b = fit
        if b <= 0:
            return True
        if own is not None:
            sharers = max(1.0, self.heads / max(own, 1))
            return used >= sharers * b * sequences / max(a + b * max(self.heads, 1), 1e-12)
        n = self.in_flight + sequences
        return used >= b * n / max(a + b * n, 1e-12)

    def _slow_start_opens(self, sequences: int) -> bool:
        """The slow start's first step is one proposal, whatever its sequences: counted in
        sequences, a MultiTryMH proposal (one per try) would wait for observations under load
        that only such a proposal can make while the block's extension streams alone."""
        if (
            not self.adaptive
            or not self.probe
            or self.speculative > 0
            or self._fit.coefficients() is not None
        ):
            return False
        return self._room() >= sequences

    def _room(self) -> float:
        """Sequences the engine's slots still hold (``inf`` without a known capacity)."""
        return math.inf if self.capacity is None else self.capacity - self.in_flight

    def release(self, sequences: int) -> None:
        self.speculative = max(0, self.speculative - sequences)

    def add_head(self, sequences: int) -> None:
        self.heads += sequences

    def remove_head(self, sequences: int) -> None:
        self.heads = max(0, self.heads - sequences)

    def observe(self, tokens: int, seconds: float, in_flight: int) -> None:
        """A stream delivered ``tokens`` more tokens ``seconds`` after its previous chunk."""
        if tokens <= 0 or not seconds > 0 or not math.isfinite(seconds):
            return
        self._fit.add(float(max(in_flight, 1)), seconds / tokens, weight=float(tokens))
        if in_flight > 1:
            self._loaded_observations += 1

    def fitted(self) -> tuple[float, float] | None:
        """The fitted ``(a, b)`` of ``seconds per token = a + b·sequences in flight``."""
        return self._fit.coefficients()
