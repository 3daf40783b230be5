"""Fixtures of the backend tests: emulation servers over real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from presto_client.backends.http_engine import HttpEngine
from tests.support.emulation import EmulationServer


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
