"""An output directory that cannot be written is a config error, exit 2, before any engine
starts (issue 10, item 3)."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import presto_client.orchestration.job as job_module
from presto_client.cli import main

EMBEDDED: dict[str, object] = {
    "engines": [{"kind": "embedded"}],
    "prompts": {"token_ids": None, "texts": ["hi"]},
}


@pytest.fixture
def no_engine_start(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    started: list[object] = []

    def start(*args: object, **kwargs: object) -> dict[str, str]:
        started.append(args)
        raise AssertionError("an engine was started")

    monkeypatch.setattr(job_module, "start_embedded_servers", start)
    return started


def test_output_pointing_at_a_file(
    write_config: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_engine_start: list[object],
) -> None:
    target = tmp_path / "a_file"
    target.write_text("x")
    config = write_config(**EMBEDDED)
    status = main(["run", str(config), "-o", str(target), "--no-progress"], out=io.StringIO())
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err and str(target) in err and "not a directory" in err
    assert not no_engine_start


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_output_dir(
    write_config: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_engine_start: list[object],
) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        config = write_config(**EMBEDDED)
        status = main(
            ["run", str(config), "-o", str(parent / "run"), "--no-progress"], out=io.StringIO()
        )
    finally:
        parent.chmod(0o700)
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err and "cannot write" in err
    assert not no_engine_start


def test_check_output_dir_reports_an_unwritable_existing_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from presto_client.errors import ConfigError
    from presto_client.orchestration.run_dir.rundir import check_output_dir

    def refuse(*args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied")

    check_output_dir(tmp_path / "new")  # creatable: fine
    monkeypatch.setattr(
        "presto_client.orchestration.run_dir.rundir.tempfile.NamedTemporaryFile", refuse
    )
    with pytest.raises(ConfigError, match="cannot write"):
        check_output_dir(tmp_path)
