"""End to end over HTTP: jobs against the backends' emulation servers (vLLM and SGLang dialects
over the reference model), with prefix-cache metrics; and prompt tokenization via /tokenize."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from orch_helpers import make_config

from presto_client.backends import EngineSpec, create_engine
from presto_client.errors import EngineError
from presto_client.orchestration.job import run_job_async
from presto_client.orchestration.prompts.prompt_tokens import decode, encode
from tests.support.memory_pool import Answer, MemoryPool, Sent, json_answer
from tests.support.plans import plan_of

emulation = pytest.importorskip("tests.support.emulation")


@pytest.fixture
def servers() -> Iterator[tuple[str, str]]:
    with (
        emulation.EmulationServer("vllm", vocab_size=32, block_size=4) as vllm,
        emulation.EmulationServer(
            "sglang", vocab_size=32, deterministic=True, block_size=4
        ) as sglang,
    ):
        yield vllm.base_url, sglang.base_url


async def test_vllm_and_sglang_side_by_side(tmp_path: Path, servers: tuple[str, str]) -> None:
    vllm_url, sglang_url = servers
    cfg = make_config(
        tmp_path / "run",
        engines=[
            {"kind": "vllm", "name": "vllm", "base_url": vllm_url, "max_concurrency": 8},
            {
                "kind": "sglang",
                "name": "sglang",
                "base_url": sglang_url,
                "logprob_mode": "scaled",
                "max_concurrency": 8,
            },
        ],
        prompts={"token_ids": [[1, 2, 3], [4, 5, 6, 7]]},
        chains_per_prompt=1,
    )
    result = await run_job_async(plan_of(cfg))
    assert result.failed == 0 and result.completed == 2 * 2 * 2
    arms = {a["arm"]: a for a in result.summary["arms"]}
    assert set(arms) == {"vllm/sequential", "vllm/crn", "sglang/sequential", "sglang/crn"}
    for engine in ("vllm", "sglang"):
        crn = arms[f"{engine}/crn"]
        assert crn["baseline"] == f"{engine}/sequential"
        assert crn["identical_to_baseline"] == 2  # replay holds over HTTP too
        assert crn["prefix_cache_hit_rate"] is not None
        assert 0.0 < crn["prefix_cache_hit_rate"] <= 1.0
    metrics = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert {m["engine"] for m in metrics} == {"vllm", "sglang"}
    samples = [
        json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    ]
    assert all(s["status"] == "ok" and s["replica"] == 0 for s in samples)


async def test_unreachable_engine_is_a_clear_error(tmp_path: Path) -> None:
    cfg = make_config(
        tmp_path / "run",
        engines=[
            {
                "kind": "vllm",
                "base_url": "http://127.0.0.1:9",
                "max_retries": 0,
                "connect_timeout_s": 1,
            }
        ],
    )
    with pytest.raises(EngineError):
        await run_job_async(plan_of(cfg))
    # Nothing was computed, so nothing is left: no empty run directory (issue 10, item 16).
    assert not (tmp_path / "run").exists()


class _Tokenizer:
    """A server that knows some paths (``{path: answer}``) and answers 404 to the others; the
    HTTP engine of the vLLM dialect in front of it (its adapter builds, its transport sends)."""

    def __init__(self, known: dict[str, Any]) -> None:
        self.known = known
        self.sent: list[tuple[str, dict[str, Any]]] = []
        spec = EngineSpec("vllm", ("http://tokenizer:1",), model="m", name="fake")
        self.engine = create_engine(spec, pool=MemoryPool(self.answer))

    def answer(self, request: Sent) -> Answer:
        self.sent.append((request.path, json.loads(request.body or b"{}")))
        if request.path not in self.known:
            return json_answer(404, {"error": {"message": f"Not Found: {request.path}"}})
        return json_answer(200, self.known[request.path])


async def test_prompts_are_tokenized_by_the_engine() -> None:
    server = _Tokenizer({"/tokenize": {"tokens": [5, 6, 7]}, "/detokenize": {"prompt": "hi"}})
    engine = server.engine
    assert await encode(engine, "hello") == (5, 6, 7)
    path, payload = server.sent[-1]
    assert path == "/tokenize" and payload == {
        "model": "m",
        "prompt": "hello",
        "add_special_tokens": True,
    }
    await encode(engine, "hello", chat_template=True, system_prompt="be brief")
    _, payload = server.sent[-1]
    assert payload["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
    ]
    assert payload["add_generation_prompt"] is True
    assert await decode(engine, [5, 6]) == "hi"


async def test_tokenize_falls_back_and_explains() -> None:
    assert await encode(_Tokenizer({"/v1/tokenize": {"tokens": [1]}}).engine, "x") == (1,)
    nothing = _Tokenizer({}).engine
    with pytest.raises(EngineError, match=r"give prompts\.token_ids"):
        await encode(nothing, "x")
    assert await decode(nothing, [1]) is None  # a missing text never fails a chain


async def test_a_server_without_detokenize_is_asked_once(caplog: pytest.LogCaptureFixture) -> None:
    """Not two failing requests and a log line per chain: once per engine."""
    server = _Tokenizer({})
    with caplog.at_level("INFO", logger="presto_client.orchestration.prompts.prompt_tokens"):
        for _ in range(5):
            assert await decode(server.engine, [1, 2]) is None
    assert [p for p, _ in server.sent] == ["/detokenize", "/v1/detokenize"]
    assert len(caplog.records) == 1
    assert "samples keep the token ids" in caplog.text and "give prompts" not in caplog.text
