"""The tests' face: a job config's plan with its prompts read (as ``presto run`` does)."""

from __future__ import annotations

from collections.abc import Sequence

from presto_client.orchestration.config.schema import JobConfig
from presto_client.orchestration.planned import JobPlan
from presto_client.orchestration.planning.plan import make_plan
from presto_client.orchestration.prompts.prompt_rows import load_prompts


def plan_of(
    cfg: JobConfig,
    *,
    engines: Sequence[str] | None = None,
    traversals: Sequence[str] | None = None,
) -> JobPlan:
    """``make_plan`` of ``cfg`` over the prompts it names."""
    return make_plan(cfg, load_prompts(cfg), engines=engines, traversals=traversals)
