"""Output equivalence (method §6): the paired TOST, its place in the summary and the tables."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from presto_client.cli import main
from presto_client.orchestration.results.summary import paired_tost, summarize
from presto_client.reporting.tables import (
    equivalence_cell,
    format_side_by_side,
    format_summary_table,
)

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------
# The TOST itself
# ------------------------------------------------------------------------------------------


def test_identical_pairs_are_equivalent_with_a_zero_interval() -> None:
    base = [-1.2, -0.8, -1.0, -1.5]
    test = paired_tost([(b, b) for b in base])
    assert test["verdict"] == "equivalent"
    assert (test["mean_diff"], test["ci_low"], test["ci_high"]) == (0.0, 0.0, 0.0)
    assert test["n"] == 4
    assert test["margin"] == pytest.approx(0.2 * statistics.stdev(base))


def test_identical_pairs_with_a_constant_baseline_are_still_equivalent() -> None:
    test = paired_tost([(-1.0, -1.0), (-1.0, -1.0)])
    assert test["verdict"] == "equivalent" and test["margin"] == 0.0


def test_a_large_shift_is_not_equivalent() -> None:
    base = [-1.2, -0.8, -1.0, -1.5, -0.9, -1.1]
    noise = [0.01, -0.02, 0.0, 0.015, -0.01, 0.005]
    test = paired_tost([(b + 0.5 + e, b) for b, e in zip(base, noise, strict=True)])
    assert test["verdict"] == "not equivalent"
    assert test["ci_low"] > test["margin"]
    assert test["p_tost"] > 0.5


def test_a_small_noisy_difference_is_equivalent() -> None:
    base = [-1.2, -0.8, -1.0, -1.5, -0.9, -1.1, -1.3, -0.7]
    noise = [0.001, -0.002, 0.0, 0.0015, -0.001, 0.0005, -0.0005, 0.001]
    test = paired_tost([(b + e, b) for b, e in zip(base, noise, strict=True)])
    assert test["verdict"] == "equivalent"
    assert -test["margin"] < test["ci_low"] <= test["ci_high"] < test["margin"]
    assert test["p_tost"] < 0.05


@pytest.mark.parametrize("pairs", [[], [(-1.0, -1.1)]])
def test_fewer_than_two_pairs_is_not_applicable(pairs: list[tuple[float, float]]) -> None:
    test = paired_tost(pairs)
    assert test["verdict"] == "n/a" and test["reason"] == "n<2"
    assert test["n"] == len(pairs)
    assert equivalence_cell(test) == "n/a (n<2)"


def test_a_constant_baseline_with_differences_is_not_applicable() -> None:
    test = paired_tost([(-0.9, -1.0), (-1.2, -1.0), (-1.0, -1.0)])
    assert test["verdict"] == "n/a" and test["reason"] == "baseline SD=0"


def test_the_interval_matches_a_hand_computation() -> None:
    # diffs 0.1, 0.2, 0.3: mean 0.2, sd 0.1, se 0.1/sqrt(3); t_{0.95, 2} = 2.919986
    pairs = [(1.1, 1.0), (2.2, 2.0), (3.3, 3.0)]
    test = paired_tost(pairs)
    half = 2.919986 * 0.1 / math.sqrt(3)
    assert test["mean_diff"] == pytest.approx(0.2)
    assert test["ci_low"] == pytest.approx(0.2 - half, abs=1e-6)
    assert test["ci_high"] == pytest.approx(0.2 + half, abs=1e-6)
    assert test["ci_level"] == pytest.approx(0.9)
    assert test["baseline_sd"] == pytest.approx(1.0)  # sample SD of 1, 2, 3
    assert test["margin"] == pytest.approx(0.2)
    assert test["verdict"] == "not equivalent"  # the interval reaches past +0.2
    assert equivalence_cell(test) == "no d=+0.200 [0.031, 0.369] +/-0.200"


def test_the_verdict_agrees_with_the_two_one_sided_p_values() -> None:
    base = [0.0, 1.0, 2.0, 3.0, 4.0]  # SD 1.58, margin 0.316
    for shift in (0.0, 0.1, 0.2, 0.25, 0.3, 0.5):
        noise = [0.05, -0.05, 0.1, -0.1, 0.0]
        test = paired_tost([(b + shift + e, b) for b, e in zip(base, noise, strict=True)])
        assert (test["verdict"] == "equivalent") == (test["p_tost"] < 0.05), shift


# ------------------------------------------------------------------------------------------
# In the summary
# ------------------------------------------------------------------------------------------


def _sample(arm: str, prompt: int, chain: int, logp: Any, neg_h: Any = None) -> dict[str, Any]:
    engine, traversal = arm.split("/")
    return {
        "chain_id": f"{arm}:{prompt}:{chain}",
        "arm": arm,
        "engine": engine,
        "traversal": traversal,
        "prompt_index": prompt,
        "chain_index": chain,
        "status": "ok",
        "token_ids": [1, 2],
        "stats": {
            "model_call_time_s": 1.0,
            "final_mean_logp0": logp,
            "final_mean_neg_entropy": neg_h,
        },
    }


def test_summary_pairs_by_prompt_and_chain_per_engine() -> None:
    base_vals = {(0, 0): -1.0, (0, 1): -1.4, (1, 0): -0.8, (1, 1): -1.2}
    samples = []
    for (p, c), v in base_vals.items():
        samples.append(_sample("e/sequential", p, c, v, neg_h=-2.0 + v))
        samples.append(_sample("e/crn", p, c, v, neg_h=-2.0 + v))
        samples.append(_sample("e/bfs", p, c, v + 1.0))  # no entropies on this arm
    samples.append(_sample("e/predictive", 0, 0, -1.0))  # a single pair
    samples.append(_sample("other/bfs", 0, 0, -1.0))  # no baseline on its engine
    samples.append(_sample("e/crn", 5, 0, None))  # no baseline chain for (5, 0): ignored
    summary = summarize(samples)
    arms = {a["arm"]: a for a in summary["arms"]}
    assert arms["e/sequential"]["equivalence"] is None
    assert arms["other/bfs"]["equivalence"] is None
    crn = arms["e/crn"]["equivalence"]
    assert set(crn) == {"final_mean_logp0", "final_mean_neg_entropy"}
    assert crn["final_mean_logp0"]["verdict"] == "equivalent" and crn["final_mean_logp0"]["n"] == 4
    assert crn["final_mean_neg_entropy"]["n"] == 4
    bfs = arms["e/bfs"]["equivalence"]
    # the baseline has entropies, bfs has none: the metric is there, without pairs
    assert bfs["final_mean_logp0"]["verdict"] == "not equivalent"
    assert bfs["final_mean_logp0"]["mean_diff"] == pytest.approx(1.0)
    assert bfs["final_mean_neg_entropy"]["verdict"] == "n/a"
    assert bfs["final_mean_neg_entropy"]["n"] == 0
    assert arms["e/predictive"]["equivalence"]["final_mean_logp0"]["reason"] == "n<2"
    pooled = summary["equivalence_pooled"]["final_mean_logp0"]
    assert pooled["n"] == 4 + 4 + 1
    # the margin of the pooled test counts each baseline chain once
    assert pooled["baseline_sd"] == pytest.approx(statistics.stdev(base_vals.values()))

    table = format_side_by_side(summary)
    lines: dict[str, str] = {}  # (a wide table comes in blocks of columns: a row's parts joined)
    for line in table.splitlines():
        label = line.split("  ")[0]
        lines[label] = lines.get(label, "") + line
    assert "likelihood equiv. (TOST)" in lines and "confidence equiv. (TOST)" in lines
    row = lines["likelihood equiv. (TOST)"]
    assert "(base)" in row and "yes d=+0.000 [0.000, 0.000]" in row and "no d=+1.000" in row
    assert "n/a (n<2)" in row
    assert "equiv" not in format_summary_table(summary)  # the run table keeps its columns


def test_no_entropy_anywhere_means_no_confidence_test() -> None:
    samples = [
        _sample(arm, p, 0, -1.0 - 0.1 * p) for arm in ("e/sequential", "e/crn") for p in range(3)
    ]
    summary = summarize(samples)
    crn = next(a for a in summary["arms"] if a["arm"] == "e/crn")
    assert set(crn["equivalence"]) == {"final_mean_logp0"}
    assert "confidence equiv." not in format_side_by_side(summary)


# ------------------------------------------------------------------------------------------
# End to end on the reference config
# ------------------------------------------------------------------------------------------


def test_compare_on_the_reference_config_reports_equivalence(tmp_path: Path) -> None:
    out = io.StringIO()
    status = main(
        [
            "compare",
            str(ROOT / "configs" / "reference.yaml"),
            "--output",
            str(tmp_path / "r"),
            "--no-progress",
            "--traversals",
            "sequential,crn,bfs",
        ],
        out=out,
    )
    assert status == 0
    assert "likelihood equiv. (TOST)" in out.getvalue()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    arms = {a["arm"]: a for a in summary["arms"]}
    assert arms["ref/sequential"]["equivalence"] is None
    for arm in ("ref/crn", "ref/bfs"):
        test = arms[arm]["equivalence"]["final_mean_logp0"]
        assert test["n"] == 6  # 3 prompts x 2 chains
        assert test["verdict"] in ("equivalent", "not equivalent")
        assert test["ci_low"] <= test["mean_diff"] <= test["ci_high"]
        assert test["margin"] == pytest.approx(0.2 * test["baseline_sd"])
    # crn replays the baseline's chains: the same responses, the same likelihoods
    crn = arms["ref/crn"]["equivalence"]["final_mean_logp0"]
    assert crn["verdict"] == "equivalent" and crn["ci_low"] == crn["ci_high"] == 0.0
    assert summary["equivalence_pooled"]["final_mean_logp0"]["n"] == 12
    rows = list(csv.DictReader(io.StringIO((tmp_path / "r" / "summary.csv").read_text())))
    by_arm = {r["arm"]: r for r in rows}
    assert by_arm["ref/crn"]["equiv_mean_logp0_verdict"] == "equivalent"
    assert by_arm["ref/bfs"]["equiv_mean_logp0_n"] == "6"
    assert by_arm["ref/sequential"]["equiv_mean_logp0_verdict"] == ""


def test_summary_reports_the_worst_normaliser_drift_per_arm() -> None:
    samples = [_sample("e/sequential", p, 0, -1.0) for p in range(3)]
    for p, drift in enumerate([1e-5, 4e-5, None]):
        samples[p]["stats"]["drift_max"] = drift
    arms = {a["arm"]: a for a in summarize(samples)["arms"]}
    assert arms["e/sequential"]["drift_max"] == 4e-5
    assert "normaliser drift (max), nats" in format_side_by_side(summarize(samples))
