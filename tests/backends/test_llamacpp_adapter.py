"""The llama.cpp adapter on synthetic answers shaped as llama-server's native /completion
answers them (shapes read in its tools/server sources and checked against the real server in
tests/integration/test_llamacpp_real.py): payload, parsing, guards, and the EOS continuation
over the in-memory pool."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from presto_client.backends import EngineSpec, create_engine
from presto_client.backends.llamacpp import (
    FORCE_BIAS,
    FULL_ROW,
    SEED_MODULUS,
    LlamaCppAdapter,
    ascii_token_ids,
    continuation_seed,
    held_back_positions,
    request_seed,
)
from presto_client.backends.metrics import prefix_cache_metrics
from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec
from presto_client.errors import EngineError, EngineUnavailableError, InvalidResponseError
from presto_client.orchestration.engines.eos_discovery import discover_eos_token_id
from tests.support.memory_pool import Answer, MemoryPool, Sent, json_answer, text_answer

EOS = 2
K = 3


def _spec(**kw: Any) -> EngineSpec:
    return EngineSpec(kind="llamacpp", base_urls=("http://llama:8790",), top_k=K, **kw)


def _entry(token: int, logprobs: list[float], ids: list[int]) -> dict[str, Any]:
    """One completion_probabilities entry: the token's raw logprob and its top list."""
    top = [
        {"id": i, "token": f"t{i}", "bytes": [], "logprob": lp}
        for i, lp in zip(ids, logprobs, strict=True)
    ]
    lp = dict(zip(ids, logprobs, strict=True)).get(token, -9.0)
    return {"id": token, "token": f"t{token}", "bytes": [], "logprob": lp, "top_logprobs": top}


def _answer(tokens: list[int], stop: str = "limit", **extra: Any) -> dict[str, Any]:
    probs = [_entry(t, [-0.5, -1.5, -2.5], [t, t + 1, t + 2]) for t in tokens]
    return {"tokens": tokens, "completion_probabilities": probs, "stop_type": stop, **extra}


SLOTS = 4


def with_props(handler: Callable[[Sent], Answer]) -> Callable[[Sent], Answer]:
    """``handler`` behind llama-server's ``GET /props`` (its slot count)."""

    def answer(request: Sent) -> Answer:
        if request.method == "GET" and request.path == "/props":
            return json_answer(200, {"total_slots": SLOTS})
        return handler(request)

    return answer


def _request(n: int = 3, seed: int = 7) -> ProposalRequest:
    return ProposalRequest((10, 11, 12), n, 0.25, seed, ScoreSpec((0.25, 1.0)))


def test_payload_sends_token_ids_raw_probs_and_only_the_temperature_sampler() -> None:
    call = LlamaCppAdapter(_spec()).build_generate(_request(), "m", label="p")
    p = call.payload
    assert call.path == "/completion"
    assert p["prompt"] == [10, 11, 12] and p["n_predict"] == 3 and p["temperature"] == 0.25
    assert p["n_probs"] == K and p["post_sampling_probs"] is False
    assert p["samplers"] == ["temperature"] and p["mirostat"] == 0
    assert p["top_k"] == 0 and p["top_p"] == 1.0 and p["min_p"] == 0.0
    assert p["typical_p"] == 1.0 and p["repeat_penalty"] == 1.0 and p["dynatemp_range"] == 0.0
    # ignore_eos would put a -inf bias on EOS: the proposal law would lose EOS's mass.
    assert p["ignore_eos"] is False
    assert p["cache_prompt"] is True and p["return_tokens"] is True and p["seed"] == 7


def test_seeds_never_reach_llamacpps_random_seed_value() -> None:
    assert request_seed(SEED_MODULUS) == 0
    assert request_seed(2**40 + 5) == (2**40 + 5) % SEED_MODULUS
    assert all(0 <= request_seed(s) < SEED_MODULUS for s in (-1, 0, 2**63 - 1))
    assert continuation_seed(7, 3) != continuation_seed(7, 4) != request_seed(7)


def test_parse_reads_raw_logprobs_and_topk() -> None:
    out = LlamaCppAdapter(_spec()).parse_generate(_request(), _answer([5, 6, 7]), label="p")
    assert out.token_ids.tolist() == [5, 6, 7]
    assert out.logprobs.tolist() == [-0.5, -0.5, -0.5]
    assert out.top_ids[0].tolist() == [5, 6, 7]


def test_float32_lowest_is_minus_infinity() -> None:
    body = _answer([5, 6, 7])
    body["completion_probabilities"][0]["top_logprobs"][2]["logprob"] = -3.4028234663852886e38
    out = LlamaCppAdapter(_spec()).parse_generate(_request(), body, label="p")
    assert out.top_logprobs[0, 2] == -math.inf


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({**_answer([5, 6, 7]), "tokens": [5, 6, 7, 8]}, "UTF-8"),
        (_answer([5, 6], stop="limit"), "2 tokens, 3 were requested"),
        ({**_answer([5, 6, 7]), "truncated": True}, "context size"),
        ({"tokens": [5], "stop_type": "limit"}, "n_probs"),
        ({"error": {"message": "boom"}}, "boom"),
    ],
)
def test_parse_refuses_what_cannot_be_scored(body: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidResponseError, match=needle):
        LlamaCppAdapter(_spec()).parse_generate(_request(), body, label="p")


def test_post_sampling_probabilities_are_named() -> None:
    body = _answer([5, 6, 7])
    for item in body["completion_probabilities"]:
        item["prob"] = math.exp(item.pop("logprob"))
    with pytest.raises(InvalidResponseError, match="post_sampling_probs"):
        LlamaCppAdapter(_spec()).parse_generate(_request(), body, label="p")


def test_a_stop_at_eos_is_a_short_answer_and_continues_after_it() -> None:
    adapter = LlamaCppAdapter(_spec())
    got = adapter.parse_generate(_request(4), _answer([5, EOS], stop="eos"), label="p")
    assert got.token_ids.tolist() == [5, EOS]
    rest = adapter.repairs.continuation(_request(4), got)
    assert rest is not None
    assert rest.prefix == (10, 11, 12, 5, EOS) and rest.num_tokens == 2
    assert rest.seed == continuation_seed(7, 2) and rest.temperature == 0.25


def test_score_calls_force_each_token_and_read_its_raw_logprob() -> None:
    adapter = LlamaCppAdapter(_spec())
    calls = adapter.build_score_calls((10, 11), (5, 6), "m", -1, label="s")
    assert [c.payload["prompt"] for c in calls] == [[10, 11], [10, 11, 5]]
    assert [c.payload["logit_bias"] for c in calls] == [[[5, FORCE_BIAS]], [[6, FORCE_BIAS]]]
    assert all(c.payload["n_probs"] == FULL_ROW and c.payload["n_predict"] == 1 for c in calls)
    bodies = [_answer([5]), _answer([6])]
    out = adapter.parse_score_bodies((10, 11), (5, 6), bodies, -1, label="s")
    assert out.token_ids.tolist() == [5, 6] and out.top_ids.shape == (2, 3)
    with pytest.raises(InvalidResponseError, match="not the tokens sent"):
        adapter.parse_score_bodies((10, 11), (5, 6), [_answer([5]), _answer([9])], -1, label="s")


async def test_engine_generates_through_an_eos_with_a_second_request() -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: Sent) -> Answer:
        payload = json.loads(request.body)
        sent.append(payload)
        if len(sent) == 1:
            return json_answer(200, _answer([5, EOS], stop="eos"))
        return json_answer(200, _answer([8, 9, 10][: payload["n_predict"]]))

    engine = create_engine(_spec(model="m"), pool=MemoryPool(with_props(handler)))
    try:
        (scored,) = await engine.generate([_request(5)])
    finally:
        await engine.aclose()
    assert scored.token_ids.tolist() == [5, EOS, 8, 9, 10]
    assert sent[1]["prompt"] == [10, 11, 12, 5, EOS] and sent[1]["n_predict"] == 3
    assert sent[1]["seed"] == continuation_seed(7, 2)
    assert np.all(np.isfinite(scored.logp0))


async def test_engine_refuses_an_answer_that_stops_short_without_eos() -> None:
    def handler(request: Sent) -> Answer:
        return json_answer(200, _answer([5], stop="word"))

    engine = create_engine(_spec(model="m"), pool=MemoryPool(with_props(handler)))
    try:
        with pytest.raises(InvalidResponseError, match="1 tokens, 3 were requested"):
            await engine.generate([_request()])
    finally:
        await engine.aclose()


def test_held_back_tokens_are_the_gaps_of_the_in_order_match() -> None:
    assert held_back_positions([5, 6, 7, 8], [5, 7, 8], label="p") == ([1], 3)
    assert held_back_positions([5, 6, 7, 8], [5, 6], label="p") == ([2, 3], 2)  # ends inside one
    with pytest.raises(InvalidResponseError, match="entry 1 \\(token 9\\) matches none"):
        held_back_positions([5, 6, 7, 8], [5, 9, 8], label="p")


def test_an_ambiguous_match_fetches_every_row_from_the_ambiguity_on() -> None:
    # Either 6 could be the held-back one: the entries after the first are not attributed.
    assert held_back_positions([5, 6, 6, 8], [5, 6, 8], label="p") == ([1, 2, 3], 1)
    assert held_back_positions([4, 5, 6, 6], [4, 5, 6], label="p") == ([2, 3], 2)


def test_an_ascii_token_is_never_the_held_back_one() -> None:
    # "\n\n" (198 198) before a character split over two tokens (7 holds its first bytes):
    # only the place that keeps the ASCII 198 out of the gaps is possible.
    tokens, entries = [5, 198, 198, 7, 8], [5, 198, 198, 8]
    assert held_back_positions(tokens, entries, label="p") == ([1, 2, 3, 4], 1)
    assert held_back_positions(tokens, entries, label="p", whole=frozenset({198})) == ([3], 4)
    probs = [
        {"id": 198, "bytes": [10], "top_logprobs": [{"id": 9, "bytes": [226, 137]}]},
        {"id": 8, "bytes": [136], "top_logprobs": [{"id": 11, "bytes": [32, 97]}]},
    ]
    assert ascii_token_ids(probs) == frozenset({198, 11})


async def test_an_ambiguous_held_back_token_is_scored_from_whole_rows() -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: Sent) -> Answer:
        payload = json.loads(request.body)
        sent.append(payload)
        if len(sent) == 1:  # one of the two 6s came without probabilities
            body = _answer([5, 6, 6])
            del body["completion_probabilities"][1]
            return json_answer(200, body)
        lp = {4: -0.25, 5: -0.75}[len(payload["prompt"])]  # after 10 11 12 5 (6)
        row = [{"id": 6, "logprob": lp}, {"id": 9, "logprob": -2.0}, {"id": 1, "logprob": -5.0}]
        forced = {"id": 0, "logprob": -7.0, "top_logprobs": row}
        return json_answer(200, {"tokens": [0], "completion_probabilities": [forced]})

    engine = create_engine(_spec(model="m"), pool=MemoryPool(with_props(handler)))
    try:
        (scored,) = await engine.generate([_request(3)])
    finally:
        await engine.aclose()
    assert scored.token_ids.tolist() == [5, 6, 6]
    # The first entry is token 5's; both 6s come from their own rows, none from the answer.
    assert scored.logp0.tolist() == [-0.5, -0.25, -0.75]
    assert [p["prompt"] for p in sent[1:]] == [[10, 11, 12, 5], [10, 11, 12, 5, 6]]


async def test_each_whole_row_is_read_as_it_arrives() -> None:
    """A repair's whole row (megabytes of JSON on a real vocabulary) is read when its answer
    comes, not with every other at the end (one step of the loop that took 0.8 s): here the
    second repair answers only once the first one's row has been read."""
    first_read = asyncio.Event()
    kept: list[Any] = []

    async def handler(request: Sent) -> Answer:
        payload = json.loads(request.body)
        if payload["n_predict"] != 1:  # both 6s came without probabilities
            body = _answer([5, 6, 6])
            del body["completion_probabilities"][1:]
            return json_answer(200, body)
        if len(payload["prompt"]) == 5:  # the second repair
            await asyncio.wait_for(first_read.wait(), 5.0)
        lp = {4: -0.25, 5: -0.75}[len(payload["prompt"])]
        row = [{"id": 6, "logprob": lp}, {"id": 9, "logprob": -2.0}]
        forced = {"id": 0, "logprob": -7.0, "top_logprobs": row}
        return json_answer(200, {"tokens": [0], "completion_probabilities": [forced]})

    engine = create_engine(_spec(model="m"), pool=MemoryPool(with_props(handler)))
    adapter = engine.adapter
    assert isinstance(adapter, LlamaCppAdapter)
    read = adapter.read_repair_body

    def reading(body: Any, *, label: str) -> Any:
        kept.append(read(body, label=label))
        first_read.set()
        return kept[-1]

    adapter.read_repair_body = reading  # type: ignore[method-assign]
    try:
        (scored,) = await engine.generate([_request(3)])
    finally:
        await engine.aclose()
    assert scored.logp0.tolist() == [-0.5, -0.25, -0.75]
    # What is kept of a repair is its row as arrays, not the answer's JSON objects.
    assert [type(row).__name__ for row in kept] == ["TokenLogprobs", "TokenLogprobs"]


async def test_a_held_back_token_gets_its_row_from_a_whole_row_request() -> None:
    sent: list[dict[str, Any]] = []
    row = [{"id": i, "logprob": lp} for i, lp in ((6, -0.1), (9, -2.0), (4, -3.0), (1, -5.0))]

    def handler(request: Sent) -> Answer:
        payload = json.loads(request.body)
        sent.append(payload)
        if len(sent) == 1:  # token 6 came without probabilities
            body = _answer([5, 6, 7])
            del body["completion_probabilities"][1]
            return json_answer(200, body)
        forced = {"id": 0, "logprob": -7.0, "top_logprobs": row}
        return json_answer(200, {"tokens": [0], "completion_probabilities": [forced]})

    engine = create_engine(_spec(model="m"), pool=MemoryPool(with_props(handler)))
    try:
        (scored,) = await engine.generate([_request(3)])
    finally:
        await engine.aclose()
    assert scored.token_ids.tolist() == [5, 6, 7]
    assert scored.logp0.tolist() == [-0.5, -0.1, -0.5]
    assert sent[1]["prompt"] == [10, 11, 12, 5] and sent[1]["n_probs"] == FULL_ROW
    assert sent[1]["logit_bias"] == [[0, FORCE_BIAS]] and sent[1]["n_predict"] == 1


# llama-server's /metrics (with --metrics), as it answers: prompt_tokens leaves out the cached ones.
METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 2396
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 1562
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 271
"""


def test_prefix_cache_counters_count_cached_and_computed_prompt_tokens() -> None:
    adapter = LlamaCppAdapter(_spec())
    out = prefix_cache_metrics(
        METRICS,
        adapter.traits.metric_names,
        queries_exclude_hits=adapter.traits.metric_queries_exclude_hits,
    )
    assert out["prefix_cache_queries"] == 2396 + 1562
    assert out["prefix_cache_hits"] == 1562
    assert out["prefix_cache_hit_rate"] == pytest.approx(1562 / 3958)
    assert adapter.capabilities().metrics == adapter.traits.metric_names


async def test_engine_reads_the_prefix_cache_counters_from_metrics() -> None:
    pool = MemoryPool(lambda sent: text_answer(200, METRICS))
    eng = create_engine(_spec(model="m"), pool=pool)
    try:
        out = await eng.metrics()
    finally:
        await eng.aclose()
    assert out["prefix_cache_queries"] == 3958 and out["prefix_cache_hits"] == 1562


# ---- streaming (llama-server's native /completion SSE, as tools/server sends it: one event per
# token with its probabilities and the generation's count so far, then a final event with
# stop_type and no tokens; no [DONE])


def _events(tokens: list[int], *, skip: int | None = None, stop: str = "limit") -> list[bytes]:
    """SSE chunks of a stream of ``tokens``; ``skip``: the index of a token held back (never
    sent, but counted by tokens_predicted)."""
    out: list[bytes] = []
    for i, t in enumerate(tokens):
        if i == skip:
            continue
        event = {
            "index": 0,
            "content": f"t{t}",
            "tokens": [t],
            "stop": False,
            "id_slot": -1,
            "tokens_predicted": i + 1,
            "completion_probabilities": [_entry(t, [-0.5, -1.5, -2.5], [t, t + 1, t + 2])],
        }
        out.append(b"data: " + json.dumps(event).encode() + b"\n\n")
    final = {"tokens": [], "stop_type": stop, "truncated": False, "tokens_predicted": len(tokens)}
    out.append(b"data: " + json.dumps(final).encode() + b"\n\n")
    return out


def _sse(chunks: list[bytes]) -> Answer:
    return Answer(200, headers={"Content-Type": "text/event-stream"}, chunks=chunks)


async def _streamed(
    engine: Any, request: ProposalRequest, stop_after: int | None = None
) -> tuple[list[int], int]:
    ids: list[int] = []
    chunks = 0
    stream = engine.stream(request)
    async for chunk in stream:
        ids += chunk.token_ids.tolist()
        chunks += 1
        if stop_after is not None and len(ids) >= stop_after:
            break
    await stream.aclose()
    return ids, chunks


async def test_a_proposal_streams_token_by_token_and_asks_to_close_the_connection() -> None:
    sent: list[Sent] = []

    def handler(request: Sent) -> Answer:
        sent.append(request)
        return _sse(_events([5, 6, 7]))

    engine = create_engine(_spec(model="m"), pool=MemoryPool(with_props(handler)))
    try:
        ids, chunks = await _streamed(engine, _request(3))
    finally:
        await engine.aclose()
    assert ids == [5, 6, 7] and chunks == 3
    payload = json.loads(sent[0].body)
    assert payload["stream"] is True and payload["id_slot"] in range(SLOTS)
    # llama-server closes a connection after a stream although it announced keep-alive.
    assert sent[0].headers["Connection"] == "close"


async def test_a_stream_stopped_at_eos_goes_on_in_a_second_stream() -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: Sent) -> Answer:
        payload = json.loads(request.body)
        sent.append(payload)
        if len(sent) == 1:
            return _sse(_events([5, EOS], stop="eos"))
        return _sse(_events([8, 9, 10][: payload["n_predict"]]))

    engine = create_engine(_spec(model="m"), pool=MemoryPool(with_props(handler)))
    try:
        ids, _ = await _streamed(engine, _request(5))
    finally:
        await engine.aclose()
    assert ids == [5, EOS, 8, 9, 10]
    # The continuation generate() would send: the same prompt, seed and length.
    assert sent[1]["prompt"] == [10, 11, 12, 5, EOS] and sent[1]["n_predict"] == 3
    assert sent[1]["seed"] == continuation_seed(7, 2) and sent[1]["stream"] is True


async def test_a_token_left_out_of_the_stream_brings_the_rest_from_the_whole_proposal() -> None:
    sent: list[dict[str, Any]] = []
    row = [{"id": i, "logprob": lp} for i, lp in ((6, -0.1), (9, -2.0), (4, -3.0), (1, -5.0))]

    def handler(request: Sent) -> Answer:
        payload = json.loads(request.body)
        sent.append(payload)
        if payload["stream"]:  # token 6 ends inside a UTF-8 character: never streamed
            return _sse(_events([5, 6, 7, 8], skip=1))
        if payload["n_predict"] == 1:  # the row of the held-back token
            forced = {"id": 0, "logprob": -7.0, "top_logprobs": row}
            return json_answer(200, {"tokens": [0], "completion_probabilities": [forced]})
        body = _answer([5, 6, 7, 8])
        del body["completion_probabilities"][1]
        return json_answer(200, body)

    engine = create_engine(_spec(model="m"), pool=MemoryPool(with_props(handler)))
    try:
        ids, chunks = await _streamed(engine, _request(4))
        (whole,) = await engine.generate([_request(4)])
    finally:
        await engine.aclose()
    assert ids == [5, 6, 7, 8] == whole.token_ids.tolist()
    assert chunks == 2  # token 5 as it streamed, then the rest of the whole proposal
    assert [p["stream"] for p in sent[:3]] == [True, False, False]


async def test_a_refetched_proposal_that_differs_from_its_stream_is_refused() -> None:
    def handler(request: Sent) -> Answer:
        if json.loads(request.body)["stream"]:
            return _sse(_events([5, 6, 7], skip=1))
        return json_answer(200, _answer([9, 6, 7]))  # another first token: seeds not honoured

    engine = create_engine(_spec(model="m"), pool=MemoryPool(with_props(handler)))
    try:
        with pytest.raises(EngineError, match="differs from what was streamed"):
            await _streamed(engine, _request(3))
    finally:
        await engine.aclose()


@pytest.mark.parametrize(
    ("chunks", "error", "needle"),
    [
        (_events([5, 6, 7])[:2], EngineUnavailableError, "ended after 2 of 3 tokens"),
        (
            [b'data: {"tokens": [], "stop_type": "limit", "truncated": true}\n\n'],
            InvalidResponseError,
            "context size",
        ),
        ([b'data: {"error": {"message": "boom"}}\n\n'], InvalidResponseError, "boom"),
        (_events([5, 6], stop="word"), EngineUnavailableError, "ended after 2 of 3 tokens"),
    ],
)
async def test_a_broken_stream_names_what_went_wrong(
    chunks: list[bytes], error: type[Exception], needle: str
) -> None:
    engine = create_engine(
        _spec(model="m", max_retries=0), pool=MemoryPool(with_props(lambda r: _sse(chunks)))
    )
    try:
        with pytest.raises(error, match=needle):
            await _streamed(engine, _request(3))
    finally:
        await engine.aclose()


async def test_the_next_proposal_goes_to_the_slot_an_early_rejection_left() -> None:
    # A stream closed after two tokens: its slot holds the prompt and those tokens. The next
    # proposal of that prefix goes there (the server holds it until the slot is free) instead
    # of a fresh slot that would prefill the whole prompt; another prompt goes elsewhere.
    sent: list[dict[str, Any]] = []

    def handler(request: Sent) -> Answer:
        payload = json.loads(request.body)
        sent.append(payload)
        return _sse(_events(list(range(20, 20 + payload["n_predict"]))))

    engine = create_engine(_spec(model="m"), pool=MemoryPool(with_props(handler)))
    other = ProposalRequest((40, 41, 42), 3, 0.25, 1, ScoreSpec((0.25, 1.0)))
    try:
        await _streamed(engine, other)
        await _streamed(engine, _request(8), stop_after=2)
        await _streamed(engine, ProposalRequest((10, 11, 12, 20), 3, 0.25, 2, ScoreSpec((0.25,))))
    finally:
        await engine.aclose()
    first, rejected, following = (p["id_slot"] for p in sent)
    assert following == rejected != first


async def test_without_a_slot_count_the_server_places_requests_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: Sent) -> Answer:
        if request.method == "GET":  # a server (or proxy) without /props
            return json_answer(404, {"error": {"message": "not found"}})
        payload = json.loads(request.body)
        sent.append(payload)
        return (
            _sse(_events([5, 6, 7])) if payload["stream"] else json_answer(200, _answer([5, 6, 7]))
        )

    engine = create_engine(_spec(model="m", max_retries=0), pool=MemoryPool(handler))
    try:
        with caplog.at_level(logging.WARNING, logger="presto_client.backends.http_engine"):
            assert (await _streamed(engine, _request(3)))[0] == [5, 6, 7]
            (whole,) = await engine.generate([_request(3)])
    finally:
        await engine.aclose()
    assert whole.token_ids.tolist() == [5, 6, 7]
    assert all("id_slot" not in p for p in sent)
    assert sum("slot count is unknown" in r.message for r in caplog.records) == 1


# ---- the EOS the server states (issue 46)


async def test_the_eos_is_the_one_props_names_tokenized_as_one_special_token() -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: Sent) -> Answer:
        if request.path == "/props":
            return json_answer(200, {"total_slots": SLOTS, "eos_token": "<|im_end|>"})
        if request.path == "/tokenize":
            sent.append(json.loads(request.body))
            return json_answer(200, {"tokens": [2]})
        return json_answer(404, {"error": "no"})

    engine = create_engine(_spec(model="m"), pool=MemoryPool(handler))
    try:
        assert await discover_eos_token_id(engine) == (2, "")
    finally:
        await engine.aclose()
    # Its text as one special token, nothing added (no BOS before it).
    assert sent == [{"content": "<|im_end|>", "add_special": False, "parse_special": True}]


async def test_a_server_that_names_no_eos_falls_back_to_its_chat_template() -> None:
    def handler(request: Sent) -> Answer:
        if request.path == "/props":
            return json_answer(200, {"total_slots": SLOTS, "eos_token": ""})
        return json_answer(404, {"error": "no such route"})

    engine = create_engine(_spec(model="m"), pool=MemoryPool(handler))
    try:
        eos, why = await discover_eos_token_id(engine)
    finally:
        await engine.aclose()
    assert eos is None and "tokenize" in why


async def test_requests_wait_for_a_free_slot_in_the_client_not_in_the_servers_queue() -> None:
    """A server of 2 slots and 6 proposals at once (whole and streamed): never more than 2 at
    the server, each on a slot of its own; the others wait in the client, where their wait
    does not count against their timeout (issue 46: 64 in flight against 4 slots timed out
    in the server's queue and were retried behind the same work)."""
    running: list[int] = []
    peak = 0
    slots_seen: list[int] = []

    async def handler(request: Sent) -> Answer:
        nonlocal peak
        if request.path == "/props":
            return json_answer(200, {"total_slots": 2})
        body = json.loads(request.body)
        slots_seen.append(body["id_slot"])
        running.append(1)
        peak = max(peak, len(running))
        await asyncio.sleep(0.02)
        running.pop()
        tokens = [5] * body["n_predict"]
        if body["stream"]:
            return _sse(_events(tokens))
        return json_answer(200, _answer(tokens))

    engine = create_engine(_spec(model="m", max_concurrency=64), pool=MemoryPool(handler))

    async def streamed(seed: int) -> int:
        return sum([len(c) async for c in engine.stream(_request(seed=seed))])

    try:
        whole = engine.generate([_request(seed=s) for s in range(3)])
        counts = await asyncio.gather(whole, *(streamed(s) for s in range(3, 6)))
    finally:
        await engine.aclose()
    assert [len(x) for x in counts[0]] == [3, 3, 3] and counts[1:] == [3, 3, 3]
    assert peak == 2 and sorted(set(slots_seen)) == [0, 1]
