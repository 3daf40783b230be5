"""The vocabulary size a server tells (``backends/vocabulary.py``), and the answer check that
uses it: vLLM's and SGLang's refusal of an id past the vocabulary states the size (one
request, over the emulations' HTTP), llama.cpp's model listing has ``meta.n_vocab``, a server
whose refusal does not state it is searched in a bounded number of requests, and a hostile
server whose answers hold ids past the vocabulary it says it has fails the proposal naming the
engine, the id and the check."""

from __future__ import annotations

import pytest

from presto_client.backends import EngineSpec, create_engine
from presto_client.backends.vocabulary import (
    FAR_ID,
    adopt_vocab_size,
    discover_vocab_size,
    search_vocab_size,
    vocab_from_message,
)
from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec
from presto_client.errors import InvalidResponseError
from tests.support.emulation import EmulationServer
from tests.support.memory_pool import Answer, MemoryPool, Sent, json_answer

LLAMACPP_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "smollm2",
            "object": "model",
            "owned_by": "llamacpp",
            "meta": {"vocab_type": 2, "n_vocab": 49152, "n_ctx_train": 8192, "n_embd": 576},
        }
    ],
}


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_one_refused_far_id_tells_the_size(dialect: str) -> None:
    with EmulationServer(dialect, vocab_size=32) as server:
        engine = create_engine(EngineSpec(dialect, (server.base_url,)))
        try:
            answer = await discover_vocab_size(engine)
        finally:
            await engine.aclose()
        probes = server.stats.requests.get("/v1/completions" if dialect == "vllm" else "/generate")
    assert answer.size == 32 and "refusal" in answer.how
    assert probes == 1


async def test_llamacpp_lists_n_vocab_with_its_models() -> None:
    seen: list[str] = []

    def handler(request: Sent) -> Answer:
        seen.append(f"{request.method} {request.path}")
        return json_answer(200, LLAMACPP_MODELS)

    spec = EngineSpec("llamacpp", ("http://llama:8790",), top_k=3)
    engine = create_engine(spec, pool=MemoryPool(handler))
    answer = await discover_vocab_size(engine)
    await engine.aclose()
    assert answer.size == 49152 and "n_vocab" in answer.how
    assert seen == ["GET /v1/models"]


async def test_a_listing_without_n_vocab_tells_nothing() -> None:
    def handler(request: Sent) -> Answer:
        return json_answer(200, {"data": [{"id": "m"}]})

    engine = create_engine(EngineSpec("openai", ("http://box:1",)), pool=MemoryPool(handler))
    answer = await discover_vocab_size(engine)
    await engine.aclose()
    assert answer.size is None and "meta.n_vocab" in answer.how


def _server(size: int, asked: list[int], *, says_size: bool = False) -> object:
    async def probe(token_id: int) -> str | None:
        asked.append(token_id)
        if 0 <= token_id < size:
            return None
        return f"Token id {token_id} is out of vocabulary" + (f" ({size})" if says_size else "")

    return probe


@pytest.mark.parametrize("size", [49152, 151936, 262144, 32, 32768, 32769])
async def test_a_refusal_without_the_size_is_searched_in_a_bounded_number_of_requests(
    size: int,
) -> None:
    asked: list[int] = []
    answer = await search_vocab_size(_server(size, asked))  # type: ignore[arg-type]
    assert answer.size == size
    assert asked[:2] == [FAR_ID, 0] and len(asked) <= 25, asked
    if size == 49152:  # (SmolLM2's: 2 checks, 2 doublings, 15 halvings)
        assert len(asked) == 19


async def test_an_expected_size_is_confirmed_in_two_more_requests() -> None:
    asked: list[int] = []
    answer = await search_vocab_size(_server(49152, asked), expected=49152)  # type: ignore[arg-type]
    assert answer.size == 49152 and asked == [FAR_ID, 0, 49151, 49152]
    asked.clear()
    wrong = await search_vocab_size(_server(49152, asked), expected=32000)  # type: ignore[arg-type]
    assert wrong.size == 49152  # (the search decides: the caller reports the disagreement)


async def test_a_server_that_checks_nothing_or_refuses_the_probe_tells_nothing() -> None:
    async def accepts_all(token_id: int) -> str | None:
        return None

    async def refuses_all(token_id: int) -> str | None:
        return "logit_bias is not supported"

    assert (await search_vocab_size(accepts_all)).size is None
    assert (await search_vocab_size(refuses_all)).size is None


def test_the_size_is_read_from_each_servers_words() -> None:
    vllm = (
        "token_id(s) [2147483647] in logit_bias contain out-of-vocab token ids. "
        "Vocabulary size: 49152 (parameter=logit_bias, value=[2147483647])"
    )
    sglang = "The input_ids [2147483647] contains values greater than the vocab size (151936)."
    newer = "token_ids_logprob contains out-of-vocabulary token id 99; valid range is [0, 64)."
    assert vocab_from_message(vllm) == 49152
    assert vocab_from_message(sglang) == 151936
    assert vocab_from_message(newer) == 64
    assert vocab_from_message("Token id 2147483647 is out of vocabulary") is None


async def test_adopting_a_size_reaches_every_part_holding_the_spec() -> None:
    engine = create_engine(EngineSpec("sglang", ("http://box:1",), logprob_mode="raw"))
    adopt_vocab_size(engine, 151936)
    assert engine.spec.vocab_size == 151936
    assert engine.adapter.spec is engine.spec and engine.generation.spec is engine.spec
    assert engine.adapter.full_vocab_top_k() == 151936  # (SGLang's full rows need it)
    await engine.aclose()


async def test_an_answer_past_the_vocabulary_the_server_states_fails_naming_the_check() -> None:
    # A hostile server: it checks ids (and says so) against 16 tokens, its model has 64.
    with EmulationServer("vllm", vocab_size=64, checked_vocab_size=16) as server:
        spec = EngineSpec("vllm", (server.base_url,), name="hostile", top_k=5)
        engine = create_engine(spec)
        try:
            told = await discover_vocab_size(engine)
            assert told.size == 16
            adopt_vocab_size(engine, 16)
            request = ProposalRequest((1, 2), 24, 1.0, 3, ScoreSpec((1.0,)))
            with pytest.raises(InvalidResponseError) as err:
                await engine.generate([request])
        finally:
            await engine.aclose()
    text = str(err.value)
    assert text.startswith("[hostile] ") and "the vocab_size check" in text
    assert "outside the model's vocabulary of 16 tokens" in text
    assert "engines[].vocab_size" in text


async def test_a_generic_server_that_is_vllm_tells_its_size_by_its_refusal() -> None:
    """Issue 48: the generic dialect (``kind: openai``) in front of vLLM (a gateway, say) had no
    way to learn the vocabulary (its listing has no ``meta.n_vocab``), so answers holding ids past
    it were kept. vLLM's refusal of a far ``logit_bias`` id states the size: one request, and an
    answer past that size then fails naming the check."""
    with EmulationServer("vllm", vocab_size=64, checked_vocab_size=16) as server:
        spec = EngineSpec("openai", (server.base_url,), name="gateway", top_k=5)
        engine = create_engine(spec)
        try:
            told = await discover_vocab_size(engine)
            probes = server.stats.requests.get("/v1/completions")
            assert told.size == 16 and "refusal" in told.how and probes == 1
            adopt_vocab_size(engine, told.size)
            request = ProposalRequest((1, 2), 24, 1.0, 3, ScoreSpec((1.0,)))
            with pytest.raises(InvalidResponseError, match="the vocab_size check"):
                await engine.generate([request])
        finally:
            await engine.aclose()


async def test_a_generic_server_that_accepts_a_far_id_tells_nothing() -> None:
    sent: list[str] = []

    def handler(request: Sent) -> Answer:
        sent.append(f"{request.method} {request.path}")
        if request.path.endswith("/models"):
            return json_answer(200, {"data": [{"id": "m"}]})
        return json_answer(200, {"choices": [{"text": "x"}]})

    engine = create_engine(EngineSpec("openai", ("http://box:1",)), pool=MemoryPool(handler))
    answer = await discover_vocab_size(engine)
    await engine.aclose()
    assert answer.size is None and f"accepts a logit_bias for token id {FAR_ID}" in answer.how
    assert sent.count("POST /v1/completions") == 1  # one probe, no search
