"""``presto serve`` as a command: it starts, answers the openai SDK, and stops on SIGTERM."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from serve_helpers import reference_job, write_config

from presto_client.errors import ConfigError
from presto_client.orchestration.config import executor_config
from presto_client.orchestration.config.loading import validate_job_config
from presto_client.serve.command import run_serve

ROOT = Path(__file__).resolve().parents[2]


def test_presto_serve_command(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "PRESTO_TEST_KEY": "k3y",
    }
    cmd = [sys.executable, "-m", "presto_client.cli", "serve", str(config), "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--api-key-env", "PRESTO_TEST_KEY"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            match = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
            url = match.group(1) if match else None
        assert url is not None, "presto serve did not say where it listens"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k3y")
        answer = client.completions.create(model="ref", prompt=[1, 2, 3], seed=7)
        assert answer.choices[0].model_extra["token_ids"]
        assert answer.model_extra["presto"]["seed"] == 7
    finally:
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=30)
    assert status == 0
    assert "k3y" not in (proc.stderr.read() if proc.stderr else "")


def test_presto_serve_refuses_the_ray_executor(tmp_path: Path) -> None:
    """``presto serve`` runs its chains in its own process: a config asking for Ray workers is
    refused, not silently served locally."""
    data = reference_job(tmp_path / "run")
    data["executor"] = {"kind": "ray", "workers": 1}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(executor_config, "ray_installed", lambda: True)
        cfg = validate_job_config(data)
    with pytest.raises(ConfigError, match=r"executor\.kind ray: presto serve runs every chain"):
        run_serve(argparse.Namespace(traversal="stream"), cfg)
