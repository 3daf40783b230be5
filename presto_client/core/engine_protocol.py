"""The engine interface: the one protocol the core talks to.

A request asks for a proposal: ``num_tokens`` tokens sampled at ``temperature`` after ``prefix``
(prompt and response prefix, token ids), with its own ``seed``, and per-token scores: the raw
``log p0`` of each sampled token, ``log q_τ`` under every temperature in ``ScoreSpec``, and (for
EntropyCut) the base entropy of each position. Engines that only see top-K raw logprobs return
``log q_τ`` as a *certified interval* ``[lo, hi]``; exact engines return ``lo == hi``.

Backends implement this over HTTP; :mod:`presto_client.core.reference` implements it in-process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class ScoreSpec:
    """Which per-token scores a request needs besides ``log p0``."""

    temperatures: tuple[float, ...]
    """Temperatures under which ``log q`` of every sampled token is wanted (column order)."""
    entropy: bool = False
    """Whether the base-model entropy ``H_t`` of each position is wanted (EntropyCut)."""


@dataclass(frozen=True, slots=True)
class ProposalRequest:
    """Sample ``num_tokens`` tokens after ``prefix`` at ``temperature`` with ``seed``."""

    prefix: tuple[int, ...]
    num_tokens: int
    temperature: float
    seed: int
    scores: ScoreSpec


@dataclass(frozen=True, slots=True)
class ScoreRequest:
    """Score the given ``token_ids`` after ``prefix`` exactly (used to tighten intervals)."""

    prefix: tuple[int, ...]
    token_ids: tuple[int, ...]
    scores: ScoreSpec


@dataclass(frozen=True, slots=True)
class ScoredTokens:
    """Tokens with their per-token scores, all arrays aligned on the token axis.

    ``logq_lo``/``logq_hi`` have one column per temperature of the request's :class:`ScoreSpec`.
    """

    token_ids: IntArray
    logp0: FloatArray
    logq_lo: FloatArray
    logq_hi: FloatArray
    entropy: FloatArray | None = None
    meta: dict[str, float] = field(default_factory=dict, compare=False)
    """Engine diagnostics (e.g. the normaliser drift at the cut); never used by the kernel."""

    def __post_init__(self) -> None:
        n = self.token_ids.shape[0]
        if self.logp0.shape != (n,):
            raise ValueError(f"logp0 has shape {self.logp0.shape}, expected ({n},)")
        if self.logq_lo.ndim != 2 or self.logq_lo.shape[0] != n:
            raise ValueError(f"logq_lo has shape {self.logq_lo.shape}, expected ({n}, M)")
        if self.logq_hi.shape != self.logq_lo.shape:
            raise ValueError("logq_lo and logq_hi must have the same shape")
        if self.entropy is not None and self.entropy.shape != (n,):
            raise ValueError(f"entropy has shape {self.entropy.shape}, expected ({n},)")

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def is_exact(self) -> bool:
        return bool(np.array_equal(self.logq_lo, self.logq_hi))

    @classmethod
    def exact(
        cls,
        token_ids: Sequence[int] | IntArray,
        logp0: Sequence[float] | FloatArray,
        logq: FloatArray,
        entropy: FloatArray | None = None,
    ) -> ScoredTokens:
        logq = np.asarray(logq, dtype=np.float64)
        return cls(
            token_ids=np.asarray(token_ids, dtype=np.int64),
            logp0=np.asarray(logp0, dtype=np.float64),
            logq_lo=logq,
            logq_hi=logq,
            entropy=None if entropy is None else np.asarray(entropy, dtype=np.float64),
        )

    @classmethod
    def empty(cls, num_temperatures: int, with_entropy: bool) -> ScoredTokens:
        return cls(
            token_ids=np.zeros(0, dtype=np.int64),
            logp0=np.zeros(0),
            logq_lo=np.zeros((0, num_temperatures)),
            logq_hi=np.zeros((0, num_temperatures)),
            entropy=np.zeros(0) if with_entropy else None,
        )

    def slice(self, start: int, stop: int | None = None) -> ScoredTokens:
        s = slice(start, stop)
        return ScoredTokens(
            token_ids=self.token_ids[s],
            logp0=self.logp0[s],
            logq_lo=self.logq_lo[s],
            logq_hi=self.logq_hi[s],
            entropy=None if self.entropy is None else self.entropy[s],
        )

    def concat(self, other: ScoredTokens) -> ScoredTokens:
        if (self.entropy is None) != (other.entropy is None):
            raise ValueError("cannot join scores with and without entropy")
        return ScoredTokens(
            token_ids=np.concatenate([self.token_ids, other.token_ids]),
            logp0=np.concatenate([self.logp0, other.logp0]),
            logq_lo=np.concatenate([self.logq_lo, other.logq_lo]),
            logq_hi=np.concatenate([self.logq_hi, other.logq_hi]),
            entropy=None
            if self.entropy is None or other.entropy is None
            else np.concatenate([self.entropy, other.entropy]),
        )

    def with_exact_logq(self, logq: FloatArray) -> ScoredTokens:
        """The same tokens with ``log q`` replaced by exact values (after tightening).

        ``log p0`` and the entropy are kept as first returned: the cut law of EntropyCut is a
        function of the stored entropies and must not move when an interval is tightened.
        """
        logq = np.asarray(logq, dtype=np.float64)
        if logq.shape != self.logq_lo.shape:
            raise ValueError(f"exact logq has shape {logq.shape}, expected {self.logq_lo.shape}")
        return ScoredTokens(self.token_ids, self.logp0, logq, logq, self.entropy, self.meta)


@runtime_checkable
class Engine(Protocol):
    """What the core needs from a serving engine.

    ``generate`` serves one round: every request of the batch, concurrently where the engine
    can, in request order. A failed request raises (an :class:`~presto_client.errors.EngineError`);
    the caller decides whether that fails the chain. ``stream`` delivers one proposal's tokens as
    they are produced; closing the iterator (``aclose``) or cancelling the consuming task aborts
    the request on the server. ``score`` returns exact scores (``lo == hi``) of given tokens.
    """

    name: str

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]: ...

    def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]: ...

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoredTokens]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class ConcurrencyBounded(Protocol):
    """An engine that serves at most ``max_concurrency`` requests at once (an optional capability).

    A chain run without a speculation budget handed in sizes its own from it
    (:func:`presto_client.core.runners.chain_budget`), so that speculative proposals never take
    the slots that the head proposals need.
    """

    @property
    def max_concurrency(self) -> int: ...


# ---- optional capabilities: what an engine may offer beyond the protocol (checked with
# isinstance, never with hasattr/getattr). The HTTP engine (backends.http_engine.HttpEngine)
# offers all of them; the reference engine none.


@runtime_checkable
class Tokenizing(Protocol):
    """An engine that tokenizes text with its model's own tokenizer (text prompts)."""

    async def tokenize(
        self, text: str, *, chat_template: bool = False, system_prompt: str | None = None
    ) -> Sequence[int]: ...


@runtime_checkable
class ChatTokenizing(Protocol):
    """An engine that renders a whole conversation (``role``/``content`` turns) through its
    model's chat template into the prompt for the assistant's next turn."""

    async def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> Sequence[int]: ...


@runtime_checkable
class Detokenizing(Protocol):
    """An engine that turns token ids back into text (the response text of a chain)."""

    async def detokenize(self, token_ids: Sequence[int]) -> str | None: ...


@runtime_checkable
class Probing(Protocol):
    """An engine that checks its server before a job (health, model, logprob semantics); the
    report has ``ok``, ``problems`` and ``base_url``."""

    async def probe(self) -> Any: ...


@runtime_checkable
class Identified(Protocol):
    """An engine that says what it serves (model, version, max_model_len, logprob mode), recorded
    in the run directory so that a resume cannot mix engines."""

    async def identity(self) -> dict[str, Any]: ...


@runtime_checkable
class PrefixCacheMetered(Protocol):
    """An engine that reads its server's prefix-cache counters (``prefix_cache_queries``,
    ``prefix_cache_hits``)."""

    async def metrics(self) -> dict[str, float]: ...


@runtime_checkable
class ContextLimited(Protocol):
    """An engine whose server states its context length (``None`` until known)."""

    max_model_len: int | None
