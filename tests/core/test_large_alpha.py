"""Large α (issue 10, item 7): log q computed stably (no underflow to NaN), α bounded in the
config with a clear message."""

from __future__ import annotations

import math

import numpy as np
import pytest

from presto_client.core.logprob_math import scores_from_topk
from presto_client.core.sampler_config import MAX_ALPHA, SamplerConfig
from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import validate_job_config


def _exact_log_z(top: list[float], a: float) -> float:
    scaled = [a * t for t in top]
    m = max(scaled)
    return m + math.log(sum(math.exp(s - m) for s in scaled))


@pytest.mark.parametrize("alpha", [4.0, 500.0, 1000.0])
def test_log_q_does_not_underflow_at_large_alpha(alpha: float) -> None:
    top = [-1.5, -2.0, -3.0]
    sampled = np.array([-2.0])
    scores = scores_from_topk(sampled, np.array([top]), (1.0 / alpha,))
    lo, hi = float(scores.logq_lo[0, 0]), float(scores.logq_hi[0, 0])
    assert math.isfinite(lo) and math.isfinite(hi) and lo <= hi <= 0.0
    exact_head = alpha * -2.0 - _exact_log_z(top, alpha)
    assert hi == pytest.approx(exact_head, abs=1e-9)  # no tail mass above the head's bound
    # the sampled token is 0.5 nats below the best: at α = 500 its q is e^-250, not NaN
    assert hi == pytest.approx(-alpha * 0.5, rel=1e-6) if alpha >= 500 else True


def test_log_q_with_a_tail_stays_finite_at_large_alpha() -> None:
    top = np.array([[-0.9, -1.2, -5.0]])  # mass ≈ 0.71: a tail to bound
    scores = scores_from_topk(np.array([-0.9]), top, (1.0 / 800,))
    assert np.all(np.isfinite(scores.logq_lo)) and np.all(np.isfinite(scores.logq_hi))
    assert scores.logq_lo[0, 0] <= scores.logq_hi[0, 0] <= 0.0


def _cfg(**sampler: object) -> dict[str, object]:
    return {
        "engines": [{"kind": "reference"}],
        "prompts": {"token_ids": [[1]]},
        "sampler": sampler,
    }


@pytest.mark.parametrize("alpha", [float("inf"), float("nan"), MAX_ALPHA * 2])
def test_alpha_is_bounded_in_the_config(alpha: float) -> None:
    with pytest.raises(ConfigError) as info:
        validate_job_config(_cfg(alpha=alpha))
    assert "sampler.alpha" in str(info.value)


def test_tiny_tau_is_refused_in_the_config() -> None:
    with pytest.raises(ConfigError, match=r"sampler\.tau"):
        validate_job_config(_cfg(tau=1e-9))


def test_sampler_config_refuses_infinite_alpha() -> None:
    with pytest.raises(ValueError, match="alpha"):
        SamplerConfig(alpha=float("inf"))
