"""The generation protocol (backends/generation.py): one loop fills a proposal for the whole and
the streamed path, so both send the same parts (placement, continuation) and differ only in
how a part's answer arrives. Over the in-memory pool, in llama.cpp's dialect (the one whose
answers stop at an EOS, leave tokens out and go to slots)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from presto_client.backends import EngineSpec, create_engine
from presto_client.backends.generation import proposal_label
from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec
from tests.support.memory_pool import Answer, MemoryPool, Sent, json_answer

EOS = 2
SLOTS = 4


def _entry(token: int) -> dict[str, Any]:
    top = [{"id": token + i, "logprob": -0.5 - i} for i in range(3)]
    return {"id": token, "logprob": -0.5, "top_logprobs": top}


def _whole(tokens: list[int], stop: str) -> Answer:
    probs = [_entry(t) for t in tokens]
    return json_answer(
        200, {"tokens": tokens, "completion_probabilities": probs, "stop_type": stop}
    )


def _streamed(tokens: list[int], stop: str) -> Answer:
    events = [
        {"tokens": [t], "tokens_predicted": i + 1, "completion_probabilities": [_entry(t)]}
        for i, t in enumerate(tokens)
    ]
    events.append({"tokens": [], "stop_type": stop, "tokens_predicted": len(tokens)})
    chunks = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events]
    return Answer(200, headers={"Content-Type": "text/event-stream"}, chunks=chunks)


def _server(sent: list[dict[str, Any]]) -> MemoryPool:
    """llama-server whose first part stops at an EOS after two tokens; every later part ends
    at its length. Streamed or whole as the request asks."""

    def handler(request: Sent) -> Answer:
        if request.method == "GET":
            return json_answer(200, {"total_slots": SLOTS})
        payload = json.loads(request.body)
        sent.append(payload)
        first = len(payload["prompt"]) == 3
        tokens = [5, EOS] if first else list(range(20, 20 + payload["n_predict"]))
        stop = "eos" if first else "limit"
        return _streamed(tokens, stop) if payload["stream"] else _whole(tokens, stop)

    return MemoryPool(handler)


def _request() -> ProposalRequest:
    return ProposalRequest((10, 11, 12), 5, 0.25, 7, ScoreSpec((0.25, 1.0)))


def _parts(sent: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    keys = ("prompt", "n_predict", "seed", "id_slot")
    return [tuple(json.dumps(p[k]) for k in keys) for p in sent]


async def test_the_whole_and_the_streamed_path_send_the_same_parts() -> None:
    whole_sent: list[dict[str, Any]] = []
    streamed_sent: list[dict[str, Any]] = []
    spec = EngineSpec(kind="llamacpp", base_urls=("http://llama:8790",), top_k=3, model="m")
    whole_engine = create_engine(spec, pool=_server(whole_sent))
    stream_engine = create_engine(spec, pool=_server(streamed_sent))
    try:
        (whole,) = await whole_engine.generate([_request()])
        streamed = [t async for c in stream_engine.stream(_request()) for t in c.token_ids.tolist()]
    finally:
        await whole_engine.aclose()
        await stream_engine.aclose()
    assert whole.token_ids.tolist() == [5, EOS, 20, 21, 22]
    assert streamed == whole.token_ids.tolist()
    # The EOS continuation, on the slot the first part left (its cache holds the prompt and
    # the tokens before the EOS), with the same prompt, length and seed on both paths.
    assert len(whole_sent) == 2 and _parts(whole_sent) == _parts(streamed_sent)
    assert whole_sent[0]["id_slot"] == whole_sent[1]["id_slot"]
    assert [p["stream"] for p in whole_sent] == [False, False]
    assert [p["stream"] for p in streamed_sent] == [True, True]


async def test_a_whole_part_gives_its_slot_back_before_its_repairs() -> None:
    # Repairs are not placed: the slot is free for another proposal while they run.
    free_during_repair: list[bool] = []
    spec = EngineSpec(kind="llamacpp", base_urls=("http://llama:8790",), top_k=3, model="m")

    def handler(request: Sent) -> Answer:
        if request.method == "GET":
            return json_answer(200, {"total_slots": 1})
        payload = json.loads(request.body)
        if payload["n_predict"] == 1:  # the row of the held-back token
            plan = engine.generation._slot_plan
            assert plan is not None and "id_slot" not in payload
            free_during_repair.append(plan.take((10,)) is not None)
            plan.give_back(0, [10])
            row = [{"id": i, "logprob": lp} for i, lp in ((6, -0.1), (9, -2.0), (4, -3.0))]
            forced = {"id": 0, "logprob": -7.0, "top_logprobs": row}
            return json_answer(200, {"tokens": [0], "completion_probabilities": [forced]})
        body = json.loads(_whole([5, 6, 7], "limit").body)
        del body["completion_probabilities"][1]  # token 6 ends inside a UTF-8 character
        return json_answer(200, body)

    engine = create_engine(spec, pool=MemoryPool(handler))
    try:
        request = ProposalRequest((10, 11, 12), 3, 0.25, 7, ScoreSpec((0.25,)))
        (scored,) = await engine.generate([request])
    finally:
        await engine.aclose()
    assert scored.token_ids.tolist() == [5, 6, 7]
    assert free_during_repair == [True]


@pytest.mark.parametrize("index", [None, 3])
def test_a_proposal_is_named_by_its_seed_length_temperature_and_prefix(index: int | None) -> None:
    label = proposal_label(_request(), index)
    assert label.startswith("proposal 3 " if index is not None else "proposal (")
    assert "seed=7, 5 tokens at τ=0.25 after 3 prefix tokens" in label
