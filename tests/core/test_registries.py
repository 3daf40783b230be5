"""Samplers and traversal rules are registered in one place each; every list follows.

A kernel class registered with :func:`register_sampler` and a tree rule registered with
:func:`register_traversal` are accepted by the job config, the arms of a plan and
:func:`run_chain`, with no other file touched; a name that is taken is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from presto_client.core import kernels, methods, tree
from presto_client.core.kernels import PowerMH, register_sampler, unregister_sampler
from presto_client.core.methods import register_traversal, unregister_method
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import (
    SAMPLERS,
    TRAVERSALS,
    SamplerConfig,
    arm_traversal_names,
    sampler_names,
    traversal_names,
)
from presto_client.core.tree import plan_crn
from presto_client.orchestration.config.loading import validate_job_config
from tests.support.plans import plan_of


@pytest.fixture
def extra() -> Iterator[None]:
    register_sampler("power_mh_again", PowerMH)
    register_traversal("crn_again", plan_crn)
    yield
    unregister_sampler("power_mh_again")
    unregister_method("crn_again")


def test_the_names_are_the_registries() -> None:
    assert SAMPLERS == sampler_names() == tuple(kernels.SAMPLER_KERNELS)
    assert TRAVERSALS == traversal_names() == ("sequential", *tree.TRAVERSAL_RULES, "stream")
    assert traversal_names() == methods.method_names("mh")
    assert arm_traversal_names()[: len(TRAVERSALS)] == TRAVERSALS


def test_registered_names_are_listed(extra: None) -> None:
    assert "power_mh_again" in sampler_names()
    assert "crn_again" in traversal_names() and "crn_again" in arm_traversal_names()
    assert traversal_names()[0] == "sequential" and traversal_names()[-1] == "crn_again"


def test_bad_registrations_are_refused() -> None:
    with pytest.raises(ValueError, match=r"not a presto_client\.core\.Kernel"):
        register_sampler("x", int)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'stream' is registered already"):
        register_traversal("stream", plan_crn)
    with pytest.raises(ValueError, match="'greedy' is registered already"):
        register_traversal("greedy", plan_crn)  # a baseline's name: once listed twice, run as one
    with pytest.raises(ValueError, match="'power_mh' is registered already"):
        register_sampler("power_mh", PowerMH)
    assert methods.arm_traversal_names().count("greedy") == 1


async def test_a_registered_sampler_and_rule_run_a_chain(extra: None) -> None:
    engine = ReferenceEngine(ReferenceModel(6))
    config = SamplerConfig(sampler="power_mh_again", block_size=4, steps_per_block=3)
    again = await run_chain(engine, (1, 2), config, traversal="crn_again", size=4, seed=3)
    base = await run_chain(
        engine,
        (1, 2),
        SamplerConfig(block_size=4, steps_per_block=3),
        traversal="crn",
        size=4,
        seed=3,
    )
    assert again.token_ids == base.token_ids  # the same kernel and rule under other names


def test_the_job_config_and_plan_accept_registered_names(extra: None, tmp_path: Path) -> None:
    cfg = validate_job_config(
        {
            "engines": [{"kind": "reference", "name": "ref"}],
            "prompts": {"token_ids": [[1, 2]]},
            "sampler": {"sampler": "power_mh_again", "traversals": ["sequential", "crn_again"]},
            "output_dir": str(tmp_path),
        }
    )
    assert [a.arm for a in plan_of(cfg).arms] == ["ref/sequential", "ref/crn_again"]
