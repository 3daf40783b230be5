"""Ctrl-C while the engines start up says that nothing was saved (the fresh run directory is
removed), not that chains are "saved in" it."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import presto_client.orchestration.job as job_module
from presto_client.cli import main


def test_ctrl_c_during_start_up(
    write_config: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(job_module, "open_engines", interrupted)
    status = main(["run", str(write_config()), "--no-progress"], out=io.StringIO())
    err = capsys.readouterr().err
    assert status == 130, err
    assert not (tmp_path / "run").exists()
    assert "saved in" not in err and "nothing was saved" in err
