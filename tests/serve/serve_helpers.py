"""Helpers of the service tests: ``presto serve`` on its own event loop in a thread.

(The openai SDK's sync client blocks its caller, so the service cannot share the test's loop.)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from presto_client.orchestration.config.loading import load_job_config
from presto_client.orchestration.config.schema import JobConfig
from presto_client.serve.app import ServeOptions
from presto_client.serve.lifecycle import RunningService, start_service


class ServiceThread:
    """A started ``presto serve`` (a context manager): ``url`` is its base URL (``/v1`` below)."""

    def __init__(
        self,
        cfg: JobConfig,
        options: ServeOptions | None = None,
        replicas: Sequence[Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.options = options or ServeOptions(port=0)
        self.replicas = replicas
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.running: RunningService | None = None

    @property
    def url(self) -> str:
        assert self.running is not None
        return self.running.url

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"

    def call(self, fn: Any) -> Any:
        """Run ``fn()`` on the service's loop (its state is the loop's) and return the result."""

        async def inner() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(inner(), self.loop).result(timeout=30)

    def __enter__(self) -> ServiceThread:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(
            start_service(self.cfg, self.options, replicas=self.replicas), self.loop
        )
        self.running = started.result(timeout=60)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.running is not None:
            stopped = asyncio.run_coroutine_threadsafe(self.running.aclose(), self.loop)
            with contextlib.suppress(Exception):
                stopped.result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def reference_job(output_dir: Path, **changes: Any) -> dict[str, Any]:
    """A small job on the reference engine (vocabulary 16: answers are not trivially short)."""
    data: dict[str, Any] = {
        "name": "serve",
        "engines": [{"kind": "reference", "name": "ref", "vocab_size": 16, "max_concurrency": 16}],
        "prompts": {"token_ids": [[1, 2, 3]]},
        "sampler": {
            "alpha": 4.0,
            "block_size": 4,
            "num_blocks": 2,
            "steps_per_block": 4,
            "traversals": ["stream"],
            "window": 4,
        },
        "chains_per_prompt": 1,
        "seed": 7,
        "output_dir": str(output_dir),
        "max_concurrency": 16,
    }
    data.update(changes)
    return data


def load(path: Path) -> JobConfig:
    return load_job_config(path)
