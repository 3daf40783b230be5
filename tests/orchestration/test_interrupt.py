"""Ctrl-C on a real ``presto run`` process: a clean stop, files intact, and a resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest


def _start_job_and_wait_for_two_chains(
    write_config: Callable[..., Path], tmp_path: Path
) -> tuple[subprocess.Popen[str], list[str], dict[str, str], Path]:
    """Start `presto run` on a slow reference job; return once two chains are on disk."""
    config = write_config(
        engines=[{"kind": "reference", "name": "ref", "vocab_size": 6, "latency_s": 0.01}],
        max_active_chains=2,
    )
    cmd = [sys.executable, "-m", "presto_client.cli", "run", str(config), "--no-progress"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    samples = tmp_path / "run" / "samples.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if samples.exists() and samples.read_text().count("\n") >= 2:
            break
        time.sleep(0.02)
    return proc, cmd, env, samples


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigint_stops_cleanly_and_rerun_resumes(
    write_config: Callable[..., Path], tmp_path: Path
) -> None:
    proc, cmd, env, samples = _start_job_and_wait_for_two_chains(write_config, tmp_path)
    assert proc.poll() is None, "the job finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "rerun the same command to resume" in err
    assert "Traceback" not in err
    done = [json.loads(line) for line in samples.read_text().splitlines()]
    assert 2 <= len(done) < 16
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["chains_ok"] == len(done)
    # rerun: only the rest runs
    rerun = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert "already finished" in rerun.stdout
    ids = [json.loads(line)["chain_id"] for line in samples.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 16


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_stops_like_ctrl_c(write_config: Callable[..., Path], tmp_path: Path) -> None:
    """A scheduler's / ``timeout``'s SIGTERM: a clean stop (exit 143), the session closed."""
    proc, *_ = _start_job_and_wait_for_two_chains(write_config, tmp_path)
    assert proc.poll() is None, "the job finished before it could be terminated"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "terminated (SIGTERM)" in err and "rerun the same command to resume" in err
    assert "Traceback" not in err
    sessions = json.loads((tmp_path / "run" / "run.json").read_text())["sessions"]
    assert sessions[-1]["finished"] is not None and sessions[-1]["completed"] is False
