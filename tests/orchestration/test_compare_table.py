"""``presto compare``'s output fits ~100 columns; the equivalence numbers are still printed."""

from __future__ import annotations

import io
import json
from pathlib import Path

from presto_client.cli import main
from presto_client.reporting.tables import equivalence_cell

ROOT = Path(__file__).resolve().parents[2]


def test_compare_fits_100_columns_and_keeps_the_details(tmp_path: Path) -> None:
    out = io.StringIO()
    status = main(
        [
            "compare",
            str(ROOT / "configs" / "reference.yaml"),
            "--output",
            str(tmp_path / "r"),
            "--no-progress",
            "--baseline",
            "ref/sequential",
        ],
        out=out,
    )
    text = out.getvalue()
    assert status == 0, text
    too_wide = [x for x in text.splitlines() if len(x) > 100 and str(tmp_path) not in x]
    assert too_wide == []
    header = text.splitlines()[0].split()
    assert header == ["ref/sequential", "ref/bfs", "ref/predictive", "ref/crn"]
    assert "speedup vs sequential" in text and "speedup vs ref/sequential" in text
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    for arm in summary["arms"][1:]:  # every arm's TOST numbers, on a line of its own
        test = arm["equivalence"]["final_mean_logp0"]
        line = next(x for x in text.splitlines() if x.startswith(f"  {arm['arm']}, likelihood:"))
        assert line.endswith(equivalence_cell(test)) and "d=" in line
    assert "summary.json" in text
