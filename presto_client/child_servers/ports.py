"""Loopback ports of the servers presto starts: a free one, whether one is taken, and by whom
(the check that the server answering is the process presto started)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

HOST = "127.0.0.1"
"""Where every server presto starts listens (loopback only)."""


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


def port_of(url: str) -> int:
    """The port of a server's base URL (``http://127.0.0.1:41823`` -> 41823)."""
    return int(url.rsplit(":", 1)[1])


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


def in_group(pid: int, group: int) -> bool:
    """Whether ``pid`` is ``group``'s leader or in its process group (a server's worker that
    inherited the listening socket is still the server presto started)."""
    if pid == group:
        return True
    try:
        return os.getpgid(pid) == group
    except OSError:
        return False
