"""A sampler's own settings in one block, discriminated on ``kind`` (issue 7); the flat form of
old configs is still read, and both are the same job (same resolved config, same fingerprint)."""

from __future__ import annotations

from pathlib import Path

import pytest
from orch_helpers import job_dict

from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import redacted_dump, validate_job_config
from tests.support.plans import plan_of


def _config(tmp_path: Path, sampler: dict[str, object]):
    return validate_job_config(job_dict(tmp_path, sampler=sampler))


@pytest.mark.parametrize(
    ("block", "flat"),
    [
        ({"kind": "entropy_cut", "beta": 2.0}, {"sampler": "entropy_cut", "beta": 2.0}),
        (
            {"kind": "multi_try_mh", "k_try": 3, "temperatures": [0.5, 1.0]},
            {"sampler": "multi_try_mh", "k_try": 3, "temperatures": [0.5, 1.0]},
        ),
        ({"kind": "power_mh"}, {"sampler": "power_mh"}),
    ],
)
def test_the_block_and_the_flat_form_are_the_same_job(
    tmp_path: Path, block: dict[str, object], flat: dict[str, object]
) -> None:
    a = _config(tmp_path, {"sampler": block})
    b = _config(tmp_path, flat)
    assert a.sampler == b.sampler
    assert redacted_dump(a) == redacted_dump(b)
    assert plan_of(a).fingerprint == plan_of(b).fingerprint


def test_a_setting_of_another_sampler_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sampler 'entropy_cut' has no setting 'k_try'"):
        _config(tmp_path, {"sampler": {"kind": "entropy_cut", "k_try": 2}})


def test_an_unknown_kind_lists_the_samplers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="valid samplers are: power_mh, entropy_cut"):
        _config(tmp_path, {"sampler": {"kind": "greedy_mh"}})


def test_a_setting_given_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="beta given twice"):
        _config(tmp_path, {"sampler": {"kind": "entropy_cut", "beta": 2.0}, "beta": 3.0})


def test_kind_at_the_top_of_the_sampler_section(tmp_path: Path) -> None:
    """``sampler: {kind: entropy_cut, beta: 4, alpha: 4}``: the issue's form."""
    a = _config(tmp_path, {"kind": "entropy_cut", "beta": 2.0, "alpha": 3.0})
    b = _config(tmp_path, {"sampler": "entropy_cut", "beta": 2.0, "alpha": 3.0})
    assert a.sampler == b.sampler and plan_of(a).fingerprint == plan_of(b).fingerprint
    with pytest.raises(ConfigError, match="sampler 'entropy_cut' has no setting 'k_try'"):
        _config(tmp_path, {"kind": "entropy_cut", "k_try": 2})
    with pytest.raises(ConfigError, match="give kind or sampler, not both"):
        _config(tmp_path, {"kind": "power_mh", "sampler": "power_mh"})
