"""A third-party backend is one file plus its tests: the toy dialect of tests/support.

Registered at run time (:func:`backends.register_backend`) or declared as an entry point in the
group ``presto_client.backends``, it is listed by the registry, accepted by a YAML job config and
``presto validate``, built by ``create_engine`` and driven by the shared HTTP engine (here over
an in-memory pool: no network).
"""

from __future__ import annotations

import io
import json
from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest
import yaml

from presto_client import backends
from presto_client.backends import EngineSpec, available_backends, create_engine, register_backend
from presto_client.cli import main as cli_main
from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec
from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import load_job_config
from tests.support.memory_pool import Answer, MemoryPool, Sent, json_answer
from tests.support.toy_backend import ToyAdapter


@pytest.fixture
def toy_registered():
    register_backend("toy", ToyAdapter)
    yield "toy"
    backends.registry._REGISTRY.pop("toy", None)


@pytest.fixture
def toy_entry_point(monkeypatch: pytest.MonkeyPatch):
    """An installed distribution declaring ``toy = "tests.support.toy_backend:ToyAdapter"``."""
    real = backends.registry.entry_points

    def fake(*, group: str):
        if group == backends.registry.ENTRY_POINT_GROUP:
            return [EntryPoint("toy", "tests.support.toy_backend:ToyAdapter", group)]
        return real(group=group)

    monkeypatch.setattr(backends.registry, "entry_points", fake)
    yield "toy"
    backends.registry._REGISTRY.pop("toy", None)


def _toy_server(request: Sent) -> Answer:
    body = json.loads(request.body)
    assert request.path == "/toy/generate"
    n = body["n"]
    tokens = [(body["prompt"][-1] + 1 + i) % 5 for i in range(n)]
    top = [[[t, -0.5], [(t + 1) % 5, -1.5]] for t in tokens]
    return json_answer(200, {"tokens": tokens, "logprobs": [-0.5] * n, "top": top})


async def _generate_once(kind: str) -> None:
    spec = EngineSpec(kind, ("http://toy:1",), model="m", top_k=2, vocab_size=5)
    engine = create_engine(spec, pool=MemoryPool(_toy_server))
    try:
        request = ProposalRequest((1, 2), 3, 0.5, 7, ScoreSpec((0.5,)))
        (scored,) = await engine.generate([request])
    finally:
        await engine.aclose()
    assert scored.token_ids.tolist() == [3, 4, 0]
    assert np.allclose(scored.logp0, -0.5)
    assert np.all(scored.logq_lo <= scored.logq_hi)


async def test_a_registered_backend_is_listed_and_served(toy_registered: str) -> None:
    assert "toy" in available_backends()
    await _generate_once(toy_registered)


async def test_an_entry_point_backend_is_listed_and_served(toy_entry_point: str) -> None:
    assert "toy" in available_backends()
    await _generate_once(toy_entry_point)


def test_a_broken_entry_point_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        backends.registry,
        "entry_points",
        lambda *, group: [EntryPoint("bad", "no_such_module_xyz:Adapter", group)],
    )
    assert "bad" in available_backends()
    with pytest.raises(ConfigError, match="backend 'bad': cannot load no_such_module_xyz"):
        create_engine(EngineSpec("bad", ("http://h:1",)))


def _toy_job(tmp_path: Path) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "engines": [{"kind": "toy", "base_url": "http://toy:1", "model": "m"}],
                "prompts": {"token_ids": [[1, 2]]},
                "sampler": {"traversals": ["sequential", "crn"]},
                "output_dir": str(tmp_path / "run"),
            }
        )
    )
    return path


def test_yaml_refuses_an_unregistered_kind(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown engine kind 'toy'; valid kinds are: vllm"):
        load_job_config(_toy_job(tmp_path))


@pytest.mark.parametrize("how", ["toy_registered", "toy_entry_point"])
def test_yaml_and_presto_validate_accept_a_third_party_backend(
    how: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    request.getfixturevalue(how)
    cfg = load_job_config(_toy_job(tmp_path))
    assert cfg.engines[0].kind == "toy"
    out = io.StringIO()
    assert cli_main(["validate", str(_toy_job(tmp_path))], out=out) == 0
    assert "engine toy [toy]" in out.getvalue() and "toy/crn" in out.getvalue()
