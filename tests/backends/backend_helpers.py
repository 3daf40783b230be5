"""Helpers shared by the backend tests (imported by name: test directories have no package)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from presto_client.backends import EngineSpec, create_engine
from presto_client.backends.http_engine import HttpEngine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_cpu"


def make_engine(
    kind: str, base_url: str, *, sleeps: list[float] | None = None, **spec_kw: Any
) -> HttpEngine:
    """An engine whose retry sleeps are patched out (and recorded in ``sleeps``)."""

    async def sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)

    spec = EngineSpec(kind, (base_url,), **spec_kw)
    return create_engine(spec, sleep=sleep)
