"""What the integration fixtures hand to the tests (imported by name: no test package)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VllmServer:
    base_url: str
    model: str
    logprobs_mode: str
    port: int
