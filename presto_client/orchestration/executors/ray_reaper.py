"""The processes of a local Ray instance stopped when the driver that started it is gone.

Ray kills its gcs_server and raylet with the driver (``prctl(PR_SET_PDEATHSIG)``), but the
raylet's agents (dashboard agent, runtime env agent) outlive a driver killed with SIGKILL by about
60 s: they notice the raylet's death at once, then try to tell the driver through the dead GCS,
a call Ray bounds at 60 s (``ray._private.utils.publish_error_to_driver``), and no Ray setting
shortens it. So a job that starts a local instance also starts this watcher (a process of its
own session, out of reach of the terminal's Ctrl-C): it waits on a pipe whose only writer is the
driver, and on end of file (the driver closed it, or died) kills the instance's processes: those
that carry its mark (an environment variable the driver sets around ``ray.init`` only, so what it
starts later is not included: gcs_server, raylet and the rest of the head) and their descendants
(the raylet's agents and workers). It notes them twice a second while the driver lives, by pid
and start time (a reused pid is never killed): an agent that sets its title (``ray::...``)
blanks its environment as /proc shows it, so by then it is known by its parent.

Run as a script (``python ray_reaper.py MARK DRIVER_PID``): it imports nothing of presto_client
or Ray, so it starts in milliseconds. Linux only (``/proc``); elsewhere nothing is started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

MARK_VAR = "PRESTO_RAY_INSTANCE"
"""The environment variable whose value marks the processes of one local Ray instance."""

ROUNDS = 20
ROUND_S = 0.1
SCAN_S = 0.5


def _stat(pid: str) -> tuple[int, int] | None:
    """The parent and the start time (clock ticks since boot) of process ``pid``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # (after the name, which may hold spaces)
    return int(fields[1]), int(fields[19])


def _carries(pid: str, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # (gone, or another user's)
        return False


def scan(mark: str, known: dict[int, int], spare: set[int]) -> None:
    """Add to ``known`` (pid: start time) the live processes carrying ``mark`` and their
    descendants. Descendants by their parent, not their mark: a Python process of Ray's that
    sets its title (``ray::DashboardAgent``) overwrites its environment in /proc later."""
    needle = f"{MARK_VAR}={mark}".encode()
    procs = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in spare:
            stat = _stat(entry.name)
            if stat is not None:
                procs[int(entry.name)] = stat
    for pid, (_, started) in procs.items():
        if known.get(pid) != started and _carries(str(pid), needle):
            known[pid] = started
    grown = True
    while grown:  # (a parent found on this pass may have its own children)
        grown = False
        for pid, (parent, started) in procs.items():
            if pid not in known and known.get(parent) == procs.get(parent, (0, -1))[1]:
                known[pid] = started
                grown = True


def reap(mark: str, known: dict[int, int], spare: set[int]) -> int:
    """Kill the known processes that still run (the same start time: never a reused pid) until
    none is left (a dying raylet may still start one); how many were killed."""
    killed: set[int] = set()
    for _ in range(ROUNDS):
        scan(mark, known, spare)
        alive = [
            pid for pid, started in known.items() if (_stat(str(pid)) or (0, -1))[1] == started
        ]
        if not alive:
            break
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(ROUND_S)
    return len(killed)


def start(mark: str) -> subprocess.Popen[bytes] | None:
    """Start the watcher for this process's instance; None where there is no ``/proc``."""
    if not sys.platform.startswith("linux"):
        return None
    return subprocess.Popen(
        [sys.executable, "-I", "-S", __file__, mark, str(os.getpid())],
        stdin=subprocess.PIPE,  # (non-inheritable here: Ray's processes never hold it open)
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(watcher: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """Let the watcher reap what the instance left (after ``ray.shutdown``) and exit."""
    if watcher.stdin is not None:
        with contextlib.suppress(OSError):
            watcher.stdin.close()
    try:
        watcher.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        watcher.kill()
        watcher.wait()


def main(argv: list[str]) -> int:
    mark, driver = argv[1], int(argv[2])
    spare = {os.getpid(), driver}
    known: dict[int, int] = {}
    # The pipe is read on a thread: end of file (the driver closed it, or died) is seen at
    # once, while this thread notes Ray's processes as they start (before their mark is gone).
    eof = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), eof.set()), daemon=True).start()
    while not eof.wait(SCAN_S):
        scan(mark, known, spare)
    reap(mark, known, spare)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
