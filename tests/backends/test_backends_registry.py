from __future__ import annotations

import dataclasses

import pytest

from presto_client import backends
from presto_client.backends import EngineSpec, available_backends, create_engine, register_backend
from presto_client.backends.openai_compat import OpenAICompatAdapter
from presto_client.backends.registry import adapter_class
from presto_client.backends.spec import Capabilities
from presto_client.core.engine_protocol import Engine
from presto_client.errors import ConfigError


def test_unknown_backend_lists_valid_names() -> None:
    with pytest.raises(ConfigError) as info:
        create_engine(EngineSpec("x", ("http://127.0.0.1:1",)))
    assert str(info.value) == (
        "unknown backend 'x'; valid backends are: llamacpp, openai, sglang, vllm"
    )


def test_available_backends_and_engine_protocol() -> None:
    assert available_backends() == ("llamacpp", "openai", "sglang", "vllm")
    for kind in available_backends():
        engine = create_engine(EngineSpec(kind, ("http://127.0.0.1:9",)))
        assert isinstance(engine, Engine)
        assert isinstance(engine.capabilities, Capabilities)
        assert engine.name == f"{kind}@127.0.0.1:9"


def test_register_third_party_backend() -> None:
    class MyAdapter(OpenAICompatAdapter):
        traits = dataclasses.replace(OpenAICompatAdapter.traits, dialect="mine")

    register_backend("mine", MyAdapter)
    try:
        assert "mine" in available_backends()
        engine = create_engine(EngineSpec("mine", ("http://h:1",), name="custom"))
        assert engine.name == "custom"
        assert isinstance(engine.adapter, MyAdapter)
    finally:
        backends.registry._REGISTRY.pop("mine")


def test_bad_modes_and_replicas() -> None:
    with pytest.raises(ConfigError, match="valid modes are: auto, raw, processed"):
        create_engine(EngineSpec("vllm", ("http://h:1",), logprob_mode="scaled"))
    with pytest.raises(ConfigError, match="valid modes are: auto, scaled, raw"):
        create_engine(EngineSpec("sglang", ("http://h:1",), logprob_mode="processed"))
    with pytest.raises(ConfigError, match="replica 2 out of range"):
        create_engine(EngineSpec("vllm", ("http://a:1", "http://b:1")), replica=2)
    with pytest.raises(ConfigError, match="no base_urls"):
        create_engine(EngineSpec("vllm", ()))


def test_auto_mode_resolution_and_capabilities() -> None:
    vllm = create_engine(EngineSpec("vllm", ("http://h:1",)))
    assert vllm.capabilities.logprob_mode == "raw"
    assert vllm.capabilities.calls_per_proposal == 1 and not vllm.capabilities.exact_logq
    assert vllm.capabilities.metrics == ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")
    sgl = create_engine(EngineSpec("sglang", ("http://h:1",)))
    assert sgl.capabilities.logprob_mode == "scaled"
    assert sgl.capabilities.exact_logq and sgl.capabilities.calls_per_proposal == 2
    oai = create_engine(EngineSpec("openai", ("http://h:1",)))
    assert not oai.capabilities.scoring_call


def test_spec_accepts_a_single_url_and_names_replicas() -> None:
    spec = EngineSpec("vllm", "http://10.0.0.1:8000")  # type: ignore[arg-type]
    assert spec.base_urls == ("http://10.0.0.1:8000",)
    two = EngineSpec("vllm", ("http://a:1", "http://b:2"), name="big")
    assert two.display_name(1) == "big#1"
    assert EngineSpec("vllm", ("http://a:1", "http://b:2")).display_name(1) == "vllm@b:2"
    assert adapter_class("vllm").traits.dialect == "vllm"
