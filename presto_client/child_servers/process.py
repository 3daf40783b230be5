"""The operating system's side of one child process: spawning it in a process group of its own,
reading its log, asking its health, naming why it exited, stopping its group.

Every server presto starts (and llama.cpp's set-up) is spawned here, so a stop always reaches
everything the child spawned in turn.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux SIGTERM the child when presto dies, SIGKILL included,
    where no ``finally`` runs (``PR_SET_PDEATHSIG``; it survives an ``exec`` of the server);
    ``None`` elsewhere. libc is loaded here, in the parent: the child only calls it."""
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


def spawn(
    cmd: Sequence[str],
    log_path: Path,
    env: Mapping[str, str],
    *,
    pdeathsig: bool,
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` with its output in ``log_path``, in a new session (its own process group,
    so that :func:`stop_process_group` reaches its children too)."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
            preexec_fn=die_with_parent() if pdeathsig else None,
        )


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


def exit_cause(code: int) -> str:
    """How a child ended, in words: ``exited with status 7``, or for a signal
    ``exited with status -9 (killed by SIGKILL)``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"exited with status {code} (killed by {name})"
    return f"exited with status {code}"


def log_tail(path: Path, n: int = 4000) -> str:
    """The last ``n`` bytes of a child's log, for an error message."""
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-n:].decode(errors="replace")


def last_log_line(path: Path) -> str:
    """The last non-blank line of a child's log (``""``: none yet), for a progress note."""
    lines = log_tail(path, 400).strip().splitlines()
    return lines[-1].strip() if lines else ""


def health_ok(url: str, timeout: float = 2.0) -> bool:
    """``/health`` answers 200 (servers answer 503 while their model loads)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class LineFollower:
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
