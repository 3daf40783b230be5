"""The embedded server over real HTTP, checked against the shapes real vLLM returns."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.embedded

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_cpu"
MODEL = "smollm2-135m"
FRANCE = [504, 3575, 282, 4649, 314]  # "The capital of France is"

# Every sampling knob explicit, as the vLLM adapter sends them.
BASE: dict[str, Any] = {
    "model": MODEL,
    "top_p": 1,
    "top_k": 0,
    "min_p": 0,
    "repetition_penalty": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
    "ignore_eos": True,
    "skip_special_tokens": False,
}


def complete(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    resp = client.post("/v1/completions", json={**BASE, **fields})
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def metric(client: httpx.Client, name: str, labels: str = "") -> float:
    text = client.get("/metrics").text
    for line in text.splitlines():
        if line.startswith(name + "{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def lp_of(choice: dict[str, Any]) -> list[float]:
    return [float(x) for x in choice["logprobs"]["token_logprobs"]]


# ---- simple endpoints ---------------------------------------------------------------------------


def test_health_models_tokenize(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == 2048

    want = json.loads((FIXTURES / "tokenize.response.json").read_text())
    got = client.post(
        "/tokenize", json=json.loads((FIXTURES / "tokenize.request.json").read_text())
    )
    assert got.json() == want

    chat = client.post(
        "/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    )
    body = chat.json()
    assert body["tokens"][0] == 1  # <|im_start|>
    assert body["count"] == len(body["tokens"]) == 31  # as real vLLM (NOTES.md)

    text = client.post("/detokenize", json={"model": MODEL, "tokens": FRANCE}).json()
    assert text == {"prompt": "The capital of France is"}


# ---- completions --------------------------------------------------------------------------------


def test_completion_shape_matches_vllm(client: httpx.Client) -> None:
    request = json.loads((FIXTURES / "completion_raw_logprobs.request.json").read_text())
    vllm = json.loads((FIXTURES / "completion_raw_logprobs.response.json").read_text())
    ours = client.post("/v1/completions", json=request).json()

    assert set(ours) == set(vllm)
    assert set(ours["choices"][0]) == set(vllm["choices"][0])
    assert set(ours["usage"]) == set(vllm["usage"])
    assert re.fullmatch(r"cmpl-[0-9a-f]{16}", ours["id"])
    c, v = ours["choices"][0], vllm["choices"][0]
    n = request["max_tokens"]
    assert len(c["token_ids"]) == n and c["finish_reason"] == "length"
    assert c["prompt_token_ids"] == request["prompt"]
    assert ours["usage"]["completion_tokens"] == n
    lp = c["logprobs"]
    assert lp["tokens"] == [f"token_id:{t}" for t in c["token_ids"]]
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    offset = 0
    for i, tok in enumerate(lp["tokens"]):
        assert lp["text_offset"][i] == offset  # counted over the token strings, as vLLM does
        offset += len(tok)
        top = lp["top_logprobs"][i]
        assert next(iter(top)) == tok  # the sampled token first
        assert top[tok] == lp["token_logprobs"][i]
        assert len(top) in (request["logprobs"], request["logprobs"] + 1)
        assert all(k.startswith("token_id:") for k in top)
        rest = list(top.values())[1:]
        assert rest == sorted(rest, reverse=True)
    # Position 0 depends only on the prompt: the raw top-20 must equal real vLLM's (fp32).
    ours0, vllm0 = lp["top_logprobs"][0], v["logprobs"]["top_logprobs"][0]
    assert set(ours0) == set(vllm0)
    for key, value in vllm0.items():
        assert ours0[key] == pytest.approx(value, abs=1e-4)


def test_sampled_logprobs_equal_prompt_scores(client: httpx.Client) -> None:
    prompt = client.post(
        "/tokenize", json={"prompt": "Once upon a time, in a small village,"}
    ).json()["tokens"]
    # Warm the prefix cache with a shorter prompt, so the generation below prefills a
    # multi-token suffix on top of cached KV (the path that must agree with a full prefill).
    complete(client, prompt=prompt[:-5], max_tokens=1, temperature=1.0, seed=0)
    gen = complete(client, prompt=prompt, max_tokens=16, temperature=0.7, seed=11, logprobs=5)
    assert gen["usage"]["prompt_tokens"] == len(prompt)
    choice = gen["choices"][0]
    ids = choice["token_ids"]
    assert len(ids) == 16
    scored = complete(
        client, prompt=prompt + ids, max_tokens=1, temperature=1.0, seed=0, prompt_logprobs=0
    )["choices"][0]["prompt_logprobs"]
    assert scored[0] is None and len(scored) == len(prompt) + len(ids)
    for i, (tid, lp) in enumerate(zip(ids, lp_of(choice), strict=True)):
        entry = scored[len(prompt) + i]
        assert list(entry) == [str(tid)]
        assert entry[str(tid)]["logprob"] == pytest.approx(lp, abs=1e-4)
        assert entry[str(tid)]["rank"] >= 1


def test_prompt_logprobs_topk_and_rank(client: httpx.Client) -> None:
    vllm = json.loads((FIXTURES / "completion_prompt_logprobs.response.json").read_text())
    body = complete(
        client, prompt=FRANCE, max_tokens=1, temperature=0.25, seed=1, prompt_logprobs=3
    )
    entries = body["choices"][0]["prompt_logprobs"]
    assert entries[0] is None
    for ours, theirs in zip(entries[1:], vllm["choices"][0]["prompt_logprobs"][1:], strict=True):
        (key, want), *_ = theirs.items()
        assert next(iter(ours)) == key
        got = ours[key]
        assert got["rank"] == want["rank"] and got["decoded_token"] == want["decoded_token"]
        assert got["logprob"] == pytest.approx(want["logprob"], abs=1e-4)
        assert len(ours) in (3, 4)


def test_same_seed_alone_and_batched(client: httpx.Client) -> None:
    prompt = client.post("/tokenize", json={"prompt": "The three most important rules are"}).json()[
        "tokens"
    ]
    req = {"prompt": prompt, "max_tokens": 24, "temperature": 1.0, "logprobs": 1}
    alone = complete(client, seed=7, **req)["choices"][0]
    passes0 = metric(client, "presto_embedded:forward_passes_total")
    with ThreadPoolExecutor(4) as pool:
        batch = list(
            pool.map(lambda s: complete(client, seed=s, **req)["choices"][0], [7, 8, 9, 10])
        )
    passes = metric(client, "presto_embedded:forward_passes_total") - passes0
    assert batch[0]["token_ids"] == alone["token_ids"]
    assert lp_of(batch[0]) == pytest.approx(lp_of(alone), abs=1e-4)
    assert len({tuple(c["token_ids"]) for c in batch}) == 4  # different seeds differ
    # Batched: 4 x 24 tokens took far fewer than 96 forward passes.
    assert passes < 70, passes
    again = complete(client, seed=8, **req)["choices"][0]
    assert again["token_ids"] == batch[1]["token_ids"]


def test_greedy_and_string_prompt(client: httpx.Client) -> None:
    body = complete(client, prompt="The capital of France is", max_tokens=2, temperature=0)
    assert body["choices"][0]["token_ids"] == [7042, 30]  # " Paris." (NOTES.md)
    assert body["choices"][0]["text"] == " Paris."
    assert body["choices"][0]["logprobs"] is None


def test_several_prompts_in_one_request(client: httpx.Client) -> None:
    other = [504, 3575, 282, 7042]
    body = complete(
        client, prompt=[FRANCE, other], max_tokens=3, temperature=1.0, seed=4, logprobs=2
    )
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][1]["prompt_token_ids"] == other
    assert body["usage"]["prompt_tokens"] == 9 and body["usage"]["completion_tokens"] == 6
    # All prompts share the request's seed, as in vLLM: each choice equals a lone request.
    lone = complete(client, prompt=other, max_tokens=3, temperature=1.0, seed=4, logprobs=2)
    assert body["choices"][1]["token_ids"] == lone["choices"][0]["token_ids"]


def test_stops_at_eos_unless_ignored(client: httpx.Client) -> None:
    chat = client.post(
        "/tokenize",
        json={
            "messages": [{"role": "user", "content": "What is 2+2? Reply with just the number."}]
        },
    ).json()["tokens"]
    body = complete(
        client,
        prompt=chat,
        max_tokens=64,
        temperature=0,
        ignore_eos=False,
        skip_special_tokens=True,
    )
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["token_ids"][-1] == 2  # <|im_end|> is returned, as vLLM does
    assert choice["text"] == "2 + 2 = 4"  # EOS not in the text with skip_special_tokens
    ignored = complete(client, prompt=chat, max_tokens=10, temperature=0)["choices"][0]
    assert ignored["finish_reason"] == "length" and len(ignored["token_ids"]) == 10
    assert ignored["token_ids"][:8] == choice["token_ids"]
    stopped = complete(client, prompt=FRANCE, max_tokens=5, temperature=0, stop_token_ids=[30])
    assert stopped["choices"][0]["token_ids"] == [7042, 30]
    assert stopped["choices"][0]["finish_reason"] == "stop"


def test_prefix_cache_hits_are_counted(client: httpx.Client) -> None:
    text = "A long shared preamble about the history of sailing ships and their rigging. " * 4
    prompt = client.post("/tokenize", json={"prompt": text}).json()["tokens"]
    q0 = metric(client, "vllm:prefix_cache_queries_total")
    h0 = metric(client, "vllm:prefix_cache_hits_total")
    complete(client, prompt=prompt, max_tokens=2, temperature=1.0, seed=1)
    complete(client, prompt=[*prompt, 13], max_tokens=2, temperature=1.0, seed=2)
    queries = metric(client, "vllm:prefix_cache_queries_total") - q0
    hits = metric(client, "vllm:prefix_cache_hits_total") - h0
    assert queries == 2 * len(prompt) + 1
    assert hits >= len(prompt)  # the second request reused the whole first prompt (+ 1 token)


# ---- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "status", "needle"),
    [
        (
            {"logprobs": 50},
            400,
            "Requested sample logprobs of 50, which is greater than max allowed: 20",
        ),
        ({"prompt_logprobs": 21}, 400, "Requested prompt logprobs of 21"),
        ({"top_p": 0.9}, 400, "top_p"),
        ({"top_k": 5}, 400, "top_k"),
        ({"min_p": 0.1}, 400, "min_p"),
        ({"repetition_penalty": 1.2}, 400, "repetition_penalty"),
        ({"logit_bias": {"5": 1}}, 400, "logit_bias"),
        ({"n": 2}, 400, "n="),
        ({"echo": True}, 400, "echo"),
        ({"frobnicate": 1}, 400, "frobnicate"),
        ({"temperature": 3}, 400, "temperature must be in [0, 2], got 3.0."),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": [99999]}, 400, "Token id 99999 is out of vocabulary"),
        ({"prompt": []}, 400, "You must pass at least one prompt"),
        ({"prompt": [5] * 2048}, 400, "maximum context length is 2048"),
        ({"prompt": [[1, 2], [3, 4]], "stream": True}, 400, "one prompt per request"),
        ({"prompt": [[1, 2], []]}, 400, "non-empty"),
        ({"stream": True, "prompt_logprobs": 1}, 400, "not available when `stream=True`"),
        ({"model": "nope"}, 404, "The model `nope` does not exist"),
    ],
)
def test_bad_requests(
    client: httpx.Client, fields: dict[str, Any], status: int, needle: str
) -> None:
    body = {**BASE, "prompt": FRANCE, "max_tokens": 2, "temperature": 1.0, **fields}
    resp = client.post("/v1/completions", json=body)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert needle in err["message"]
    assert err["code"] == status
    assert set(err) == {"message", "type", "param", "code"}


def test_logprobs_50_error_is_vllms(client: httpx.Client) -> None:
    want = json.loads((FIXTURES / "error_400_logprobs_50.response.json").read_text())
    resp = client.post("/v1/completions", json={**BASE, "prompt": FRANCE, "logprobs": 50})
    assert resp.status_code == 400 and resp.json() == want


def test_malformed_json(client: httpx.Client) -> None:
    resp = client.post(
        "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == 400


# ---- streaming ----------------------------------------------------------------------------------


def test_streaming_matches_non_streaming(client: httpx.Client) -> None:
    req = {"prompt": FRANCE, "max_tokens": 6, "temperature": 1.0, "seed": 5, "logprobs": 2}
    plain = complete(client, **req)["choices"][0]
    chunks: list[dict[str, Any]] = []
    with client.stream(
        "POST",
        "/v1/completions",
        json={**BASE, **req, "stream": True, "stream_options": {"include_usage": True}},
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    vllm = [
        json.loads(line.removeprefix("data: "))
        for line in (FIXTURES / "completion_stream.sse.txt").read_text().splitlines()
        if line.startswith("data: {")
    ]
    assert set(chunks[0]) == set(vllm[0]) and set(chunks[-1]) == set(vllm[-1])
    assert set(chunks[0]["choices"][0]) == set(vllm[0]["choices"][0])
    assert set(chunks[-1]["usage"]) == set(vllm[-1]["usage"])
    usage = chunks.pop()
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert len(chunks) == 6
    ids = [c["choices"][0]["token_ids"][0] for c in chunks]
    assert ids == plain["token_ids"]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == FRANCE
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in chunks[1:])
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["text"]
    offsets = [c["choices"][0]["logprobs"]["text_offset"][0] for c in chunks]
    assert offsets == plain["logprobs"]["text_offset"]
    streamed_lp = [c["choices"][0]["logprobs"]["token_logprobs"][0] for c in chunks]
    assert streamed_lp == pytest.approx(lp_of(plain), abs=1e-4)


def test_closing_a_stream_aborts_it(client: httpx.Client, base_url: str) -> None:
    aborted0 = metric(client, "vllm:request_success_total", 'finished_reason="abort"')
    body = {
        **BASE,
        "prompt": FRANCE,
        "max_tokens": 1000,
        "temperature": 1.0,
        "seed": 3,
        "stream": True,
    }
    with (
        httpx.Client(base_url=base_url, timeout=60) as own,
        own.stream("POST", "/v1/completions", json=body) as resp,
    ):
        seen = 0
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                seen += 1
                if seen == 2:
                    break
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if metric(client, "vllm:request_success_total", 'finished_reason="abort"') > aborted0:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the closed stream was not aborted")
    assert metric(client, "vllm:num_requests_running") == 0
