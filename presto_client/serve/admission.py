"""Admission: how many requests run at once, how many may wait, how long one may take.

Beyond ``max_active`` running requests, up to ``max_queue`` wait (first come, first served);
one more is refused at once with a 429 whose ``Retry-After`` is the mean service time of the
recent requests times the queue's depth over the active slots (at least one second): a
client that waits that long finds the queue about as deep as it was.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator

from presto_client.orchestration.orchestrator import FifoSemaphore
from presto_client.serve.errors import ApiError


class Admission:
    def __init__(self, max_active: int, max_queue: int) -> None:
        if max_active < 1 or max_queue < 0:
            raise ValueError("max_active >= 1 and max_queue >= 0 needed")
        self.max_active = max_active
        self.max_queue = max_queue
        self._slots = FifoSemaphore(max_active)
        self.waiting = 0
        self._mean_s = 1.0

    @property
    def active(self) -> int:
        return self._slots.in_use

    def retry_after_s(self) -> int:
        return max(1, math.ceil(self._mean_s * (self.waiting + 1) / self.max_active))

    def observe(self, seconds: float) -> None:
        self._mean_s = 0.8 * self._mean_s + 0.2 * seconds

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one running slot for the block; a 429 when the queue is full."""
        if self._slots.in_use >= self.max_active and self.waiting >= self.max_queue:
            raise ApiError(
                429,
                f"the server is busy: {self.active} request(s) running and {self.waiting} "
                f"queued (the queue holds {self.max_queue}); retry later",
                code="queue_full",
                headers={"Retry-After": str(self.retry_after_s())},
            )
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self._slots.release()
