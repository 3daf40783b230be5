"""The stream window defines no work (``stream`` replays the sequential chain for every window):
the fingerprint leaves it out, and a run directory recorded with a window (older releases wrote
``window: 16``) resumes without a cap or with another one."""

from __future__ import annotations

import io
import json
from pathlib import Path

from presto_client.cli import main
from presto_client.orchestration.run_dir.rundir import fingerprint_conflicts

ROOT = Path(__file__).resolve().parents[2]


def test_the_window_is_no_fingerprint_conflict() -> None:
    old = {"sampler": {"alpha": 4.0, "window": 16}, "seed": 0}
    assert fingerprint_conflicts(old, {"sampler": {"alpha": 4.0}, "seed": 0}) == []
    assert fingerprint_conflicts(old, {"sampler": {"alpha": 2.0}, "seed": 0}) == ["sampler"]


def test_a_run_recorded_with_a_window_resumes_without_one(tmp_path: Path) -> None:
    config = str(ROOT / "configs" / "reference.yaml")
    out_dir = tmp_path / "r"
    args = ["--output", str(out_dir), "--no-progress", "--set", "chains_per_prompt=1"]
    assert main(["run", config, *args, "--set", "sampler.window=16"], out=io.StringIO()) == 0
    run_json = out_dir / "run.json"
    info = json.loads(run_json.read_text())
    assert "window" not in info["fingerprint"]["sampler"]
    info["fingerprint"]["sampler"]["window"] = 16  # as an older release recorded it
    run_json.write_text(json.dumps(info))
    out = io.StringIO()
    assert main(["run", config, *args], out=out) == 0
    assert "0 chain(s) run, 12 already finished" in out.getvalue()
