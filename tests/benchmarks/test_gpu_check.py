"""The GPU check's dry run (issue 45): every step of what ``scripts/gpu_check.sh`` runs on a lent
GPU, on a tiny model on this CPU, so that the one short run a GPU allows is known to work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.embedded  # (torch and transformers: the embedded extra)


def test_the_dry_run_measures_drift_cost_and_the_jobs_shape(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks import gpu_check

    assert gpu_check.main(["--dry-run", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(result["drift"]) == {"bf16", "bf16, deterministic algorithms", "float32"}
    assert result["drift"]["float32"]["max_nats"] < 1e-6  # float32 on a CPU: invariant
    cost = result["cost"]
    assert cost["a_ms"] > 0 and cost["b_ms"] >= 0 and cost["prefill_us"] > 0
    (stream,) = result["speed"]
    assert stream["replays_sequential"] == "1/1"  # the same chain, on the measured cost
    table = (tmp_path / "gpu_check.md").read_text()
    assert "decode step, bf16" in table and "stream@auto vs sequential" in table
