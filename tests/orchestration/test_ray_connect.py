"""Joining a Ray cluster that is not there: a clear error naming ``executor.address``, quickly,
before anything is written (no Ray instance is started here)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from orch_helpers import make_config

from presto_client.errors import ConfigError
from presto_client.orchestration.job import run_job
from presto_client.orchestration.planning.plan import make_plan
from presto_client.orchestration.prompts.prompt_rows import load_prompts

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("127.0.0.1:9", r"executor\.address '127\.0\.0\.1:9': no Ray cluster answers there"),
        ("ray://127.0.0.1:9", r"executor\.address 'ray://127\.0\.0\.1:9': no Ray cluster"),
        ("auto", r"executor\.address: could not start or join the cluster at 'auto'"),
    ],
)
def test_an_unreachable_address_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, address: str, message: str
) -> None:
    if ray.is_initialized():
        pytest.skip("this process is in a Ray session already (a job would use it)")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = tmp_path / "run"
    cfg = make_config(
        out, executor={"kind": "ray", "workers": 2, "address": address, "connect_timeout_s": 2}
    )
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=message):
        run_job(make_plan(cfg, load_prompts(cfg)))
    assert time.perf_counter() - start < 15
    assert not out.exists()
    assert not ray.is_initialized()


LOCAL_INSTANCE = """
import asyncio, json, os
from presto_client.orchestration.planned import ExecutorSettings
from presto_client.orchestration.executors.ray_executor import RaySession

async def main():
    session = await RaySession.connect(ExecutorSettings(kind="ray", workers=1))
    import ray
    from ray._raylet import AuthenticationMode, get_authentication_mode
    print(json.dumps({
        "token": get_authentication_mode() == AuthenticationMode.TOKEN,
        "secret": len(os.environ.get("RAY_AUTH_TOKEN", "")),
        "nodes": [n["NodeManagerAddress"] for n in ray.nodes()],
    }))
    session.close()

asyncio.run(main())
"""


def test_a_local_instance_answers_this_process_only(tmp_path: Path) -> None:
    """The local Ray instance a job starts takes only calls that carry this process's token:
    Ray's servers listen on every interface and Ray will not use a loopback node address, so
    the token is what keeps others out (issue 38 item 6)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    out = subprocess.run(
        [sys.executable, "-c", LOCAL_INSTANCE],
        capture_output=True,
        text=True,
        timeout=240,
        env={**env, "HOME": str(tmp_path)},  # no token of the user's
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["token"] is True and seen["secret"] == 64
    assert len(seen["nodes"]) == 1
    assert not (tmp_path / ".ray" / "auth_token").exists()  # the token never went to disk
