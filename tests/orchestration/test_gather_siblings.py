"""The gather helper (presto_client.concurrency.gather_or_fail, used by the backends and the
orchestration alike) reads every sibling's exception (issue 10, item 9): no "Task exception was
never retrieved" when several requests of a batch fail (a server rejecting top-20)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from presto_client.concurrency import gather_or_fail


async def _fails(delay: float, n: int) -> int:
    await asyncio.sleep(delay)
    raise ValueError(f"rejected {n}")


async def _ok(delay: float) -> int:
    await asyncio.sleep(delay)
    return 1


Helper = Callable[[Sequence[Any]], Awaitable[list[Any]]]


@pytest.mark.parametrize("helper", [gather_or_fail])
def test_sibling_failures_are_retrieved(helper: Helper) -> None:
    unretrieved: list[dict[str, Any]] = []
    raised: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
        for _ in range(3):
            # every request of a batch rejected at once (a server refusing top-20), and a
            # batch where a later request is still in flight
            for batch in (
                [_fails(0.0, 0), _fails(0.0, 1), _fails(0.0, 2)],
                [_fails(0.0, 0), _fails(0.0, 1), _ok(0.0), _fails(0.0, 2), _fails(0.01, 3)],
            ):
                try:
                    await helper(batch)
                except ValueError as exc:
                    raised.append(str(exc))
        await asyncio.sleep(0.05)
        gc.collect()

    asyncio.run(main())
    gc.collect()
    assert raised == ["rejected 0"] * 6  # the earliest request's error, as itself
    messages = [str(c.get("message")) for c in unretrieved]
    assert not messages, messages


async def test_one_awaitable_fails_and_cancels_like_many() -> None:
    assert await gather_or_fail([_ok(0.0)]) == [1]
    with pytest.raises(ValueError, match="rejected 7"):
        await gather_or_fail([_fails(0.0, 7)])
    started = asyncio.Event()

    async def slow() -> int:
        started.set()
        await asyncio.sleep(10)
        return 1

    task = asyncio.ensure_future(gather_or_fail([slow()]))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
