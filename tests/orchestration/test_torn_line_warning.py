"""A resume warns about a truncated last line of samples.jsonl once, not once per read."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest

from presto_client.cli import main


def test_a_truncated_last_line_is_warned_about_once(
    write_config: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config()
    assert main(["run", str(config), "--no-progress"], out=io.StringIO()) == 0
    samples = tmp_path / "run" / "samples.jsonl"
    text = samples.read_text()
    last = text.splitlines()[-1]
    samples.write_text(text[: -len(last) - 1] + last[: len(last) // 2])  # the kill -9 case
    capsys.readouterr()
    assert main(["run", str(config), "--no-progress"], out=io.StringIO()) == 0
    err = capsys.readouterr().err
    assert err.count("skipping a truncated last line") == 1, err
