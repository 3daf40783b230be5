"""The servers presto started for a job or a service, as its event loop sees them.

A started server (:class:`~presto_client.child_servers.lifecycle.ChildServer`) is watched from
a thread of its own, restarted when it dies, and given up past its restarts. Whatever depends on
it then has no engine left: without this, every request would retry the dead port for its
restart window (minutes) before the job failed without naming the cause. :class:`ServerWatch`
brings the failure onto the event loop; :meth:`ServerWatch.race` stops a job's work at once on
it (its chains cancelled, what finished kept), and a service answers 503 naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Protocol, TypeVar

from presto_client.errors import PrestoError

T = TypeVar("T")


class WatchedServer(Protocol):
    """A started server whose failure for good can be listened to
    (:class:`~presto_client.child_servers.lifecycle.ChildServer`)."""

    def on_failure(self, listener: Callable[[str], None]) -> Callable[[], None]: ...


class ServerFailedError(PrestoError):
    """A server presto started for an engine is gone for good (its restarts spent, or a restart
    failed); the message says which engine, why (exit status, signal) and where its log is."""

    def __init__(self, engine: str, failure: str) -> None:
        super().__init__(f"engine {engine}: its server is gone: {failure}")
        self.engine = engine
        self.failure = failure


class ServerWatch:
    """The failures for good of ``servers`` (engine name → its started server), on the event
    loop that enters it (``async with``); empty: nothing ever fails."""

    def __init__(self, servers: Mapping[str, WatchedServer] | None = None) -> None:
        self.servers = dict(servers or {})
        self.failed: ServerFailedError | None = None
        """The first server gone for good, once one is."""
        self._event: asyncio.Event | None = None
        self._removers: list[Callable[[], None]] = []

    async def __aenter__(self) -> ServerWatch:
        loop = asyncio.get_running_loop()
        self._event = event = asyncio.Event()

        def failed(engine: str, failure: str) -> None:
            if self.failed is None:
                self.failed = ServerFailedError(engine, failure)
            event.set()

        for engine, server in self.servers.items():

            def told(failure: str, engine: str = engine) -> None:
                # (the server's watch thread calls: hand it to the loop; a closed loop has
                # nobody left to tell)
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(failed, engine, failure)

            self._removers.append(server.on_failure(told))
        # (a server already gone called at once: let that land before anything runs on it)
        await asyncio.sleep(0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for remove in self._removers:
            remove()
        self._removers.clear()

    async def wait(self) -> ServerFailedError:
        """Return once a server is gone for good (never, when none is watched)."""
        if self._event is None:
            raise RuntimeError("ServerWatch used outside its async with")
        await self._event.wait()
        assert self.failed is not None
        return self.failed

    async def race(self, work: Awaitable[T]) -> T:
        """``await work``, unless a watched server is gone for good first: then ``work`` is
        cancelled (and awaited: what it finished stays written) and :class:`ServerFailedError`
        raised. An error of ``work`` once a server is gone names the server's failure as its
        cause. Cancellation of the caller cancels ``work`` too and is re-raised."""
        task = asyncio.ensure_future(work)
        if not self.servers:
            return await task
        gone = asyncio.ensure_future(self.wait())
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():
                task.cancel()
                # (the caller's own cancellation, if it came, is re-raised here or above)
                await asyncio.wait({task})
        if task.cancelled() and self.failed is None:
            raise asyncio.CancelledError
        if self.failed is not None and (task.cancelled() or task.exception() is not None):
            raise self.failed from (None if task.cancelled() else task.exception())
        return task.result()
