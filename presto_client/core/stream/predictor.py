"""How likely the walk's head accepts, read from the part of its proposal received so far.

The ``stream`` traversal speculates the *accept branch*: while the head transition's proposal
streams in, a later transition whose cut lies inside the part received can have the proposal
it would get if the head accepts issued from that state (the head's prefix, then its tokens).
Most heads reject, so such proposals are worth their tokens only when the head is likely to
accept. :class:`AcceptPredictor` estimates that probability from the tokens seen so far and the
transition's own uniform (known in advance: the draws are keyed by transition).

An estimate for sizing only, never a decision: which proposals are in flight does not change
the chain, because a proposal is used only if the state it was issued from is the realised one
(every decision is the kernel's, :mod:`presto_client.core.kernels`).

The estimate: the per-token terms ``α·log p0 − log q`` of the suffix (both states'), the
unseen ones of the proposal extrapolated by the mean of those seen (shrunk towards the current
suffix's mean while few are in), and a normal spread for what is not seen yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from presto_client.core.engine_protocol import FloatArray, ScoredTokens
from presto_client.core.kernels import Kernel, MultiTryMH
from presto_client.core.rng import TransitionDraws
from presto_client.core.state import ChainState
from presto_client.core.stream.flight import InFlight
from presto_client.core.stream.tuning import DEFAULT_TUNING


def _normal_above(margin: float, scale: float) -> float:
    """``P(margin + N(0, scale²) > 0)``."""
    if scale <= 0.0:
        return 1.0 if margin > 0.0 else 0.0
    return 0.5 * math.erfc(-margin / (scale * math.sqrt(2.0)))


def _mid(scores: ScoredTokens) -> FloatArray:
    """Per-token ``log q`` at every temperature, midway in its certified interval."""
    mid: FloatArray = 0.5 * (scores.logq_lo + scores.logq_hi)
    return mid


class AcceptPredictor:
    """The predicted accept probability of one transition, and the candidate it would splice.

    :meth:`feed` hands over the next tokens of sequence ``index`` (in order, as for a
    :class:`~presto_client.core.verdict.RejectionBound`); :meth:`predict` returns the estimated
    probability that the transition accepts and the sequence it would splice in.
    """

    def __init__(
        self,
        kernel: Kernel,
        state: ChainState,
        cut: int,
        draws: TransitionDraws,
        length: int | None = None,
        prior_tokens: float = DEFAULT_TUNING.prior_tokens,
    ):
        """``length``: the response's length once complete, if ``state`` holds only its first
        tokens (a block's extension streaming in): the current suffix's unseen tokens are then
        extrapolated by its mean, as the proposal's are. ``prior_tokens``: the tuning's
        (:attr:`~presto_client.core.stream.tuning.StreamTuning.prior_tokens`)."""
        self._prior_tokens = prior_tokens
        x = state.response.slice(cut)
        self._alpha = kernel.alpha
        self._length = (state.length if length is None else length) - cut
        q = _mid(x)
        terms = kernel.alpha * x.logp0 - q[:, 0]
        unseen = self._length - len(x)
        scale = (self._length / len(x)) if len(x) else 0.0
        self._x_logp0 = float(x.logp0.sum()) * scale
        self._x_logq = q.sum(axis=0) * scale
        std = float(terms.std()) if len(terms) > 1 else 0.0
        self._x_unseen = std * math.sqrt(unseen)
        self._spread = std * math.sqrt(2.0)
        per = kernel.sequences_per_proposal
        temperatures = q.shape[1]
        self._logp0 = np.zeros(per)
        self._logq = np.zeros((per, temperatures))
        self._seen = np.zeros(per)
        self._draws = draws
        self._multi_try = isinstance(kernel, MultiTryMH)
        self._log_m = math.log(temperatures)

    def feed(self, index: int, chunk: ScoredTokens) -> None:
        if len(chunk) == 0:
            return
        self._logp0[index] += float(chunk.logp0.sum())
        self._logq[index] += _mid(chunk).sum(axis=0)
        self._seen[index] += len(chunk)

    def _extrapolated(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Each sequence's whole-suffix ``log p0`` and ``log q`` (per temperature), and the
        spread of the part still to come."""
        seen = self._seen
        rest = self._length - seen
        x_mean_logp0 = self._x_logp0 / max(self._length, 1)
        x_mean_logq = self._x_logq / max(self._length, 1)
        prior = self._prior_tokens
        weight = seen + prior
        mean_logp0 = (self._logp0 + prior * x_mean_logp0) / weight
        mean_logq = (self._logq + prior * x_mean_logq) / weight[:, None]
        logp0 = self._logp0 + rest * mean_logp0
        logq = self._logq + rest[:, None] * mean_logq
        scale = self._spread * (np.sqrt(rest) + rest / np.sqrt(weight))
        return logp0, logq, np.sqrt(scale**2 + self._x_unseen**2)

    def predict(self) -> tuple[float, int]:
        logp0, logq, scale = self._extrapolated()
        log_u = math.log(self._draws.u_accept)
        if not self._multi_try:
            log_accept = self._alpha * (logp0[0] - self._x_logp0) + self._x_logq[0] - logq[0, 0]
            return _normal_above(float(log_accept) - log_u, float(scale[0])), 0
        # MultiTryMH: the candidates' weights relative to the current suffix, the selection the
        # transition's uniform makes among them, and that candidate's acceptance ratio.
        x_mix = float(np.logaddexp.reduce(self._x_logq)) - self._log_m
        mix = np.logaddexp.reduce(logq, axis=1) - self._log_m
        log_w = self._alpha * (logp0 - self._x_logp0) + x_mix - mix
        shift = float(log_w.max())
        w = np.exp(log_w - shift)
        cumulative = np.cumsum(w)
        selected = int(np.searchsorted(cumulative, self._draws.u_select * cumulative[-1], "right"))
        selected = min(selected, len(w) - 1)
        log_total = shift + math.log(float(cumulative[-1]))
        rest = np.delete(log_w, selected)
        log_rest = float(np.logaddexp.reduce(np.append(rest, 0.0)))
        log_ratio = min(0.0, log_total - log_rest)
        return _normal_above(log_ratio - log_u, float(scale[selected])), selected


@dataclass(slots=True, eq=False)
class Watch:
    """A proposal in flight, its accept predictor and how many chunks of each sequence it has
    been fed (rebuilt when the stream restarts: ``attempts``)."""

    flight: InFlight
    attempts: int
    predictor: AcceptPredictor
    fed: list[int] = field(default_factory=list)
