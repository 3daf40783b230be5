"""The probe's gateway checks without a gateway: worker lists as the real binaries answer them
(recorded from smg 1.13.0 and vllm-router 0.1.17), and what the probe makes of them.

The gateway tier (tests/integration/test_gateways_real.py) runs the same checks against the
binaries themselves.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from presto_client.backends import EngineSpec, create_engine
from presto_client.backends.gateways import parse_workers, routing_findings
from presto_client.errors import ProbeError
from presto_client.orchestration.engines.opening import describe_probe
from tests.support.emulation import EmulationServer
from tests.support.memory_pool import Answer, MemoryPool, Sent, json_answer, text_answer

SMG_WORKERS: dict[str, Any] = {
    "workers": [
        {
            "id": "01a23441-98d9-773b-83d5-e1063feb0d93",
            "model_id": "reference-64",
            "url": f"http://127.0.0.1:{port}",
            "models": [{"id": "reference-64", "model_type": ["completions"]}],
            "worker_type": "regular",
            "connection_mode": "http",
            "runtime_type": "vllm",
            "priority": 50,
            "cost": 1.0,
            "is_healthy": True,
            "status": "ready",
            "load": 0,
        }
        for port in (42711, 42712)
    ]
}
VLLM_ROUTER_WORKERS: dict[str, Any] = {
    "workers": [
        {
            "url": f"http://127.0.0.1:{port}",
            "model_id": "unknown",
            "worker_type": "regular",
            "is_healthy": True,
            "load": 0,
            "connection_mode": "Http",
            "priority": 50,
            "cost": 1.0,
        }
        for port in (36659, 35851)
    ],
    "total": 2,
    "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": 2},
}
SMG_REFUSAL = {
    "error": {
        "message": "Invalid JSON data: Failed to deserialize the JSON body into the target type: "
        "prompt: data did not match any variant of untagged enum StringOrArray at line 1 "
        "column 45",
        "type": "invalid_request_error",
        "param": "prompt",
        "code": "invalid_type",
    }
}


def test_the_worker_lists_name_their_gateway() -> None:
    smg = parse_workers(SMG_WORKERS)
    router = parse_workers(VLLM_ROUTER_WORKERS)
    assert smg is not None and (smg.name, smg.workers) == ("smg", 2)
    assert router is not None and (router.name, router.workers) == ("vllm-router", 2)
    other = parse_workers({"workers": [{"url": "http://a:1"}]})
    assert other is not None and other.name == "a gateway" and not other.known
    for body in ({"error": "Not Found"}, [], {"workers": [{"host": "a"}]}, {"workers": "x"}):
        assert parse_workers(body) is None


def test_a_header_the_gateway_does_not_read_is_refused_and_a_missing_one_warned() -> None:
    smg = parse_workers(SMG_WORKERS)
    problems, _ = routing_findings(smg, "x-session-id")
    assert len(problems) == 1 and "x-smg-routing-key" in problems[0]
    router = parse_workers(VLLM_ROUTER_WORKERS)
    problems, _ = routing_findings(router, "x-smg-routing-key")
    assert len(problems) == 1 and "set routing_key_header: x-session-id" in problems[0]
    assert routing_findings(router, "X-Session-Id") == ([], [])  # header names ignore case
    problems, warnings = routing_findings(router, None)
    assert not problems and "--policy consistent_hash" in warnings[0]
    problems, warnings = routing_findings(None, "x-session-id")
    assert not problems and "lists no workers" in warnings[0]
    assert routing_findings(None, None) == ([], [])


class _Gateway:
    """A gateway at one URL: its worker list, and the emulation's answers behind it (the
    SGLang dialect's /generate, the vLLM one's /v1/completions, or smg's refusal of it)."""

    def __init__(self, workers: dict[str, Any] | None, dialect: str, *, smg: bool = False):
        self.workers = workers
        self.server = EmulationServer(dialect, vocab_size=32)
        self.smg = smg
        self.generations = 0

    def answer(self, sent: Sent) -> Answer:
        s = self.server
        if sent.path == "/workers" and self.workers is not None:
            return json_answer(200, self.workers)
        if sent.path == "/health":
            return text_answer(200, "OK")
        if sent.path == "/v1/models":
            return json_answer(200, s.vllm_models())
        if sent.path == "/get_model_info":
            return json_answer(200, {"model_path": s.model_name, "is_generation": True})
        if sent.path == "/v1/completions" and self.smg:
            return json_answer(400, SMG_REFUSAL)
        if sent.path in ("/v1/completions", "/generate"):
            self.generations += 1
            body = json.loads(sent.body)
            answer = s.vllm_completion(body) if s.dialect == "vllm" else s.sglang_generate(body)
            return json_answer(200, answer)
        return json_answer(404, {"error": {"message": f"Not Found: {sent.path}"}})


async def _probe(gateway: _Gateway, kind: str, header: str | None = None) -> Any:
    spec = EngineSpec(kind, ("http://gw:1",), name="gw", max_retries=0, routing_key_header=header)
    engine = create_engine(spec, pool=MemoryPool(gateway.answer))
    try:
        return await engine.probe(check_scoring=False)
    finally:
        await engine.aclose()


async def test_sglang_through_vllm_router_is_refused_before_any_generation() -> None:
    gateway = _Gateway(VLLM_ROUTER_WORKERS, "sglang")
    with pytest.raises(ProbeError, match=r"(?s)\[gw\].*vllm-router.*drops top_logprobs_num.*smg"):
        await _probe(gateway, "sglang", "x-session-id")
    assert gateway.generations == 0


async def test_token_ids_refused_by_smg_are_explained() -> None:
    with pytest.raises(
        ProbeError, match=r"(?s)\[gw\].*smg.*refuses token-id prompts.*kind: sglang.*vllm-router"
    ):
        await _probe(_Gateway(SMG_WORKERS, "vllm", smg=True), "vllm", "x-smg-routing-key")


async def test_a_wrong_header_is_refused_and_a_right_one_names_the_gateway() -> None:
    with pytest.raises(ProbeError, match="does not read it"):
        await _probe(_Gateway(VLLM_ROUTER_WORKERS, "vllm"), "vllm", "x-smg-routing-key")
    report = await _probe(_Gateway(VLLM_ROUTER_WORKERS, "vllm"), "vllm", "x-session-id")
    assert report.gateway == "vllm-router" and not report.warnings
    assert "through the gateway vllm-router" in describe_probe("gw", report)[0]
    report = await _probe(_Gateway(None, "vllm"), "vllm", "x-session-id")
    assert report.gateway is None and any("lists no workers" in w for w in report.warnings)
