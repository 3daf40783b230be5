"""Bad input and faults get OpenAI-shaped errors naming the parameter, with the right status."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from serve_helpers import ServiceThread, load, reference_job, write_config

from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.serve.app import ServeOptions
from presto_client.serve.mapping import Limits
from tests.support.emulation import EmulationServer


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceThread]:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    options = ServeOptions(port=0, max_body_bytes=4096, limits=Limits(max_n=4, max_tokens=64))
    with ServiceThread(load(config), options) as s:
        yield s


def _post(
    service: ServiceThread,
    body: Any,
    path: str = "/v1/completions",
    timeout: float = 30,
    **kw: Any,
) -> Any:
    return httpx.post(f"{service.url}{path}", json=body, timeout=timeout, **kw)


def _error(response: httpx.Response, status: int, param: str | None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert set(error) == {"message", "type", "param", "code"}
    return str(error["message"])


def test_malformed_json_is_a_400(service: ServiceThread) -> None:
    r = httpx.post(
        f"{service.url}/v1/completions",
        content=b'{"model": "ref", "prompt": [1,',
        headers={"Content-Type": "application/json"},
    )
    assert "not valid JSON" in _error(r, 400, None)
    assert "JSON object" in _error(_post(service, [1, 2]), 400, None)


def test_unknown_field_is_named(service: ServiceThread) -> None:
    r = _post(service, {"model": "ref", "prompt": [1], "max_token": 8})
    message = _error(r, 400, "max_token")
    assert "unknown field 'max_token'" in message and "max_tokens" in message


def test_negative_max_tokens_is_refused(service: ServiceThread) -> None:
    r = _post(service, {"model": "ref", "prompt": [1], "max_tokens": -1})
    assert "greater than or equal to 1" in _error(r, 400, "max_tokens")


def test_temperature_is_refused_with_what_to_use(service: ServiceThread) -> None:
    client = openai.OpenAI(base_url=service.v1, api_key="unused")
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="ref", prompt=[1, 2], temperature=0.7)
    assert info.value.param == "temperature"
    assert "set alpha instead" in info.value.message
    # a client that always sends temperature (lm-eval) says alpha: temperature is ignored
    a = client.completions.create(
        model="ref", prompt=[1, 2], temperature=0.0, seed=1, extra_body={"alpha": 2.0}
    )
    assert a.model_extra["presto"]["ignored"] == ["temperature"]
    assert a.model_extra["presto"]["alpha"] == 2.0
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="ref", prompt=[1, 2], top_p=0.9)
    assert info.value.param == "top_p"


def test_power_sampling_settings_are_validated(service: ServiceThread) -> None:
    r = _post(service, {"model": "ref", "prompt": [1], "alpha": -2})
    assert "alpha" in _error(r, 400, "alpha")
    r = _post(service, {"model": "ref", "prompt": [1], "traversal": "dfs"})
    assert "valid traversals" in _error(r, 400, "traversal")
    r = _post(service, {"model": "ref", "prompt": [1], "max_tokens": 10, "block_size": 4})
    assert "multiple of block_size" in _error(r, 400, "max_tokens")


def test_max_tokens_is_split_into_equal_blocks(service: ServiceThread) -> None:
    client = openai.OpenAI(base_url=service.v1, api_key="unused")
    a = client.completions.create(model="ref", prompt=[1, 2], max_tokens=9, seed=2)
    presto = a.model_extra["presto"]
    assert (presto["block_size"], presto["num_blocks"]) == (9, 1)  # config: 2 blocks; 9 is odd
    a = client.completions.create(model="ref", prompt=[1, 2], max_tokens=12, seed=2)
    presto = a.model_extra["presto"]
    assert (presto["block_size"], presto["num_blocks"]) == (6, 2)
    assert len(a.choices[0].model_extra["token_ids"]) <= 12


def test_unknown_model_is_a_404(service: ServiceThread) -> None:
    client = openai.OpenAI(base_url=service.v1, api_key="unused")
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt=[1])
    assert info.value.code == "model_not_found" and "'ref'" in info.value.message
    assert [m.id for m in client.models.list()] == ["ref"]


def test_sizes_are_bounded(service: ServiceThread) -> None:
    r = _post(service, {"model": "ref", "prompt": [1] * 3000})
    assert "larger than" in _error(r, 413, None)
    r = _post(service, {"model": "ref", "prompt": [1], "n": 5})
    assert "limit 4 (serve.limits.max_n)" in _error(r, 400, "n")
    r = _post(service, {"model": "ref", "prompt": [1], "max_tokens": 65})
    assert "limit 64 (serve.limits.max_tokens)" in _error(r, 400, "max_tokens")
    r = _post(service, {"model": "ref", "prompt": [99]})
    assert "vocabulary" in _error(r, 400, "prompt")


def test_text_on_an_engine_without_a_tokenizer_says_what_to_send(service: ServiceThread) -> None:
    r = _post(service, {"model": "ref", "prompt": "hello"})
    assert "token ids" in _error(r, 400, "prompt")
    r = _post(service, {"model": "ref", "prompt": [1], "stop": ["x"]})
    assert "detokenize" in _error(r, 400, "stop")


def test_api_key(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    with ServiceThread(load(config), ServeOptions(port=0, api_key="s3cret")) as service:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=service.v1, api_key="wrong").completions.create(
                model="ref", prompt=[1]
            )
        assert httpx.get(f"{service.url}/v1/models").status_code == 401
        assert httpx.get(f"{service.url}/health").status_code == 200
        good = openai.OpenAI(base_url=service.v1, api_key="s3cret")
        assert good.completions.create(model="ref", prompt=[1], seed=1).choices


def test_the_cli_refuses_an_unset_api_key_variable(tmp_path: Path, capsys: Any) -> None:
    from presto_client.cli import main

    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    status = main(["serve", str(config), "--api-key-env", "PRESTO_TEST_UNSET_KEY_VAR"])
    assert status == 2
    assert "PRESTO_TEST_UNSET_KEY_VAR" in capsys.readouterr().err


def test_prompt_past_the_context_is_a_400(tmp_path: Path) -> None:
    with EmulationServer("vllm", vocab_size=32, max_model_len=32) as upstream:
        data = reference_job(tmp_path / "run")
        data["engines"] = [{"kind": "vllm", "name": "emu", "base_url": upstream.base_url}]
        config = write_config(tmp_path / "job.yaml", data)
        with ServiceThread(load(config)) as service:
            r = _post(service, {"model": "emu", "prompt": [1] * 28})
            message = _error(r, 400, "max_tokens")
            assert "context is 32" in message
            r = _post(service, {"model": "emu", "prompt": [1] * 40})
            assert _error(r, 400, "prompt")


def test_upstream_down_is_a_503_and_nothing_hangs(tmp_path: Path) -> None:
    upstream = EmulationServer("vllm", vocab_size=32).start()
    data = reference_job(tmp_path / "run")
    data["engines"] = [
        {
            "kind": "vllm",
            "name": "emu",
            "base_url": upstream.base_url,
            "max_retries": 0,
            "connect_timeout_s": 10,  # (a stopped upstream refuses at once; 2 s failed at load 8)
            "restart_window_s": 0,
        }
    ]
    config = write_config(tmp_path / "job.yaml", data)
    with ServiceThread(load(config)) as service:
        client = openai.OpenAI(base_url=service.v1, api_key="unused", max_retries=0)
        assert client.completions.create(model="emu", prompt=[1, 2], seed=1).choices
        upstream.stop()
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model="emu", prompt=[1, 2], seed=1, timeout=30)
        assert info.value.status_code == 503
        assert "upstream engine is unavailable" in info.value.message
        stream = client.completions.create(model="emu", prompt=[1, 2], seed=1, stream=True)
        with pytest.raises(openai.APIError, match="unavailable"):
            list(stream)


GATE_S = 150.0
"""How long a gated proposal waits at most: past the test's own deadline (60 s) and its
requests' timeout (120 s), so on a starved machine a request still waits rather than ends."""


class _GatedEngine(ReferenceEngine):
    """The reference engine whose proposals wait until the test opens the gate."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__(ReferenceModel(16), name="ref")
        self.gate = gate

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        if not self.gate.is_set():  # (a worker thread waits; the test sets the gate at its end)
            await asyncio.to_thread(self.gate.wait, GATE_S)
        return await super().generate(requests)

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        if not self.gate.is_set():  # (the stream traversal streams its extensions too)
            await asyncio.to_thread(self.gate.wait, GATE_S)
        async for chunk in super().stream(request):
            yield chunk


def test_beyond_the_queue_bound_is_a_429_with_retry_after(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    gate = threading.Event()
    options = ServeOptions(port=0, max_active=1, max_queue=1)
    with ServiceThread(load(config), options, replicas=[_GatedEngine(gate)]) as service:
        body = {"model": "ref", "prompt": [1, 2], "seed": 1, "traversal": "sequential"}
        results: list[httpx.Response | BaseException] = []

        def send() -> None:
            try:
                results.append(_post(service, body, timeout=120))
            except Exception as exc:  # (said by the wait below, not lost in a thread)
                results.append(exc)

        admission = service.running.service.admission  # type: ignore[union-attr]
        threads = [threading.Thread(target=send) for _ in range(2)]
        # One request at a time, each waited for against a deadline (not a count of polls: on
        # a loaded 2-core machine a request can take seconds to reach admission, and a third
        # sent before then is queued, not refused).
        for thread, state in zip(threads, [(1, 0), (1, 1)], strict=True):
            thread.start()
            deadline = time.monotonic() + 60
            while (now := service.call(lambda: (admission.active, admission.waiting))) != state:
                assert time.monotonic() < deadline and not results, (
                    f"(active, waiting) is {now}, not {state}; answers so far: {results}"
                )
                threading.Event().wait(0.01)
        refused = _post(service, body)
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "queue_full"
        gate.set()
        for t in threads:
            t.join(timeout=30)
        answers = [r for r in results if isinstance(r, httpx.Response)]
        assert [r.status_code for r in answers] == [200, 200], results
        assert (
            answers[0].json()["choices"][0]["token_ids"]
            == (answers[1].json()["choices"][0]["token_ids"])
        )
        metrics = httpx.get(f"{service.url}/metrics").text
        assert 'presto_serve_requests_total{endpoint="/v1/completions",status="429"} 1' in metrics
        assert "presto_serve_chains_total 2" in metrics


def test_deadline_is_a_504(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    gate = threading.Event()
    options = ServeOptions(port=0, request_timeout_s=0.3)
    with ServiceThread(load(config), options, replicas=[_GatedEngine(gate)]) as service:
        r = _post(service, {"model": "ref", "prompt": [1, 2], "seed": 1})
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        gate.set()


_UPSTREAM = """
import sys, time
from tests.support.emulation import EmulationServer
server = EmulationServer("vllm", vocab_size=32).start()
server.faults.delay_s = 0.05  # slow answers (and streamed events): a request is under way
print(server.base_url, flush=True)
time.sleep(600)
"""


def _upstream_process() -> Any:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "-c", _UPSTREAM], stdout=subprocess.PIPE, text=True, env=env
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_dead_upstream_fails_running_requests_as_soon_as_it_is_known(
    tmp_path: Path, stream: bool
) -> None:
    """Issue 48, item 4: with the upstream killed, /health said 503 at once but a request rode
    out its restart window (the default: a minute of backoff against a dead port) before its
    503. The service's health check, once it finds the upstream unreachable twice in a row,
    now ends the running requests with a 503 naming it: within seconds."""
    upstream = _upstream_process()
    try:
        assert upstream.stdout is not None
        url = upstream.stdout.readline().strip()
        data = reference_job(tmp_path / "run")
        data["engines"] = [{"kind": "vllm", "name": "emu", "base_url": url}]  # the defaults
        config = write_config(tmp_path / "job.yaml", data)
        with ServiceThread(load(config)) as service:
            client = openai.OpenAI(base_url=service.v1, api_key="unused", max_retries=0)
            errors: list[BaseException] = []

            def ask() -> None:
                try:
                    answer = client.completions.create(
                        model="emu", prompt=[1, 2], seed=1, stream=stream, timeout=120
                    )
                    if stream:
                        list(answer)  # type: ignore[arg-type]
                except openai.APIError as exc:
                    errors.append(exc)

            thread = threading.Thread(target=ask)
            thread.start()
            engine = service.running.service.engine  # type: ignore[union-attr]
            deadline = time.monotonic() + 60  # (a deadline: polls are slow under load)
            while service.call(lambda: engine.in_flight) == 0:
                assert time.monotonic() < deadline, "the request never reached the engine"
                threading.Event().wait(0.01)
            upstream.kill()
            upstream.wait(timeout=10)
            killed = time.monotonic()
            thread.join(timeout=60)
            said = time.monotonic() - killed
            assert not thread.is_alive() and errors, "the request outlived its upstream"
            # (what it took: `pytest -k dead_upstream -o log_cli=true --log-cli-level=INFO`)
            logging.getLogger(__name__).info("answered %.2f s after the upstream died", said)
            assert said < 15.0, said  # (2 checks a second apart; the default window is 60 s)
            assert "upstream engine is unreachable" in str(errors[0]), errors[0]
    finally:
        upstream.kill()
        upstream.wait(timeout=10)


def test_an_upstream_that_dies_mid_request_is_a_503(tmp_path: Path) -> None:
    upstream = _upstream_process()
    try:
        assert upstream.stdout is not None
        url = upstream.stdout.readline().strip()
        data = reference_job(tmp_path / "run")
        data["engines"] = [
            {
                "kind": "vllm",
                "name": "emu",
                "base_url": url,
                "max_retries": 0,
                "restart_window_s": 0,
                "connect_timeout_s": 2,
            }
        ]
        config = write_config(tmp_path / "job.yaml", data)
        with ServiceThread(load(config)) as service:
            answers: list[httpx.Response] = []
            body = {"model": "emu", "prompt": [1, 2], "seed": 1}
            thread = threading.Thread(target=lambda: answers.append(_post(service, body)))
            thread.start()
            engine = service.running.service.engine  # type: ignore[union-attr]
            deadline = time.monotonic() + 60  # (a deadline: polls are slow under load)
            while service.call(lambda: engine.in_flight) == 0:
                assert time.monotonic() < deadline, "the request never reached the engine"
                threading.Event().wait(0.01)
            upstream.kill()  # the engine dies mid-request: its connections are reset
            upstream.wait(timeout=10)
            thread.join(timeout=20)
            assert not thread.is_alive()
            assert answers[0].status_code == 503, answers[0].text
            assert "unavailable" in answers[0].json()["error"]["message"]
            assert service.call(lambda: engine.in_flight) == 0
    finally:
        upstream.kill()
        upstream.wait(timeout=10)
