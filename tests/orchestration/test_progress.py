"""Progress a first-time user can follow (issue 10, item 13): counted in transitions, with the
arm, the rate and the ETA; plain lines when stderr is not a terminal; the embedded engine's
first start says what it is doing."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from presto_client.cli import main


def test_not_a_tty_gets_progress_lines(
    write_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # 4 prompts x 2 chains x 2 arms = 16 chains of 1 block x 6 steps = 96 transitions
    status = main(["run", str(write_config())], out=io.StringIO())
    assert status == 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("progress:")]
    assert lines, err
    assert "0/96 transitions" in lines[0]
    last = lines[-1]
    assert "96/96 transitions (100%)" in last and "chains 16/16" in last
    assert "transitions/s" in last and "ETA" in last and "arm ref/" in last


def test_baseline_arms_count_their_blocks_as_steps_to_the_end(
    write_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # The baselines make no transition: counted in transitions their chains were never in the
    # total's reach (issue 50's run: 40/3,112 transitions after 48 of 240 chains, ETA 2h20m,
    # for a job of 10 minutes). 4 prompts x 2 chains x (6 transitions + 2 baselines' 1 block)
    # = 8 x 8 = 64 steps, all reached.
    config = write_config(sampler={"traversals": ["sequential", "sample", "best_of_n"]})
    assert main(["run", str(config)], out=io.StringIO()) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("progress:")]
    assert "0/64 steps" in lines[0], lines
    assert "64/64 steps (100%)" in lines[-1] and "chains 24/24" in lines[-1], lines


def test_no_progress_and_quiet_print_no_progress(
    write_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(write_config()), "--no-progress"], out=io.StringIO()) == 0
    assert "progress:" not in capsys.readouterr().err


def test_progress_notes_reach_the_terminal_at_the_default_verbosity(
    write_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    main(["validate", str(write_config())], out=io.StringIO())
    capsys.readouterr()
    logging.getLogger("presto_client.progress").info("downloading the model wheel")
    assert "presto: downloading the model wheel" in capsys.readouterr().err


def test_the_first_start_of_the_embedded_engine_says_what_it_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from presto_client.child_servers.embedded import EmbeddedServer, EmbeddedServerError

    monkeypatch.setenv("PRESTO_CACHE", str(tmp_path / "empty-cache"))
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\necho 'converting the model...'\nsleep 1.5\nexit 3\n")
    fake.chmod(0o755)
    server = EmbeddedServer(python=str(fake), startup_timeout_s=30, note_every_s=0.5)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    progress = logging.getLogger("presto_client.progress")
    progress.addHandler(handler)
    level, progress.level = progress.level, logging.INFO
    try:
        with pytest.raises(EmbeddedServerError):
            server.start()
    finally:
        progress.removeHandler(handler)
        progress.setLevel(level)
    notes = [r.getMessage() for r in records]
    assert "first use" in notes[0] and "93 MB" in notes[0] and "once" in notes[0]
    assert any("still starting" in n and "converting the model" in n for n in notes[1:]), notes
