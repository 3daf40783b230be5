"""``routing_key_header``: what a config may name, and the chain's key on every request it sends.

The engine runs over an in-memory pool in front of the emulation's vLLM dialect (its pure
answers, no sockets), so every request a job sends is seen with the headers it carried.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from orch_helpers import make_config

from presto_client.backends import EngineSpec, create_engine
from presto_client.backends.http_engine import HttpEngine
from presto_client.backends.pool import Reply
from presto_client.backends.routing import RoutedEngine
from presto_client.errors import ConfigError
from presto_client.orchestration.job import run_job_async
from presto_client.orchestration.planned import routing_key
from tests.support.emulation import BadRequest, EmulationServer
from tests.support.memory_pool import Answer, MemoryPool, Sent, json_answer, text_answer
from tests.support.plans import plan_of

HEADER = "x-session-id"


class RecordingPool(MemoryPool):
    """The in-memory pool, also keeping the very header mapping each request was given."""

    def __init__(self, server: EmulationServer) -> None:
        super().__init__(self._answer_of)
        self.server = server
        self.given: list[Mapping[str, str]] = []

    def _answer_of(self, sent: Sent) -> Answer:
        s = self.server
        if sent.path == "/v1/models":
            return json_answer(200, s.vllm_models())
        if sent.path == "/health":
            return text_answer(200, "")
        if sent.path == "/metrics":
            return text_answer(200, s.vllm_metrics())
        if sent.path != "/v1/completions":
            return json_answer(404, {"error": {"message": f"Not Found: {sent.path}"}})
        body = json.loads(sent.body)
        if body.get("stream"):
            events = [f"data: {json.dumps(e)}\n\n".encode() for e in s.vllm_stream_events(body)]
            return Answer(200, headers={"Content-Type": "text/event-stream"}, chunks=events)
        try:
            return json_answer(200, s.vllm_completion(body))
        except BadRequest as exc:  # (as the server answers it: the vocabulary probe's refusal)
            return json_answer(exc.status, {"error": {"message": exc.message}})

    async def fetch(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        max_bytes: int,
    ) -> Reply:
        self.given.append(headers)
        return await super().fetch(method, url, body, headers, max_bytes=max_bytes)

    async def open(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]
    ) -> Any:
        self.given.append(headers)
        return await super().open(method, url, body, headers)


def _engine(mode: str, header: str | None = HEADER) -> tuple[HttpEngine, RecordingPool]:
    logprobs = "processed_logprobs" if mode == "processed" else "raw_logprobs"
    server = EmulationServer("vllm", vocab_size=32, logprobs_mode=logprobs, max_logprobs=-1)
    pool = RecordingPool(server)
    spec = EngineSpec(
        "vllm",
        ("http://gateway:1",),
        logprob_mode=mode,
        top_k=5,
        name="gw",
        vocab_size=32,
        routing_key_header=header,
    )
    return create_engine(spec, pool=pool), pool


def _job(tmp_path: Path, seed: int = 7, mode: str = "raw") -> Any:
    return make_config(
        tmp_path,
        engines=[
            {
                "kind": "vllm",
                "name": "gw",
                "base_url": "http://gateway:1",
                "logprob_mode": mode,
                "routing_key_header": HEADER,
                "vocab_size": 32,
                "top_k": 5,
            }
        ],
        prompts={"token_ids": [[1, 2, 3], [4, 5]]},
        sampler={"traversals": ["sequential", "crn", "stream"]},
        seed=seed,
    )


@pytest.mark.parametrize(
    "name",
    [
        "Content-Type",
        "authorization",
        "HOST",
        "Content-Length",
        "x key",
        "x:y",
        "",
        # hop-by-hop, body-changing and credential headers (issue 38)
        "content-encoding",
        "Content-Range",
        "proxy-connection",
        "X-Api-Key",
        "x-forwarded-for",
        "range",
    ],
)
def test_a_header_the_request_needs_or_no_header_name_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=r"engines\[0\]\.routing_key_header: .*x-session-id"):
        make_config(
            Path("/nonexistent"),
            engines=[{"kind": "vllm", "base_url": "http://a:1", "routing_key_header": name}],
        )
    with pytest.raises(ConfigError, match="routing_key_header: "):
        EngineSpec("vllm", ("http://a:1",), routing_key_header=name)


@pytest.mark.parametrize("mode", ["raw", "processed"])
async def test_every_request_of_a_chain_carries_its_key_and_the_probe_none(
    tmp_path: Path, mode: str
) -> None:
    engine, pool = _engine(mode)
    await engine.probe()
    assert pool.sent and all(HEADER not in s.headers for s in pool.sent)
    probe_requests = len(pool.sent)

    plan = plan_of(_job(tmp_path / "run", mode=mode))
    result = await run_job_async(plan, engine_overrides={"gw": [engine]})
    assert result.failed == 0 and result.completed == 2 * 2 * 3
    sent = pool.sent[probe_requests:]
    # (the run's vocabulary probe, a logit_bias past the vocabulary, is no chain's request)
    work = [
        s for s in sent if s.path == "/v1/completions" and "logit_bias" not in json.loads(s.body)
    ]
    # proposals (streamed in raw mode) and scoring calls (processed: each proposal's second
    # call; raw: exact scores that settle a decision)
    assert any(json.loads(s.body).get("stream") for s in work) == (mode == "raw")
    assert any(json.loads(s.body).get("prompt_logprobs") for s in work)
    assert all(HEADER in s.headers for s in work)
    keys = {s.headers[HEADER] for s in work}
    # one key per (prompt, chain), shared by its arms (they replay one chain's prefixes)
    expected = {routing_key(plan.fingerprint, f"p{p}/c{c}") for p in range(2) for c in range(2)}
    assert keys == expected
    # the run's own reads (model, version, metrics) are not a chain's: no key
    assert all(HEADER not in s.headers for s in sent if s not in work)
    # a chain's header mapping is built once: the same object on every request of the chain
    # (a key's requests come from its 3 arms' chains, however many requests they send)
    by_key: dict[str, set[int]] = {}
    for given in pool.given[probe_requests:]:
        if HEADER in given:
            by_key.setdefault(given[HEADER], set()).add(id(given))
    assert set(by_key) == expected
    assert all(len(ids) <= 3 for ids in by_key.values())
    assert len(work) > 4 * 3 * 3


def test_a_chain_key_is_stable_across_sessions_and_apart_across_jobs(tmp_path: Path) -> None:
    first = plan_of(_job(tmp_path / "a")).fingerprint
    again = plan_of(_job(tmp_path / "b")).fingerprint
    other = plan_of(_job(tmp_path / "c", seed=8)).fingerprint
    key = routing_key(first, "p0/c0")
    assert key == routing_key(again, "p0/c0")  # a rerun or a resume: the same replica
    assert key != routing_key(first, "p0/c1")
    assert key != routing_key(other, "p0/c0")
    # an engine added to the run later does not move the chains already there
    grown = {**first, "engines": {**first["engines"], "more": {"kind": "vllm"}}}
    assert routing_key(grown, "p0/c0") == key


def test_chains_never_share_a_mutable_header_mapping() -> None:
    engine, _ = _engine("raw")
    a, b = engine.routed("chain-a"), engine.routed("chain-b")
    assert isinstance(a, RoutedEngine) and isinstance(b, RoutedEngine)
    assert a.headers.json[HEADER] == "chain-a" and b.headers.json[HEADER] == "chain-b"
    assert a.headers.json is not b.headers.json
    with pytest.raises(TypeError):
        a.headers.json[HEADER] = "chain-b"  # type: ignore[index]
    assert HEADER not in engine.transport.headers.json  # the engine's own stays without a key
    assert a.headers.json["Content-Type"] == "application/json"


def test_without_a_header_a_chain_uses_the_engine_itself() -> None:
    engine, _ = _engine("raw", header=None)
    assert engine.routed("chain-a") is engine
