"""``presto serve`` answers with the tokens ``presto run`` gives for the same prompt, seed and
config: on the in-process reference engine and over HTTP (text prompts, chat) against the vLLM
emulation; and the same request with the same seed gives the same answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from serve_helpers import ServiceThread, load, reference_job, write_config

from presto_client.cli import main as presto_main
from tests.support.emulation import EmulationServer


def _presto_run(config: Path) -> list[dict[str, Any]]:
    assert presto_main(["run", str(config), "--no-progress", "-q"]) == 0
    cfg = load(config)
    lines = (Path(str(cfg.output_dir)) / "samples.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert rows and all(r["status"] == "ok" for r in rows)
    return sorted(rows, key=lambda r: (r["traversal"], r["prompt_index"], r["chain_index"]))


@pytest.mark.parametrize("traversal", ["stream", "sequential", "crn"])
def test_completions_match_presto_run_on_the_reference_engine(
    tmp_path: Path, traversal: str
) -> None:
    prompts = [[1, 2, 3], [4, 5]]
    data = reference_job(
        tmp_path / "run", prompts={"token_ids": prompts}, chains_per_prompt=3, seed=11
    )
    data["sampler"]["traversals"] = [traversal]
    config = write_config(tmp_path / "job.yaml", data)
    rows = _presto_run(config)
    with ServiceThread(load(config)) as service:
        client = openai.OpenAI(base_url=service.v1, api_key="unused")
        answer = client.completions.create(
            model="ref", prompt=prompts, n=3, seed=11, extra_body={"traversal": traversal}
        )
    got = [c.model_extra["token_ids"] for c in sorted(answer.choices, key=lambda c: c.index)]
    assert got == [r["token_ids"] for r in rows]
    assert len({tuple(t) for t in got}) > 1  # the chains differ: the seeds are per chain
    assert answer.usage.completion_tokens == sum(len(t) for t in got)
    assert answer.usage.prompt_tokens == 5
    assert answer.usage.model_extra["tokens_generated"] >= answer.usage.completion_tokens


def test_the_same_seed_gives_the_same_answer_and_another_seed_another(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    with ServiceThread(load(config)) as service:
        client = openai.OpenAI(base_url=service.v1, api_key="unused")

        def ids(seed: int | None) -> list[list[int]]:
            a = client.completions.create(model="ref", prompt=[1, 2, 3], n=4, seed=seed)
            return [c.model_extra["token_ids"] for c in a.choices]

        assert ids(5) == ids(5)
        assert ids(5) != ids(6)


@pytest.fixture
def emulation() -> Any:
    with EmulationServer("vllm", vocab_size=64, tokenizer=True, max_model_len=256) as server:
        yield server


def _http_job(output_dir: Path, url: str, **changes: Any) -> dict[str, Any]:
    data = reference_job(output_dir, **changes)
    data["engines"] = [
        {"kind": "vllm", "name": "emu", "base_url": url, "max_concurrency": 8, "max_retries": 0}
    ]
    return data


def test_text_prompt_over_http_matches_presto_run(tmp_path: Path, emulation: Any) -> None:
    data = _http_job(
        tmp_path / "run", emulation.base_url, prompts={"texts": ["power sampling"]}, seed=3
    )
    config = write_config(tmp_path / "job.yaml", data)
    rows = _presto_run(config)
    with ServiceThread(load(config)) as service:
        client = openai.OpenAI(base_url=service.v1, api_key="unused")
        answer = client.completions.create(model="emu", prompt="power sampling", seed=3)
    assert answer.choices[0].model_extra["token_ids"] == rows[0]["token_ids"]
    assert answer.choices[0].text == rows[0]["text"]


def test_chat_over_http_matches_presto_run_with_the_chat_template(
    tmp_path: Path, emulation: Any
) -> None:
    prompts = {"texts": ["what is 2+2?"], "chat_template": True, "system_prompt": "be brief"}
    data = _http_job(tmp_path / "run", emulation.base_url, prompts=prompts, seed=4)
    config = write_config(tmp_path / "job.yaml", data)
    rows = _presto_run(config)
    with ServiceThread(load(config)) as service:
        client = openai.OpenAI(base_url=service.v1, api_key="unused")
        answer = client.chat.completions.create(
            model=emulation.model_name,  # the upstream's model id is accepted too
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "what is 2+2?"},
            ],
            seed=4,
        )
    assert answer.choices[0].model_extra["token_ids"] == rows[0]["token_ids"]
    assert answer.choices[0].message.content == rows[0]["text"]
    assert answer.choices[0].finish_reason in ("stop", "length")


CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "what is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3+3?"},
]


def test_a_multi_turn_chat_matches_presto_run_on_the_templated_prompt(
    tmp_path: Path, emulation: Any
) -> None:
    # the prompt ids: the whole conversation through the upstream's own chat template
    templated = httpx.post(
        f"{emulation.base_url}/tokenize",
        json={"messages": CONVERSATION, "add_generation_prompt": True},
    ).json()["tokens"]
    data = _http_job(tmp_path / "run", emulation.base_url, prompts={"token_ids": [templated]})
    data["seed"] = 4
    config = write_config(tmp_path / "job.yaml", data)
    rows = _presto_run(config)
    with ServiceThread(load(config)) as service:
        client = openai.OpenAI(base_url=service.v1, api_key="unused")
        answer = client.chat.completions.create(model="emu", messages=CONVERSATION, seed=4)
        one_turn = client.chat.completions.create(model="emu", messages=CONVERSATION[-1:], seed=4)
    assert answer.choices[0].model_extra["token_ids"] == rows[0]["token_ids"]
    assert answer.usage.prompt_tokens == len(templated)
    # the earlier turns are in the prompt: the last turn alone is a shorter prompt
    assert one_turn.usage.prompt_tokens < len(templated)


def test_chat_refuses_a_conversation_that_ends_with_the_assistant(
    tmp_path: Path, emulation: Any
) -> None:
    config = write_config(tmp_path / "job.yaml", _http_job(tmp_path / "run", emulation.base_url))
    with ServiceThread(load(config)) as service:
        client = openai.OpenAI(base_url=service.v1, api_key="unused")
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="emu", messages=CONVERSATION[:3], seed=4)
    assert err.value.body["param"] == "messages"
    assert "end with a user message" in err.value.body["message"]


def test_chat_on_an_engine_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    with ServiceThread(load(config)) as service:
        client = openai.OpenAI(base_url=service.v1, api_key="unused")
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="ref", messages=CONVERSATION, seed=4)
    assert err.value.body["param"] == "messages"
    assert "cannot tokenize" in err.value.body["message"]


@pytest.mark.parametrize(
    "settings",
    [
        {"sampler": "entropy_cut", "beta": 2.0, "alpha": 3.0},
        {"sampler": {"kind": "multi_try_mh", "k_try": 2}, "steps_per_block": 3},
    ],
)
def test_per_request_settings_are_those_of_a_config(
    tmp_path: Path, settings: dict[str, Any]
) -> None:
    """Settings in the body give what a config with those settings gives ``presto run``."""
    data = reference_job(tmp_path / "run", chains_per_prompt=2, seed=5)
    data["sampler"] = {**data["sampler"], **settings}
    config = write_config(tmp_path / "job.yaml", data)
    rows = _presto_run(config)
    plain = write_config(tmp_path / "plain.yaml", reference_job(tmp_path / "unused"))
    with ServiceThread(load(plain)) as service:
        client = openai.OpenAI(base_url=service.v1, api_key="unused")
        answer = client.completions.create(
            model="ref", prompt=[1, 2, 3], n=2, seed=5, extra_body=settings
        )
    assert [c.model_extra["token_ids"] for c in answer.choices] == [r["token_ids"] for r in rows]
    name = settings["sampler"] if isinstance(settings["sampler"], str) else "multi_try_mh"
    assert answer.model_extra["presto"]["sampler"] == name


def test_a_stop_string_cuts_the_token_ids_where_it_cuts_the_text(
    tmp_path: Path, emulation: Any
) -> None:
    def detokenize(ids: list[int]) -> str:
        answer = httpx.post(f"{emulation.base_url}/detokenize", json={"tokens": ids})
        return str(answer.json()["prompt"])

    config = write_config(tmp_path / "job.yaml", _http_job(tmp_path / "run", emulation.base_url))
    with ServiceThread(load(config)) as service:
        client = openai.OpenAI(base_url=service.v1, api_key="unused")
        full = client.completions.create(model="emu", prompt="power sampling", seed=7)
        ids = full.choices[0].model_extra["token_ids"]
        stop = detokenize([ids[len(ids) // 2]])
        assert stop and len(ids) >= 3
        cut = client.completions.create(model="emu", prompt="power sampling", seed=7, stop=stop)
        streamed = list(
            client.completions.create(
                model="emu", prompt="power sampling", seed=7, stop=stop, stream=True
            )
        )
    text = full.choices[0].text
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    # the tokens up to the one that completed the stop string, found one prefix at a time
    k = next(k for k in range(1, len(ids) + 1) if stop in detokenize(ids[:k]))
    assert k < len(ids)
    assert cut.choices[0].model_extra["token_ids"] == ids[:k]
    assert cut.usage.completion_tokens == k
    assert streamed[0].choices[0].model_extra["token_ids"] == ids[:k]
    assert streamed[0].choices[0].text == cut.choices[0].text


def test_max_tokens_is_a_budget_that_stops_at_eos_as_presto_run(tmp_path: Path) -> None:
    """With the engine's EOS known, a served chain stops after the block whose state holds it
    (the same tokens as ``presto run``), and ``stop_at_eos: false`` runs every block."""
    prompts = [[1, 2, 3], [4, 5]]
    data = reference_job(
        tmp_path / "run", prompts={"token_ids": prompts}, chains_per_prompt=3, seed=11
    )
    data["engines"][0]["eos_token_id"] = 3
    data["sampler"].update(block_size=4, num_blocks=6)
    config = write_config(tmp_path / "job.yaml", data)
    rows = _presto_run(config)
    assert any(r["stats"]["stopped_at_eos"] for r in rows)  # the case happens
    with ServiceThread(load(config)) as service:
        client = openai.OpenAI(base_url=service.v1, api_key="unused")
        answer = client.completions.create(model="ref", prompt=prompts, n=3, seed=11, max_tokens=24)
        every = client.completions.create(
            model="ref",
            prompt=prompts,
            n=3,
            seed=11,
            max_tokens=24,
            extra_body={"stop_at_eos": False},
        )
    got = [c.model_extra["token_ids"] for c in sorted(answer.choices, key=lambda c: c.index)]
    assert got == [r["token_ids"] for r in rows]
    for choice in answer.choices:
        ids = choice.model_extra["token_ids"]
        assert choice.finish_reason == ("stop" if ids and ids[-1] == 3 else "length")
    full = [c.model_extra["token_ids"] for c in sorted(every.choices, key=lambda c: c.index)]
    assert (
        every.usage.model_extra["tokens_generated"] > answer.usage.model_extra["tokens_generated"]
    )
    for ids in full:  # every block ran: 24 tokens, cut only after a first EOS at the end
        assert len(ids) == 24 or ids[-1] == 3


def test_an_answer_that_ends_at_eos_leaves_the_eos_text_out(tmp_path: Path, emulation: Any) -> None:
    """``<|im_end|>`` (here ``<tN>``) is no part of an answer's text: its ids keep the EOS and
    ``finish_reason`` says ``stop``, as an OpenAI server answers."""
    ended = 0
    for eos in range(64):
        data = _http_job(
            tmp_path / f"run{eos}", emulation.base_url, prompts={"texts": ["power sampling"]}
        )
        data["engines"][0]["eos_token_id"] = eos
        config = write_config(tmp_path / f"job{eos}.yaml", data)
        with ServiceThread(load(config)) as service:
            client = openai.OpenAI(base_url=service.v1, api_key="unused")
            answer = client.completions.create(model="emu", prompt="power sampling", n=4, seed=3)
        for choice in answer.choices:
            ids = choice.model_extra["token_ids"]
            if ids and ids[-1] == eos:
                ended += 1
                assert choice.finish_reason == "stop"
                assert not choice.text.endswith(f"<t{eos}>")
                assert choice.text == "".join(f"<t{t}>" for t in ids[:-1])
        if ended:
            break
    assert ended > 0


def test_a_served_engine_without_an_eos_in_its_config_stops_at_its_chat_templates(
    tmp_path: Path,
) -> None:
    """``presto serve`` asks the server for its end-of-turn token as a job does, so answers
    end at it (``finish_reason: stop``) without ``eos_token_id`` in the config."""
    with EmulationServer(
        "vllm", vocab_size=32, tokenizer=True, max_model_len=256, end_of_turn_token_id=2
    ) as server:
        data = _http_job(tmp_path / "run", server.base_url, prompts={"texts": ["x"]})
        data["sampler"].update(block_size=4, num_blocks=16)
        config = write_config(tmp_path / "job.yaml", data)
        with ServiceThread(load(config)) as service:
            assert service.running is not None
            assert service.running.service.engine.eos_token_id == 2
            client = openai.OpenAI(base_url=service.v1, api_key="unused")
            answer = client.completions.create(model="emu", prompt="power", n=6, seed=1)
            every = client.completions.create(
                model="emu", prompt="power", n=6, seed=1, extra_body={"stop_at_eos": False}
            )
    ended = [c for c in answer.choices if c.finish_reason == "stop"]
    assert ended and all(c.model_extra["token_ids"][-1] == 2 for c in ended)
    assert (
        answer.usage.model_extra["tokens_generated"] < every.usage.model_extra["tokens_generated"]
    )
