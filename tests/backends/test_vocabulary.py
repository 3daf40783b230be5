"""Token ids a model cannot have are refused where answers are parsed (negative, or at or past
the vocabulary size when it is known: the config's, or the server's own, see
test_server_vocabulary.py), naming the engine and the check, and at the config edge for
prompts."""

from __future__ import annotations

import math
from typing import Any

import pytest

from presto_client.backends import EngineSpec, create_engine
from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec
from presto_client.errors import InvalidResponseError
from presto_client.orchestration.config.schema import JobConfig
from tests.support.memory_pool import Answer, MemoryPool, Sent, json_answer

LP = math.log(0.5)


def completion(ids: list[int]) -> dict[str, Any]:
    top = [{f"token_id:{t}": LP, "token_id:1": math.log(0.25)} for t in ids]
    logprobs = {"token_logprobs": [LP] * len(ids), "top_logprobs": top}
    return {"choices": [{"index": 0, "token_ids": ids, "logprobs": logprobs}]}


def answering(ids: list[int]) -> Any:
    def handler(request: Sent) -> Answer:
        return json_answer(200, completion(ids))

    return handler


REQUEST = ProposalRequest((5, 6), 3, 1.0, 7, ScoreSpec((1.0,)))


@pytest.mark.parametrize(
    ("ids", "vocab", "match"),
    [
        ([3, 4, 100000], 64, r"token id 100000, outside the model's vocabulary of 64 tokens"),
        ([3, -5, 4], None, r"token id -5, negative \(the token-id check\)"),
    ],
)
async def test_impossible_ids_in_an_answer_are_refused(
    ids: list[int], vocab: int | None, match: str
) -> None:
    spec = EngineSpec("vllm", ("http://box:8000",), model="m", vocab_size=vocab)
    engine = create_engine(spec, pool=MemoryPool(answering(ids)))
    with pytest.raises(InvalidResponseError, match=match):
        await engine.generate([REQUEST])
    await engine.aclose()


async def test_ids_inside_the_vocabulary_are_kept() -> None:
    spec = EngineSpec("vllm", ("http://box:8000",), model="m", vocab_size=64)
    engine = create_engine(spec, pool=MemoryPool(answering([3, 4, 63])))
    (scored,) = await engine.generate([REQUEST])
    assert scored.token_ids.tolist() == [3, 4, 63]
    await engine.aclose()


def _job(prompts: list[list[int]], **engine: Any) -> dict[str, Any]:
    return {
        "engines": [{"kind": "vllm", "base_url": "http://box:8000", **engine}],
        "prompts": {"token_ids": prompts},
    }


def test_negative_prompt_ids_are_refused_at_the_config() -> None:
    with pytest.raises(ValueError, match=r"token_ids\[1\] holds -3"):
        JobConfig.model_validate(_job([[1, 2], [4, -3]]))


def test_prompt_ids_outside_a_known_vocabulary_are_refused_at_the_config() -> None:
    with pytest.raises(ValueError, match=r"holds 64, outside engines\[0\]'s vocabulary of 64"):
        JobConfig.model_validate(_job([[1, 64]], vocab_size=64))
    JobConfig.model_validate(_job([[1, 64]]))  # no vocabulary known: the server decides
    with pytest.raises(ValueError, match="vocabulary of 49152"):
        JobConfig.model_validate(
            {"engines": [{"kind": "embedded"}], "prompts": {"token_ids": [[49152]]}}
        )
