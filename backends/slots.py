"""Which server slot a request goes to, for engines whose prefix cache lives in a slot.

llama-server keeps one KV cache per slot (``-np``) and gives a request the free slot whose
cache shares the longest prefix with it. When a stream is closed early (an early rejection),
the server stops that slot only at its next step; the chain's next proposal, sent at once,
finds the slot still busy, goes to another one and prefills its whole prompt there (0.25 s
on one CPU thread, against 0.1 s for the proposal itself). So the client places each request
itself (``id_slot``), on the slot whose cache it last left with the longest shared prefix;
a slot the server is still stopping holds the request back until it is free (the server
defers a task whose slot is busy), a step at most, and its cache is reused.

The plan only places requests: every slot computes the same distribution
(docs/backends.md), so where a request runs changes its time, never its tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from presto_client.core.engine_protocol import IntArray


def shared_prefix(cached: IntArray, prefix: IntArray) -> int:
    """How many leading tokens ``cached`` and ``prefix`` share."""
    n = min(len(cached), len(prefix))
    if n == 0:
        return 0
    differ = np.flatnonzero(cached[:n] != prefix[:n])
    return int(differ[0]) if len(differ) else n


class SlotPlan:
    """The client's view of a server's slots: what each cache holds, which ones it has
    handed out. Requests it cannot place (every slot handed out) go without a slot, and the
    server chooses."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a server has at least one slot")
        self._cached: list[IntArray] = [np.zeros(0, dtype=np.int64) for _ in range(slots)]
        self._taken = [False] * slots
        self._last_used = [0] * slots
        self._clock = 0

    @property
    def slots(self) -> int:
        return len(self._taken)

    def take(self, prefix: Sequence[int]) -> int | None:
        """A free slot for a request of ``prefix``: the longest shared prefix, then the least
        recently used (what the server itself would pick); ``None`` when none is free."""
        tokens = np.asarray(prefix, dtype=np.int64)
        best: int | None = None
        best_key = (-1, 0)
        for slot, taken in enumerate(self._taken):
            if taken:
                continue
            key = (shared_prefix(self._cached[slot], tokens), -self._last_used[slot])
            if key > best_key:
                best, best_key = slot, key
        if best is not None:
            self._taken[best] = True
        return best

    def give_back(self, slot: int, tokens: Sequence[int] | IntArray) -> None:
        """``slot`` is free again and its cache holds ``tokens`` (a request's prefix and what it
        generated: the server keeps them all)."""
        self._clock += 1
        self._cached[slot] = np.asarray(tokens, dtype=np.int64)
        self._taken[slot] = False
        self._last_used[slot] = self._clock
