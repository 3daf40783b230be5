"""What presto-client will rely on from the real gateways, checked against their binaries.

A chain's requests must reach one replica (its prefix cache), and its token ids must reach the
engine unchanged (a re-tokenised prompt changes the chain's law). Each gateway runs in front of
two emulation servers; what each server received is counted there.
"""

from __future__ import annotations

from typing import Any

import pytest
from gateways import GatewayPair

from tests.support.emulation import EmulationServer
from tests.support.gateways import Gateway, post_json

pytestmark = pytest.mark.gateway

COMPLETION: dict[str, Any] = {"model": "reference-64", "max_tokens": 2, "logprobs": 3, "seed": 7}
GENERATE: dict[str, Any] = {
    "sampling_params": {"max_new_tokens": 2, "temperature": 1.0, "sampling_seed": 7},
    "return_logprob": True,
    "top_logprobs_num": 3,
    "logprob_start_len": -1,
}


def _replicas(
    gateway: Gateway,
    workers: list[EmulationServer],
    path: str,
    bodies: list[dict[str, Any]],
    headers: dict[str, str],
) -> list[int]:
    """Sends each body in turn; the index of the worker each one reached."""
    out: list[int] = []
    for body in bodies:
        before = [w.stats.requests.get(path, 0) for w in workers]
        status, answer = post_json(gateway.base_url + path, body, headers)
        assert status == 200, answer
        after = [w.stats.requests.get(path, 0) for w in workers]
        reached = [i for i, (a, b) in enumerate(zip(after, before, strict=True)) if a > b]
        assert len(reached) == 1, (before, after)
        out.append(reached[0])
    return out


def _payloads_with(workers: list[EmulationServer], field: str) -> list[dict[str, Any]]:
    return [p for w in workers for p in w.stats.payloads if field in p]


def _chain(n: int, head: int, key: str = "prompt") -> list[dict[str, Any]]:
    """A chain's requests: one prompt growing by a token each time, as a chain's prefix does."""
    base = COMPLETION if key == "prompt" else GENERATE
    return [{**base, key: [head, *range(1, 4 + i)]} for i in range(n)]


def test_vllm_router_keeps_a_keyed_chain_on_one_replica_and_carries_token_ids(
    gateway_pair: GatewayPair,
) -> None:
    with gateway_pair("vllm-router", "consistent_hash") as (gateway, workers):
        seen: set[int] = set()
        for chain in range(6):
            headers = {"x-session-id": f"chain-{chain}"}
            reached = _replicas(gateway, workers, "/v1/completions", _chain(5, chain), headers)
            assert len(set(reached)) == 1, reached
            seen |= set(reached)
        assert seen == {0, 1}  # keys spread over replicas (6 keys: 1/32 chance they would not)
        # The token ids reached the engine as they were sent, the extra fields untouched.
        body = {**COMPLETION, "prompt": [5, 6, 7], "return_tokens_as_token_ids": True}
        status, answer = post_json(gateway.base_url + "/v1/completions", body)
        assert status == 200, answer
        (forwarded,) = _payloads_with(workers, "return_tokens_as_token_ids")
        assert forwarded["prompt"] == [5, 6, 7]
        assert {k: forwarded[k] for k in body} == body
        # Without a key the hash is the body's: a growing prompt moves between replicas.
        unkeyed = _replicas(gateway, workers, "/v1/completions", _chain(12, 60), {})
        assert len(set(unkeyed)) == 2, unkeyed


def test_smg_refuses_token_ids_on_completions(gateway_pair: GatewayPair) -> None:
    with gateway_pair("smg", "consistent_hashing") as (gateway, workers):
        body = {**COMPLETION, "prompt": [5, 6, 7]}
        status, answer = post_json(
            gateway.base_url + "/v1/completions", body, {"x-smg-routing-key": "c"}
        )
        assert status == 400
        assert "StringOrArray" in answer["error"]["message"]
        assert sum(w.stats.requests.get("/v1/completions", 0) for w in workers) == 0


def test_smg_keeps_a_keyed_chain_on_one_replica_on_sglang_generate(
    gateway_pair: GatewayPair,
) -> None:
    with gateway_pair("smg", "consistent_hashing", "sglang") as (gateway, workers):
        seen: set[int] = set()
        # the hash ring's positions depend on the workers' (free, random) ports, so its split
        # of a few keys can be lopsided: keys are tried until both replicas are used
        for chain in range(48):
            headers = {"x-smg-routing-key": f"chain-{chain}"}
            bodies = _chain(5, chain, key="input_ids")
            reached = _replicas(gateway, workers, "/generate", bodies, headers)
            assert len(set(reached)) == 1, reached
            seen |= set(reached)
            if seen == {0, 1} and chain >= 5:
                break
        assert seen == {0, 1}
        sent = {**GENERATE, "input_ids": [9, 8, 7], "rid": "probe"}
        status, answer = post_json(gateway.base_url + "/generate", sent, {"x-smg-routing-key": "c"})
        assert status == 200, answer
        (forwarded,) = _payloads_with(workers, "rid")
        # The token ids and every field sent arrive unchanged (smg adds defaults of its own).
        assert {k: forwarded[k] for k in sent} == sent


def test_vllm_router_drops_sglang_logprob_fields_on_generate(gateway_pair: GatewayPair) -> None:
    # Why the client must not use vllm-router's /generate: the fields that ask for top-K
    # logprobs and the seed do not reach the engine.
    with gateway_pair("vllm-router", "consistent_hash", "sglang") as (gateway, workers):
        body = {**GENERATE, "input_ids": [1, 2, 3]}
        status, answer = post_json(gateway.base_url + "/generate", body, {"x-session-id": "c"})
        assert status == 200, answer
        (forwarded,) = _payloads_with(workers, "input_ids")
        assert forwarded["input_ids"] == [1, 2, 3]
        assert "top_logprobs_num" not in forwarded
        assert "sampling_seed" not in forwarded["sampling_params"]
