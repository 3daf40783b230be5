"""A full disk stops the job with one line naming the file, exit 2, no chain counted as failed,
no torn line, and a rerun after freeing space resumes; at start-up it leaves a directory that
the rerun accepts."""

from __future__ import annotations

import errno
import io
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from presto_client.cli import main


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")


def _run(config: Path) -> int:
    return main(["run", str(config), "--no-progress"], out=io.StringIO())


@pytest.mark.parametrize("target", ["samples.jsonl", "records.jsonl"])
def test_disk_full_while_writing_stops_cleanly_and_rerun_resumes(
    target: str,
    write_config: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = write_config()
    real_write = os.write
    calls = {"n": 0}

    def full_disk(fd: int, data: bytes | memoryview) -> int:
        if _fd_path(fd).endswith(target):
            calls["n"] += 1
            if calls["n"] >= 3:  # the third line: half of it fits, then the disk is full
                real_write(fd, bytes(data)[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    status = _run(config)
    monkeypatch.setattr(os, "write", real_write)
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("presto: error:")]
    assert len(errors) == 1 and target in errors[0]
    assert "no space left on device" in errors[0]
    assert "failed" not in err  # a local I/O error is not a chain failure
    run = tmp_path / "run"
    kept = []
    for name in ("samples.jsonl", "records.jsonl"):
        text = (run / name).read_text()
        assert text == "" or text.endswith("\n")  # no torn line
        rows = [json.loads(line) for line in text.splitlines()]
        assert all(r.get("status", "ok") == "ok" for r in rows)
        if name == "samples.jsonl":
            kept = [r["chain_id"] for r in rows]

    assert _run(config) == 0
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len({r["chain_id"] for r in samples}) == 16 and all(r["status"] == "ok" for r in samples)
    # the chains that finished before the disk filled are resumed, not rerun
    assert {r["chain_id"] for r in samples if r["session"] == 0} == set(kept)


def test_disk_full_writing_run_json_at_start_leaves_a_rerunnable_directory(
    write_config: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = write_config()
    real_fsync = os.fsync

    def full_disk(fd: int) -> None:
        if Path(_fd_path(fd)).name.startswith(".run.json."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
    status = _run(config)
    monkeypatch.setattr(os, "fsync", real_fsync)
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err and "run.json" in err and "no space left on device" in err
    run = tmp_path / "run"
    assert not run.exists() or list(run.iterdir()) == []
    assert _run(config) == 0, capsys.readouterr().err


def test_a_directory_left_with_only_lock_and_temporary_is_a_new_run(
    write_config: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a session killed while writing its first run.json leaves behind."""
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("")
    (run / ".run.json.4242.tmp").write_text('{"form')
    assert _run(write_config()) == 0, capsys.readouterr().err
    assert not (run / ".run.json.4242.tmp").exists()
