"""The gateway launcher without a gateway: what it finds, what it runs, how it fails."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.support.gateways import GatewayError, command, gateway_binary, running_gateway


def test_a_gateway_not_set_up_is_not_found(tmp_path: Path) -> None:
    assert gateway_binary("smg", home=tmp_path) is None
    with pytest.raises(ValueError, match="unknown gateway 'nginx'"):
        gateway_binary("nginx", home=tmp_path)


@pytest.mark.parametrize("kind", ["smg", "vllm-router"])
def test_every_listener_is_on_loopback(kind: str) -> None:
    cmd = command(kind, Path("/x"), "round_robin", ["http://127.0.0.1:1"], 2, 3)
    hosts = [cmd[i + 1] for i, arg in enumerate(cmd) if arg in ("--host", "--prometheus-host")]
    assert hosts == ["127.0.0.1", "127.0.0.1"]
    assert cmd[cmd.index("--prometheus-port") + 1] == "3"


def test_a_gateway_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    fake = tmp_path / "vllm-router"
    fake.write_text("#!/bin/sh\necho 'no such flag' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with (
        pytest.raises(GatewayError, match=r"(?s)exited with 3.*no such flag"),
        running_gateway(
            "vllm-router", "round_robin", ["http://127.0.0.1:1"], log_dir=tmp_path, binary=fake
        ),
    ):
        pass
