"""The sample draws that a job's arms on one engine share (held by the engine's chain step, as
its speculation budget is): a cache, never a source of answers."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class SharedDraws:
    """The sample draws of one engine's arms that read the same samples (``best_of_n`` and
    ``majority_vote`` for one prompt and seed): the first arm to ask draws, the second reads
    the draw and drops it. A cache only: a draw that nobody reads is pushed out after ``keep``
    newer ones (the plan runs the two arms of a chain next to each other), and an arm that
    finds none, or whose drawer failed, draws its own, which is the same draw. The answers
    never depend on it; the compute does."""

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep
        self._draws: OrderedDict[Hashable, asyncio.Future[Any]] = OrderedDict()

    async def draw(self, key: Hashable, make: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """The draw of ``key`` and whether another arm paid for it."""
        pending = self._draws.pop(key, None)
        if pending is not None:
            # shielded: a reader cancelled while it waits must not cancel the drawer's future
            drawn = await asyncio.shield(pending)
            if drawn is not None:
                return drawn, True
        future: asyncio.Future[T | None] = asyncio.get_running_loop().create_future()
        self._draws[key] = future
        while len(self._draws) > self.keep:
            self._draws.popitem(last=False)
        try:
            drawn = await make()
        except BaseException:
            future.set_result(None)  # (a reader waiting on it draws its own)
            if self._draws.get(key) is future:
                del self._draws[key]
            raise
        future.set_result(drawn)
        return drawn, False
