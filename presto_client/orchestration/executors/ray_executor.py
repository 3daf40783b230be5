"""The Ray executor: a job's chains sharded over Ray actors, the driver the one writer.

The driver (the ``presto run`` process) plans as always, opens its own engines for what a job
does once (probe, identity, tokenizing, prefix-cache counters) and writes the run directory;
the chains run in ``executor.workers`` Ray actors (:class:`~presto_client.orchestration.
ray_worker.ChainWorker`), each an asyncio orchestrator with its own HTTP pools and its share of
every bound (:mod:`presto_client.orchestration.executors.shares`). Each actor streams its finished
chains
back (a Ray streaming generator of batches); the driver drops a chain it has already (by chain
id), reports the others to its sinks (the run directory, the progress bar) and counts failures
against the job's budget. A worker that dies (its actor is lost) has its unfinished chains dealt
to the workers still alive; they restart from their seeds, and since the worker wrote nothing,
nothing of them is written twice. Stopping (Ctrl-C, SIGTERM, the failure budget) stops every
worker.

Ray is imported here only, lazily: it is the extra ``ray``, never a dependency.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from presto_client.errors import ConfigError, EngineUnavailableError, PrestoError
from presto_client.orchestration.config.executor_config import RAY_EXTRA_HINT
from presto_client.orchestration.executors.orchestrator import (
    ChainOutcome,
    ChainSink,
    ChainSpec,
    EnginePool,
    JobFailedError,
    OrchestratorResult,
    failure_budget_error,
    replay_chain,
)
from presto_client.orchestration.executors.ray_output import RayOutput
from presto_client.orchestration.executors.ray_reaper import MARK_VAR
from presto_client.orchestration.executors.ray_reaper import start as start_reaper
from presto_client.orchestration.executors.ray_reaper import stop as stop_reaper
from presto_client.orchestration.executors.ray_worker import ChainReport, ChainWorker
from presto_client.orchestration.executors.shares import deal, worker_shares
from presto_client.orchestration.planned import ExecutorSettings, JobPlan, JobSettings

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0
"""Bound on a worker's orderly close (its pools) before its actor is killed anyway."""

WORKER_NAME = "presto-worker-{index}"
"""The name of worker ``index``'s actor in the job's own Ray namespace (``ray.get_actor``)."""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            f"executor.kind ray needs Ray, which is not installed; {RAY_EXTRA_HINT}"
        ) from None
    return ray


def _require_token_auth(ray: Any) -> bool:
    """Token authentication (Ray >= 2.52) for the local instance this process starts: a fresh
    random token in this process's environment (inherited by the instance's processes, never
    written to disk), unless the user chose a mode or a token already; ``False`` (and a
    warning) when the user turned it off."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        logger.warning(
            "RAY_AUTH_MODE=disabled: the local Ray instance takes calls from anyone who can "
            "reach this machine's ports"
        )
        return False
    os.environ["RAY_AUTH_MODE"] = "token"
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    with contextlib.suppress(ImportError, AttributeError):
        ray._raylet.Config.initialize("")  # re-read the mode (Ray caches its config)
    return True


def _host_port(address: str) -> tuple[str, int]:
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port)


def _check_reachable(address: str, timeout_s: float) -> None:
    """A TCP connection to ``HOST:PORT`` within the timeout (Ray itself retries for a long
    time before it gives up on an address that does not answer)."""
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as exc:
        raise ConfigError(
            f"executor.address {address!r}: no Ray cluster answers there within "
            f"{timeout_s:g} s ({exc.strerror or exc}); start one (ray start --head) or fix "
            "executor.address (null starts a local one)"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def _reclaim_signals() -> None:
    """Give SIGTERM and SIGINT back to this process's Python handlers (``presto run``'s: stop
    the job, keep what finished). Ray's core worker installs a C failure handler over them when
    it starts in the driver, which prints a stack and aborts the process instead."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(signum)
        if handler is not None:
            signal.signal(signum, handler)


def _package_root() -> str:
    """The folder the driver imports presto_client from: local workers import the same copy."""
    return str(Path(__file__).resolve().parents[2])


class RaySession:
    """Ray, joined or started for a job; ``close`` shuts down only what it started."""

    def __init__(
        self, ray: Any, started: bool, reaper: subprocess.Popen[bytes] | None = None
    ) -> None:
        self.ray = ray
        self.started = started
        self.reaper = reaper
        self.output = RayOutput()

    @classmethod
    async def connect(cls, settings: ExecutorSettings) -> RaySession:
        ray = _import_ray()
        if ray.is_initialized():  # the caller's session (a notebook, a test's cluster)
            return cls(ray, started=False)
        address = settings.address
        if address is not None and address != "auto":
            _check_reachable(address, settings.connect_timeout_s)
        kwargs: dict[str, Any] = {
            # (a local start's warnings are about the driver's thread and tokens, not the job)
            "logging_level": logging.ERROR if address is None else logging.WARNING,
            "include_dashboard": False,
        }
        if settings.runtime_env is not None:
            kwargs["runtime_env"] = dict(settings.runtime_env)
        if address is None:
            # ("local": a new instance of the job's own, never another process's on this machine)
            kwargs["address"] = "local"
            kwargs["num_cpus"] = max(1, round(settings.workers * settings.cpus_per_worker))
            # Every call to it needs a token of this process's: Ray's servers listen on every
            # interface (a loopback node address is replaced by a reachable one: Ray's
            # resolve_ip_for_localhost), and a Ray instance without authentication runs any
            # code sent to it.
            if _require_token_auth(ray):
                logging.getLogger("presto_client.progress").info(
                    "a local Ray instance: its servers listen on every interface of this "
                    "machine (Ray does not bind them to loopback); they take calls only with "
                    "this job's token"
                )
        else:
            kwargs["address"] = address

        def init() -> None:
            ray.init(**kwargs)

        # A local instance's processes carry a mark of their own (set around the start only:
        # what this process starts later is not Ray's), which the reaper kills them by once this
        # process is gone, even by SIGKILL (see ray_reaper).
        reaper = None
        if address is None:
            mark = secrets.token_hex(16)
            reaper = start_reaper(mark)
            os.environ[MARK_VAR] = mark
        try:
            async with asyncio.timeout(settings.connect_timeout_s + 30.0):
                # (a local start takes seconds; never on the event loop)
                await asyncio.to_thread(init)
        except TimeoutError:
            raise ConfigError(
                f"executor.address {address!r}: Ray did not start or connect within "
                f"{settings.connect_timeout_s + 30.0:g} s"
            ) from None
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = "a local Ray instance" if address is None else f"the cluster at {address!r}"
            raise ConfigError(f"executor.address: could not start or join {where}: {exc}") from None
        finally:
            os.environ.pop(MARK_VAR, None)
            if reaper is not None and not ray.is_initialized():
                stop_reaper(reaper)  # (what a failed start left)
        _reclaim_signals()
        session = cls(ray, started=True, reaper=reaper)
        session.output.install()
        return session

    def close(self) -> None:
        """Shut down what :meth:`connect` started (blocking, about a second: the job's last
        step, when nothing else runs on its loop)."""
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()
        self.output.uninstall()
        if self.reaper is not None:
            stop_reaper(self.reaper)  # (and what the shutdown left: the agents linger too)
            self.reaper = None


class RayExecutor:
    """The chains of a job over Ray workers (see the module's docstring)."""

    def __init__(self, session: RaySession, settings: ExecutorSettings) -> None:
        self.session = session
        self.settings = settings
        self.actors: dict[int, Any] = {}
        self.placed: dict[int, dict[str, Any]] = {}
        self.worker_stats: list[dict[str, Any]] = []

    async def start(
        self,
        plan: JobPlan,
        engines: Sequence[str],
        *,
        embedded_urls: Mapping[str, str],
        probe: bool,
    ) -> None:
        """Start the workers, each opening (and probing) ``engines`` from its node."""
        ray = self.session.ray
        settings = plan.settings
        n = self.settings.workers
        planned = {name: plan.engines[name] for name in engines}
        shares = worker_shares(
            n,
            max_concurrency=settings.max_concurrency,
            max_active_chains=settings.max_active_chains,
            engine_concurrency={name: e.max_concurrency for name, e in planned.items()},
        )
        options: dict[str, Any] = {"num_cpus": self.settings.cpus_per_worker, "max_restarts": 0}
        if self.settings.address is None:
            path = os.pathsep.join(p for p in (_package_root(), os.environ.get("PYTHONPATH")) if p)
            options["runtime_env"] = {"env_vars": {"PYTHONPATH": path}}
        remote = ray.remote(ChainWorker)
        for share in shares:
            self.actors[share.index] = remote.options(
                name=WORKER_NAME.format(index=share.index), **options
            ).remote(share, planned, dict(embedded_urls), probe)
        refs = {i: a.open.remote() for i, a in self.actors.items()}
        timeout = self.settings.connect_timeout_s
        try:
            async with asyncio.timeout(timeout):
                for i, ref in refs.items():
                    self.placed[i] = await ref
        except TimeoutError:
            raise ConfigError(
                f"executor.workers: {len(refs) - len(self.placed)} of {n} Ray worker(s) of "
                f"{self.settings.cpus_per_worker:g} CPU (executor.cpus_per_worker) were not "
                f"placed and opened within {timeout:g} s (executor.connect_timeout_s); the "
                "cluster has too few free CPUs, or a worker cannot start"
            ) from None
        except ray.exceptions.RayTaskError as exc:
            # (the worker's own error, raised in its process: said as the driver would say it)
            cause = exc.cause
            what = str(cause) if isinstance(cause, PrestoError) else _first_line(exc)
            error = ConfigError if isinstance(cause, ConfigError) else EngineUnavailableError
            raise error(f"Ray worker {i} could not open its engines: {what}") from None
        except ray.exceptions.RayError as exc:
            raise EngineUnavailableError(
                f"Ray worker {i} did not start: {_first_line(exc)}"
            ) from None
        logger.info(
            "ray executor: %d worker(s) on %s",
            n,
            ", ".join(sorted({str(p["node"]) for p in self.placed.values()})),
        )

    async def run(
        self,
        specs: Sequence[ChainSpec],
        *,
        pools: Mapping[str, EnginePool],
        sinks: Sequence[ChainSink],
        finish: Callable[[ChainOutcome], Awaitable[None]] | None,
        settings: JobSettings,
    ) -> OrchestratorResult:
        """Run ``specs`` on the workers; ``pools`` and ``finish`` are the driver's and unused
        (each worker has its own engines and detokenizes on them)."""
        result = OrchestratorResult()
        order = {s.chain_id: i for i, s in enumerate(specs)}
        by_id = {s.chain_id: s for s in specs}
        done: set[str] = set()
        alive = sorted(self.actors)
        outstanding: dict[int, set[str]] = {w: set() for w in alive}
        tasks: dict[asyncio.Task[None], int] = {}
        fatal: list[JobFailedError] = []

        def report(worker: int, chain: ChainReport) -> None:
            outcome = chain.outcome
            cid = outcome.spec.chain_id
            outstanding.get(worker, set()).discard(cid)
            if cid in done:
                logger.warning("chain %s reported twice (worker %d); kept once", cid, worker)
                return
            done.add(cid)
            replay_chain(sinks, outcome, chain.rounds)
            if outcome.ok:
                result.completed.append(outcome)
                return
            result.failed.append(outcome)
            if len(result.failed) > settings.failure_budget and not fatal:
                # (once: a chain that finishes while the job stops is kept, not raised again)
                fatal.append(
                    failure_budget_error(len(result.failed), settings.failure_budget, outcome)
                )
                raise fatal[0]

        async def consume(worker: int, chunk: list[ChainSpec]) -> None:
            stream: AsyncIterator[Any] = self.actors[worker].run.remote(chunk)
            async for ref in stream:
                for chain in await ref:
                    report(worker, chain)

        def submit(worker: int, chunk: list[ChainSpec]) -> None:
            outstanding[worker].update(s.chain_id for s in chunk)
            task = asyncio.create_task(consume(worker, chunk), name=f"presto-ray-worker-{worker}")
            tasks[task] = worker

        for worker, chunk in deal(list(specs), alive).items():
            if chunk:
                submit(worker, chunk)
        ray_actor_error = self.session.ray.exceptions.RayActorError
        try:
            while tasks:
                finished, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    worker = tasks.pop(task)
                    exc = task.exception()
                    if exc is None:
                        continue
                    if not isinstance(exc, ray_actor_error):
                        raise fatal[0] if fatal else exc
                    if worker not in alive:
                        continue  # (its chains were dealt out already)
                    alive.remove(worker)
                    left = sorted(outstanding.pop(worker) - done, key=order.__getitem__)
                    logger.warning(
                        "Ray worker %d died (%s); its %d unfinished chain(s) go to the "
                        "%d worker(s) left",
                        worker,
                        _first_line(exc),
                        len(left),
                        len(alive),
                    )
                    if not left:
                        continue
                    if not alive:
                        raise EngineUnavailableError(
                            f"every Ray worker died; {len(specs) - len(done)} chain(s) not run "
                            "(rerun the same command to resume)"
                        )
                    for w, chunk in deal([by_id[c] for c in left], alive).items():
                        if chunk:
                            submit(w, chunk)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return result

    async def close(self) -> None:
        """Close every live worker's engines (briefly), then end the actors."""
        ray = self.session.ray
        closing = {i: a.close.remote() for i, a in self.actors.items() if i in self.placed}
        for i, ref in closing.items():
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    self.worker_stats.append(await ref)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.debug("ray worker %d: no orderly close (%s)", i, exc)
        for actor in self.actors.values():
            with contextlib.suppress(Exception):
                ray.kill(actor)
        self.actors.clear()
