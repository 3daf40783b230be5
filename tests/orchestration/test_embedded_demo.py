"""The demo on the real embedded engine (configs/demo_embedded.yaml: SmolLM2-135M on CPU),
kept tiny."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from presto_client.cli import main

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.embedded


def _embedded_ready() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401

        from presto_client.embedded.model import is_prepared
    except ImportError:
        return False
    return is_prepared()


@pytest.mark.skipif(not _embedded_ready(), reason="needs the 'embedded' extra and its model")
def test_demo_config_runs_on_the_embedded_engine(tmp_path: Path) -> None:
    out = io.StringIO()
    status = main(
        [
            "run",
            str(ROOT / "configs" / "demo_embedded.yaml"),
            "--output",
            str(tmp_path / "demo"),
            "--no-progress",
            "--set",
            'prompts.texts=["What is 2+2?"]',
            "--set",
            "sampler.block_size=8",
            "--set",
            "sampler.steps_per_block=3",
            "--set",
            "sampler.traversals=[sequential, crn, stream]",
        ],
        out=out,
    )
    assert status == 0, out.getvalue()
    table = out.getvalue()
    assert all(f"embedded/{t}" in table for t in ("sequential", "crn", "stream"))
    samples = [
        json.loads(x) for x in (tmp_path / "demo" / "samples.jsonl").read_text().splitlines()
    ]
    assert [s["status"] for s in samples] == ["ok", "ok", "ok"]
    assert all(isinstance(s["text"], str) and s["text"] for s in samples)
    assert samples[0]["prompt_len"] > 5  # the chat template was applied by /tokenize
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    for traversal in ("crn", "stream"):  # float32: both replay the baseline exactly
        arm = next(a for a in summary["arms"] if a["traversal"] == traversal)
        assert arm["identical_to_baseline"] == 1, traversal
        assert arm["prefix_cache_hit_rate"] is not None
