"""What the integration fixtures hand to the tests (imported by name: no test package)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class VllmServer:
    base_url: str
    model: str
    logprobs_mode: str
    port: int


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick; the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_port(variable: str) -> tuple[int, bool]:
    """The port the environment variable ``variable`` names and True (use a server already
    running there), else a free port and False (start one of this session's own)."""
    named = os.environ.get(variable)
    return (int(named), True) if named else (free_port(), False)
