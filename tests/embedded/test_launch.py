"""The launcher: start-up failures surface with the child's log."""

from __future__ import annotations

import socket
import time

import pytest

from presto_client.child_servers.embedded import EmbeddedServerError, embedded_server

pytestmark = pytest.mark.embedded


def test_port_clash_fails_fast_with_the_log() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        with (
            pytest.raises(EmbeddedServerError, match=r"cannot listen on 127\.0\.0\.1"),
            embedded_server(port, startup_timeout_s=120),
        ):
            pytest.fail("the server should not have started")
        assert time.monotonic() - t0 < 60  # before the model loads


async def test_async_variant_starts_and_stops() -> None:
    import httpx

    from presto_client.child_servers.embedded import async_embedded_server

    async with (
        async_embedded_server(startup_timeout_s=300) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        assert (await client.get("/health")).status_code == 200
    async with httpx.AsyncClient(base_url=url, timeout=2) as after:
        with pytest.raises(httpx.TransportError):
            await after.get("/health")  # stopped on exit
