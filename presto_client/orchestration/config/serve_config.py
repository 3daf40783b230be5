"""The ``serve:`` section of a job config: what ``presto serve`` lets one request ask for.

A job run by ``presto run`` ignores it (it is no part of a run directory's fingerprint). Every
per-request setting a client may send has an upper bound here, so that no single request can
hold the service's event loop, its memory or its engine for long: a request above a bound is a
400 naming the bound (``steps_per_block 30000 is above this server's limit 1024
(serve.limits.max_steps_per_block)``). An operator raises a bound in the config, or with
``--set serve.limits.NAME=VALUE`` on the command line.
"""

from __future__ import annotations

from pydantic import Field

from presto_client.orchestration.config.engine_config import StrictModel


class ServeLimits(StrictModel):
    """Upper bounds of one request's settings (``presto serve``)."""

    max_n: int = Field(16, ge=1, description="Chains per prompt (the request's n).")
    max_prompts: int = Field(64, ge=1, description="Prompts in one request.")
    max_chains: int = Field(64, ge=1, description="Chains of one request (prompts x n).")
    max_tokens: int = Field(
        4096, ge=1, description="Tokens of an answer (max_tokens = block_size x num_blocks)."
    )
    max_num_blocks: int = Field(1024, ge=1, description="Blocks of an answer (num_blocks).")
    max_steps_per_block: int = Field(
        1024, ge=1, description="Metropolis-Hastings transitions per block (steps_per_block)."
    )
    max_transitions: int = Field(
        1 << 18,
        ge=1,
        description="Transitions of one request: chains x num_blocks x steps_per_block.",
    )
    max_n_pf: int = Field(64, ge=1, description="Proposals prefetched per round (n_pf).")
    max_window: int = Field(
        1024, ge=1, description="Proposals a stream chain keeps in flight (window)."
    )
    max_k_try: int = Field(64, ge=1, description="MultiTryMH candidates per transition (k_try).")
    max_temperatures: int = Field(
        64, ge=1, description="MultiTryMH temperatures listed (the length of temperatures)."
    )
    max_stops: int = Field(16, ge=0, description="Stop strings of one request (stop).")


class ServeConfig(StrictModel):
    """What ``presto serve`` allows (ignored by ``presto run``)."""

    limits: ServeLimits = Field(
        default_factory=ServeLimits,
        description="Upper bounds of one request's settings; a request above one is a 400 "
        "naming it.",
    )
