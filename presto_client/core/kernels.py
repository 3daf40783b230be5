"""The three Metropolis–Hastings kernels: cut laws, proposals, and ``log A``.

This module is the one place where ``log A`` is computed, for every runner. Each kernel turns a
realised state ``x``, a cut ``c``, the generated proposal(s) and the transition's draws into a
:class:`Verdict`. Scores may be certified intervals (top-K engines): the verdict is then decided
only when ``log u`` lies outside the interval of ``log A``, so that every decided verdict is
exactly the exact kernel's decision; otherwise it is *ambiguous* and the runner tightens the
scores and asks again.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from presto_client.core.engine_protocol import FloatArray, ProposalRequest, ScoredTokens, ScoreSpec
from presto_client.core.rng import TransitionDraws
from presto_client.core.settings import SamplerConfig, Setting
from presto_client.core.state import ChainState
from presto_client.core.verdict import (
    CUT_LAW_SLACK,
    UNSEEN_TOKEN_SLACK,
    RejectionBound,
    Verdict,
    check_finite,
    decide_interval,
    temperatures_bound_each_token,
)


class _SuffixBound(RejectionBound):
    """PowerMH (and EntropyCut's PowerMH part): ``log A ≤ const(x) + Σ_{seen} (α·log p0 − log q)``.

    With certified intervals the upper ends are used: ``log q_hi`` for ``x``, ``log q_lo`` for the
    proposal. Every unseen token adds at most :data:`UNSEEN_TOKEN_SLACK`.
    """

    def __init__(self, kernel: Kernel, state: ChainState, cut: int, draws: TransitionDraws):
        x = state.response.slice(cut)
        self._alpha = kernel.alpha
        self._const = -kernel.alpha * float(x.logp0.sum()) + float(x.logq_hi[:, 0].sum())
        self._partial = 0.0
        self._unseen = state.length - cut
        self._log_u = math.log(draws.u_accept)
        self._epsilon = kernel.config.epsilon

    def feed(self, index: int, chunk: ScoredTokens) -> None:
        n = len(chunk)
        if n == 0:
            return
        terms = self._alpha * chunk.logp0 - chunk.logq_lo[:, 0]
        self._partial += float(terms.sum())
        self._unseen -= n
        self._feed_extra(chunk)

    def _feed_extra(self, chunk: ScoredTokens) -> None:
        return None

    def _extra_upper(self) -> float:
        return 0.0

    def upper(self) -> float:
        slack = max(self._unseen, 0) * UNSEEN_TOKEN_SLACK
        return self._const + self._partial + slack + self._extra_upper()

    def rejects(self) -> bool:
        upper = self.upper()
        if math.isnan(upper):
            return False  # the full kernel names the NaN; never decide on it here
        return self._log_u >= upper


class _EntropyCutBound(_SuffixBound):
    """PowerMH's bound plus an upper bound of the cut-law ratio ``log λ(c; y) − log λ(c; x)``.

    ``λ(c; y) = w_c(y) / Σ_t w_t(y)`` with ``w_t = max(0, H_t − H_{t−1})^β``: the weights before
    ``c`` are ``x``'s, ``w_c`` is known from the proposal's first token, and the total only grows
    as more tokens arrive, so ``w_c / Σ_{seen} w_t`` bounds ``λ(c; y)`` from above. With
    ``w_c = 0``: ``λ = 0`` once any weight is positive, else at most the uniform ``1/T``.
    """

    def __init__(self, kernel: EntropyCut, state: ChainState, cut: int, draws: TransitionDraws):
        super().__init__(kernel, state, cut, draws)
        entropy = state.response.entropy
        if entropy is None:
            raise ValueError("EntropyCut needs per-token entropies in the state")
        self._beta = kernel.beta
        self._length = state.length
        previous = np.concatenate([[0.0], entropy[: max(cut - 1, 0)]])
        jumps = np.maximum(0.0, entropy[:cut] - previous[:cut]) if cut > 0 else np.zeros(0)
        self._seen_weight = float((jumps**self._beta).sum())
        self._last_entropy = float(entropy[cut - 1]) if cut > 0 else 0.0
        self._cut_weight: float | None = None
        self._log_forward = kernel.log_cut_probability(state, cut)

    def _feed_extra(self, chunk: ScoredTokens) -> None:
        if chunk.entropy is None:
            raise ValueError("EntropyCut needs per-token entropies in every proposal")
        previous = np.concatenate([[self._last_entropy], chunk.entropy[:-1]])
        weights = np.maximum(0.0, chunk.entropy - previous) ** self._beta
        if self._cut_weight is None:
            self._cut_weight = float(weights[0])
        self._seen_weight += float(weights.sum())
        self._last_entropy = float(chunk.entropy[-1])

    def _extra_upper(self) -> float:
        if self._cut_weight is None:
            log_backward = 0.0  # λ ≤ 1
        elif self._cut_weight > 0.0:
            log_backward = math.log(self._cut_weight) - math.log(self._seen_weight)
        elif self._seen_weight > 0.0:
            return -math.inf
        else:
            log_backward = -math.log(self._length)
        return log_backward - self._log_forward + CUT_LAW_SLACK


class Kernel:
    """Shared machinery of the kernels: proposals of one suffix at the proposal temperature."""

    #: Whether the cut law depends on the state (EntropyCut): trees must verify speculated cuts.
    state_dependent_cut: bool = False
    #: The ``SamplerConfig`` fields beyond the common ones that this sampler reads (the built-in
    #: samplers' settings, stated with their defaults on ``SamplerConfig``).
    settings: ClassVar[tuple[str, ...]] = ()
    #: Settings of the sampler's own that ``SamplerConfig`` has no field for, each with its one
    #: default: read with :meth:`option`. Together with :attr:`settings`, what a job config's
    #: ``sampler: {kind: NAME, ...}`` block may hold.
    options: ClassVar[Mapping[str, Setting]] = {}

    def __init__(self, config: SamplerConfig) -> None:
        unknown = sorted(set(dict(config.options)) - set(self.options))
        if unknown:
            raise ValueError(
                f"sampler {config.sampler!r} has no option {', '.join(map(repr, unknown))}; "
                f"its options are: {', '.join(self.options) or 'none'}"
            )
        self.config = config
        self.alpha = config.alpha
        self.tau = config.proposal_temperature
        self.score_spec = ScoreSpec(temperatures=(self.tau,))

    def option(self, name: str) -> Any:
        """The value of the option ``name``: the config's, parsed, else its declared default."""
        setting = self.options[name]
        given = dict(self.config.options)
        return setting.parse(given[name]) if name in given else setting.default

    @property
    def sequences_per_proposal(self) -> int:
        return 1

    def cut(self, state: ChainState, u_cut: float) -> int:
        """The cut ``c ∈ {0, …, T−1}`` that the uniform ``u_cut`` picks under the cut law."""
        return min(int(u_cut * state.length), state.length - 1)

    def speculative_cut(self, state: ChainState, length: int, u_cut: float) -> int:
        """The cut ``u_cut`` will draw once the response, whose first tokens ``state`` holds, is
        complete at ``length`` tokens (a block's extension still streaming in).

        For a law of the length alone (the uniform cut) this is the cut itself. For a
        state-dependent law it is a guess: a runner that issues a proposal on it must check,
        before using the proposal, that the realised state's law draws the same cut.
        """
        return min(int(u_cut * length), length - 1)

    def log_cut_probability(self, state: ChainState, cut: int) -> float:
        return -math.log(state.length)

    def requests(
        self, prefix: tuple[int, ...], num_tokens: int, draws: TransitionDraws
    ) -> list[ProposalRequest]:
        return [ProposalRequest(prefix, num_tokens, self.tau, draws.seeds[0], self.score_spec)]

    def extension_request(self, prefix: tuple[int, ...], seed: int) -> ProposalRequest:
        return ProposalRequest(prefix, self.config.block_size, self.tau, seed, self.score_spec)

    def log_accept_bounds(
        self, state: ChainState, cut: int, proposal: ScoredTokens
    ) -> tuple[float, float]:
        """``log A`` of replacing ``x``'s suffix at ``cut`` with ``proposal`` (PowerMH §2).

        ``α·(Σ log p0(y) − Σ log p0(x)) + Σ log q(x) − Σ log q(y)``, suffix terms only: both
        states share the prefix, so its terms cancel exactly.
        """
        x = state.response.slice(cut)
        base = self.alpha * (float(proposal.logp0.sum()) - float(x.logp0.sum()))
        lo = base + float(x.logq_lo[:, 0].sum()) - float(proposal.logq_hi[:, 0].sum())
        hi = base + float(x.logq_hi[:, 0].sum()) - float(proposal.logq_lo[:, 0].sum())
        return lo, hi

    def evaluate(
        self,
        state: ChainState,
        cut: int,
        proposals: Sequence[ScoredTokens],
        draws: TransitionDraws,
    ) -> Verdict:
        lo, hi = self.log_accept_bounds(state, cut, proposals[0])
        return decide_interval(lo, hi, draws.u_accept, self.config.epsilon)

    def rejection_bound(
        self, state: ChainState, cut: int, draws: TransitionDraws
    ) -> RejectionBound | None:
        """An early-rejection bound for this transition, or ``None`` where none holds.

        Only when every token's term is ``≤ 0``: ``α ≥ 1/τ ≥ 1`` (method §5).
        """
        if not temperatures_bound_each_token(self.alpha, self.score_spec.temperatures):
            return None
        return _SuffixBound(self, state, cut, draws)

    def accept(
        self, state: ChainState, cut: int, proposals: Sequence[ScoredTokens], verdict: Verdict
    ) -> ChainState:
        return state.splice(cut, proposals[verdict.selected])

    def normaliser_drift(self, state: ChainState, cut: int, proposal: ScoredTokens) -> float:
        """Engine health: ``|log Z|`` at the cut as seen by ``x`` and by ``y`` (same context).

        Both the current token at ``cut`` and the proposal's first token were scored in the same
        context, so their implied normalisers ``log p0/τ − log q`` must agree; any difference is
        numerical drift of the engine (batching, dtype).
        """
        if len(proposal) == 0:
            return 0.0
        x = state.response
        worst = 0.0
        for m, tau in enumerate(self.score_spec.temperatures):
            lz_x = x.logp0[cut] / tau - 0.5 * (x.logq_lo[cut, m] + x.logq_hi[cut, m])
            lz_y = proposal.logp0[0] / tau - 0.5 * (proposal.logq_lo[0, m] + proposal.logq_hi[0, m])
            worst = max(worst, abs(float(lz_x - lz_y)))
        return worst


class PowerMH(Kernel):
    """Karan & Du's power sampler: uniform cut, one suffix from ``q_τ``."""


class EntropyCut(Kernel):
    """Cut at decision points: ``λ(c; x) ∝ Δ_{c+1}^β`` with ``Δ_t = max(0, H_t − H_{t−1})``.

    ``H_0 := 0``, so the first position's jump is its own entropy. The law is a deterministic
    function of the stored entropies (uniform when every jump is 0), and its ratio enters
    ``log A``: ``+ log λ(c; y) − log λ(c; x)``. The cut is drawn by an exponential race keyed
    by the transition (:meth:`cut`), not by an inverse CDF.
    """

    state_dependent_cut = True
    settings: ClassVar[tuple[str, ...]] = ("beta",)

    def __init__(self, config: SamplerConfig) -> None:
        super().__init__(config)
        self.beta = config.beta
        self.score_spec = ScoreSpec(temperatures=(self.tau,), entropy=True)

    def _jump_weights(self, state: ChainState) -> FloatArray:
        """``Δ_t^β`` per position, unnormalised."""
        entropy = state.response.entropy
        if entropy is None:
            raise ValueError("EntropyCut needs per-token entropies in the state")
        previous = np.concatenate([[0.0], entropy[:-1]])
        jumps = np.maximum(0.0, entropy - previous)
        weights: FloatArray = jumps**self.beta
        return weights

    def cut_weights(self, state: ChainState) -> FloatArray:
        weights = self._jump_weights(state)
        total = float(weights.sum())
        if not total > 0.0:
            return np.full(state.length, 1.0 / state.length)
        return weights / total

    def cut(self, state: ChainState, u_cut: float) -> int:
        """The first arrival of an exponential race: position ``t`` arrives at ``E_t / w_t``.

        With independent ``E_t ~ Exp(1)`` the winner is ``t`` with probability ``w_t / Σ w`` (the
        law exactly), and the times are a function of the transition's draw alone (``E`` from
        ``u_cut``'s bits, :func:`race_times`), not of the state. That couples the cut across
        states as an inverse CDF cannot: a state that differs only after position ``c`` moves the
        cut only if one of its new positions arrives first, while one draw of an inverse CDF
        moves with every change of the total weight. So a proposal speculated before an accept
        at a later cut usually keeps its cut (stream, crn), and a cut guessed from a response
        still streaming in is final once the positions to come cannot overtake it.
        """
        return _race_winner(self._jump_weights(state), race_times(u_cut, state.length))

    def speculative_cut(self, state: ChainState, length: int, u_cut: float) -> int:
        """A guess: each position still to come is given the mean weight of those received (the
        walk uses the proposal only if the realised state draws the same cut). A guess beyond the
        tokens received means: not known yet."""
        received = state.length
        if received >= length:
            return self.cut(state, u_cut)
        if received == 0:
            return length - 1
        weights = self._jump_weights(state)
        filled = np.concatenate([weights, np.full(length - received, float(weights.mean()))])
        return _race_winner(filled, race_times(u_cut, length))

    def log_cut_probability(self, state: ChainState, cut: int) -> float:
        p = float(self.cut_weights(state)[cut])
        return math.log(p) if p > 0 else -math.inf

    def rejection_bound(
        self, state: ChainState, cut: int, draws: TransitionDraws
    ) -> RejectionBound | None:
        if not temperatures_bound_each_token(self.alpha, self.score_spec.temperatures):
            return None
        return _EntropyCutBound(self, state, cut, draws)

    def log_accept_bounds(
        self, state: ChainState, cut: int, proposal: ScoredTokens
    ) -> tuple[float, float]:
        """PowerMH's ``log A`` plus the cut-law ratio ``log λ(c; y) − log λ(c; x)``."""
        lo, hi = super().log_accept_bounds(state, cut, proposal)
        log_forward = self.log_cut_probability(state, cut)
        if log_forward == -math.inf:
            raise ValueError(f"cut {cut} has probability 0 under the current state's law")
        proposed = state.splice(cut, proposal)
        correction = self.log_cut_probability(proposed, cut) - log_forward
        return lo + correction, hi + correction


class MultiTryMH(Kernel):
    """Multiple-try Metropolis with independent candidates at mixed temperatures (§3).

    ``w_j = π(y_j)/q_mix(y_j)`` relative to the current suffix ``u`` (whose weight is 1);
    select ``J ∝ w_J``; accept with ``min(1, W / (W − w_J + 1))``. With interval scores both the
    selection and the acceptance are certified by monotonicity (see :meth:`evaluate`).
    """

    settings: ClassVar[tuple[str, ...]] = ("k_try", "temperatures")

    def __init__(self, config: SamplerConfig) -> None:
        super().__init__(config)
        self.temperatures = config.temperatures
        self.k_try = config.k_try
        self.score_spec = ScoreSpec(temperatures=tuple(config.temperatures))
        self._log_m = math.log(len(config.temperatures))

    @property
    def sequences_per_proposal(self) -> int:
        return self.k_try

    def requests(
        self, prefix: tuple[int, ...], num_tokens: int, draws: TransitionDraws
    ) -> list[ProposalRequest]:
        return [
            ProposalRequest(prefix, num_tokens, self.temperatures[m], seed, self.score_spec)
            for seed, m in zip(draws.seeds, draws.temperature_index, strict=True)
        ]

    def extension_request(self, prefix: tuple[int, ...], seed: int) -> ProposalRequest:
        return ProposalRequest(prefix, self.config.block_size, self.tau, seed, self.score_spec)

    def _log_q_mix(self, scores: ScoredTokens) -> tuple[float, float]:
        lo = float(np.logaddexp.reduce(scores.logq_lo.sum(axis=0))) - self._log_m
        hi = float(np.logaddexp.reduce(scores.logq_hi.sum(axis=0))) - self._log_m
        return lo, hi

    def log_weight_bounds(
        self, state: ChainState, cut: int, proposals: Sequence[ScoredTokens]
    ) -> tuple[FloatArray, FloatArray]:
        """Bounds of ``log w_j`` for every candidate, relative to the current suffix."""
        current = state.response.slice(cut)
        u_lo, u_hi = self._log_q_mix(current)
        u_logp0 = float(current.logp0.sum())
        lo = np.empty(len(proposals))
        hi = np.empty(len(proposals))
        for j, y in enumerate(proposals):
            y_lo, y_hi = self._log_q_mix(y)
            base = self.alpha * (float(y.logp0.sum()) - u_logp0)
            lo[j] = base + u_lo - y_hi
            hi[j] = base + u_hi - y_lo
        return lo, hi

    def evaluate(
        self,
        state: ChainState,
        cut: int,
        proposals: Sequence[ScoredTokens],
        draws: TransitionDraws,
    ) -> Verdict:
        log_lo, log_hi = self.log_weight_bounds(state, cut, proposals)
        check_finite("log w", *log_lo, *log_hi)
        # Scale so the largest weight (or the current state's 1) is 1: no overflow.
        shift = max(float(log_hi.max()), 0.0)
        a = np.exp(log_lo - shift)
        b = np.exp(log_hi - shift)
        one = math.exp(-shift)
        u_sel = draws.u_select
        # The selection is scale-free: weigh it with the largest weight at 1, so that weights far
        # below the current state's (log w ≪ −745) do not all underflow to 0 and leave no
        # candidate selected (found by the MultiTryMH benchmark: "exact scores must decide").
        sel_shift = float(log_hi.max())
        a_sel = np.exp(log_lo - sel_shift)
        b_sel = np.exp(log_hi - sel_shift)
        # J = min{j : S_j > u·W}. For candidate j that holds for every weight vector in the box
        # iff (1−u)·Σ_{i<j} w_i ≤ u·Σ_{i≥j} w_i and (1−u)·Σ_{i≤j} w_i > u·Σ_{i>j} w_i hold at the
        # box corner least favourable to each.
        selected = -1
        for j in range(len(proposals)):
            before_ok = (1 - u_sel) * b_sel[:j].sum() <= u_sel * a_sel[j:].sum()
            through_ok = (1 - u_sel) * a_sel[: j + 1].sum() > u_sel * b_sel[j + 1 :].sum()
            if before_ok and through_ok:
                selected = j
                break
        ratio_lo, ratio_hi = self._ratio_bounds(log_lo, log_hi, max(selected, 0))
        eps = self.config.epsilon
        eps_certain = ratio_lo >= math.log1p(-eps) or ratio_hi <= math.log(eps)
        if selected < 0:
            return Verdict(False, False, 0, ratio_lo, ratio_hi, eps_certain)
        # Accept iff u·(W − w_J + 1) < W  ⟺  (u−1)·Σ_{i≠J} w_i − w_J + u·1 < 0, whose left side
        # falls as any weight grows: certain at the low corner (accept) or high corner (reject).
        u_acc = draws.u_accept
        others_a = a.sum() - a[selected]
        others_b = b.sum() - b[selected]
        if (u_acc - 1) * others_a - a[selected] + u_acc * one < 0:
            return Verdict(True, True, selected, ratio_lo, ratio_hi, eps_certain)
        if (u_acc - 1) * others_b - b[selected] + u_acc * one >= 0:
            return Verdict(True, False, selected, ratio_lo, ratio_hi, eps_certain)
        return Verdict(False, False, selected, ratio_lo, ratio_hi, eps_certain)

    def rejection_bound(
        self, state: ChainState, cut: int, draws: TransitionDraws
    ) -> RejectionBound | None:
        if not temperatures_bound_each_token(self.alpha, self.temperatures):
            return None
        return _MultiTryBound(self, state, cut, draws)

    @staticmethod
    def _ratio_bounds(log_lo: FloatArray, log_hi: FloatArray, j: int) -> tuple[float, float]:
        """``log min(1, W/(W − w_J + 1))`` at both corners (statistics only, not decisions).

        In log space: with a large shift every scaled weight of the low corner can underflow to 0
        (or ``W − w_J`` round below 0), and ``math.log`` of it would raise.
        """

        def log_ratio(log_w: FloatArray) -> float:
            log_total = float(np.logaddexp.reduce(log_w))
            rest = np.delete(log_w, j)
            log_rest = float(np.logaddexp.reduce(np.append(rest, 0.0)))
            return min(0.0, log_total - log_rest)

        r1, r2 = log_ratio(log_lo), log_ratio(log_hi)
        return min(r1, r2), max(r1, r2)


class _MultiTryBound(RejectionBound):
    """Upper bounds ``b_j`` of every candidate weight, and rejection certain for every selection.

    ``log w_j = α·(log p0(y_j) − log p0(u)) + log q_mix(u) − log q_mix(y_j)``. When every
    per-token term ``α·log p0 − log q_τm`` is ``≤ 0``, ``α·L − log mean_m exp(Q_m)`` can only fall
    as tokens arrive, so the value over the seen tokens bounds ``log w_j`` from above. The accept
    test ``(u−1)·Σ_{i≠J} w_i − w_J + u < 0`` falls as any weight grows; rejection is certain when
    it fails at the upper corner ``b`` for *every* candidate ``J`` (the selection is not known yet).
    """

    def __init__(self, kernel: MultiTryMH, state: ChainState, cut: int, draws: TransitionDraws):
        current = state.response.slice(cut)
        _, u_hi = kernel._log_q_mix(current)
        self._alpha = kernel.alpha
        self._log_m = kernel._log_m
        self._const = -kernel.alpha * float(current.logp0.sum()) + u_hi
        n = kernel.k_try
        m = len(kernel.temperatures)
        self._logp0 = np.zeros(n)
        self._logq_lo = np.zeros((n, m))
        self._unseen = np.full(n, state.length - cut, dtype=np.int64)
        self._u = draws.u_accept
        self._epsilon = kernel.config.epsilon

    def feed(self, index: int, chunk: ScoredTokens) -> None:
        if len(chunk) == 0:
            return
        self._logp0[index] += float(chunk.logp0.sum())
        self._logq_lo[index] += chunk.logq_lo.sum(axis=0)
        self._unseen[index] -= len(chunk)

    def _log_weight_upper(self) -> FloatArray:
        mix = np.logaddexp.reduce(self._logq_lo, axis=1) - self._log_m
        slack = np.maximum(self._unseen, 0) * UNSEEN_TOKEN_SLACK
        out: FloatArray = self._alpha * self._logp0 + self._const - mix + slack
        return out

    def _corner(self) -> tuple[FloatArray, float]:
        log_b = self._log_weight_upper()
        shift = max(float(log_b.max()), 0.0)
        return np.exp(log_b - shift), math.exp(-shift)

    def upper(self) -> float:
        """The largest ``log A = log W − log(W − w_J + 1)`` over the selections ``J`` at the
        upper corner, in log space: a dominant weight underflows ``1`` and ``W − w_J`` in the
        linear form (a log of 0)."""
        log_b = self._log_weight_upper()
        log_total = float(np.logaddexp.reduce(log_b))
        rests = [np.append(np.delete(log_b, j), 0.0) for j in range(len(log_b))]  # others, 1
        return max(min(0.0, log_total - float(np.logaddexp.reduce(r))) for r in rests)

    def rejects(self) -> bool:
        log_b = self._log_weight_upper()
        if np.isnan(log_b).any():
            return False
        b, one = self._corner()
        u = self._u
        total = float(b.sum())
        return all((u - 1) * (total - float(bj)) - float(bj) + u * one >= 0 for bj in b)


SAMPLER_KERNELS: dict[str, type[Kernel]] = {
    "power_mh": PowerMH,
    "entropy_cut": EntropyCut,
    "multi_try_mh": MultiTryMH,
}
"""The registry of samplers: name -> kernel class. Every list of sampler names (the job config,
the benchmarks) is derived from it (:func:`sampler_names`)."""


def sampler_names() -> tuple[str, ...]:
    """The registered samplers, built-ins first."""
    return tuple(SAMPLER_KERNELS)


def sampler_settings(name: str) -> tuple[str, ...]:
    """A registered sampler's own settings (fields, then options); ``()`` if unknown."""
    kernel = SAMPLER_KERNELS.get(name)
    return () if kernel is None else (*kernel.settings, *kernel.options)


def register_sampler(name: str, kernel_cls: type[Kernel]) -> None:
    """Make ``kernel_cls`` available as ``sampler: name``; a name already taken is refused."""
    if not name or not isinstance(name, str):
        raise ValueError(f"a sampler name must be a non-empty string, got {name!r}")
    if not (isinstance(kernel_cls, type) and issubclass(kernel_cls, Kernel)):
        raise ValueError(f"sampler {name!r}: {kernel_cls!r} is not a presto_client.core.Kernel")
    if name in SAMPLER_KERNELS:
        raise ValueError(
            f"sampler {name!r} is registered already ({SAMPLER_KERNELS[name].__name__}); "
            "choose another name"
        )
    clash = [k for k in kernel_cls.options if k in SamplerConfig.__dataclass_fields__]
    if clash:
        raise ValueError(
            f"sampler {name!r}: option(s) {', '.join(clash)} are SamplerConfig fields already"
        )
    SAMPLER_KERNELS[name] = kernel_cls


def unregister_sampler(name: str) -> None:
    """Remove a registered sampler (tests, plugins unloading)."""
    SAMPLER_KERNELS.pop(name, None)


def make_kernel(config: SamplerConfig) -> Kernel:
    kernel_cls = SAMPLER_KERNELS.get(config.sampler)
    if kernel_cls is None:
        raise ValueError(
            f"unknown sampler {config.sampler!r}; valid samplers are {sampler_names()}"
        )
    return kernel_cls(config)


_RACE_SCALE = float(2**53)


@functools.lru_cache(maxsize=1024)
def _race_times_cached(key: int, length: int) -> FloatArray:
    uniforms = np.random.Generator(np.random.PCG64(key)).random(length)
    times: FloatArray = -np.log1p(-uniforms)
    times.flags.writeable = False
    return times


def race_times(u_cut: float, length: int) -> FloatArray:
    """``length`` independent ``Exp(1)`` times keyed by the transition's cut draw.

    ``u_cut`` is ``rng.random()``: 53 random bits, which seed the race's own generator. Position
    ``t``'s time is the ``t``-th draw of that generator whatever ``length`` is (one 64-bit draw
    per double), so a response that grows (a block's extension streaming in, the next block)
    keeps its earlier positions' times. Read-only: shared through a small cache, because the
    stream walk asks for the same transition's cut from several states.
    """
    return _race_times_cached(int(u_cut * _RACE_SCALE), length)


def _race_winner(weights: FloatArray, times: FloatArray) -> int:
    """The position whose ``times / weights`` is smallest; every weight 0 means uniform (the
    smallest time). A weight-0 position never wins otherwise."""
    if not float(weights.max(initial=0.0)) > 0.0:
        return int(np.argmin(times))
    positive = weights > 0.0
    arrivals = np.where(positive, times / np.where(positive, weights, 1.0), np.inf)
    return int(np.argmin(arrivals))
