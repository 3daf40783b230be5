"""Real serving gateways (``smg``, ``vllm-router``) as child processes in front of local workers.

The gateways come from PyPI into their own venv (``scripts/gateways.sh setup``); this module
only finds their console scripts there and runs one on loopback in front of worker URLs it is
given. Every port is a fresh free one (the gateway's Prometheus exporter included: both bind
29000 by default, ``smg`` on every interface), so two runs on one machine never collide.

A started gateway is ready when its worker list (``GET /workers``) names every worker as
healthy: both gateways probe a worker before routing to it (``/health``; ``smg`` also reads
``/v1/models``, ``/version``, ``/loads`` and ``/metrics`` to discover the model and the
runtime), so a request sent before then may be refused with 503.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GATEWAY_HOME = Path(
    os.environ.get("PRESTO_GATEWAY_HOME", str(Path.home() / ".cache/presto-client/gateways"))
)
"""Where ``scripts/gateways.sh setup`` puts the gateways' venv (``$GATEWAY_HOME/venv``)."""

KINDS = ("smg", "vllm-router")

POLICIES: dict[str, tuple[str, ...]] = {
    "smg": ("consistent_hashing", "cache_aware", "round_robin", "random", "power_of_two"),
    "vllm-router": ("consistent_hash", "cache_aware", "round_robin", "random", "power_of_two"),
}
"""The policies measured here, by each gateway's own name for them."""

ROUTING_KEY_HEADER: dict[str, str] = {
    "smg": "x-smg-routing-key",
    "vllm-router": "x-session-id",
}
"""The header each gateway's consistent-hash policy reads first (see docs/backends.md)."""

CONSISTENT_HASH: dict[str, str] = {"smg": "consistent_hashing", "vllm-router": "consistent_hash"}


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick; the gateway binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway_binary(kind: str, home: Path = GATEWAY_HOME) -> Path | None:
    """The console script of gateway ``kind`` in the set-up venv, or None if not set up."""
    if kind not in KINDS:
        raise ValueError(f"unknown gateway {kind!r}; known: {', '.join(KINDS)}")
    path = home / "venv" / "bin" / kind
    return path if path.is_file() and os.access(path, os.X_OK) else None


def command(
    kind: str,
    binary: Path,
    policy: str,
    workers: Sequence[str],
    port: int,
    metrics_port: int,
    *,
    retries: bool = True,
) -> list[str]:
    """The command line that runs gateway ``kind`` on loopback in front of ``workers``."""
    common = [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *workers,
        "--policy",
        policy,
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics_port),
        "--health-check-interval-secs",
        "1",
    ]
    if not retries:
        # smg 1.13 then forwards a request's body unparsed (chunked), see docs/backends.md.
        common.append("--disable-retries")
    if kind == "smg":
        return [
            str(binary),
            "launch",
            *common,
            "--log-level",
            "warn",
            "--shutdown-grace-period-secs",
            "1",
        ]
    return [str(binary), *common, "--log-level", "warning"]


def _get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def healthy_workers(base_url: str) -> set[str]:
    """The worker URLs the gateway at ``base_url`` lists as healthy (empty if it cannot say)."""
    try:
        body = _get_json(f"{base_url}/workers")
    except (OSError, ValueError):
        return set()
    rows = body.get("workers", []) if isinstance(body, dict) else []
    out: set[str] = set()
    for row in rows:
        if isinstance(row, dict) and row.get("is_healthy", True):
            url = row.get("url")
            if isinstance(url, str):
                out.add(url.rstrip("/"))
    return out


@dataclass
class Gateway:
    kind: str
    policy: str
    base_url: str
    workers: tuple[str, ...]
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def routing_key_header(self) -> str:
        return ROUTING_KEY_HEADER[self.kind]

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


class GatewayError(RuntimeError):
    """The gateway did not come up (its log tail is in the message)."""


def _stop(process: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@contextlib.contextmanager
def running_gateway(
    kind: str,
    policy: str,
    workers: Sequence[str],
    *,
    log_dir: Path,
    binary: Path | None = None,
    retries: bool = True,
    timeout_s: float = 60.0,
) -> Iterator[Gateway]:
    """Run gateway ``kind`` with ``policy`` in front of ``workers`` until the block ends.

    Raises :class:`GatewayError` (with the log tail) if it exits or does not list every worker
    as healthy within ``timeout_s``; it is stopped (SIGTERM to its process group, then SIGKILL)
    however the block ends.
    """
    binary = binary or gateway_binary(kind)
    if binary is None:
        raise GatewayError(f"{kind} is not set up: run `bash scripts/gateways.sh setup`")
    port = free_port()
    cmd = command(kind, binary, policy, workers, port, free_port(), retries=retries)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{kind}-{policy}-{port}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    gateway = Gateway(kind, policy, f"http://127.0.0.1:{port}", tuple(workers), process, log_path)
    try:
        wanted = {w.rstrip("/") for w in workers}
        deadline = time.monotonic() + timeout_s
        while healthy_workers(gateway.base_url) != wanted:
            if process.poll() is not None:
                raise GatewayError(
                    f"{kind} exited with {process.returncode}: {' '.join(cmd)}\n"
                    f"{gateway.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise GatewayError(
                    f"{kind} did not list {sorted(wanted)} as healthy within {timeout_s:.0f} s"
                    f" (it lists {sorted(healthy_workers(gateway.base_url))})\n"
                    f"{gateway.log_tail()}"
                )
            time.sleep(0.2)
        yield gateway
    finally:
        _stop(process)


def post_json(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None, timeout: float = 30.0
) -> tuple[int, Any]:
    """POST ``body`` as JSON; returns the status and the decoded answer (text if not JSON)."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")
