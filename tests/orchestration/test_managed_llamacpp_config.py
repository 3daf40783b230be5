"""``kind: llamacpp`` without a URL is llama.cpp that presto builds and starts itself; with
one it is the server the user started. The config says which, refuses what only one of them
takes by name, and the plan carries the server to start and how its engine opens."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from presto_client.child_servers import llamacpp as llamacpp_server
from presto_client.child_servers.llamacpp import DEFAULT_SETUP_TIMEOUT_S
from presto_client.errors import ConfigError, EngineUnavailableError
from presto_client.orchestration.config.llamacpp_engine import ManagedLlamaCppConfig
from presto_client.orchestration.config.loading import load_job_config
from presto_client.orchestration.config.schema import HttpEngineConfig
from presto_client.orchestration.engines.engine_openers import StartedServerOpener
from presto_client.orchestration.engines.opening import start_embedded_servers
from presto_client.orchestration.planned import LlamaCppServer
from presto_client.orchestration.planning.plan import make_plan


def load(tmp_path: Path, *engines: dict[str, Any]) -> Any:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"engines": list(engines), "prompts": ["x"]}))
    return load_job_config(path)


def test_without_a_url_presto_starts_it_with_concurrency_of_its_slots(tmp_path: Path) -> None:
    cfg = load(tmp_path, {"kind": "llamacpp"}, {"kind": "llamacpp", "name": "two", "parallel": 2})
    first, second = cfg.engines
    assert isinstance(first, ManagedLlamaCppConfig) and first.name == "llamacpp0"
    assert (first.parallel, first.max_concurrency) == (4, 4)
    assert (second.parallel, second.max_concurrency) == (2, 2)
    assert first.resolved_eos_token_id() == 2 and first.known_vocab_size() == 49152
    assert "started by presto" in first.describe()


def test_an_explicit_concurrency_is_kept(tmp_path: Path) -> None:
    (e,) = load(tmp_path, {"kind": "llamacpp", "parallel": 2, "max_concurrency": 8}).engines
    assert (e.parallel, e.max_concurrency) == (2, 8)


def test_with_a_url_it_is_the_users_server(tmp_path: Path) -> None:
    (e,) = load(tmp_path, {"kind": "llamacpp", "base_url": "http://127.0.0.1:8790"}).engines
    assert isinstance(e, HttpEngineConfig) and e.server() is None


def test_fields_of_a_started_server_say_to_give_its_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, {"kind": "llamacpp", "model": "m", "logprob_mode": "raw"})
    msg = str(err.value)
    assert "engines[0]: logprob_mode, model: for a llama-server you started" in msg
    assert "give its base_url" in msg and "parallel" in msg
    assert "llamacpp-managed" not in msg  # the union tag is no part of the path


def test_unknown_fields_and_bad_slots_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load(
            tmp_path, {"kind": "llamacpp", "dtype": "float32"}, {"kind": "llamacpp", "parallel": 0}
        )
    msg = str(err.value)
    assert "engines[0].dtype: unknown field 'dtype'" in msg and "setup_timeout_s" in msg
    assert "engines[1].parallel: Input should be greater than or equal to 1" in msg
    assert "engines[1].max_concurrency" not in msg  # one problem, said once


def test_the_kinds_listed_are_the_ones_a_config_writes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, {"kind": "tgi"})
    assert "valid kinds are: vllm, sglang, openai, llamacpp, embedded, reference" in str(err.value)


def test_the_plan_starts_its_server_and_opens_it_as_llamacpp(tmp_path: Path) -> None:
    cfg = load(tmp_path, {"kind": "llamacpp", "parallel": 3, "port": 8999, "top_k": 5})
    e = make_plan(cfg, ()).engines["llamacpp"]
    assert e.server == LlamaCppServer(3, 8999, 120.0, DEFAULT_SETUP_TIMEOUT_S, threads=None)
    cfg = load(tmp_path, {"kind": "llamacpp", "threads": 1})
    assert make_plan(cfg, ()).engines["llamacpp"].server.threads == 1
    assert e.kind == "llamacpp" and e.probes
    assert isinstance(e.opener, StartedServerOpener)
    with pytest.raises(ConfigError, match="its server was not started"):
        e.opener.open_replicas({})
    (replica,) = e.opener.open_replicas({"llamacpp": "http://127.0.0.1:8999"})
    try:
        assert type(replica.adapter).__name__ == "LlamaCppAdapter"
        assert replica.spec.base_urls == ("http://127.0.0.1:8999",) and replica.spec.top_k == 5
        assert replica.spec.vocab_size == 49152 and replica.spec.max_concurrency == 3
    finally:
        asyncio.run(replica.aclose())


def test_a_server_that_cannot_start_names_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llamacpp_server, "SCRIPT", tmp_path / "missing" / "llamacpp.sh")
    plan = make_plan(load(tmp_path, {"kind": "llamacpp", "name": "lc"}), ())
    with contextlib.ExitStack() as stack, pytest.raises(EngineUnavailableError) as err:
        start_embedded_servers(plan, stack)
    assert err.value.engine == "lc"
    assert "the llama.cpp engine did not start" in str(err.value) and "kind: embedded" in str(
        err.value
    )
