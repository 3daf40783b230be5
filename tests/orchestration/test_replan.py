"""A run that died before any chain finished can be re-planned, and ``presto validate`` agrees
with ``presto run`` about a directory (issue 10, item 10)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from orch_helpers import job_dict, make_config

from presto_client.cli import main
from presto_client.errors import ProbeError
from presto_client.orchestration.job import run_job_async
from tests.support.plans import plan_of

emulation = pytest.importorskip("tests.support.emulation")


def _engine(url: str, model: str) -> dict[str, object]:
    return {"kind": "vllm", "name": "v", "base_url": url, "model": model, "max_concurrency": 4}


async def test_a_run_that_died_at_the_probe_can_be_replanned(tmp_path: Path) -> None:
    run = tmp_path / "run"
    small = {"prompts": {"token_ids": [[1, 2, 3]]}, "chains_per_prompt": 1}
    with emulation.EmulationServer("vllm", vocab_size=32, model_name="right") as server:
        wrong = make_config(run, engines=[_engine(server.base_url, "wrong")], **small)
        with pytest.raises(ProbeError, match="wrong"):
            await run_job_async(plan_of(wrong))
        # Nothing ran: no empty run directory is left behind (issue 10, item 16).
        assert not run.exists()
        fixed = make_config(run, engines=[_engine(server.base_url, "right")], **small)
        result = await run_job_async(plan_of(fixed))
    assert result.completed == 2 and result.failed == 0


async def test_a_dead_run_in_an_existing_folder_keeps_the_folder(tmp_path: Path) -> None:
    run = tmp_path / "mine"
    run.mkdir()
    small = {"prompts": {"token_ids": [[1, 2, 3]]}, "chains_per_prompt": 1}
    with emulation.EmulationServer("vllm", vocab_size=32, model_name="right") as server:
        wrong = make_config(run, engines=[_engine(server.base_url, "wrong")], **small)
        with pytest.raises(ProbeError, match="wrong"):
            await run_job_async(plan_of(wrong))
    assert run.is_dir() and list(run.iterdir()) == []


def _write(tmp_path: Path, name: str, **changes: object) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(job_dict(tmp_path / "run", **changes), sort_keys=False))
    return path


def test_validate_refuses_what_run_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _write(tmp_path, "a.yaml")
    assert main(["run", str(first), "--no-progress", "-q"], out=io.StringIO()) == 0
    out = io.StringIO()
    assert main(["validate", str(first)], out=out) == 0
    assert "16 chain(s) already finished" in out.getvalue()
    other = _write(tmp_path, "b.yaml", seed=8)
    capsys.readouterr()
    assert main(["validate", str(other)], out=io.StringIO()) == 2
    validate_err = capsys.readouterr().err
    assert main(["run", str(other), "--no-progress"], out=io.StringIO()) == 2
    run_err = capsys.readouterr().err
    assert "different job" in validate_err and "seed" in validate_err
    assert validate_err == run_err


def test_validate_refuses_a_folder_that_is_not_a_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    config = _write(tmp_path, "a.yaml")
    assert main(["validate", str(config)], out=io.StringIO()) == 2
    assert "is not a run directory" in capsys.readouterr().err
