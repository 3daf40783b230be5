"""What presto needs of a server it runs as a child process: its health, its log, its stop.

Shared by the embedded engine's launcher and the managed llama.cpp one: both start their child in
a process group of its own, so a stop reaches everything it spawned.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

logger = logging.getLogger(__name__)


def log_tail(path: Path, n: int = 4000) -> str:
    """The last ``n`` bytes of a child's log, for an error message."""
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-n:].decode(errors="replace")


def health_ok(url: str, timeout: float = 2.0) -> bool:
    """``/health`` answers 200 (servers answer 503 while their model loads)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float, what: str) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        logger.warning("%s (%d) ignored SIGTERM; killing it", what, proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
