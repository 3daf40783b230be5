"""Plain settings of one sampler, as the core sees them (configs are parsed at the config edge).

A leaf: it knows no registry. Which sampler names exist is the kernels' registry's business
(:func:`presto_client.core.kernels.make_kernel` refuses an unknown one); which settings a sampler
has beyond these common ones is its kernel's (``Kernel.options``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_ALPHA = 1000.0
"""The largest sharpening exponent accepted: far past greedy decoding in practice (α = 4 in the
paper), and it keeps α·Δlog p0 meaningful with float32 engine logprobs (noise ~1e-5 nats)."""
MIN_TAU = 1.0 / MAX_ALPHA
"""The smallest proposal temperature accepted (τ = 1/α at the largest α)."""
ROUND_SIZE = 8
"""``N_pf``: the proposals prefetched per round of a round method (``bfs``, ``predictive``,
``crn``), and the size a caller of ``run_chain`` gets when it names none."""
WINDOW: int | None = None
"""``W``: the most proposals a ``stream`` chain keeps in flight, an optional cap. ``None`` (the
default): the engine's shared speculation budget sizes the window (its measured cost and the
slots the chains' heads need), up to every remaining transition of the block."""


@dataclass(frozen=True, slots=True)
class Setting:
    """A sampler's own setting (beyond the fields of :class:`SamplerConfig`), declared on its
    kernel: its one default, how a config value becomes the value the kernel uses (raising
    ``ValueError`` with the reason), and what it means (error messages, ``presto validate``)."""

    default: Any
    parse: Callable[[Any], Any]
    description: str = ""


@dataclass(frozen=True, slots=True)
class SamplerConfig:
    """One power sampler: target ``p0^α``, blocks of ``block_size`` tokens, ``K`` steps a block."""

    sampler: str = "power_mh"
    """A registered sampler (:data:`presto_client.core.kernels.SAMPLER_KERNELS`)."""
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
    """The engine's end-of-sequence token: responses are truncated after its first occurrence."""
    stop_at_eos: bool = True
    """The stop rule (method §2 step 3, the reference code's ``stop_on_eos``): after a block's
    ``K`` transitions, if the state holds an EOS, the response is truncated after the first EOS
    and no further block runs, so ``block_size × num_blocks`` is a budget. ``False``: every
    block runs (fixed-length responses, truncated only at the end). No effect without
    :attr:`eos_token_id`."""
    smc_ess_threshold: float = 0.5
    """Power-SMC (the ``power_smc`` arm): resample when the particles' effective sample size
    falls below this share of their number."""
    options: tuple[tuple[str, Any], ...] = ()
    """Settings of the sampler's own beyond the fields above (its kernel's ``options``), as
    ``(name, value)`` pairs; a setting left out takes the kernel's declared default."""

    def __post_init__(self) -> None:
        if not self.sampler or not isinstance(self.sampler, str):
            raise ValueError(f"a sampler name must be a non-empty string, got {self.sampler!r}")
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
        if not 0 < self.smc_ess_threshold <= 1:
            raise ValueError("smc_ess_threshold must be in (0, 1]")
        if not 0 < self.epsilon < 0.5:
            raise ValueError("epsilon must be in (0, 0.5)")

    @property
    def proposal_temperature(self) -> float:
        return self.tau if self.tau is not None else 1.0 / self.alpha

    @property
    def response_length(self) -> int:
        return self.block_size * self.num_blocks

    @property
    def option_values(self) -> Mapping[str, Any]:
        """:attr:`options` as a mapping."""
        return dict(self.options)
