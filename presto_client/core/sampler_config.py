"""A sampler's settings and the names a config may use, as the public API names them.

:class:`SamplerConfig` lives in :mod:`presto_client.core.settings` (a leaf every runner and kernel
imports); the names are the registries': samplers from :mod:`presto_client.core.kernels`,
traversals and baselines from :mod:`presto_client.core.methods`.
"""

from __future__ import annotations

from presto_client.core.kernels import sampler_names, sampler_settings
from presto_client.core.methods import (
    arm_traversal_names,
    baseline_names,
    replaying_names,
    traversal_names,
)
from presto_client.core.settings import MAX_ALPHA, MIN_TAU, ROUND_SIZE, WINDOW, SamplerConfig

__all__ = [
    "ARM_TRAVERSALS",
    "MAX_ALPHA",
    "MIN_TAU",
    "ROUND_SIZE",
    "SAMPLERS",
    "TRAVERSALS",
    "WINDOW",
    "SamplerConfig",
    "arm_traversal_names",
    "baseline_names",
    "replaying_names",
    "sampler_names",
    "sampler_settings",
    "traversal_names",
]

SAMPLERS: tuple[str, ...] = sampler_names()
"""The built-in samplers (later registrations: :func:`sampler_names`)."""
TRAVERSALS: tuple[str, ...] = traversal_names()
"""The built-in MH traversals (later registrations: :func:`traversal_names`)."""
ARM_TRAVERSALS: tuple[str, ...] = arm_traversal_names()
"""The built-in arm methods (later registrations: :func:`arm_traversal_names`)."""
