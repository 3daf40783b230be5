"""The integration servers' ports: free ones of each session's own, unless a variable names one."""

from __future__ import annotations

import socket

import pytest
from vllm_servers import server_port


def test_each_session_gets_free_ports_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRESTO_VLLM_TEST_PORT_RAW", raising=False)
    with socket.socket() as taken:  # another run's server, say
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = {server_port("PRESTO_VLLM_TEST_PORT_RAW") for _ in range(5)}
    assert all(not reuse for _, reuse in ports)
    assert busy not in {p for p, _ in ports}
    for port, _ in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: nothing listens there


def test_a_named_port_is_used_and_its_server_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRESTO_VLLM_TEST_PORT_RAW", "8781")
    assert server_port("PRESTO_VLLM_TEST_PORT_RAW") == (8781, True)
