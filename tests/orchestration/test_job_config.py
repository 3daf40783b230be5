"""Job configs: validation errors name the file, the field path and the fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import load_job_config, redacted_dump
from presto_client.orchestration.config.overrides import apply_override
from presto_client.orchestration.prompts.prompt_rows import load_prompts

ROOT = Path(__file__).resolve().parents[2]


def test_valid_config_with_defaults(write_config: Callable[..., Path]) -> None:
    cfg = load_job_config(write_config())
    assert cfg.engines[0].name == "ref"
    assert cfg.sampler.traversals == ["sequential", "crn"]
    sc = cfg.sampler.to_sampler_config(eos_token_id=3)
    assert sc.alpha == 4.0 and sc.eos_token_id == 3 and sc.proposal_temperature == 0.25


def test_unknown_field_names_file_path_and_fix(write_config: Callable[..., Path]) -> None:
    path = write_config(sampler={"alhpa": 3})
    with pytest.raises(ConfigError) as err:
        load_job_config(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "sampler.alhpa" in msg
    assert "did you mean 'alpha'" in msg


def test_bad_type_in_engine_list_uses_index_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "engines": [
                    {"kind": "vllm", "base_url": "http://localhost:8000"},
                    {"kind": "sglang", "base_url": 3, "max_concurrency": "many"},
                ],
                "prompts": ["hello"],
            }
        )
    )
    with pytest.raises(ConfigError) as err:
        load_job_config(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "engines[1].base_url" in msg
    assert "engines[1].max_concurrency" in msg
    assert "sglang" not in msg.split("engines[1]")[1].split(":")[0]  # no union tag in the path


def test_missing_base_url_and_unknown_kind(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump({"engines": [{"kind": "vllm"}, {"kind": "tgi"}], "prompts": ["x"]})
    )
    with pytest.raises(ConfigError) as err:
        load_job_config(path)
    msg = str(err.value)
    assert "engines[0]" in msg and "base_url is required" in msg
    assert "engines[1]" in msg and "unknown engine kind 'tgi'" in msg
    assert "vllm, sglang, openai, llamacpp, embedded, reference" in msg


def test_bad_traversal_lists_valid_ones(write_config: Callable[..., Path]) -> None:
    with pytest.raises(ConfigError, match=r"sampler.traversals\[1\].*'sequential'"):
        load_job_config(write_config(sampler={"traversals": ["crn", "dfs"]}))


def test_overrides_are_applied_and_typed(write_config: Callable[..., Path]) -> None:
    cfg = load_job_config(
        write_config(),
        [
            "sampler.alpha=2.5",
            "sampler.traversals=[crn, bfs]",
            "engines[0].max_concurrency=3",
            "engines.0.latency_s=0.5",
            "chains_per_prompt=4",
        ],
    )
    assert cfg.sampler.alpha == 2.5
    assert cfg.sampler.traversals == ["crn", "bfs"]
    assert cfg.engines[0].max_concurrency == 3
    assert cfg.engines[0].latency_s == 0.5  # type: ignore[union-attr]
    assert cfg.chains_per_prompt == 4


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("sampler.alpha", "expected KEY=VALUE"),
        ("engines[3].base_url=http://x:1", "engines[3] does not exist"),
        ("seed.x=1", "seed is not a mapping"),
    ],
)
def test_bad_override(write_config: Callable[..., Path], override: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=r"bad override") as err:
        load_job_config(write_config(), [override])
    assert fragment in str(err.value)


def test_invalid_override_value_is_attributed(write_config: Callable[..., Path]) -> None:
    with pytest.raises(ConfigError) as err:
        load_job_config(write_config(), ["sampler.n_pf=0"])
    assert "sampler.n_pf" in str(err.value) and "--set sampler.n_pf=0" in str(err.value)


def test_apply_override_creates_missing_mappings() -> None:
    data: dict[str, object] = {}
    apply_override(data, "sampler.alpha=3")
    assert data == {"sampler": {"alpha": 3}}


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("prompts: [1, 2\nsampler: {")
    with pytest.raises(ConfigError, match=r"broken.yaml \(line \d+, column \d+\): not valid YAML"):
        load_job_config(path)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_job_config("/nonexistent/job.yaml")


def test_reference_engine_needs_token_ids(write_config: Callable[..., Path]) -> None:
    with pytest.raises(ConfigError, match=r"reference\) takes token-id prompts"):
        load_job_config(write_config(prompts=["hello"]))


def test_duplicate_engine_names(write_config: Callable[..., Path]) -> None:
    engines = [{"kind": "reference", "name": "a"}, {"kind": "reference", "name": "a"}]
    with pytest.raises(ConfigError, match="engine names must be unique"):
        load_job_config(write_config(engines=engines))


def test_default_names_and_default_engine(tmp_path: Path) -> None:
    path = tmp_path / "j.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "engines": [
                    {"kind": "vllm", "base_url": "http://a:1"},
                    {"kind": "vllm", "base_urls": ["http://b:1", "http://b:2"]},
                ],
                "prompts": ["hi"],
            }
        )
    )
    cfg = load_job_config(path)
    assert cfg.engine_names() == ["vllm0", "vllm1"]
    assert cfg.output_dir == Path("runs/j")
    path.write_text(yaml.safe_dump({"prompts": ["hi"]}))
    assert load_job_config(path).engines[0].kind == "embedded"


def test_prompts_jsonl_file(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"question": "a"}\n{"question": "b"}\n\n')
    path = tmp_path / "j.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "engines": [{"kind": "vllm", "base_url": "http://a:1"}],
                "prompts": {"file": "p.jsonl", "field": "question", "chat_template": True},
            }
        )
    )
    cfg = load_job_config(path)
    assert [p.text for p in load_prompts(cfg)] == ["a", "b"]
    (tmp_path / "p.jsonl").write_text('{"question": "a"}\n{"q": "b"}\n')
    with pytest.raises(ConfigError, match=r"p.jsonl:2: no field 'question' \(has: q\)"):
        load_prompts(cfg)
    (tmp_path / "p.jsonl").write_text('{"question": "a"}\n{"question": \n')
    with pytest.raises(ConfigError, match=r"p.jsonl:2: not valid JSON"):
        load_prompts(cfg)


def test_api_key_never_stored_and_urls_redacted(tmp_path: Path) -> None:
    path = tmp_path / "j.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "engines": [
                    {"kind": "openai", "base_url": "https://user:hunter2@api.example.com/v1"},
                    {
                        "kind": "openai",
                        "base_url": "https://api.example.com/v1",
                        "api_key_env": "MY_KEY",
                    },
                ],
                "prompts": ["hi"],
            }
        )
    )
    dumped = yaml.safe_dump(redacted_dump(load_job_config(path)))
    assert "hunter2" not in dumped and "user:" not in dumped
    assert "MY_KEY" in dumped  # the variable's name, not its value


def test_api_key_field_is_rejected(write_config: Callable[..., Path]) -> None:
    engines = [{"kind": "vllm", "base_url": "http://a:1", "api_key": "sk-123"}]
    with pytest.raises(ConfigError, match="api_key_env"):
        load_job_config(write_config(engines=engines, prompts={"texts": ["x"]}))


@pytest.mark.parametrize(
    "name",
    [
        "demo.yaml",
        "demo_embedded.yaml",
        "reference.yaml",
        "vllm.yaml",
        "sglang.yaml",
        "vllm_vs_sglang.yaml",
    ],
)
def test_shipped_configs_validate(name: str) -> None:
    cfg = load_job_config(ROOT / "configs" / name)
    assert cfg.engines
