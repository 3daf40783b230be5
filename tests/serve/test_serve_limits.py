"""One request cannot freeze ``presto serve``: every per-request setting has the server's bound.

A request above a bound is a 400 naming it (``serve.limits.NAME``) before any work that grows
with it; a heavy request within the bounds leaves the event loop free for other clients.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_helpers import ServiceThread, load, reference_job, write_config

from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.errors import ConfigError
from presto_client.orchestration.config.serve_config import ServeLimits
from presto_client.serve.app import ServeOptions
from presto_client.serve.mapping import blocks_for, check_config_within


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceThread]:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    with ServiceThread(load(config), ServeOptions(port=0)) as s:
        yield s


def _post(service: ServiceThread, body: dict[str, Any], timeout: float = 30) -> httpx.Response:
    return httpx.post(
        f"{service.url}/v1/completions",
        json={"model": "ref", "prompt": [1, 2, 3], **body},
        timeout=timeout,
    )


def _refused(response: httpx.Response, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    return str(error["message"])


@pytest.mark.parametrize(
    ("body", "param", "named"),
    [
        (
            {"steps_per_block": 30000},
            "steps_per_block",
            "limit 1024 (serve.limits.max_steps_per_block)",
        ),
        ({"steps_per_block": 10**9}, "steps_per_block", "serve.limits.max_steps_per_block"),
        (
            {"max_tokens": 100000007, "num_blocks": 100000006},
            "max_tokens",
            "limit 4096 (serve.limits.max_tokens)",
        ),
        ({"num_blocks": 100000}, "num_blocks", "serve.limits.max_num_blocks"),
        ({"block_size": 100000}, "block_size", "serve.limits.max_tokens"),
        ({"n_pf": 1000000}, "n_pf", "limit 64 (serve.limits.max_n_pf)"),
        ({"window": 1000000}, "window", "serve.limits.max_window"),
        ({"sampler": "multi_try_mh", "k_try": 100000}, "k_try", "serve.limits.max_k_try"),
        (
            {"sampler": {"kind": "multi_try_mh", "k_try": 100000}},
            "k_try",
            "serve.limits.max_k_try",
        ),
        (
            {"sampler": "multi_try_mh", "temperatures": [0.5] * 100000},
            "temperatures",
            "temperatures: a list of 100000 is above this server's limit 64 "
            "(serve.limits.max_temperatures)",
        ),
        (
            {"sampler": {"kind": "multi_try_mh", "temperatures": [0.5] * 1000}},
            "temperatures",
            "serve.limits.max_temperatures",
        ),
        ({"n": 17}, "n", "limit 16 (serve.limits.max_n)"),
        ({"prompt": [[1]] * 65}, "prompt", "serve.limits.max_prompts"),
        ({"prompt": [[1]] * 8, "n": 9}, "n", "serve.limits.max_chains"),
        ({"stop": ["x"] * 17}, "stop", "serve.limits.max_stops"),
        (
            {"n": 16, "steps_per_block": 1024, "num_blocks": 64, "max_tokens": 64},
            "steps_per_block",
            "serve.limits.max_transitions",
        ),
    ],
)
def test_a_setting_above_the_servers_bound_is_a_400_naming_it(
    service: ServiceThread, body: dict[str, Any], param: str, named: str
) -> None:
    start = time.perf_counter()
    response = _post(service, body)
    assert named in _refused(response, param)
    assert response.json()["error"]["code"] == "limit_exceeded"
    assert time.perf_counter() - start < 5  # refused before any work that grows with it


def test_the_divisor_scan_is_bounded() -> None:
    for length in range(1, 200):
        for blocks in range(1, 30):
            want = max(b for b in range(1, min(blocks, length) + 1) if length % b == 0)
            assert blocks_for(length, blocks) == (length // want, want)
    start = time.perf_counter()
    assert blocks_for(1_000_000_007, 1_000_000_006) == (1_000_000_007, 1)  # a prime
    assert time.perf_counter() - start < 0.5


def test_zero_blocks_and_bad_types_are_400s(service: ServiceThread) -> None:
    assert _post(service, {"max_tokens": 8, "block_size": 0}).status_code == 400
    assert _post(service, {"max_tokens": 8, "num_blocks": 0}).status_code == 400
    assert _post(service, {"block_size": 0}).status_code == 400
    assert _post(service, {"num_blocks": 0}).status_code == 400
    assert "valid number" in _refused(_post(service, {"alpha": True}), "alpha")
    _refused(_post(service, {"n": True}), "n")
    _refused(_post(service, {"n": "2"}), "n")
    _refused(_post(service, {"max_tokens": "8"}), "max_tokens")
    _refused(_post(service, {"prompt": [True, 2]}), "prompt")
    _refused(_post(service, {"sampler": {"kind": "multi_try_mh", "k_try": True}}), "k_try")
    ok = _post(service, {"alpha": 2, "n": 2, "seed": 1})  # an integer is a float
    assert ok.status_code == 200, ok.text


def test_a_second_client_is_answered_while_a_heavy_request_runs(service: ServiceThread) -> None:
    heavy: list[httpx.Response] = []
    body = {"steps_per_block": 1024, "num_blocks": 2, "max_tokens": 8, "n": 2, "seed": 3}
    thread = threading.Thread(target=lambda: heavy.append(_post(service, body, timeout=120)))
    thread.start()
    engine = service.running.service.engine  # type: ignore[union-attr]
    for _ in range(500):  # the heavy request's chains are under way
        if service.call(lambda: engine.in_flight) > 0 or heavy:
            break
        time.sleep(0.01)
    # and one far above the bounds (it froze the loop for minutes) is refused at once
    start = time.perf_counter()
    assert _post(service, {"steps_per_block": 10**9}, timeout=10).status_code == 400
    assert time.perf_counter() - start < 2
    waits: list[float] = []
    while thread.is_alive() and len(waits) < 20:
        start = time.perf_counter()
        assert httpx.get(f"{service.url}/health", timeout=10).status_code == 200
        small = _post(service, {"max_tokens": 2, "seed": 1}, timeout=10)
        assert small.status_code == 200, small.text
        waits.append(time.perf_counter() - start)
    thread.join(timeout=120)
    assert heavy and heavy[0].status_code == 200, heavy
    assert waits and max(waits) < 2.0, waits


def test_the_limits_come_from_the_config_and_the_command_line(tmp_path: Path) -> None:
    import argparse

    from presto_client.serve.command import options_from

    data = reference_job(tmp_path / "run")
    data["serve"] = {"limits": {"max_steps_per_block": 8, "max_n": 3}}
    cfg = load(write_config(tmp_path / "job.yaml", data))
    args = argparse.Namespace(
        host="127.0.0.1",
        port=0,
        traversal="stream",
        model_name=None,
        api_key_env=None,
        max_active=4,
        max_queue=4,
        request_timeout=60.0,
        max_body_bytes=1 << 20,
        max_n=2,
        max_tokens=None,
        no_probe=False,
    )
    options = options_from(args, cfg)
    assert options.limits.max_n == 2  # the command line over the config
    assert options.limits.max_steps_per_block == 8
    assert options.limits.max_tokens == ServeLimits().max_tokens
    with ServiceThread(cfg, ServeOptions(port=0)) as service:  # the config's own limits
        message = _refused(_post(service, {"steps_per_block": 9}), "steps_per_block")
        assert message == (
            "steps_per_block 9 is above this server's limit 8 (serve.limits.max_steps_per_block)"
        )
    data["serve"] = {"limits": {"max_steps_per_block": 2}}  # below the config's own K = 4
    cfg = load(write_config(tmp_path / "job.yaml", data))
    with pytest.raises(ConfigError, match=r"serve\.limits\.max_steps_per_block"):
        check_config_within(cfg, cfg.serve.limits)  # (the service checks it as it starts)


class _BusyEngine(ReferenceEngine):
    """The reference engine whose every proposal call first spins the interpreter for 0.5 s:
    chain work that never awaits (a saturated client parsing and walking)."""

    def __init__(self) -> None:
        super().__init__(ReferenceModel(16), name="ref")

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        _spin(0.5)
        return await super().generate(requests)

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        _spin(0.5)
        async for chunk in super().stream(request):
            yield chunk


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_health_answers_while_chain_work_holds_the_interpreter(tmp_path: Path) -> None:
    """Issue 48, item 3: the chains ran on the service's own loop, so a busy chain held
    /health for as long as it computed (here 0.5 s a call); on their own thread they leave it
    a turn every millisecond."""
    cfg = load(write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run")))
    with ServiceThread(cfg, replicas=[_BusyEngine()]) as service:
        busy: list[httpx.Response] = []
        body = {"steps_per_block": 4, "num_blocks": 2, "max_tokens": 8, "seed": 1}
        thread = threading.Thread(target=lambda: busy.append(_post(service, body, timeout=60)))
        thread.start()
        time.sleep(0.3)  # (the request's first proposal call is spinning)
        waits = []
        while thread.is_alive() and len(waits) < 8:
            start = time.perf_counter()
            assert httpx.get(f"{service.url}/health", timeout=10).status_code == 200
            waits.append(time.perf_counter() - start)
        thread.join(timeout=60)
    assert busy and busy[0].status_code == 200, busy
    assert len(waits) >= 3 and max(waits) < 0.25, waits
