"""What the ``stream`` traversal keeps in flight: streamed requests and their chunks so far.

A :class:`Streamed` is a block's extension or the sequences of one transition's proposal
(:class:`InFlight`, which adds the transition's draws, cut and the prefix it was issued after).
The walk (:mod:`presto_client.core.stream.walk`) fills them from the engine's streams
(:mod:`presto_client.core.stream.streams`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens
from presto_client.core.rng import TransitionDraws

HEAD = "head"
"""The role of what the walk waits for: the request the sequential chain makes anyway."""
SPECULATIVE = "speculative"
"""The role of a proposal issued ahead of the walk (it holds a slot of the engine's budget)."""


def join_chunks(chunks: Sequence[ScoredTokens]) -> ScoredTokens:
    """One :class:`ScoredTokens` from a stream's chunks (one concatenation, not one per chunk)."""
    if len(chunks) == 1:
        return chunks[0]
    first = chunks[0]
    entropy = None
    if first.entropy is not None:
        parts = [c.entropy for c in chunks]
        if any(p is None for p in parts):
            raise ValueError("cannot join scores with and without entropy")
        entropy = np.concatenate([p for p in parts if p is not None])
    return ScoredTokens(
        token_ids=np.concatenate([c.token_ids for c in chunks]),
        logp0=np.concatenate([c.logp0 for c in chunks]),
        logq_lo=np.concatenate([c.logq_lo for c in chunks]),
        logq_hi=np.concatenate([c.logq_hi for c in chunks]),
        entropy=entropy,
    )


@dataclass(slots=True, eq=False)
class Streamed:
    """Requests in flight as streams (a proposal's sequences, or a block's extension)."""

    k: int
    """The transition (``-1``: the block's extension)."""
    requests: list[ProposalRequest]
    role: str
    chunks: list[list[ScoredTokens]] = field(default_factory=list)
    received: list[int] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)
    active: list[bool] = field(default_factory=list)
    """Sequences still holding a slot of the budget (streaming, not yet finished or closed)."""
    attempts: int = 0
    """Restarts after broken streams: the walk rebuilds its rejection bound when it changes."""
    closed: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    error: BaseException | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def complete(self) -> bool:
        return all(self.finished)

    @property
    def tokens(self) -> int:
        return sum(self.received)

    @property
    def what(self) -> str:
        return "the extension" if self.k < 0 else f"transition {self.k}"


@dataclass(slots=True, eq=False)
class InFlight(Streamed):
    """One transition's proposal in flight: its draws, cut and prefix besides its streams."""

    draws: TransitionDraws = field(kw_only=True)
    cut: int = field(kw_only=True)
    response_prefix: np.ndarray = field(kw_only=True)
    """The response tokens before the cut that the proposal was requested after."""
    candidate: int = field(default=-1, kw_only=True)
    """An accept-branch proposal: the head's sequence whose tokens follow the head's cut in its
    prefix (``-1``: issued from a realised state)."""
