"""`presto run` uses uvloop's event loop when installed (the `fast` extra), unless disabled."""

from __future__ import annotations

import asyncio

import pytest

from presto_client.orchestration.job import event_loop_factory


def test_uvloop_when_installed_and_not_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRESTO_UVLOOP", raising=False)
    factory = event_loop_factory()
    try:
        import uvloop
    except ImportError:
        assert factory is None
    else:
        assert factory is uvloop.new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            assert runner.run(asyncio.sleep(0, result=3)) == 3
            assert isinstance(runner.get_loop(), uvloop.Loop)
    monkeypatch.setenv("PRESTO_UVLOOP", "0")
    assert event_loop_factory() is None
