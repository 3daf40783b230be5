"""Admission: how many requests run at once, how many may wait, how long one may take.

Beyond ``max_active`` running requests, up to ``max_queue`` wait (first come, first served);
one more is refused at once with a 429 whose ``Retry-After`` is the mean service time of the
recent requests times the queue's depth over the active slots (at least one second): a
client that waits that long finds the queue about as deep as it was.

When the service stops (:meth:`Admission.drain`), every request still waiting, and every one
that arrives, is answered 503 with ``Retry-After`` (another replica, or this one restarted,
takes it); the running ones keep their slots until they finish or are cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable

from presto_client.orchestration.executors.orchestrator import FifoSemaphore
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
        self.draining = False
        self.drain_retry_after_s = 5
        self._pending: set[asyncio.Future[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.on_idle: Callable[[], None] | None = None
        """Called when the last running request ends (the service gives memory back then)."""

    @property
    def active(self) -> int:
        return self._slots.in_use

    def retry_after_s(self) -> int:
        return max(1, math.ceil(self._mean_s * (self.waiting + 1) / self.max_active))

    def observe(self, seconds: float) -> None:
        self._mean_s = 0.8 * self._mean_s + 0.2 * seconds

    def closing(self) -> ApiError:
        """The answer of a request the stopping service will not run."""
        return ApiError(
            503,
            "the server is shutting down; retry (another replica, or this one restarted, "
            "will take the request)",
            code="shutting_down",
            headers={"Retry-After": str(self.drain_retry_after_s)},
        )

    async def wait_idle(self) -> None:
        """Until no request holds a running slot."""
        await self._idle.wait()

    def drain(self) -> int:
        """Stop admitting: every waiting request is answered 503 (returns how many)."""
        self.draining = True
        pending = [f for f in self._pending if not f.done()]
        for f in pending:
            f.cancel()
        return len(pending)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one running slot for the block; a 429 when the queue is full, a 503 when the
        service is stopping."""
        if self.draining:
            raise self.closing()
        if self._slots.in_use >= self.max_active and self.waiting >= self.max_queue:
            raise ApiError(
                429,
                f"the server is busy: {self.active} request(s) running and {self.waiting} "
                f"queued (the queue holds {self.max_queue}); retry later",
                code="queue_full",
                headers={"Retry-After": str(self.retry_after_s())},
            )
        self.waiting += 1
        acquire = asyncio.ensure_future(self._slots.acquire())
        self._pending.add(acquire)
        try:
            await acquire
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self.draining and acquire.cancelled() and task is not None and not task.cancelling():
                raise self.closing() from None  # drained, not the client gone
            raise
        finally:
            self._pending.discard(acquire)
            self.waiting -= 1
        self._idle.clear()
        try:
            yield
        finally:
            self._slots.release()
            if self._slots.in_use == 0:
                self._idle.set()
                if self.on_idle is not None:
                    self.on_idle()
