"""asyncio helpers shared by every layer that runs requests concurrently (backends, orchestration).

Run a batch, results in order, and the first failure fails the batch (:func:`gather_or_fail`);
say how late the event loop runs what is due (:class:`LoopLag`: a client that falls behind its
streams shows there first).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import resource
from collections.abc import Awaitable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")


async def gather_or_fail(aws: Sequence[Awaitable[T]]) -> list[T]:
    """Run awaitables concurrently; results in order.

    The first failure cancels the rest and is raised as itself (not wrapped): of the requests
    that failed, the earliest in order. Every sibling's exception is read, so asyncio never
    logs "Task exception was never retrieved" when several requests of a batch fail.
    Cancelling the caller cancels every child (and so aborts their HTTP requests) and is
    re-raised.
    """
    if len(aws) == 1:
        # One awaitable (a chain's proposal, the usual case): awaited in the caller's task,
        # which has the same failure and cancellation semantics without the cost of a task.
        return [await aws[0]]
    tasks = [asyncio.ensure_future(a) for a in aws]
    if not tasks:
        return []
    try:
        _done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        if pending:  # something failed: the rest is not needed
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    errors = [t.exception() for t in tasks if t.done() and not t.cancelled()]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return [t.result() for t in tasks]


class LoopLag:
    """The event loop's lag while inside: every ``interval_s`` a timer is due, and how late it
    runs is one sample (work that holds the loop: parsing, the walks, a blocking call).

    ``async with LoopLag() as lag: ...`` then :meth:`report`.
    """

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            # (the sampler's own cancellation is gathered; the caller's propagates)
            await asyncio.gather(self._task, return_exceptions=True)

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.samples.append(max(loop.time() - due, 0.0))

    def report(self) -> dict[str, Any]:
        """Lag (ms): the largest and the 99th percentile of the samples; and this process's
        peak resident memory (MB)."""
        ordered = sorted(self.samples)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0
        return {
            "loop_lag_max_ms": 1e3 * (ordered[-1] if ordered else 0.0),
            "loop_lag_p99_ms": 1e3 * p99,
            "loop_lag_samples": len(ordered),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }


GC_THRESHOLDS = (100_000, 50, 1_000)
"""The cyclic collector's thresholds while chains run (Python's are (700, 10, 10))."""


@contextlib.contextmanager
def fewer_gc_passes() -> Iterator[None]:
    """The cyclic garbage collector, run less often while chains run.

    A client's heap grows with its chains (their states, streams and coroutine frames), and
    every pass of the collector walks the generations it collects while the event loop waits:
    with Python's thresholds, 10,000 ``stream`` chains spent 35 % of the client's CPU there and
    held the loop for 2.5 s at a time (``benchmarks/configs/scale_10k.yaml``: 55 s of CPU and a
    2.5 s p99 lag by default, 36 s and 0.2 s with these). Nothing a chain makes is left to the
    collector to free in bulk (a proposal's arrays have no cycles), so the memory stays close
    (446 MB and 418 MB at the peak there). For a job, which ends: a service that runs for days
    keeps Python's thresholds (full collections this rare would let cyclic garbage pile up)."""
    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
