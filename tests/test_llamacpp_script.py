"""scripts/llamacpp.sh without building anything: a set-up cache is reused as it is, and the
commands that cannot work say why. Run against a fake cache (``PRESTO_LLAMACPP_HOME`` in a
temporary folder)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "llamacpp.sh"

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("flock") is None, reason="needs bash and flock"
)


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PRESTO_LLAMACPP_HOME": str(home)}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_set_up_cache_is_reused_without_building(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    binary = tmp_path / "bin" / "llama-server-0.3.36"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    result = run(tmp_path, "setup")
    assert result.returncode == 0, result.stderr
    assert "already set up" in result.stderr
    assert not (tmp_path / "downloads").exists()


def test_start_before_setup_and_status_of_nothing_say_so(tmp_path: Path) -> None:
    port = str(free_port())
    start = run(tmp_path, "start", "--port", port)
    assert start.returncode != 0 and "not set up" in start.stderr
    status = run(tmp_path, "status", "--port", port)
    assert status.returncode == 3 and "health=000" in status.stdout
    usage = run(tmp_path, "bogus")
    assert usage.returncode != 0 and "usage" in usage.stderr
