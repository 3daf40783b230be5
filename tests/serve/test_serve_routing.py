"""``presto serve`` routes its chains as ``presto run`` does (issue 35: one path runs a chain for
every face): behind a gateway, every request of a chain carries that chain's routing key."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
from serve_helpers import ServiceThread, load, reference_job, write_config

from presto_client.core.engine_protocol import Engine, ProposalRequest, ScoredTokens
from presto_client.core.reference import ReferenceEngine, ReferenceModel


class _RoutingEngine(ReferenceEngine):
    """The reference engine as a gateway's client: ``routed(key)`` is a view whose every
    request is noted with its key (``None``: a request sent without one)."""

    def __init__(self) -> None:
        super().__init__(ReferenceModel(16), name="ref")
        self.seen: list[str | None] = []

    def routed(self, key: str) -> Engine:
        return _Routed(self, key)

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        self.seen.extend([None] * len(requests))
        return await super().generate(requests)

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        self.seen.append(None)
        async for chunk in super().stream(request):
            yield chunk


class _Routed:
    def __init__(self, inner: _RoutingEngine, key: str) -> None:
        self.inner = inner
        self.key = key
        self.name = inner.name

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        self.inner.seen.extend([self.key] * len(requests))
        return await ReferenceEngine.generate(self.inner, requests)

    def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        self.inner.seen.append(self.key)
        return ReferenceEngine.stream(self.inner, request)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_every_request_of_a_served_chain_carries_its_routing_key(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    engine = _RoutingEngine()
    with ServiceThread(load(config), replicas=[engine]) as service:
        body = {"model": "ref", "prompt": [1, 2, 3], "n": 2, "seed": 5, "max_tokens": 8}
        answer = httpx.post(f"{service.v1}/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
    assert engine.seen, "no request reached the engine"
    assert None not in engine.seen  # no request went out unrouted
    keys = set(engine.seen)
    assert len(keys) == 2  # one key per chain: the gateway keeps each chain on one replica
    assert all(len(k) == 32 and k != "5" for k in keys)  # a digest, not the request in clear
