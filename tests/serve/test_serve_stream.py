"""Streaming (SSE) with the openai SDK, the async client under concurrency, and a client that
disconnects mid-stream: its chains are cancelled and their upstream requests aborted."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx
import openai
from serve_helpers import ServiceThread, load, reference_job, write_config

from benchmarks.latency_server import CostProfile, LatencyServer, ServerThread
from tests.support.emulation import EmulationServer


def test_stream_gives_the_plain_answer(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    with ServiceThread(load(config)) as service:
        client = openai.OpenAI(base_url=service.v1, api_key="unused")
        plain = client.completions.create(model="ref", prompt=[1, 2, 3], n=2, seed=9)
        chunks = list(
            client.completions.create(
                model="ref",
                prompt=[1, 2, 3],
                n=2,
                seed=9,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    streamed = {c.index: c.model_extra["token_ids"] for ch in chunks for c in ch.choices}
    assert streamed == {c.index: c.model_extra["token_ids"] for c in plain.choices}
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_stream_sends_a_comment_per_finished_block_before_the_answer(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    with ServiceThread(load(config)) as service:
        body = {"model": "ref", "prompt": [1, 2], "seed": 1, "stream": True}
        with httpx.stream("POST", f"{service.url}/v1/completions", json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines() if line]
    comments = [line for line in lines if line.startswith(":")]
    assert comments == [": block 1/2 prompt 0 chain 0", ": block 2/2 prompt 0 chain 0"]
    assert lines.index(comments[-1]) < next(i for i, x in enumerate(lines) if x.startswith("data"))
    assert lines[-1] == "data: [DONE]"


def test_stream_misses_no_blocks_progress_comment(tmp_path: Path) -> None:
    """Chains that finish together put their last comments in the queue at once: every one is
    written before the answer (the queue is drained when the chains finish)."""
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    with ServiceThread(load(config)) as service:
        for seed in range(6):
            body = {
                "model": "ref",
                "prompt": [[1, 2], [3]],
                "n": 8,
                "seed": seed,
                "stream": True,
            }
            with httpx.stream("POST", f"{service.url}/v1/completions", json=body) as r:
                lines = [line for line in r.iter_lines() if line]
            comments = {line for line in lines if line.startswith(":")}
            want = {
                f": block {b}/2 prompt {i} chain {j}"
                for b in (1, 2)
                for i in range(2)
                for j in range(8)
            }
            assert comments == want, (seed, sorted(want - comments))
            first_data = next(i for i, x in enumerate(lines) if x.startswith("data"))
            assert all(not x.startswith(":") for x in lines[first_data:])


def test_chat_stream_over_http(tmp_path: Path) -> None:
    with EmulationServer("vllm", vocab_size=64, tokenizer=True) as upstream:
        data = reference_job(tmp_path / "run")
        data["engines"] = [{"kind": "vllm", "name": "emu", "base_url": upstream.base_url}]
        config = write_config(tmp_path / "job.yaml", data)
        with ServiceThread(load(config)) as service:
            client = openai.OpenAI(base_url=service.v1, api_key="unused")
            messages = [{"role": "user", "content": "hi"}]
            plain = client.chat.completions.create(model="emu", messages=messages, seed=2)
            stream = client.chat.completions.create(
                model="emu", messages=messages, seed=2, stream=True
            )
            parts = list(stream)
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text == plain.choices[0].message.content and text
    assert parts[0].choices[0].delta.role == "assistant"
    assert parts[-1].choices[0].finish_reason == plain.choices[0].finish_reason


def test_async_client_many_requests_at_once(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    with ServiceThread(load(config)) as service:
        sync = openai.OpenAI(base_url=service.v1, api_key="unused")
        alone = [
            sync.completions.create(model="ref", prompt=[1, 2], seed=s).choices[0]
            for s in range(12)
        ]

        async def together() -> list[list[int]]:
            async with openai.AsyncOpenAI(base_url=service.v1, api_key="unused") as client:
                answers = await asyncio.gather(
                    *(
                        client.completions.create(model="ref", prompt=[1, 2], seed=s)
                        for s in range(12)
                    )
                )
            return [a.choices[0].model_extra["token_ids"] for a in answers]

        assert asyncio.run(together()) == [c.model_extra["token_ids"] for c in alone]


# 40 ms per engine step: a chain of 2 blocks of 4 tokens with 4 steps each runs for seconds.
# A step of 0.2 s: a chain's proposal lasts a second, so the four chains' requests overlap even
# on a loaded machine (at 40 ms, chains that started late on a busy CI machine found the first
# ones already past their proposals: 3 of 4 at once).
SLOW = CostProfile("test-slow", 0.2, 0.0, 0.0, 64)


def _running(upstream: ServerThread) -> float:
    text = httpx.get(f"{upstream.base_url}/metrics").text
    match = re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.M)
    assert match is not None
    return float(match.group(1))


def test_a_client_that_disconnects_mid_stream_cancels_its_chains(tmp_path: Path) -> None:
    with ServerThread(LatencyServer(SLOW)) as upstream:
        data = reference_job(tmp_path / "run")
        data["engines"] = [
            {"kind": "vllm", "name": "lat", "base_url": upstream.base_url, "probe": False}
        ]
        config = write_config(tmp_path / "job.yaml", data)
        with ServiceThread(load(config)) as service:
            body = {"model": "lat", "prompt": [1, 2], "n": 4, "seed": 1, "stream": True}
            with httpx.stream("POST", f"{service.url}/v1/completions", json=body) as r:
                assert r.status_code == 200
                deadline = time.monotonic() + 20
                while _running(upstream) < 4 and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert _running(upstream) >= 4  # the 4 chains' requests run upstream
            # the connection is closed: the chains are cancelled, the upstream requests aborted
            deadline = time.monotonic() + 10
            while _running(upstream) > 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert _running(upstream) == 0
            engine = service.running.service.engine  # type: ignore[union-attr]
            assert service.call(lambda: engine.in_flight) == 0
            metrics = httpx.get(f"{service.url}/metrics").text
            assert 'endpoint="/v1/completions",status="499"} 1' in metrics
            assert "presto_serve_chains_total 0" in metrics
