"""Running ``presto serve``: start it on its socket, serve until a signal, drain gracefully.

The service itself (routes, admission, answers) is :mod:`presto_client.serve.app`; this module
owns its life: the listening site with its guards, the signal handling and the drain with its
grace period and exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from presto_client.orchestration.config.schema import JobConfig
from presto_client.orchestration.engines.server_watch import ServerWatch, WatchedServer
from presto_client.serve.app import ServeOptions, Service
from presto_client.serve.chains import EngineThread
from presto_client.serve.guard import (
    GuardedSite,
    default_max_connections,
    install_log_flood,
    remove_log_flood,
)

logger = logging.getLogger(__name__)
progress = logging.getLogger("presto_client.progress")
"""What an operator waits for (shown by the CLI at the default verbosity)."""


@dataclass(slots=True)
class RunningService:
    """A started service (``aclose()`` stops it and closes its engine)."""

    url: str
    service: Service
    _runner: web.AppRunner
    _stack: contextlib.AsyncExitStack

    async def stop_listening(self) -> None:
        """Close the listening sockets (connections already open are served on)."""
        for site in list(self._runner.sites):
            await site.stop()

    async def aclose(self) -> None:
        await self._runner.cleanup()
        await self._stack.aclose()


async def start_service(
    cfg: JobConfig,
    options: ServeOptions,
    *,
    embedded_urls: dict[str, str] | None = None,
    replicas: Sequence[Any] | None = None,
    servers: Mapping[str, WatchedServer] | None = None,
) -> RunningService:
    """Open the config's first engine and serve it on ``options.host:options.port``;
    ``servers``: the server presto started for it (gone for good: every request is a 503)."""
    stack = contextlib.AsyncExitStack()
    try:
        watch = await stack.enter_async_context(ServerWatch(servers))
        # (the chains run on a loop of their own: see EngineThread)
        engine = await EngineThread.open(
            cfg, embedded_urls=embedded_urls, probe=options.probe, replicas=replicas
        )
        stack.push_async_callback(engine.aclose)
        service = Service(engine, options)
        service.admission.on_idle = _memory_returned_when_idle(service, engine)
        service.watch = watch
        runner = web.AppRunner(
            service.app(),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=5.0,
            # an idle connection, and one whose request headers have not all arrived, is
            # closed this long after it opened (or after its previous answer)
            keepalive_timeout=options.idle_timeout_s,
            # after an answer to a request whose body was not read (a 408, a 413), what is
            # left of it is read (so that the client gets the answer) for a second at most
            lingering_time=1.0,
        )
        await runner.setup()
        site = GuardedSite(
            runner,
            options.host,
            options.port,
            options.max_connections or default_max_connections(),
        )
        await site.start()
    except BaseException:
        await stack.aclose()
        raise
    host, port = runner.addresses[0][:2]
    return RunningService(f"http://{host}:{port}", service, runner, stack)


RETURN_MEMORY_IDLE_S = 2.0
"""How long the service is idle before it hands memory back (a full collection: 0.3-0.4 s
after a burst; after every request it cost a sequential client 2-4 ms a request)."""


def _memory_returned_when_idle(service: Service, engine: EngineThread) -> Callable[[], None]:
    loop = asyncio.get_running_loop()
    later: list[asyncio.TimerHandle] = []

    def give_back() -> None:
        if service.admission.active == 0:
            engine.return_memory()

    def on_idle() -> None:
        for handle in later:
            handle.cancel()
        later[:] = [loop.call_later(RETURN_MEMORY_IDLE_S, give_back)]

    return on_idle


async def serve_until_stopped(
    cfg: JobConfig,
    options: ServeOptions,
    embedded_urls: dict[str, str] | None = None,
    servers: Mapping[str, WatchedServer] | None = None,
) -> int:
    """Serve until SIGINT/SIGTERM, then drain; the exit status (0: nothing was cut).

    The first signal stops listening and admitting: queued and new requests are answered 503
    with Retry-After, ``/health`` says ``draining``, and the running requests have
    ``options.shutdown_grace_s`` to finish. Those still running then are cut (their chains
    cancelled, their upstream requests aborted, each answered 503) and the status is 1. A
    second signal cuts at once; a third one is the signal's default (the process ends)."""
    flood = install_log_flood()
    try:
        return await _serve_until_stopped(cfg, options, embedded_urls, servers)
    finally:
        remove_log_flood(*flood)


async def _serve_until_stopped(
    cfg: JobConfig,
    options: ServeOptions,
    embedded_urls: dict[str, str] | None,
    servers: Mapping[str, WatchedServer] | None,
) -> int:
    running = await start_service(cfg, options, embedded_urls=embedded_urls, servers=servers)
    service = running.service
    stop = asyncio.Event()
    now = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)

    def on_signal() -> None:
        if not stop.is_set():
            stop.set()
            return
        now.set()
        for sig in signals:  # a third signal: the default action
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)

    for sig in signals:
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal)
    progress.info(
        "presto serve: %s (engine %s) on %s/v1", service.model_id, service.engine.name, running.url
    )
    try:
        await stop.wait()
        return await drain(running, options.shutdown_grace_s, now)
    finally:
        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        await running.aclose()


async def drain(running: RunningService, grace_s: float, now: asyncio.Event | None = None) -> int:
    """Stop a service gracefully (see :func:`serve_until_stopped`); 0, or 1 if work was cut."""
    service = running.service
    await running.stop_listening()
    refused = service.begin_drain()
    active = service.admission.active
    logger.warning(
        "presto serve: stopping; %d running request(s) have %g s to finish, %d queued "
        "answered 503 (a second signal stops at once)",
        active,
        grace_s,
        refused,
    )
    now = now or asyncio.Event()
    idle = asyncio.ensure_future(service.admission.wait_idle())
    at_once = asyncio.ensure_future(now.wait())
    try:
        await asyncio.wait({idle, at_once}, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
        if not idle.done():
            service.cut_running()
            with contextlib.suppress(TimeoutError):  # their 503s are written
                await asyncio.wait_for(asyncio.shield(idle), timeout=5)
    finally:
        idle.cancel()
        at_once.cancel()
    if service.cut_requests:
        logger.warning(
            "presto serve: %d request(s) were cut (answered 503); exit status 1",
            service.cut_requests,
        )
        return 1
    return 0
