"""A non-HTTP engine kind is one file: this one defines an in-process kind wrapping the core's
reference model, registers it, and runs a job on it through ``presto run``'s Python entry.

It proves: a registered kind validates (its field errors name the path, an unknown kind lists it),
``presto validate`` describes it, ``presto run`` opens and runs it (the same chains as the
built-in reference kind over the same model), and a taken kind is refused.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
import yaml
from pydantic import Field

from presto_client.cli import main
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.errors import ConfigError
from presto_client.orchestration.config import engine_config
from presto_client.orchestration.config.engine_config import EngineConfigBase, register_engine_kind
from presto_client.orchestration.config.loading import validate_job_config

KIND = "toy_reference"


@dataclass(frozen=True, slots=True)
class ToyOpener:
    """What the plan holds for the toy engine: plain data that makes its one replica."""

    name: str
    vocab_size: int
    model_seed: int
    eos_token_id: int | None

    def open_replicas(self, embedded_urls: Mapping[str, str]) -> list[Any]:
        model = ReferenceModel(
            self.vocab_size, seed=self.model_seed, eos_token_id=self.eos_token_id
        )
        return [ReferenceEngine(model, name=self.name)]


class ToyEngineConfig(EngineConfigBase):
    """An in-process toy engine: the reference model at its default logit scale, exact scores."""

    kind: Literal["toy_reference"] = Field(description="The toy in-process engine.")
    vocab_size: int = Field(6, ge=2, description="Vocabulary size of the toy model.")
    model_seed: int = Field(0, ge=0, description="Seed of the toy model's logits.")

    takes_text: ClassVar[bool] = False

    def fingerprint_model(self) -> str | None:
        return f"toy:{self.vocab_size}:{self.model_seed}"

    def describe(self) -> str:
        return f"toy in-process model; vocab={self.vocab_size}"

    def opener(self, index: int) -> ToyOpener:
        return ToyOpener(str(self.name), self.vocab_size, self.model_seed, self.eos_token_id)


@pytest.fixture
def toy_kind() -> Iterator[None]:
    """The kind registered for one test, and the registry as it was afterwards."""
    before = dict(engine_config.ENGINE_TAGS)
    register_engine_kind(ToyEngineConfig)
    try:
        yield
    finally:
        engine_config.ENGINE_TAGS.clear()
        engine_config.ENGINE_TAGS.update(before)
        for hook in engine_config._REGISTERED_HOOKS:
            hook()


def _job(tmp_path: Path, engine: dict[str, Any], name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    job = {
        "name": name,
        "engines": [{"name": "eng", **engine}],
        "prompts": {"token_ids": [[1, 2, 3], [4, 5]]},
        "sampler": {
            "block_size": 4,
            "num_blocks": 2,
            "steps_per_block": 3,
            "traversals": ["sequential", "stream"],
        },
        "chains_per_prompt": 2,
        "output_dir": str(tmp_path / name),
    }
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return path


def _samples(run: Path) -> dict[str, dict[str, Any]]:
    lines = (run / "samples.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["chain_id"]: r for r in map(json.loads, lines)}


def test_presto_runs_a_job_on_the_registered_kind(toy_kind: None, tmp_path: Path) -> None:
    config = _job(tmp_path, {"kind": KIND, "vocab_size": 6, "model_seed": 3}, "toy")
    out = io.StringIO()
    assert main(["validate", str(config)], out=out) == 0
    assert f"engine eng [{KIND}] toy in-process model; vocab=6" in out.getvalue()

    assert main(["run", str(config), "-q"], out=io.StringIO()) == 0
    toy = _samples(tmp_path / "toy")
    assert len(toy) == 2 * 2 * 2 and all(r["status"] == "ok" for r in toy.values())
    run = json.loads((tmp_path / "toy" / "run.json").read_text(encoding="utf-8"))
    assert run["fingerprint"]["engines"]["eng"] == {
        "kind": KIND,
        "model": "toy:6:3",
        "eos_token_id": None,
    }

    # The same model behind the built-in kind: the same chains, token for token.
    same = _job(tmp_path, {"kind": "reference", "vocab_size": 6, "model_seed": 3}, "ref")
    assert main(["run", str(same), "-q"], out=io.StringIO()) == 0
    ref = _samples(tmp_path / "ref")
    assert {c: r["token_ids"] for c, r in toy.items()} == {
        c: r["token_ids"] for c, r in ref.items()
    }


def test_errors_of_a_registered_kind_name_the_field_and_list_it(toy_kind: None) -> None:
    with pytest.raises(ConfigError) as err:
        validate_job_config(
            {"engines": [{"kind": KIND, "vocab_size": 1}], "prompts": {"token_ids": [[1]]}}
        )
    assert "engines[0].vocab_size" in str(err.value)
    with pytest.raises(ConfigError) as err:
        validate_job_config({"engines": [{"kind": "tgi"}], "prompts": {"token_ids": [[1]]}})
    assert "unknown engine kind 'tgi'" in str(err.value) and KIND in str(err.value)


def test_a_taken_kind_is_refused(toy_kind: None) -> None:
    class Again(ToyEngineConfig):
        pass

    with pytest.raises(ValueError, match=f"engine kind '{KIND}' is already registered"):
        register_engine_kind(Again)

    class Vllm(EngineConfigBase):
        kind: Literal["vllm"]

    with pytest.raises(ValueError, match="'vllm' is already an HTTP backend"):
        register_engine_kind(Vllm)


def test_the_kind_is_unknown_unless_registered() -> None:
    with pytest.raises(ConfigError, match=f"unknown engine kind '{KIND}'"):
        validate_job_config({"engines": [{"kind": KIND}], "prompts": {"token_ids": [[1]]}})
