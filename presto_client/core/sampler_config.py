"""Plain settings of one sampler, as the core sees them (configs are parsed in the faces layer)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from presto_client.core.kernels import SAMPLER_KERNELS
from presto_client.core.tree import RUNNER_TRAVERSALS, TRAVERSAL_RULES

SamplerName = Literal["power_mh", "entropy_cut", "multi_try_mh"]
Traversal = Literal["sequential", "bfs", "predictive", "crn", "stream"]

MAX_ALPHA = 1000.0
"""The largest sharpening exponent accepted: far past greedy decoding in practice (α = 4 in the
paper), and it keeps α·Δlog p0 meaningful with float32 engine logprobs (noise ~1e-5 nats)."""
MIN_TAU = 1.0 / MAX_ALPHA
"""The smallest proposal temperature accepted (τ = 1/α at the largest α)."""

BASELINE_TRAVERSALS: tuple[str, ...] = ("sample", "low_temperature", "greedy")
"""Arms without MH (presto_client.core.baseline_runners): plain, τ = 1/α and greedy sampling."""


def sampler_names() -> tuple[str, ...]:
    """The registered samplers (:data:`presto_client.core.kernels.SAMPLER_KERNELS`)."""
    return tuple(SAMPLER_KERNELS)


def sampler_settings(name: str) -> tuple[str, ...]:
    """A registered sampler's own settings (its kernel's ``settings``); ``()`` if unknown."""
    kernel = SAMPLER_KERNELS.get(name)
    return () if kernel is None else tuple(kernel.settings)


def traversal_names() -> tuple[str, ...]:
    """The MH traversals: ``sequential``, the registered tree rules
    (:data:`presto_client.core.tree.TRAVERSAL_RULES`), ``stream``."""
    first, last = RUNNER_TRAVERSALS
    return (first, *TRAVERSAL_RULES, last)


def arm_traversal_names() -> tuple[str, ...]:
    """Everything an arm may run: the MH traversals and the baselines."""
    return (*traversal_names(), *BASELINE_TRAVERSALS)


SAMPLERS: tuple[str, ...] = sampler_names()
"""The built-in samplers (later registrations: :func:`sampler_names`)."""
TRAVERSALS: tuple[str, ...] = traversal_names()
"""The built-in MH traversals (later registrations: :func:`traversal_names`)."""
ARM_TRAVERSALS: tuple[str, ...] = arm_traversal_names()
"""The built-in arm traversals (later registrations: :func:`arm_traversal_names`)."""


@dataclass(frozen=True, slots=True)
class SamplerConfig:
    """One power sampler: target ``p0^α``, blocks of ``block_size`` tokens, ``K`` steps a block."""

    sampler: SamplerName = "power_mh"
    alpha: float = 4.0
    tau: float | None = None
    """Proposal temperature; ``None`` means ``1/α``."""
    block_size: int = 16
    num_blocks: int = 1
    steps_per_block: int = 8
    """``K``: Metropolis–Hastings transitions after each block's extension."""
    beta: float = 4.0
    """EntropyCut: exponent of the entropy-jump cut law."""
    k_try: int = 4
    """MultiTryMH: candidates per transition."""
    temperatures: tuple[float, ...] = field(default=(0.25, 0.5, 1.0))
    """MultiTryMH: temperatures a candidate's suffix may be drawn at (uniformly)."""
    epsilon: float = 0.01
    """A decision is ε-certain when ``A ≥ 1−ε`` or ``A ≤ ε`` (statistics, predictor)."""
    eos_token_id: int | None = None
    """Responses are truncated at the first EOS after the last block."""

    def __post_init__(self) -> None:
        if self.sampler not in sampler_names():
            raise ValueError(
                f"unknown sampler {self.sampler!r}; valid samplers are {sampler_names()}"
            )
        if not 0 < self.alpha <= MAX_ALPHA:  # (NaN fails too)
            raise ValueError(f"alpha must be > 0 and at most {MAX_ALPHA:g}, got {self.alpha}")
        if self.tau is not None and not MIN_TAU <= self.tau < math.inf:
            raise ValueError(f"tau must be finite and at least {MIN_TAU:g}, got {self.tau}")
        if self.block_size < 1 or self.num_blocks < 1 or self.steps_per_block < 0:
            raise ValueError("block_size and num_blocks must be >= 1, steps_per_block >= 0")
        if self.k_try < 1:
            raise ValueError("k_try must be >= 1")
        if not self.temperatures or any(t <= 0 for t in self.temperatures):
            raise ValueError("temperatures must be a non-empty list of positive numbers")
        if not 0 < self.epsilon < 0.5:
            raise ValueError("epsilon must be in (0, 0.5)")

    @property
    def proposal_temperature(self) -> float:
        return self.tau if self.tau is not None else 1.0 / self.alpha

    @property
    def response_length(self) -> int:
        return self.block_size * self.num_blocks
