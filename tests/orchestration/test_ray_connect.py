"""Joining a Ray cluster that is not there: a clear error naming ``executor.address``, quickly,
before anything is written (no Ray instance is started here)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from orch_helpers import make_config

from presto_client.errors import ConfigError
from presto_client.orchestration.job import run_job
from presto_client.orchestration.loading import load_prompts
from presto_client.orchestration.plan import make_plan

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
