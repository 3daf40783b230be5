"""A transition's verdict and the pieces of a decision that need no kernel: the certified
interval test, the early-rejection bound's interface and its slacks.

Every ``log A`` is computed in :mod:`presto_client.core.kernels`; this module holds what those
computations return and the rules they decide by.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from presto_client.core.engine_protocol import ScoredTokens
from presto_client.errors import InvalidResponseError


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one transition's decision (or the news that it is not yet decidable)."""

    decided: bool
    accepted: bool
    selected: int
    """Index of the proposal spliced in on accept (MultiTryMH's selected candidate, else 0)."""
    log_accept_lo: float
    log_accept_hi: float
    """Bounds of ``log A`` (MultiTryMH: of the log acceptance ratio of the selected candidate)."""
    eps_certain: bool
    """``A ≥ 1−ε`` or ``A ≤ ε`` over the whole interval."""
    early: bool = False
    """Rejected from a partial proposal by :class:`RejectionBound` (method §5)."""

    @property
    def log_accept(self) -> float:
        return 0.5 * (self.log_accept_lo + self.log_accept_hi)


def check_finite(name: str, *values: float) -> None:
    """Raise when a ratio came out NaN. A server's NaN logprob is refused where it is parsed,
    so from a server one arises only from infinities: a token scored ``-inf`` on both sides."""
    for v in values:
        if math.isnan(v):
            raise InvalidResponseError(
                f"{name} is NaN: the current sequence and the proposal both hold a token scored "
                "-inf (probability zero, e.g. a server's -9999 sentinel; -inf minus -inf), or a "
                "score is NaN; a server that samples tokens it scores -inf applies a logit "
                "bias, grammar or mask to sampling but not to the logprobs it returns"
            )


def decide_interval(lo: float, hi: float, u: float, epsilon: float) -> Verdict:
    """Accept iff ``log u < log A``, ``log A ∈ [lo, hi]``; ambiguous if ``lo ≤ log u < hi``."""
    check_finite("log A", lo, hi)
    log_u = math.log(u)
    eps_certain = lo >= math.log1p(-epsilon) or hi <= math.log(epsilon)
    if log_u < lo:
        return Verdict(True, True, 0, lo, hi, eps_certain)
    if log_u >= hi:
        return Verdict(True, False, 0, lo, hi, eps_certain)
    return Verdict(False, False, 0, lo, hi, eps_certain)


UNSEEN_TOKEN_SLACK = 1e-6
"""What a not-yet-received token may add to the upper bound of ``log A``, in nats.

Each unseen token's term ``α·log p0 − log q_τ`` is ``≤ 0`` in exact arithmetic (method §5); the
slack covers the rounding of the engine's reported logprobs (fp32 log-softmax drifts by ~1e-7),
so that an early rejection is always the decision the full kernel takes on the reported scores.
"""
CUT_LAW_SLACK = 1e-9
"""Rounding allowance of EntropyCut's cut-law bound (a ratio of sums summed in another order)."""


class RejectionBound:
    """An upper bound of a transition's acceptance, kept as a proposal's tokens stream in.

    :meth:`feed` hands over the next tokens of sequence ``index`` (in order); :meth:`rejects` is
    true once the transition is *certainly* rejected whatever the unseen tokens turn out to be:
    the full kernel, given the whole proposal, would reject too. The walk then decides at once
    and closes the proposal's stream (early rejection, method §5).
    """

    def feed(self, index: int, chunk: ScoredTokens) -> None:
        raise NotImplementedError

    def upper(self) -> float:
        """The current upper bound of ``log A`` (MultiTryMH: of the log acceptance ratio)."""
        raise NotImplementedError

    def rejects(self) -> bool:
        raise NotImplementedError

    def verdict(self) -> Verdict:
        """The (early) rejection, for the records: ``log A`` is reported at its upper bound."""
        upper = self.upper()
        return Verdict(True, False, 0, upper, upper, upper <= math.log(self._epsilon), early=True)

    _epsilon: float = 0.01


def temperatures_bound_each_token(alpha: float, temperatures: Sequence[float]) -> bool:
    """Whether ``α·log p0 − log q_τ = (α − 1/τ)·log p0 + log Z_τ ≤ 0`` for every token.

    True iff ``α ≥ 1/τ ≥ 1`` for every temperature: both terms are then ``≤ 0``.
    """
    return all(t <= 1.0 + 1e-12 and alpha * t >= 1.0 - 1e-12 for t in temperatures)
