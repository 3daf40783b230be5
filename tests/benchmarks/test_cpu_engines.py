"""benchmarks.cpu_engines refuses before its minutes-long plain loop when a server is down."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from benchmarks import cpu_engines


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_server_down_is_named_before_the_plain_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _closed_port()
    config = tmp_path / "engines.yaml"
    config.write_text(
        "engines:\n"
        f"  - {{kind: vllm, name: down, base_url: 'http://127.0.0.1:{port}'}}\n"
        "  - {kind: embedded, name: embedded}\n"
    )
    monkeypatch.setattr(cpu_engines, "CONFIG", config)

    def no_plain_loop(*args: object) -> None:
        raise AssertionError("the plain loop ran although a server is down")

    monkeypatch.setattr(cpu_engines, "plain_loop", no_plain_loop)
    with pytest.raises(SystemExit, match=rf"down \(http://127.0.0.1:{port}\).*llamacpp.sh start"):
        cpu_engines.main(["--out", str(tmp_path / "out")])


def test_engines_selects_by_name_and_refuses_an_unknown_one() -> None:
    config = cpu_engines.selected_config(["llamacpp"])
    assert [e["name"] for e in config["engines"]] == ["llamacpp"]
    with pytest.raises(SystemExit, match="no engine \\['nope'\\]"):
        cpu_engines.selected_config(["llamacpp", "nope"])
