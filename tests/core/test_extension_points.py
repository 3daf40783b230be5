"""Each extension is one file plus its tests: here each is written in this file, registered from
the test, and run as a tiny job (config, plan, orchestrator, run directory, summary).

* a traversal with a runner of its own (:func:`register_method`);
* a baseline arm (:func:`baseline_method`);
* a sampler with a setting of its own (``sampler: {kind: gamma_mh, gamma: 2}``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from presto_client.core.chain_runner import ChainRunner
from presto_client.core.kernels import PowerMH, Setting, register_sampler, unregister_sampler
from presto_client.core.methods import (
    Method,
    baseline_method,
    register_method,
    unregister_method,
)
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import run_chain
from presto_client.core.settings import SamplerConfig
from presto_client.core.state import ChainState
from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import validate_job_config
from presto_client.orchestration.job import run_job_async
from presto_client.reporting.tables import format_summary_table
from tests.support.plans import plan_of

# ---- the extensions (each would be a file of its own)


class OneByOneRunner(ChainRunner):
    """A traversal with a runner of its own: one transition per call, as the sequential chain."""

    async def _advance(self, state: ChainState, block: int, k: int) -> tuple[ChainState, int]:
        draws = self.randomness.transition(block, k)
        cut = self.kernel.cut(state, draws.u_cut)
        requests = self.kernel.requests(state.prefix(cut), state.length - cut, draws)
        proposals, wall = await self._generate(requests)
        self.stats.rounds += 1
        self.stats.call_wall_s.append(wall)
        verdict = await self._decide(state, cut, proposals, draws, block, k)
        self._emit(
            block=block,
            kind="propose",
            requests=1,
            sequences=len(requests),
            used=1,
            transitions=1,
            accepts=int(verdict.accepted),
            wall_s=wall,
            tokens=sum(len(p) for p in proposals),
        )
        if verdict.accepted:
            state = self.kernel.accept(state, cut, proposals, verdict)
        return state, 1


class GammaMH(PowerMH):
    """PowerMH towards ``p0^(α·γ)``: a sampler with a setting of its own, ``gamma``."""

    options: ClassVar[dict[str, Setting]] = {
        "gamma": Setting(2.0, lambda v: _positive(float(v)), "extra sharpening factor")
    }

    def __init__(self, config: SamplerConfig) -> None:
        super().__init__(config)
        self.alpha = config.alpha * self.option("gamma")


def _positive(value: float) -> float:
    if not value > 0:
        raise ValueError(f"must be > 0, got {value}")
    return value


# ---- the tests


@pytest.fixture
def extensions() -> Iterator[None]:
    register_method(Method("one_by_one", "mh", OneByOneRunner, "none", replays=True))
    register_method(baseline_method("half_temperature", lambda sampler: 0.5))
    register_sampler("gamma_mh", GammaMH)
    yield
    unregister_method("one_by_one")
    unregister_method("half_temperature")
    unregister_sampler("gamma_mh")


def _job(tmp_path: Path, sampler: dict[str, Any]) -> dict[str, Any]:
    return {
        "engines": [{"kind": "reference", "name": "ref", "vocab_size": 6}],
        "prompts": {"token_ids": [[1, 2], [3]]},
        "sampler": {"block_size": 4, "steps_per_block": 3, **sampler},
        "chains_per_prompt": 2,
        "output_dir": str(tmp_path / "run"),
    }


async def test_a_new_traversal_and_baseline_run_as_arms_of_a_job(
    extensions: None, tmp_path: Path
) -> None:
    traversals = ["sequential", "one_by_one", "half_temperature"]
    cfg = validate_job_config(_job(tmp_path, {"traversals": traversals}))
    result = await run_job_async(plan_of(cfg))
    arms = {a["traversal"]: a for a in result.summary["arms"]}
    assert set(arms) == set(traversals)
    assert all(a["chains_ok"] == 4 for a in arms.values())
    # the registry says one_by_one replays the sequential chain: the summary checks it
    assert arms["one_by_one"]["identical_to_baseline"] == 4
    assert "4/4" in format_summary_table(result.summary)
    assert arms["one_by_one"]["size"] is None and arms["half_temperature"]["size"] is None
    assert arms["half_temperature"]["transitions"] == 0  # a baseline: no MH


async def test_a_sampler_with_a_setting_of_its_own(extensions: None, tmp_path: Path) -> None:
    cfg = validate_job_config(
        _job(tmp_path, {"sampler": {"kind": "gamma_mh", "gamma": 2}, "alpha": 2, "tau": 0.25})
    )
    assert cfg.sampler.options == {"gamma": 2}
    engine = ReferenceEngine(ReferenceModel(6, seed=2))
    gamma = await run_chain(engine, [1], cfg.sampler.to_sampler_config(), traversal="crn", seed=4)
    power = SamplerConfig(alpha=4.0, tau=0.25, block_size=4, steps_per_block=3)
    plain = await run_chain(engine, [1], power, traversal="crn", seed=4)
    assert gamma.token_ids == plain.token_ids  # γ = 2 at α = 2 is PowerMH at α = 4
    assert [t.log_accept for t in gamma.transitions] == [t.log_accept for t in plain.transitions]
    result = await run_job_async(plan_of(cfg))
    assert result.completed == 4 * len(cfg.sampler.traversals)


@pytest.mark.parametrize(
    ("sampler", "message"),
    [
        ({"sampler": {"kind": "gamma_mh", "gama": 2}}, "has no setting 'gama'"),
        ({"sampler": {"kind": "gamma_mh", "gamma": -1}}, "gamma: must be > 0"),
        ({"sampler": {"kind": "power_mh", "gamma": 2}}, "has no setting 'gamma'"),
    ],
)
def test_a_setting_is_checked_at_the_config_edge(
    extensions: None, tmp_path: Path, sampler: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_job_config(_job(tmp_path, sampler))


def test_the_option_default_is_stated_once(extensions: None) -> None:
    config = SamplerConfig(sampler="gamma_mh", alpha=2.0)
    assert GammaMH(config).alpha == 4.0  # gamma's declared default, 2


def test_a_name_that_is_taken_is_refused(extensions: None) -> None:
    with pytest.raises(ValueError, match="'one_by_one' is registered already"):
        register_method(baseline_method("one_by_one", lambda sampler: 1.0))
    with pytest.raises(ValueError, match="'gamma_mh' is registered already"):
        register_sampler("gamma_mh", GammaMH)
