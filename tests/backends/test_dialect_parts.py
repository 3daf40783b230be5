"""The adapter contract's shape: a required core, optional parts that are ``None`` or whole.

A new dialect writes its traits and the core (the toy dialect is the minimal one); each part a
shipped dialect exposes has every method of its protocol, and the flags that gate a part agree
with it being there (a slots path without a slots part would fail at the first request).
"""

from __future__ import annotations

import pytest

from presto_client.backends import EngineSpec
from presto_client.backends.adapter import (
    Adapter,
    AnswerRepairs,
    ScoringCalls,
    SlotPlacement,
    TokenizerCalls,
)
from presto_client.backends.llamacpp import LlamaCppAdapter
from presto_client.backends.openai_compat import OpenAICompatAdapter
from presto_client.backends.sglang import SglangAdapter
from presto_client.backends.vllm import VllmAdapter
from tests.support.toy_backend import ToyAdapter

PARTS = {
    "scoring": ScoringCalls,
    "slots": SlotPlacement,
    "repairs": AnswerRepairs,
    "tokenizer": TokenizerCalls,
}
DIALECTS = [VllmAdapter, SglangAdapter, OpenAICompatAdapter, LlamaCppAdapter, ToyAdapter]


def _adapter(cls: type[Adapter]) -> Adapter:
    return cls(EngineSpec(cls.traits.dialect, ("http://127.0.0.1:9",)))


def _members(protocol: type) -> list[str]:
    return [n for n in vars(protocol) if not n.startswith("_")]


def test_the_toy_dialect_is_the_core_alone() -> None:
    toy = _adapter(ToyAdapter)
    assert all(getattr(toy, name) is None for name in PARTS)
    own = {n for n in vars(ToyAdapter) if not n.startswith("_")}
    assert own == {"traits", "build_generate", "parse_generate"}


@pytest.mark.parametrize("cls", DIALECTS, ids=lambda c: c.traits.dialect)
def test_each_part_is_absent_or_whole(cls: type[Adapter]) -> None:
    adapter = _adapter(cls)
    for name, protocol in PARTS.items():
        part = getattr(adapter, name)
        if part is not None:
            missing = [m for m in _members(protocol) if not callable(getattr(part, m, None))]
            assert not missing, f"{cls.traits.dialect}.{name} lacks {missing}"
    assert (cls.traits.slots_path is not None) == (adapter.slots is not None)
    if cls.traits.stream_reports_progress:
        assert adapter.repairs is not None
    if cls.traits.streaming:
        assert cls.parse_stream_event is not Adapter.parse_stream_event
    assert adapter.capabilities().scoring_call == (adapter.scoring is not None)


def test_who_has_which_part() -> None:
    have = {
        cls.traits.dialect: {n for n in PARTS if getattr(_adapter(cls), n) is not None}
        for cls in DIALECTS
    }
    assert have == {
        "vllm": {"scoring", "tokenizer"},
        "sglang": {"scoring", "tokenizer"},
        "openai": {"tokenizer"},
        "llamacpp": {"scoring", "slots", "repairs", "tokenizer"},
        "toy": set(),
    }


def test_tokenizer_calls_on_the_wire_are_the_dialects() -> None:
    vllm = _adapter(VllmAdapter).tokenizer
    llama = _adapter(LlamaCppAdapter).tokenizer
    assert vllm is not None and llama is not None
    calls = vllm.build_tokenize("hi", "m")
    assert [c.path for c in calls] == ["/tokenize", "/v1/tokenize"]
    assert calls[0].payload == {"model": "m", "prompt": "hi", "add_special_tokens": True}
    assert [c.path for c in vllm.build_detokenize([1], None)] == ["/detokenize", "/v1/detokenize"]
    (call,) = llama.build_tokenize("hi", "m")
    assert (call.path, call.payload) == (
        "/tokenize",
        {"content": "hi", "add_special": True, "parse_special": True},
    )
    assert [c.path for c in llama.build_detokenize([1], None)] == ["/detokenize"]
    assert llama.build_tokenize_messages([{"role": "user", "content": "x"}], "m")[0].path == (
        "/apply-template"
    )
