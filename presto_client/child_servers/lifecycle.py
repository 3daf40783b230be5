"""The one lifecycle of a server that presto starts as a child process.

:class:`ChildServer` starts the child in a process group of its own, waits until it answers
``/health`` (saying every ``note_every_s`` what it is doing), checks that the process answering
is the one it started, watches it while the job runs (a death is said at once, with its cause
and its log file, and the server is started again on its port, up to ``max_restarts`` times),
and stops the whole group at the end. A kind of server (:mod:`.embedded`, :mod:`.llamacpp`)
says only what differs: its command line, its environment, how its URL is known, what it does
before the first start.

The child's log lives in a temporary folder that is removed at the stop, unless something went
wrong (a failed start, a death): then it is kept, and every message names it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import ClassVar

from presto_client.child_servers.ports import (
    HOST,
    free_port,
    in_group,
    listening_pid,
    port_in_use,
    port_of,
)
from presto_client.child_servers.process import (
    exit_cause,
    health_ok,
    last_log_line,
    log_tail,
    spawn,
    stop_process_group,
)

logger = logging.getLogger(__name__)
progress = logging.getLogger("presto_client.progress")
"""What a user waits for (shown by the CLI at the default verbosity)."""


class ChildServerError(RuntimeError):
    """A server presto starts did not start, or is not the process answering (the message says
    why, with the tail of its log)."""


class ChildServer:
    """A server that presto starts, watches and stops (one process group).

    Subclasses set the class settings and :meth:`command`; the other hooks have defaults."""

    name: ClassVar[str] = "server"
    """What the child is, in messages: "the {name} exited ..."."""
    label: ClassVar[str] = "the server"
    """What a user waits for, in progress notes: "{label} is still starting"."""
    error: ClassVar[type[ChildServerError]] = ChildServerError
    workdir_prefix: ClassVar[str] = "presto-server-"
    pdeathsig: ClassVar[bool] = True
    """Have Linux SIGTERM the child when presto dies (a child that watches its parent itself
    does without)."""
    chooses_port: ClassVar[bool] = True
    """Without a configured port presto picks a free one; otherwise the child binds port 0 and
    tells its URL (:meth:`ready_url`), which leaves no race for the port."""
    busy_port_hint: ClassVar[str] = "Free the port, or leave port unset (a free one is taken)"

    def __init__(
        self,
        *,
        port: int | None,
        startup_timeout_s: float,
        stop_grace_s: float,
        note_every_s: float,
        max_restarts: int,
        watch_every_s: float,
    ) -> None:
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.note_every_s = note_every_s
        self.max_restarts = max_restarts
        self.watch_every_s = watch_every_s
        self.base_url: str | None = None
        self.log_path: Path | None = None
        self.workdir: Path | None = None
        self.restarts = 0
        self.failure: str | None = None
        """Why the server is gone for good (it died and could not be restarted)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._keep_workdir = False
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self._listeners: list[Callable[[str], None]] = []
        self._listeners_lock = threading.Lock()

    # ---- what a kind of server says --------------------------------------------------------

    def command(self, port: int) -> list[str]:
        """The child's command line (``port``: 0 when the child picks one itself)."""
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        """The child's environment."""
        return dict(os.environ)

    def prepare(self, work: Path) -> None:
        """What must be done once before the first start (a set-up); nothing by default."""

    def announce(self, port: int) -> None:
        """Say that the server starts (the progress logger)."""
        progress.info("starting %s", self.label)

    def before_launch(self) -> None:
        """Forget what an earlier launch left behind (a ready file); nothing by default."""

    def ready_url(self, port: int) -> str | None:
        """The server's base URL once it is known (``None``: not yet)."""
        return f"http://{HOST}:{port}" if port else None

    # ---- the lifecycle ---------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> str:
        """Start the child and block until it answers; returns its base URL."""
        if self._proc is not None:
            raise RuntimeError("already started")
        self.workdir = Path(tempfile.mkdtemp(prefix=self.workdir_prefix))
        self._keep_workdir = False
        self.restarts = 0
        self.failure = None
        try:
            self.prepare(self.workdir)
            port = self._port()
            self.log_path = self.workdir / "server.log"
            self.announce(port)
            url = self._launch(port)
        except BaseException:
            self.stop()
            raise
        self.base_url = url
        self._stopping.clear()
        self._watcher = threading.Thread(
            target=self._watch, args=(url,), name=f"{self.workdir_prefix}watch", daemon=True
        )
        self._watcher.start()
        return url

    def _port(self) -> int:
        """The port to start on: a configured one only if it is free (presto would otherwise
        run the job on whatever answers there)."""
        if self.port is None:
            return free_port() if self.chooses_port else 0
        if port_in_use(self.port):
            owner = listening_pid(self.port)
            raise self.error(
                f"the {self.name} cannot listen on {HOST}:{self.port}: port {self.port} is in use"
                + (f" (by pid {owner})" if owner is not None else "")
                + f": presto starts a {self.name} of its own there and would otherwise run the "
                f"job on whatever answers. {self.busy_port_hint}"
            )
        return self.port

    def _launch(self, port: int) -> str:
        """Spawn the child, wait for its health, and check that what answers is ours."""
        assert self.log_path is not None
        self.before_launch()
        self._proc = proc = spawn(
            self.command(port), self.log_path, self.env(), pdeathsig=self.pdeathsig
        )
        url = self._wait_ready(proc, port)
        owner = listening_pid(port_of(url))
        if owner is not None and not in_group(owner, proc.pid):
            raise self.failed(
                f"{url} is answered by pid {owner}, not by the {self.name} presto started "
                f"(pid {proc.pid}): another process took the port",
                self.log_path,
            )
        return url

    def _wait_ready(self, proc: subprocess.Popen[bytes], port: int) -> str:
        assert self.log_path is not None
        t0 = time.monotonic()
        next_note = t0 + self.note_every_s
        while True:
            now = time.monotonic()
            if now >= next_note:
                next_note += self.note_every_s
                last = last_log_line(self.log_path)
                progress.info(
                    "%s is still starting (%.0f s)%s",
                    self.label,
                    now - t0,
                    f": {last[:160]}" if last else "",
                )
            code = proc.poll()
            if code is not None:
                raise self.failed(
                    f"the {self.name} {exit_cause(code)} during start-up", self.log_path
                )
            url = self.ready_url(port)
            if url and health_ok(url):
                break
            if now - t0 > self.startup_timeout_s:
                where = f"{url}/health " if url else ""
                raise self.failed(
                    f"the {self.name} did not answer {where}within "
                    f"{self.startup_timeout_s:.0f} s (startup_timeout_s)",
                    self.log_path,
                )
            time.sleep(0.2)
        logger.info("%s ready at %s in %.1f s", self.name, url, time.monotonic() - t0)
        return url

    def failed(self, what: str, log: Path, *, then: str = "") -> ChildServerError:
        """The error for ``what`` went wrong, with the tail of ``log``; the log is kept (the
        folder is not removed at the stop) and named."""
        self._keep_workdir = True
        return self.error(f"{what}; log tail:\n{log_tail(log)}\n(the whole log: {log}){then}")

    def _watch(self, url: str) -> None:
        """Watch the server while the job runs: when it dies, say so at once (its cause and its
        log) and start it again on its port, up to ``max_restarts`` times; the engine's
        requests reconnect within their restart window. Past that, :attr:`failure` says why."""
        while not self._stopping.wait(self.watch_every_s):
            proc = self._proc
            if proc is None:
                return
            code = proc.poll()
            if code is None or self._stopping.is_set():
                continue
            self._keep_workdir = True
            log = self.log_path
            cause = f"the {self.name} (pid {proc.pid}) at {url} {exit_cause(code)}"
            tail = log_tail(log) if log is not None else ""
            if self.restarts >= self.max_restarts:
                self._give_up(
                    f"{cause} after {self.restarts} restart(s); its log: {log}; log tail:\n{tail}"
                )
                return
            self.restarts += 1
            logger.error(
                "%s; restarting it (%d of %d); its log: %s; log tail:\n%s",
                cause,
                self.restarts,
                self.max_restarts,
                log,
                tail,
            )
            if self.workdir is not None:
                # (a log of its own per start: the dead server's stays as it was)
                self.log_path = self.workdir / f"server.restart{self.restarts}.log"
            try:
                self._launch(port_of(url))
            except (ChildServerError, OSError) as exc:
                self._give_up(f"the {self.name} at {url} died and could not be restarted: {exc}")
                return
            progress.info("the %s restarted at %s (pid %d)", self.name, url, self.pid)

    def on_failure(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener(failure)`` once the server is gone for good (at once when it already
        is), from the watch's thread; returns what removes it. A job that depends on the
        server stops on it rather than retrying a dead port for its restart window."""
        with self._listeners_lock:
            failure = self.failure
            if failure is None:
                self._listeners.append(listener)
        if failure is not None:
            listener(failure)

        def remove() -> None:
            with self._listeners_lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    def _give_up(self, failure: str) -> None:
        """Record and say that the server is gone for good, and tell whoever listens."""
        with self._listeners_lock:
            self.failure = failure
            listeners, self._listeners = self._listeners, []
        logger.error("%s", failure)
        for listener in listeners:
            try:
                listener(failure)
            except Exception:  # (a listener's bug must not end the watch's report)
                logger.exception("a listener of the %s's failure failed", self.name)

    def stop(self) -> None:
        """Stop the watch and the child's process group, and remove its folder (kept when
        something went wrong); idempotent."""
        self._stopping.set()
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=self.startup_timeout_s + 5)
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process_group(proc, self.stop_grace_s, self.name)
        workdir, self.workdir = self.workdir, None
        if workdir is not None:
            if self._keep_workdir:
                logger.warning("the %s's logs are kept in %s", self.name, workdir)
            else:
                shutil.rmtree(workdir, ignore_errors=True)
        self.base_url = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
