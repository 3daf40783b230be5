"""Helpers of the orchestration tests: small reference-engine jobs and engine wrappers.

(A uniquely named module, imported by the tests directly: the test folders have no
``__init__.py``, so that ``tests/`` never shadows the top-level ``backends`` package.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens, ScoreRequest
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.errors import EngineUnavailableError
from presto_client.orchestration.config.loading import validate_job_config
from presto_client.orchestration.config.schema import JobConfig

PROMPTS = [[1, 2, 3], [4, 5], [6, 0, 7, 1], [2, 2]]


def job_dict(output_dir: Path, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "test",
        "engines": [{"kind": "reference", "name": "ref", "vocab_size": 6, "max_concurrency": 16}],
        "prompts": {"token_ids": PROMPTS},
        "sampler": {
            "alpha": 4.0,
            "block_size": 8,
            "num_blocks": 1,
            "steps_per_block": 6,
            "traversals": ["sequential", "crn"],
            "n_pf": 4,
        },
        "chains_per_prompt": 2,
        "seed": 7,
        "output_dir": str(output_dir),
        "max_concurrency": 8,
    }
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


def write_http_job(
    tmp_path: Path,
    url: str,
    *,
    prompt: Sequence[int] = (1, 2, 3, 4),
    block_size: int = 4,
    **engine: object,
) -> Path:
    """A one-chain job against the vLLM-dialect server at ``url`` (two blocks, one step each),
    written to ``tmp_path/job.yaml``; ``engine`` adds to or overrides the engine's fields."""
    data = job_dict(
        tmp_path / "run",
        engines=[{"kind": "vllm", "name": "v", "base_url": url, "max_concurrency": 4, **engine}],
        prompts={"token_ids": [list(prompt)]},
        chains_per_prompt=1,
        sampler={"block_size": block_size, "num_blocks": 2, "steps_per_block": 1},
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def make_config(output_dir: Path, **changes: Any) -> JobConfig:
    return validate_job_config(job_dict(output_dir, **changes))


def reference_engine(name: str = "ref", vocab_size: int = 6) -> ReferenceEngine:
    return ReferenceEngine(ReferenceModel(vocab_size), name=name)


class CountingEngine:
    """Wraps an engine; counts requests in flight (max seen) and can sleep or fail on demand."""

    def __init__(
        self,
        inner: Any,
        *,
        delay_s: float = 0.002,
        fail_if: Callable[[Sequence[int]], bool] | None = None,
        shared: dict[str, int] | None = None,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.delay_s = delay_s
        self.fail_if = fail_if
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0
        self.failures = 0
        # counters shared between engines (the global bound)
        self.shared = shared if shared is not None else {"in_flight": 0, "max": 0}

    def _enter(self, n: int) -> None:
        self.calls += 1
        self.in_flight += n
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.shared["in_flight"] += n
        self.shared["max"] = max(self.shared["max"], self.shared["in_flight"])

    def _leave(self, n: int) -> None:
        self.in_flight -= n
        self.shared["in_flight"] -= n

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        self._enter(len(requests))
        try:
            await asyncio.sleep(self.delay_s)
            if self.fail_if is not None and any(self.fail_if(r.prefix) for r in requests):
                self.failures += 1
                raise EngineUnavailableError("connection refused (test)", engine=self.name)
            out: list[ScoredTokens] = await self.inner.generate(requests)
            return out
        finally:
            self._leave(len(requests))

    def stream(self, request: ProposalRequest) -> Any:
        return self.inner.stream(request)

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoredTokens]:
        self._enter(len(requests))
        try:
            await asyncio.sleep(self.delay_s)
            out: list[ScoredTokens] = await self.inner.score(requests)
            return out
        finally:
            self._leave(len(requests))

    async def aclose(self) -> None:
        await self.inner.aclose()


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``predicate`` (files on disk, counters) until it holds; fail after ``timeout_s``."""
    step = 0.005
    for _ in range(int(timeout_s / step)):
        if predicate():
            return
        await asyncio.sleep(step)
    raise AssertionError("condition not reached in time")
