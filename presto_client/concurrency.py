"""asyncio helpers shared by every layer that runs requests concurrently (backends, orchestration).

One idea, one helper: run a batch, results in order, and the first failure fails the batch
(:func:`gather_or_fail`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TypeVar

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
