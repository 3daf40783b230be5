"""Credentials in a config's URL never reach the terminal or the run directory (issue 10, 1)."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest

from presto_client.cli import main

SECRET_URL = "http://user:secret@127.0.0.1:9"


def _engine(**kw: object) -> dict[str, object]:
    return {
        "kind": "vllm",
        "name": "v",
        "base_url": SECRET_URL,
        "max_retries": 0,
        "restart_window_s": 0,
        "connect_timeout_s": 1,
        "probe": False,
        **kw,
    }


def test_validate_and_run_never_show_the_password(
    write_config: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(engines=[_engine()], chains_per_prompt=1)
    out = io.StringIO()
    assert main(["validate", str(config)], out=out) == 0
    assert "secret" not in out.getvalue() and "***@127.0.0.1:9" in out.getvalue()
    out = io.StringIO()
    status = main(["run", str(config), "--no-progress", "-v"], out=out)
    assert status != 0
    printed = out.getvalue() + "".join(capsys.readouterr())
    assert "secret" not in printed
    run_dir = tmp_path / "run"  # (removed when nothing ran: then nothing can leak there)
    for f in run_dir.iterdir() if run_dir.exists() else ():
        if f.is_file():
            assert "secret" not in f.read_text(), f.name


def test_userinfo_with_api_key_env_is_a_config_error(
    write_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(engines=[_engine(api_key_env="SOME_KEY")])
    assert main(["validate", str(config)], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "api_key_env" in err and "secret" not in err


def test_a_redacted_url_is_refused_asking_for_the_credential_again(
    write_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # What config.resolved.yaml holds for a URL with a password: rerun as it is, it would send
    # HTTP Basic "***:" and report the 401 as a server still loading.
    config = write_config(engines=[_engine(base_url="http://***@127.0.0.1:9")])
    assert main(["validate", str(config)], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "give the credential again" in err and "config.resolved.yaml" in err


def test_a_secret_in_a_url_query_is_never_shown(
    write_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        engines=[_engine(base_url="http://127.0.0.1:9/?api_key=hunter2")], chains_per_prompt=1
    )
    out = io.StringIO()
    main(["validate", str(config)], out=out)
    main(["run", str(config), "--no-progress", "-v"], out=out)
    printed = out.getvalue() + "".join(capsys.readouterr())
    assert "127.0.0.1:9" in printed and "hunter2" not in printed
