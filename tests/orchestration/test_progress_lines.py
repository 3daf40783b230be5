"""Progress lines belong to a job that runs: a failed probe prints none."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from orch_helpers import job_dict

from presto_client.cli import main

emulation = pytest.importorskip("tests.support.emulation")


def _config(tmp_path: Path, url: str, **engine: object) -> Path:
    data = job_dict(
        tmp_path / "run",
        engines=[{"kind": "vllm", "name": "v", "base_url": url, "max_concurrency": 4, **engine}],
        prompts={"token_ids": [[1, 2, 3, 4]]},
        chains_per_prompt=1,
        sampler={"block_size": 4, "num_blocks": 2, "steps_per_block": 1},
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_failed_probe_prints_no_progress_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with emulation.EmulationServer("vllm", vocab_size=32) as server:
        wrong_model = _config(tmp_path, server.base_url, model="not-served")
        assert main(["run", str(wrong_model)], out=io.StringIO()) != 0
        err = capsys.readouterr().err
        assert "not-served" in err  # the probe's own error is there
        assert "progress:" not in err

        # the same job against the served model does show its start and its end
        assert main(["run", str(_config(tmp_path, server.base_url))], out=io.StringIO()) == 0
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("progress:")]
        assert lines[0].endswith("[started]") and lines[-1].endswith("[done]")
        assert "2/2 chains" not in lines[0] and "chains 2/2" in lines[-1]
