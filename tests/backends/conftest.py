"""Fixtures of the backend tests: emulation servers over real HTTP, engines with sleeps patched."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from backends import EngineSpec, create_engine
from backends.emulation import EmulationServer
from backends.engine import HttpEngine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_cpu"


async def no_sleep(seconds: float) -> None:
    """Retry sleeps patched out; the waits are recorded by the tests that need them."""
    return None


def make_engine(
    kind: str, base_url: str, *, sleeps: list[float] | None = None, **spec_kw: object
) -> HttpEngine:
    async def sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)

    spec = EngineSpec(kind, (base_url,), **spec_kw)  # type: ignore[arg-type]
    return create_engine(spec, sleep=sleep)


@pytest.fixture
def vllm_raw() -> Iterator[EmulationServer]:
    with EmulationServer("vllm") as server:
        yield server


@pytest.fixture
def vllm_processed() -> Iterator[EmulationServer]:
    with EmulationServer("vllm", logprobs_mode="processed_logprobs") as server:
        yield server


@pytest.fixture
def vllm_unlimited() -> Iterator[EmulationServer]:
    """A vLLM server started with --max-logprobs -1 (full-vocabulary scoring allowed)."""
    with EmulationServer("vllm", max_logprobs=-1) as server:
        yield server


@pytest.fixture
def sglang_scaled() -> Iterator[EmulationServer]:
    with EmulationServer("sglang", deterministic=True) as server:
        yield server


@pytest.fixture
def sglang_raw() -> Iterator[EmulationServer]:
    with EmulationServer("sglang", return_original_logprob=True, deterministic=True) as server:
        yield server


@pytest.fixture
async def engine_factory() -> AsyncIterator[list[HttpEngine]]:
    engines: list[HttpEngine] = []
    yield engines
    for engine in engines:
        await engine.aclose()
