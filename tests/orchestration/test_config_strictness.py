"""Config values that pydantic would accept but mean nothing: a boolean for a number, K = 0;
an unknown engine kind gets a did-you-mean and no spurious errors about its other fields."""

from __future__ import annotations

from typing import Any

import pytest

from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import validate_job_config


def _config(sampler: dict[str, Any] | None = None, **engine: Any) -> dict[str, Any]:
    return {
        "engines": [engine or {"kind": "reference"}],
        "prompts": {"token_ids": [[1, 2]]},
        "sampler": sampler or {},
    }


@pytest.mark.parametrize(
    ("sampler", "engine", "where"),
    [
        ({"alpha": True}, {}, "sampler.alpha"),
        ({"block_size": True}, {}, "sampler.block_size"),
        ({}, {"kind": "vllm", "base_url": "http://h:1", "vocab_size": False}, "vocab_size"),
    ],
)
def test_a_boolean_is_no_number(
    sampler: dict[str, Any], engine: dict[str, Any], where: str
) -> None:
    with pytest.raises(ConfigError, match=rf"{where}: (True|False) is a boolean, not a number"):
        validate_job_config(_config(sampler, **engine))


def test_numbers_and_real_booleans_still_pass() -> None:
    cfg = validate_job_config(
        _config({"alpha": 2, "block_size": 4}, kind="vllm", base_url="http://h:1", probe=False)
    )
    assert cfg.sampler.alpha == 2.0 and cfg.engines[0].probe is False


def test_steps_per_block_zero_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match=r"steps_per_block is 0: .*plain sample.*K >= 1"):
        validate_job_config(_config({"steps_per_block": 0}))


def test_a_misspelt_kind_gets_a_suggestion_and_only_that_error() -> None:
    with pytest.raises(ConfigError) as caught:
        validate_job_config(
            {"engines": [{"kind": "embeded", "dtype": "float32"}], "prompts": ["hi"]}
        )
    message = str(caught.value)
    assert "(1 problem(s))" in message and "did you mean 'embedded'?" in message
    assert "dtype" not in message
