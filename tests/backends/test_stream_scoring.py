"""Streamed chunks scored together (:mod:`backends.stream_scoring`): bit for bit what each
chunk gives scored alone, and a bad chunk's error still its own stream's."""

from __future__ import annotations

import asyncio
import json
import math
import random
from typing import Any

import numpy as np
import pytest
from backend_helpers import make_engine

from presto_client.backends import EngineSpec, create_engine
from presto_client.backends.completions import fast_completion_logprobs
from presto_client.backends.stream_scoring import StreamScorer
from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens, ScoreSpec
from presto_client.core.scoring import scored_from_raw
from presto_client.core.stream.flight import join_chunks
from presto_client.errors import InvalidResponseError
from tests.support.emulation import EmulationServer
from tests.support.memory_pool import Answer, MemoryPool, Sent, json_answer

K = 5
VOCAB = 40


def _choice(rng: random.Random, n: int) -> dict[str, Any]:
    """``n`` tokens in vLLM's stream shape: rows sorted or not, with or without the sampled
    token as an extra entry (rows of K or K + 1 entries), ties in either order."""
    ids, values, rows = [], [], []
    for _ in range(n):
        tokens = rng.sample(range(VOCAB), K + 1)
        lps = [round(math.log(rng.random() + 1e-9), 1) for _ in tokens]
        if rng.random() < 0.5:
            pairs = sorted(zip(tokens, lps, strict=True), key=lambda p: (-p[1], p[0]))
            tokens, lps = [t for t, _ in pairs], [v for _, v in pairs]
        sampled = rng.randrange(len(tokens))
        width = K + 1 if rng.random() < 0.3 else K
        if sampled >= width:
            sampled = 0
        ids.append(tokens[sampled])
        values.append(lps[sampled])
        rows.append({f"token_id:{t}": v for t, v in zip(tokens[:width], lps[:width], strict=True)})
    return {"token_ids": ids, "logprobs": {"token_logprobs": values, "top_logprobs": rows}}


def _alone(choice: dict[str, Any], scores: ScoreSpec) -> ScoredTokens:
    raw = fast_completion_logprobs(choice, K, expect=None)
    assert raw is not None
    return scored_from_raw(raw, scores, VOCAB)


def _assert_identical(got: ScoredTokens, want: ScoredTokens) -> None:
    for name in ("token_ids", "logp0", "logq_lo", "logq_hi"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    if want.entropy is None:
        assert got.entropy is None
    else:
        assert got.entropy is not None
        np.testing.assert_array_equal(got.entropy, want.entropy)


@pytest.mark.parametrize("seed", range(5))
async def test_chunks_scored_together_are_bit_identical_to_chunks_scored_alone(seed: int) -> None:
    rng = random.Random(seed)
    specs = [ScoreSpec((0.25, 1.0)), ScoreSpec((0.5,), entropy=True), ScoreSpec((2.0, 0.25))]
    chunks = [(_choice(rng, rng.randint(1, 8)), rng.choice(specs)) for _ in range(40)]
    scorer = StreamScorer(K)
    futures = [scorer.score(choice, scores, VOCAB) for choice, scores in chunks]
    results = await asyncio.gather(*futures)
    # One pass per score spec: every chunk submitted in this turn was scored in it.
    assert scorer.batches == len({scores for _, scores in chunks})
    assert scorer.chunks == len(chunks)
    for (choice, scores), got in zip(chunks, results, strict=True):
        assert got is not None
        _assert_identical(got, _alone(choice, scores))


async def test_a_batch_with_an_unusual_chunk_hands_every_chunk_back_unscored() -> None:
    rng = random.Random(7)
    good = [_choice(rng, 3) for _ in range(3)]
    bad = _choice(rng, 2)
    bad["logprobs"]["token_logprobs"][1] = math.nan
    scorer = StreamScorer(K)
    scores = ScoreSpec((0.25,))
    results = await asyncio.gather(*[scorer.score(c, scores, VOCAB) for c in [*good, bad]])
    assert results == [None] * 4  # each stream then parses its own chunk alone
    # Something unforeseen in a pass (here a chunk without its logprobs) hands the batch back
    # too: no stream waits for a pass that failed.
    broken = {"token_ids": [1]}
    assert await asyncio.gather(*[scorer.score(c, scores, VOCAB) for c in [good[0], broken]]) == [
        None,
        None,
    ]
    # A cancelled consumer's chunk is left out of the pass; the others are scored.
    again = [scorer.score(c, scores, VOCAB) for c in good]
    again[1].cancel()
    done = await asyncio.gather(again[0], again[2])
    for choice, got in zip([good[0], good[2]], done, strict=True):
        assert got is not None
        _assert_identical(got, _alone(choice, scores))


# ---- through the engine: many streams at once


def _sse(events: list[dict[str, Any]]) -> Answer:
    chunks = [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]
    return Answer(200, headers={"Content-Type": "text/event-stream"}, chunks=chunks)


def _server(choices: dict[int, dict[str, Any]]) -> MemoryPool:
    """Streams each request's tokens (chosen by its seed) one event per token."""

    def handle(sent: Sent) -> Answer:
        if sent.path == "/v1/models":
            return json_answer(200, {"data": [{"id": "m"}]})
        choice = choices[json.loads(sent.body)["seed"]]
        lp = choice["logprobs"]
        events = [
            {
                "choices": [
                    {
                        "token_ids": [t],
                        "logprobs": {"token_logprobs": [v], "top_logprobs": [row]},
                    }
                ]
            }
            for t, v, row in zip(
                choice["token_ids"], lp["token_logprobs"], lp["top_logprobs"], strict=True
            )
        ]
        return _sse(events)

    return MemoryPool(handle)


async def test_concurrent_streams_score_as_alone_and_bad_ones_fail_alone() -> None:
    rng = random.Random(11)
    n = 6
    choices = {seed: _choice(rng, n) for seed in range(1, 9)}
    choices[5]["logprobs"]["token_logprobs"][3] = math.nan
    past = choices[6]  # an id past the vocabulary (the sampled token and its row's entry)
    token = past["token_ids"][2]
    row = past["logprobs"]["top_logprobs"][2]
    row[f"token_id:{VOCAB + 3}"] = row.pop(f"token_id:{token}")
    past["token_ids"][2] = VOCAB + 3
    spec = EngineSpec("vllm", ("http://x",), top_k=K, vocab_size=VOCAB, max_retries=0)
    engine = create_engine(spec, pool=_server(choices))
    scores = ScoreSpec((0.25, 1.0))

    async def stream(seed: int) -> ScoredTokens:
        request = ProposalRequest((1, 2), n, 0.25, seed, scores)
        return join_chunks([chunk async for chunk in engine.stream(request)])

    try:
        results = await asyncio.gather(*[stream(s) for s in choices], return_exceptions=True)
    finally:
        await engine.aclose()
    for seed, got in zip(choices, results, strict=True):
        if seed == 5:
            assert isinstance(got, InvalidResponseError) and "NaN" in str(got)
            assert "seed=5" in str(got)
            continue
        if seed == 6:
            assert isinstance(got, InvalidResponseError) and "seed=6" in str(got)
            assert f"vocabulary of {VOCAB} tokens (the vocab_size check)" in str(got)
            continue
        assert isinstance(got, ScoredTokens)
        _assert_identical(got, _alone(choices[seed], scores))
    assert engine.generation.scorer.chunks > engine.generation.scorer.batches  # batched


async def test_streams_at_once_equal_their_whole_proposals_bit_for_bit(
    vllm_raw: EmulationServer,
) -> None:
    """Against the emulation server over real HTTP: eight streams at once, each chunk scored
    with the others', give every score exactly as the unstreamed proposal does."""
    engine = make_engine("vllm", vllm_raw.base_url, top_k=8, vocab_size=64)
    scores = ScoreSpec((0.25, 0.5, 1.0), entropy=True)
    requests = [ProposalRequest((1, 2, 3, 4, 5), 12, 0.25, 40 + i, scores) for i in range(8)]

    async def streamed(request: ProposalRequest) -> ScoredTokens:
        return join_chunks([chunk async for chunk in engine.stream(request)])

    try:
        together = await asyncio.gather(*[streamed(r) for r in requests])
        whole = await engine.generate(requests)
    finally:
        await engine.aclose()
    for got, want in zip(together, whole, strict=True):
        _assert_identical(got, want)


# ---- whole answers read the same way (Generation.whole_scored)


def _whole_server(choices: dict[int, dict[str, Any]]) -> MemoryPool:
    """Answers each request whole with the tokens its seed chooses (vLLM's plain shape)."""

    def handle(sent: Sent) -> Answer:
        if sent.path == "/v1/models":
            return json_answer(200, {"data": [{"id": "m"}]})
        return json_answer(200, {"choices": [choices[json.loads(sent.body)["seed"]]]})

    return MemoryPool(handle)


def _counting_full_parse(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many answers go through the full parse (each call appends one)."""
    from presto_client.backends import completions

    calls: list[int] = []
    full = completions.fast_completion_logprobs

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return full(*args, **kwargs)

    monkeypatch.setattr(completions, "fast_completion_logprobs", counted)
    return calls


async def test_whole_answers_are_scored_from_their_values_bit_for_bit(
    vllm_raw: EmulationServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the emulation server over real HTTP: whole proposals scored from their rows'
    values alone (no full parse) give every score exactly as the full parse does."""
    calls = _counting_full_parse(monkeypatch)
    engine = make_engine("vllm", vllm_raw.base_url, top_k=8, vocab_size=64)
    try:
        for scores in (ScoreSpec((0.25, 0.5, 1.0), entropy=True), ScoreSpec((2.0,))):
            requests = [ProposalRequest((1, 2, 3, i), 12, 0.25, 70 + i, scores) for i in range(6)]
            got = await engine.generate(requests)
            assert calls == []  # (the values alone)
            for request, scored in zip(requests, got, strict=True):
                parsed = await engine.generation.whole(request, "x", None)
                _assert_identical(scored, scored_from_raw(parsed, scores, 64))
            calls.clear()
    finally:
        await engine.aclose()


async def test_an_unusual_whole_answer_fails_as_the_full_parse_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Answers the values alone cannot vouch for go through the full parse: its scores where
    it takes them (a sampled token absent from its row, below it), its errors where not (NaN,
    an id past the vocabulary, rows that do not belong to their tokens, too few tokens)."""
    rng = random.Random(5)
    n = 5
    choices = {seed: _choice(rng, n) for seed in range(1, 7)}
    absent = choices[1]  # the sampled token left out of a row it is below: taken
    row = absent["logprobs"]["top_logprobs"][0]
    row.pop(f"token_id:{absent['token_ids'][0]}")
    absent["logprobs"]["token_logprobs"][0] = min(row.values()) - 1.0
    choices[2]["logprobs"]["token_logprobs"][3] = math.nan
    past = choices[3]
    token = past["token_ids"][2]
    row = past["logprobs"]["top_logprobs"][2]
    row[f"token_id:{VOCAB + 3}"] = row.pop(f"token_id:{token}")
    past["token_ids"][2] = VOCAB + 3
    shifted = choices[4]["logprobs"]
    shifted["top_logprobs"] = shifted["top_logprobs"][1:] + shifted["top_logprobs"][:1]
    short = choices[5]
    short["token_ids"].pop()
    short["logprobs"]["token_logprobs"].pop()
    short["logprobs"]["top_logprobs"].pop()
    calls = _counting_full_parse(monkeypatch)
    spec = EngineSpec("vllm", ("http://x",), top_k=K, vocab_size=VOCAB, max_retries=0)
    engine = create_engine(spec, pool=_whole_server(choices))
    scores = ScoreSpec((0.25, 1.0))
    try:
        results = await asyncio.gather(
            *[engine.generate([ProposalRequest((1, 2), n, 0.25, s, scores)]) for s in choices],
            return_exceptions=True,
        )
    finally:
        await engine.aclose()
    assert len(calls) == 5  # (seed 6 alone read from its values)
    expected = {
        2: "NaN",
        3: f"vocabulary of {VOCAB} tokens (the vocab_size check)",
        4: "do not belong to the sampled tokens",
        5: f"returned {n - 1} tokens, {n} were requested",
    }
    for seed, got in zip(choices, results, strict=True):
        if seed in expected:
            assert isinstance(got, InvalidResponseError), (seed, got)
            assert expected[seed] in str(got), (seed, got)
            continue
        assert not isinstance(got, BaseException), (seed, got)
        _assert_identical(got[0], _alone(choices[seed], scores))


async def test_whole_answers_the_values_cannot_vouch_for_fail_as_before() -> None:
    """A row that is not a mapping, and a sampled token tied at the K-th value of a row longer
    than K (the full parse cuts it and checks it against that value, in its own arithmetic:
    at the tolerance's edge the two checks round apart), go through the full parse."""
    lp = -0.0008178324970353872
    edge = -0.0018178324970353874
    choices = {
        1: {
            "token_ids": [3, 4],
            "logprobs": {
                "token_logprobs": [-1.0, -2.0],
                "top_logprobs": [{"token_id:3": -1.0}, None],
            },
        },
        2: {
            "token_ids": [9],
            "logprobs": {
                "token_logprobs": [lp],
                "top_logprobs": [{"token_id:5": edge, "token_id:9": edge}],
            },
        },
    }
    spec = EngineSpec("vllm", ("http://x",), top_k=1, vocab_size=VOCAB, max_retries=0)
    engine = create_engine(spec, pool=_whole_server(choices))
    scores = ScoreSpec((0.25, 1.0))
    try:
        with pytest.raises(InvalidResponseError, match=r"seed=1.*top_logprobs\[1\] is missing"):
            await engine.generate([ProposalRequest((1, 2), 2, 0.25, 1, scores)])
        with pytest.raises(InvalidResponseError, match="missing from its top-1 row"):
            await engine.generate([ProposalRequest((1, 2), 1, 0.25, 2, scores)])
    finally:
        await engine.aclose()
