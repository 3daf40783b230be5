"""Pure builders and parsers: dict in, dict / normalised logprobs out, no network."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from backend_helpers import FIXTURES

from presto_client.backends import EngineSpec
from presto_client.backends.metrics import parse_prometheus, prefix_cache_metrics
from presto_client.backends.openai_compat import OpenAICompatAdapter
from presto_client.backends.parsing import TokenLogprobs, error_message, logprob_value, topk_rows
from presto_client.backends.sglang import SglangAdapter
from presto_client.backends.vllm import VllmAdapter
from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec
from presto_client.core.logprob_math import exact_scores
from presto_client.core.reference import ReferenceModel
from presto_client.core.scoring import (
    exact_from_full_rows,
    exact_from_normalisers,
    scored_from_raw,
    scored_from_scaled,
)
from presto_client.errors import ConfigError, InvalidResponseError

SPEC = ScoreSpec((0.25, 0.5, 1.0), entropy=True)


def vllm(mode: str = "raw", top_k: int = 20) -> VllmAdapter:
    return VllmAdapter(EngineSpec("vllm", ("http://h:1",), logprob_mode=mode, top_k=top_k))


def sglang(mode: str = "scaled", top_k: int = 20, vocab: int | None = None) -> SglangAdapter:
    spec = EngineSpec("sglang", ("http://h:1",), logprob_mode=mode, top_k=top_k, vocab_size=vocab)
    return SglangAdapter(spec)


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def request(n: int, prefix: tuple[int, ...] = (1, 2, 3), tau: float = 0.25) -> ProposalRequest:
    return ProposalRequest(prefix, n, tau, 7, SPEC)


# ---- helpers


def test_logprob_value_sentinels_nan_missing() -> None:
    assert logprob_value(-9999.0, label="r", what="x") == -math.inf
    assert logprob_value(-3.4028234663852886e38, label="r", what="x") == -math.inf
    assert logprob_value(-0.5, label="r", what="x") == -0.5
    assert logprob_value(1e-7, label="r", what="x") == 0.0  # rounding noise above 0
    with pytest.raises(InvalidResponseError, match="req 3: NaN logprob"):
        logprob_value(float("nan"), label="req 3", what="x")
    with pytest.raises(InvalidResponseError, match="missing logprob"):
        logprob_value(None, label="r", what="x")
    with pytest.raises(InvalidResponseError, match="positive logprob"):
        logprob_value(0.5, label="r", what="x")


def test_topk_rows_dedupes_sorts_cuts_and_pads() -> None:
    rows = [
        [(5, -0.1), (7, -2.0), (5, -0.1), (9, -1.0)],  # 5 repeated (sampled token + top-K)
        [(3, -0.2)],
        [(4, -0.5), (8, -math.inf)],
    ]
    ids, lps = topk_rows(rows, 3, label="r")
    assert ids.tolist() == [[5, 9, 7], [3, -1, -1], [4, 8, -1]]
    assert lps[0].tolist() == [-0.1, -1.0, -2.0]
    assert np.isneginf(lps[1, 1:]).all() and np.isneginf(lps[2, 1:]).all()
    # A sampled token of rank > K is listed in addition to the top-K: cut to K, it goes.
    ids, _ = topk_rows([[(11, -9.0), (1, -0.1), (2, -0.2)]], 2, label="r")
    assert ids.tolist() == [[1, 2]]
    with pytest.raises(InvalidResponseError, match="listed twice"):
        topk_rows([[(5, -0.1), (5, -0.9)]], 2, label="r")


def test_error_message_shapes() -> None:
    body = load("error_400_logprobs_50.response.json")
    assert error_message(body, "?").startswith("Requested sample logprobs of 50")
    assert error_message({"object": "error", "message": "old shape"}, "?") == "old shape"
    assert error_message({"detail": [{"msg": "field required"}]}, "?") == "field required"
    assert error_message("not json", "fallback") == "fallback"


# ---- vLLM: real vLLM 0.32 responses (tests/fixtures/vllm_cpu)


def test_vllm_real_raw_response() -> None:
    req_body = load("completion_raw_logprobs.request.json")
    body = load("completion_raw_logprobs.response.json")
    req = ProposalRequest(tuple(req_body["prompt"]), 8, 0.25, 1, SPEC)
    parsed = vllm().parse_generate(req, body, label="fixture")
    assert parsed.token_ids.tolist() == [7042, 30, 198, 198, 504, 2988, 314, 42]
    assert parsed.logprobs[0] == pytest.approx(-0.25807321071624756)
    assert parsed.top_ids.shape == (8, 20)
    assert (np.diff(parsed.top_logprobs, axis=1) <= 0).all()
    scored = scored_from_raw(parsed, SPEC)
    assert (scored.logq_lo <= scored.logq_hi).all()
    np.testing.assert_allclose(scored.logq_lo[:, 2], parsed.logprobs)  # τ = 1 is exact
    widths = scored.logq_hi[:, 0] - scored.logq_lo[:, 0]
    assert float(np.median(widths)) < 1e-3  # usually tight ...
    assert float(np.max(widths)) < 0.1  # ... wide on a flat row (position 5: 0.061)


def test_vllm_real_processed_values_inside_raw_intervals() -> None:
    """The same request against a processed_logprobs server: same tokens (seeded), and each
    exact log q_0.25 lies in the interval certified from the raw server's top-20."""
    raw_body = load("completion_raw_logprobs.response.json")
    proc_body = load("completion_processed_logprobs.response.json")
    req = ProposalRequest((504, 3575, 282, 4649, 314), 8, 0.25, 1, SPEC)
    raw = vllm().parse_generate(req, raw_body, label="raw")
    proc = vllm("processed").parse_generate(req, proc_body, label="processed")
    assert proc.token_ids.tolist() == raw.token_ids.tolist()
    scored = scored_from_raw(raw, ScoreSpec((0.25,)))
    tol = 1e-4
    assert (proc.logprobs >= scored.logq_lo[:, 0] - tol).all()
    assert (proc.logprobs <= scored.logq_hi[:, 0] + tol).all()
    combined = scored_from_scaled(proc, 0.25, raw, SPEC)
    np.testing.assert_array_equal(combined.logq_lo[:, 0], proc.logprobs)
    assert combined.meta["scaled_outside_interval"] < tol


def test_vllm_real_processed_topk_sentinels_and_ids_from_tokens() -> None:
    body = load("completion_processed_topk.response.json")
    req = ProposalRequest((504, 3575, 282, 4649, 314), 2, 0.5, 1, SPEC)
    parsed = vllm("processed", top_k=5).parse_generate(req, body, label="fixture")
    assert parsed.token_ids.tolist() == [7042, 28]  # token_ids null: read from "token_id:<id>"
    # -9999.0 (masked by top_k=3) is -inf; the sampled token is not first after sorting.
    assert np.isneginf(parsed.top_logprobs[:, 3:]).all()
    assert parsed.top_ids[1, :3].tolist() == [30, 28, 284]


def test_vllm_real_prompt_logprobs() -> None:
    body = load("completion_prompt_logprobs.response.json")
    parsed = vllm().parse_score([504, 3575], [282, 4649, 314], body, 0, label="fixture")
    assert parsed.token_ids.tolist() == [282, 4649, 314]
    np.testing.assert_allclose(
        parsed.logprobs, [-0.3376066982746124, -2.4386610984802246, -0.45092111825942993]
    )
    assert parsed.top_ids.shape == (3, 0)
    with pytest.raises(InvalidResponseError, match="lacks the prompt token 9"):
        vllm().parse_score([504, 3575], [282, 9, 314], body, 0, label="fixture")
    with pytest.raises(InvalidResponseError, match="prompt_logprobs entries"):
        vllm().parse_score([504], [282, 4649, 314], body, 0, label="fixture")


def test_vllm_real_stream_events() -> None:
    adapter = vllm(top_k=2)
    req = ProposalRequest((504, 3575, 282, 4649, 314), 3, 0.25, 1, SPEC)
    chunks = []
    for line in (FIXTURES / "completion_stream.sse.txt").read_text().splitlines():
        if not line.startswith("data:") or line.endswith("[DONE]"):
            continue
        chunk = adapter.parse_stream_event(req, json.loads(line[5:]), label="stream")
        if chunk is not None:
            chunks.append(chunk)
    assert [c.token_ids.tolist() for c in chunks] == [[7042], [30], [198]]
    whole = chunks[0].concat(chunks[1]).concat(chunks[2])
    assert whole.logprobs[2] == pytest.approx(-1.0093424320220947)


def test_vllm_real_metrics_excerpt() -> None:
    text = (FIXTURES / "metrics_excerpt.txt").read_text()
    samples = parse_prometheus(text)
    assert samples["vllm:request_success_total"] == 23.0  # summed over label sets
    assert "vllm:prefix_cache_queries_created" not in samples
    metrics = prefix_cache_metrics(text, vllm().traits.metric_names)
    assert metrics["prefix_cache_queries"] == 2258.0
    assert metrics["prefix_cache_hits"] == 64.0
    assert metrics["prefix_cache_hit_rate"] == pytest.approx(64 / 2258)
    # vllm:external_prefix_cache_* (KV-connector sharing) must not be mixed in.
    external = text + 'vllm:external_prefix_cache_hits_total{engine="0"} 1000.0\n'
    assert prefix_cache_metrics(external, vllm().traits.metric_names)["prefix_cache_hits"] == 64.0
    # The same names without the _total suffix are read too.
    bare = "vllm:prefix_cache_queries 10\nvllm:prefix_cache_hits 4\n"
    assert prefix_cache_metrics(bare, vllm().traits.metric_names)["prefix_cache_hits"] == 4.0
    assert "process_start_time" not in metrics
    # The process collector's start time comes along when the server exposes it.
    started = bare + "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.7e9\n"
    assert prefix_cache_metrics(started, vllm().traits.metric_names)["process_start_time"] == 1.7e9


# ---- vLLM: builders and synthetic answers


def test_vllm_generate_payload_sets_every_knob() -> None:
    call = vllm(top_k=20).build_generate(request(16), "m", label="p")
    p = call.payload
    assert call.path == "/v1/completions" and not call.stream
    assert p["prompt"] == [1, 2, 3] and p["max_tokens"] == 16 and p["seed"] == 7
    assert p["temperature"] == 0.25 and p["logprobs"] == 20
    assert p["top_p"] == 1.0 and p["top_k"] == 0 and p["min_p"] == 0.0
    assert p["repetition_penalty"] == 1.0
    assert p["presence_penalty"] == 0.0 and p["frequency_penalty"] == 0.0
    assert p["ignore_eos"] is True and p["skip_special_tokens"] is False
    assert p["return_token_ids"] is True and p["return_tokens_as_token_ids"] is True
    assert p["n"] == 1 and p["stream"] is False
    stream = vllm().build_generate(request(4), "m", label="p", stream=True)
    assert stream.stream and stream.payload["stream"] is True
    with pytest.raises(ValueError, match="non-empty prefix"):
        vllm().build_generate(request(4, prefix=()), "m", label="p")


def test_vllm_score_payload() -> None:
    call = vllm().build_score([1, 2], [3, 4], "m", 20, label="s")
    p = call.payload
    assert p["prompt"] == [1, 2, 3, 4] and p["max_tokens"] == 1 and p["temperature"] == 1.0
    assert p["prompt_logprobs"] == 20 and "logprobs" not in p
    assert vllm().full_vocab_top_k() == -1


def _vllm_body(ids: list[int], lps: list[Any], tops: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "choices": [
            {
                "index": 0,
                "token_ids": ids,
                "logprobs": {
                    "token_logprobs": lps,
                    "tokens": [f"token_id:{t}" for t in ids],
                    "top_logprobs": tops,
                },
            }
        ]
    }


def test_vllm_parse_errors_name_the_request() -> None:
    adapter = vllm(top_k=2)
    good_top = {"token_id:1": -0.1, "token_id:2": -2.5}
    body = _vllm_body([1, 1], [-0.1, float("nan")], [good_top, good_top])
    with pytest.raises(InvalidResponseError, match=r"proposal 4.*NaN"):
        adapter.parse_generate(request(2), body, label="proposal 4")
    body = _vllm_body([1, 1], [-0.1, None], [good_top, good_top])
    with pytest.raises(InvalidResponseError, match="missing logprob"):
        adapter.parse_generate(request(2), body, label="p")
    body = _vllm_body([1], [-0.1], [good_top])
    with pytest.raises(InvalidResponseError, match="returned 1 tokens, 2 were requested"):
        adapter.parse_generate(request(2), body, label="p")
    body = _vllm_body([1, 1], [-0.1, -0.1], [good_top, good_top])
    body["choices"][0]["logprobs"] = None
    with pytest.raises(InvalidResponseError, match="no logprobs"):
        adapter.parse_generate(request(2), body, label="p")
    with pytest.raises(InvalidResponseError, match="no choices"):
        adapter.parse_generate(request(2), {"choices": []}, label="p")
    with pytest.raises(InvalidResponseError, match="reported an error: boom"):
        adapter.parse_generate(request(2), {"error": {"message": "boom"}}, label="p")


def test_vllm_sampled_token_outside_topk_is_not_in_the_top_set() -> None:
    adapter = vllm(top_k=2)
    top = {"token_id:9": -6.0, "token_id:1": -0.1, "token_id:2": -2.5}  # K+1 entries
    parsed = adapter.parse_generate(request(1), _vllm_body([9], [-6.0], [top]), label="p")
    assert parsed.top_ids.tolist() == [[1, 2]]
    assert parsed.logprobs.tolist() == [-6.0]


def test_vllm_next_token_topk_multi_prompt() -> None:
    adapter = vllm(top_k=2)
    calls = adapter.build_next_token_topk([[1], [1, 2]], 0.5, "m", label="n")
    assert len(calls) == 1 and calls[0].payload["prompt"] == [[1], [1, 2]]
    assert calls[0].payload["temperature"] == 0.5 and calls[0].payload["max_tokens"] == 1
    body = _vllm_body([3], [-0.2], [{"token_id:3": -0.2, "token_id:4": -1.8}])
    second = dict(body["choices"][0], index=1)
    body["choices"].insert(0, second)  # out of order: sorted by index
    out = adapter.parse_next_token_topk(calls, [body], 2, label="n")
    assert out.token_ids.tolist() == [3, 3] and out.top_ids.tolist() == [[3, 4], [3, 4]]
    with pytest.raises(InvalidResponseError, match="2 choices for 3 prompts"):
        adapter.parse_next_token_topk(calls, [body], 3, label="n")


# ---- SGLang


def _sgl(ids: list[int], lps: list[Any], tops: list[list[list[Any]]]) -> dict[str, Any]:
    return {
        "text": "",
        "output_ids": ids,
        "meta_info": {
            "finish_reason": {"type": "length", "length": len(ids)},
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids, strict=True)],
            "output_top_logprobs": tops,
        },
    }


def test_sglang_generate_payload() -> None:
    call = sglang().build_generate(request(8), "m", label="p")
    p = call.payload
    assert call.path == "/generate"
    assert p["input_ids"] == [1, 2, 3] and p["return_logprob"] is True
    assert p["top_logprobs_num"] == 20
    sp = p["sampling_params"]
    assert sp["max_new_tokens"] == 8 and sp["temperature"] == 0.25 and sp["sampling_seed"] == 7
    assert sp["top_p"] == 1.0 and sp["top_k"] == -1 and sp["min_p"] == 0.0
    assert sp["ignore_eos"] is True


def test_sglang_parse_generate_clamped_inf_and_errors() -> None:
    adapter = sglang(top_k=3)
    f32min = -3.4028234663852886e38
    tops = [[[-0.1, 5, None], [-2.0, 6, None], [f32min, 7, None], [-0.1, 5, None]]]
    parsed = adapter.parse_generate(request(1), _sgl([5], [-0.1], tops), label="p")
    assert parsed.top_ids.tolist() == [[5, 6, 7]]
    assert np.isneginf(parsed.top_logprobs[0, 2])
    with pytest.raises(InvalidResponseError, match="NaN"):
        adapter.parse_generate(request(1), _sgl([5], [float("nan")], tops), label="p")
    with pytest.raises(InvalidResponseError, match="returned 1 tokens, 2 were requested"):
        adapter.parse_generate(request(2), _sgl([5], [-0.1], tops), label="p")
    body = _sgl([5], [-0.1], tops)
    del body["meta_info"]["output_token_logprobs"]
    with pytest.raises(InvalidResponseError, match="output_token_logprobs is missing"):
        adapter.parse_generate(request(1), body, label="p")
    body = _sgl([5], [-0.1], tops)
    body["meta_info"]["finish_reason"] = {"type": "abort", "message": "oom"}
    with pytest.raises(InvalidResponseError, match="aborted it: oom"):
        adapter.parse_generate(request(1), body, label="p")


def test_sglang_scoring_call_and_parse() -> None:
    adapter = sglang(top_k=2)
    call = adapter.build_score([1, 2, 3], [4, 5], "m", 2, label="s")
    p = call.payload
    assert p["input_ids"] == [1, 2, 3, 4, 5] and p["logprob_start_len"] == 2
    assert p["sampling_params"]["max_new_tokens"] == 0
    assert p["sampling_params"]["temperature"] == 1.0
    assert "sampling_seed" not in p["sampling_params"]
    body = {
        "meta_info": {
            "input_token_logprobs": [[None, 3, None], [-0.5, 4, None], [-1.5, 5, None]],
            "input_top_logprobs": [
                None,
                [[-0.5, 4, None], [-1.0, 8, None]],
                [[-0.7, 9, None], [-1.5, 5, None]],
            ],
            "output_token_logprobs": [],
            "output_top_logprobs": [],
        }
    }
    parsed = adapter.parse_score([1, 2, 3], [4, 5], body, 2, label="s")
    assert parsed.token_ids.tolist() == [4, 5]
    assert parsed.logprobs.tolist() == [-0.5, -1.5]
    assert parsed.top_ids.tolist() == [[4, 8], [9, 5]]
    with pytest.raises(InvalidResponseError, match="not the tokens sent"):
        adapter.parse_score([1, 2, 3], [4, 6], body, 2, label="s")
    with pytest.raises(InvalidResponseError, match="expected 4"):
        adapter.parse_score([1, 2, 3], [4, 5, 6], body, 2, label="s")
    assert sglang(vocab=64).full_vocab_top_k() == 64 and sglang().full_vocab_top_k() is None


def test_sglang_batch_next_token_topk() -> None:
    adapter = sglang(top_k=2)
    calls = adapter.build_next_token_topk([[1], [1, 2]], 0.5, "m", label="n")
    p = calls[0].payload
    assert p["input_ids"] == [[1], [1, 2]] and len(p["sampling_params"]) == 2
    item = _sgl([3], [-0.2], [[[-0.2, 3, None], [-1.8, 4, None]]])
    out = adapter.parse_next_token_topk(calls, [[item, item]], 2, label="n")
    assert out.top_ids.tolist() == [[3, 4], [3, 4]]
    with pytest.raises(InvalidResponseError, match="list of 3 results"):
        adapter.parse_next_token_topk(calls, [[item, item]], 3, label="n")


def test_sglang_models_from_server_info() -> None:
    models = sglang().parse_models({"model_path": "Qwen/Qwen3-8B", "is_generation": True})
    assert models.names == ["Qwen/Qwen3-8B"]
    text = (
        'sglang:prompt_tokens_total{model_name="m"} 100.0\n'
        'sglang:cached_tokens_total{model_name="m",cache_source="device"} 60.0\n'
        'sglang:cached_tokens_total{model_name="m",cache_source="host"} 20.0\n'
    )
    metrics = prefix_cache_metrics(text, sglang().traits.metric_names)
    assert metrics == {
        "prefix_cache_queries": 100.0,
        "prefix_cache_hits": 80.0,
        "prefix_cache_hit_rate": 0.8,
    }


# ---- generic OpenAI-compatible: both response shapes


def openai(top_k: int = 2) -> OpenAICompatAdapter:
    return OpenAICompatAdapter(EngineSpec("openai", ("http://h:1",), top_k=top_k))


def test_openai_legacy_completions_shape() -> None:
    body: dict[str, Any] = {
        "choices": [
            {
                "text": "ab",
                "logprobs": {
                    "tokens": ["token_id:5", "token_id:6"],
                    "token_logprobs": [-0.1, -0.7],
                    "top_logprobs": [
                        {"token_id:5": -0.1, "token_id:9": -2.4},
                        {"token_id:3": -0.5, "token_id:6": -0.7, "token_id:1": -4.0},
                    ],
                },
            }
        ]
    }
    parsed = openai().parse_generate(request(2), body, label="p")
    assert parsed.token_ids.tolist() == [5, 6]
    assert parsed.top_ids.tolist() == [[5, 9], [3, 6]]
    body["choices"][0]["logprobs"]["tokens"] = ["a", "b"]
    with pytest.raises(InvalidResponseError, match="token id"):
        openai().parse_generate(request(2), body, label="p")


def test_openai_chat_shape_with_ids_and_duplicates() -> None:
    content = [
        {
            "id": 5,
            "token": "a",
            "logprob": -0.1,
            "top_logprobs": [
                {"id": 5, "token": "a", "logprob": -0.1},
                {"id": 5, "token": "a", "logprob": -0.1},
                {"id": 8, "token": "a", "logprob": -2.0},  # same text, another id
            ],
        },
        {
            "token": "token_id:6",
            "logprob": -9999.0,
            "top_logprobs": [{"token": "token_id:2", "logprob": -0.01}],
        },
    ]
    body = {"choices": [{"logprobs": {"content": content}}]}
    parsed = openai().parse_generate(request(2), body, label="p")
    assert parsed.token_ids.tolist() == [5, 6]
    assert parsed.top_ids.tolist() == [[5, 8], [2, -1]]
    assert np.isneginf(parsed.logprobs[1])
    content[0]["top_logprobs"] = [{"token": "a", "logprob": -0.1}]
    with pytest.raises(InvalidResponseError, match="no token id"):
        openai().parse_generate(request(2), body, label="p")
    with pytest.raises(InvalidResponseError, match="returned 2 tokens, 3 were requested"):
        openai().parse_generate(request(3), body, label="p")


def test_openai_payload_asks_for_raw_probs() -> None:
    p = openai(top_k=5).build_generate(request(4), "m", label="p").payload
    assert p["logprobs"] == 5 and p["n_probs"] == 5 and p["post_sampling_probs"] is False
    assert p["samplers"] == ["temperature"] and p["ignore_eos"] is True
    assert openai().scoring is None


# ---- from normalised logprobs to scores, against the exact reference model


def _raw_from_model(
    model: ReferenceModel, prefix: tuple[int, ...], ids: list[int], k: int
) -> TokenLogprobs:
    rows = model.rows(prefix, ids)
    order = np.argsort(-rows, axis=1)[:, :k]
    top = np.take_along_axis(rows, order, axis=1)
    return TokenLogprobs(
        np.asarray(ids), rows[np.arange(len(ids)), ids], order.astype(np.int64), top
    )


def test_scores_contain_the_exact_values() -> None:
    model = ReferenceModel(64, seed=3)
    prefix = (1, 2, 3)
    ids, _ = model.sample(prefix, 12, 0.25, seed=11)
    raw = _raw_from_model(model, prefix, ids, 20)
    logp0, logq, _ = exact_scores(ids, model.rows(prefix, ids), SPEC.temperatures)
    scored = scored_from_raw(raw, SPEC)
    np.testing.assert_allclose(scored.logp0, logp0)
    assert (scored.logq_lo <= logq + 1e-12).all() and (logq <= scored.logq_hi + 1e-12).all()
    # Two-call: the exact scaled value fills the τ = 0.25 column.
    scaled = TokenLogprobs(raw.token_ids, logq[:, 0], raw.top_ids, raw.top_logprobs)
    combined = scored_from_scaled(scaled, 0.25, raw, SPEC)
    np.testing.assert_allclose(combined.logq_lo[:, 0], logq[:, 0])
    np.testing.assert_allclose(combined.logq_hi[:, 0], logq[:, 0])
    assert combined.meta["scaled_outside_interval"] < 1e-9
    # Temperatures > 1 need the vocabulary size.
    with pytest.raises(ConfigError, match="vocab_size"):
        scored_from_raw(raw, ScoreSpec((2.0,)))
    hot = scored_from_raw(raw, ScoreSpec((2.0,)), vocab_size=64)
    _, logq_hot, _ = exact_scores(ids, model.rows(prefix, ids), (2.0,))
    assert (hot.logq_lo <= logq_hot + 1e-12).all() and (logq_hot <= hot.logq_hi + 1e-12).all()


def test_exact_from_full_rows_and_normalisers() -> None:
    model = ReferenceModel(64, seed=5)
    prefix = (4, 5)
    ids, _ = model.sample(prefix, 6, 0.5, seed=2)
    _, logq, entropy = exact_scores(ids, model.rows(prefix, ids), SPEC.temperatures)
    full = _raw_from_model(model, prefix, ids, 64)
    exact = exact_from_full_rows(ids, full, SPEC, 64)
    assert exact.is_exact
    np.testing.assert_allclose(exact.logq_lo, logq, atol=1e-12)
    assert exact.entropy is not None
    np.testing.assert_allclose(exact.entropy, entropy, atol=1e-12)
    raw = _raw_from_model(model, prefix, ids, 20)
    scaled_rows = {}
    for tau in (0.25, 0.5):
        rows = model.rows(prefix, ids)
        q = np.stack([np.asarray(r) / tau for r in rows])
        q = (
            q
            - np.log(np.exp(q - q.max(1, keepdims=True)).sum(1, keepdims=True))
            - q.max(1, keepdims=True)
        )
        order = np.argsort(-q, axis=1)[:, :20]
        scaled_rows[tau] = TokenLogprobs(
            np.asarray(ids), q[np.arange(6), ids], order, np.take_along_axis(q, order, axis=1)
        )
    exact2 = exact_from_normalisers(raw, scaled_rows, SPEC, label="s")
    np.testing.assert_allclose(exact2.logq_lo, logq, atol=1e-9)
