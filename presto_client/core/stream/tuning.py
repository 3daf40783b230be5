"""The ``stream`` traversal's tuning: every constant of its speed policy, in one frozen object.

None of these values can change a sample: they decide which proposals are in flight and when,
and the walk (:mod:`presto_client.core.stream.walk`) uses a proposal only if it passes the rule
(:mod:`presto_client.core.stream.rule`) against the state it holds. Change them to trade tokens
for latency; the replay suites must pass unchanged.

The engine's speculation budget (:mod:`presto_client.core.speculation`: tolerance, cost fit) is
the engine's, shared with the round rules, and keeps its own constants.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamTuning:
    """The speed policy's constants, each with the reason for its value."""

    survival_floor: float = 0.1
    """A speculative proposal goes out only while it is this likely to be usable at its turn:
    deep proposals with long prefixes still go, those an earlier accept would likely rewrite wait
    until the walk is nearer (on a compute-bound engine the measured cost, when higher)."""
    branch_floor: float = 0.5
    """An accept-branch proposal goes out only while this likely to be used: most heads reject,
    and branches at 10 % or 30 % cost a quarter and a sixth of the chain's tokens for little
    time saved (docs/benchmarks.md, issue 17 (a))."""
    branch_drop: float = 0.3
    """An accept branch is closed once its head's predicted accept falls below this fraction of
    :attr:`branch_floor`: a margin against closing and re-issuing on every chunk (at 0.5,
    MultiTryMH's chain took 6 % longer)."""
    branch_watch: int = 4
    """Besides the head, the next proposals whose accept branches are speculated: further ones
    assume more rejections and are seldom worth their tokens."""
    branch_span: int = 24
    """An accept branch holds proposals of at most this many transitions after its own: past
    that, an accept before them is near certain and rewrites their prefix anyway."""
    accept_prior: tuple[float, float] = (1.2, 4.0)
    """Prior of the acceptance rate (pseudo accepts, pseudo transitions), 0.3: what chains
    accept before this one has a rate of its own."""
    prior_tokens: float = 16.0
    """Weight, in tokens, of the current suffix's per-token mean in the accept predictor's
    estimate of a proposal's mean: few tokens in say little of the rest."""
    stream_retries: int = 2
    """A broken stream (connection lost midway) is re-requested this many times with the same
    seed before the chain fails: breaks are rare and independent of the tokens."""

    def __post_init__(self) -> None:
        for name in ("survival_floor", "branch_floor", "branch_drop"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value}")
        if self.branch_watch < 0 or self.branch_span < 0 or self.stream_retries < 0:
            raise ValueError("branch_watch, branch_span and stream_retries must be >= 0")
        accepts, transitions = self.accept_prior
        if not 0.0 <= accepts <= transitions or transitions <= 0.0:
            raise ValueError("accept_prior must be (accepts, transitions) with 0 <= a <= t, t > 0")
        if self.prior_tokens <= 0.0:
            raise ValueError("prior_tokens must be > 0")


DEFAULT_TUNING = StreamTuning()
"""What every ``stream`` chain runs with unless given another (looked up when a runner is made,
so a test may replace it)."""
