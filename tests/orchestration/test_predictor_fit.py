"""The certainty predictor refit from a run's own decisions (scikit-learn), ``presto
fit-predictor``, and a job that runs the predictive traversal with the refit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from orch_helpers import job_dict, make_config

from presto_client.cli import main
from presto_client.core.predictor import (
    CLASS_ACCEPT,
    CLASS_REJECT,
    CLASS_UNCERTAIN,
    CertaintyPredictor,
)
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import run_chain
from presto_client.core.settings import SamplerConfig
from presto_client.core.speculation import SpeculationBudget
from presto_client.core.stats import RoundRecord
from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import load_job_config
from presto_client.orchestration.executors.orchestrator import ChainOutcome, ChainSpec
from presto_client.orchestration.job import run_job_async

pytest.importorskip("sklearn", reason="the predictor fit needs the extra 'fit' (scikit-learn)")

from presto_client.orchestration.results.predictor_fit import (
    PredictorFitError,
    classify,
    decisions_of,
    fit_and_evaluate,
    fit_predictor,
    predictor_log_loss,
    read_decisions,
)
from presto_client.orchestration.run_dir.rundir import RunDir
from tests.support import exact_law as exact
from tests.support.plans import plan_of

EPS = 0.01


def _synthetic(truth: CertaintyPredictor, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 1.0, n)
    y = np.array([rng.choice(3, p=truth.probabilities(float(v))) for v in x])
    return x, y


def _centred(p: CertaintyPredictor) -> np.ndarray:
    # A multinomial model is defined up to a shift shared by the classes.
    a, b = np.array(p.intercepts), np.array(p.slopes)
    return np.concatenate([a - a.mean(), b - b.mean()])


def test_the_fit_recovers_known_coefficients() -> None:
    truth = CertaintyPredictor((-0.5, 1.5, -1.0), (1.5, -3.0, 1.5))
    x, y = _synthetic(truth, 20000, seed=1)
    fitted = fit_predictor(x, y)
    assert np.abs(_centred(fitted) - _centred(truth)).max() < 0.15
    # and it beats a clearly different predictor on fresh data from the same law
    x2, y2 = _synthetic(truth, 4000, seed=2)
    other = CertaintyPredictor.paper("entropy_cut")
    assert predictor_log_loss(fitted, x2, y2) < predictor_log_loss(other, x2, y2)


def test_the_fit_from_recorded_transitions_recovers_them() -> None:
    """The same, through the run directory's row format: classes from log A and ε, the feature
    rebuilt from the block and block_size."""
    truth = CertaintyPredictor.paper("power_mh")
    block_size, rng = 16, np.random.default_rng(3)
    log_a = {CLASS_ACCEPT: 0.0, CLASS_REJECT: -9.0, CLASS_UNCERTAIN: -0.7}
    rows = []
    for chain in range(400):
        transitions = []
        for block in range(3):
            length = (block + 1) * block_size
            for k in range(8):
                cut = int(rng.integers(0, length))
                cls = int(rng.choice(3, p=truth.probabilities(cut / length)))
                transitions.append([block, k, cut, int(cls == CLASS_ACCEPT), log_a[cls]])
        rows.append(
            {
                "chain_id": f"e/seq/p{chain:04d}/c000",
                "engine": "e",
                "prompt_index": chain,
                "chain_index": 0,
                "status": "ok",
                "transitions": transitions,
            }
        )
    decisions = decisions_of(rows, block_size=block_size, epsilon=EPS, sampler="power_mh")
    assert len(decisions) == 400 * 3 * 8
    assert decisions.cut_fractions.max() < 1.0
    report = fit_and_evaluate(decisions)
    assert np.abs(_centred(report.predictor) - _centred(truth)).max() < 0.2
    # the truth is the paper's fit: the refit can only match it on held-out chains
    assert report.refit_log_loss == pytest.approx(report.paper_log_loss, abs=0.02)


def test_classes_follow_epsilon() -> None:
    assert classify(math.log1p(-EPS), EPS) == CLASS_ACCEPT
    assert classify(0.3, EPS) == CLASS_ACCEPT  # log A above 0: certain accept
    assert classify(math.log(EPS), EPS) == CLASS_REJECT
    assert classify(-math.inf, EPS) == CLASS_REJECT
    assert classify(math.log(0.5), EPS) == CLASS_UNCERTAIN


def test_one_class_only_is_refused() -> None:
    with pytest.raises(PredictorFitError, match="one class"):
        fit_predictor([0.1, 0.5, 0.9], [CLASS_REJECT] * 3)


def _job(tmp_path: Path, traversals: list[str], **sampler: object) -> dict[str, object]:
    return job_dict(
        tmp_path / "run",
        sampler={"traversals": traversals, "num_blocks": 2, "steps_per_block": 8, **sampler},
        chains_per_prompt=3,
    )


async def _run(tmp_path: Path, data: dict[str, object], name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))  # (JSON is YAML)
    result = await run_job_async(plan_of(load_job_config(path)))
    assert result.failed == 0
    return result.run_dir


async def test_fit_predictor_on_a_real_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rounds keep every planned proposal: sized by the in-process engine's timings, a loaded
    # machine can shrink every predictive round to its root, whose chain is the sequential one.
    def unadaptive(replicas: int, capacity: int, **_: object) -> list[SpeculationBudget]:
        return [SpeculationBudget(capacity, adaptive=False) for _ in range(replicas)]

    monkeypatch.setattr(SpeculationBudget, "per_replica", unadaptive)
    run_dir = await _run(tmp_path, _job(tmp_path, ["sequential", "predictive"]))
    run = RunDir(run_dir)
    decisions = read_decisions(run)
    # 4 prompts x 3 chains, 16 decisions each, per arm; a predictive chain that never left the
    # all-reject path of its rounds is the sequential chain itself, and counts once
    rows = list(run.samples())
    distinct = {(r["prompt_index"], r["chain_index"], json.dumps(r["transitions"])) for r in rows}
    assert 4 * 3 < len(distinct) <= 4 * 3 * 2
    assert len(decisions) == len(distinct) * 16
    assert ((decisions.cut_fractions >= 0) & (decisions.cut_fractions < 1)).all()
    out = tmp_path / "fitted.json"
    assert main(["fit-predictor", str(run_dir), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert f"refit {data['held_out_log_loss']['refit']:.4f}" in printed
    assert f"paper {data['held_out_log_loss']['paper']:.4f}" in printed
    assert data["decisions"] == len(decisions)
    assert len(data["intercepts"]) == len(data["slopes"]) == 3


async def test_a_run_dir_without_transitions_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = await _run(tmp_path, _job(tmp_path, ["sample"]))
    assert main(["fit-predictor", str(run_dir)]) == 2
    assert "no recorded transitions" in capsys.readouterr().err
    assert main(["fit-predictor", str(tmp_path / "nowhere")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_a_run_dir_with_one_class_only_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    (run / "config.resolved.yaml").write_text("sampler: {block_size: 4, epsilon: 0.01}\n")
    rows = [
        {"chain_id": f"c{i}", "prompt_index": i, "chain_index": 0, "status": "ok",
         "transitions": [[0, 0, 1, 0, -20.0], [0, 1, 3, 0, -15.0]]}
        for i in range(3)
    ]  # fmt: skip
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["fit-predictor", str(run)]) == 2
    assert "all of one class (reject)" in capsys.readouterr().err


class _SpecSink:
    """Records the predictor each chain was handed."""

    def __init__(self) -> None:
        self.predictors: dict[str, CertaintyPredictor | None] = {}

    def chain_started(self, spec: ChainSpec, replica: int) -> None:
        self.predictors[spec.chain_id] = spec.predictor

    def round_done(self, spec: ChainSpec, record: RoundRecord, queue_s: float) -> None:
        return None

    def chain_done(self, outcome: ChainOutcome) -> None:
        return None


async def test_a_job_with_a_refit_predictor_replays_the_sequential_chain(tmp_path: Path) -> None:
    first = await _run(tmp_path, _job(tmp_path, ["sequential", "predictive"]))
    assert main(["fit-predictor", str(first), "-o", str(tmp_path / "refit.json")]) == 0
    data = _job(tmp_path, ["sequential", "crn", "predictive"], predictor="refit.json")
    data["output_dir"] = str(tmp_path / "second")
    plan = plan_of(load_job_config(_write(tmp_path / "second.yaml", data)))
    refit = json.loads((tmp_path / "refit.json").read_text())
    assert plan.predictor == CertaintyPredictor(tuple(refit["intercepts"]), tuple(refit["slopes"]))
    assert plan.predictor != CertaintyPredictor.paper("power_mh")
    assert plan.fingerprint["sampler"]["predictor"]["slopes"] == refit["slopes"]
    sink = _SpecSink()
    result = await run_job_async(plan, sinks=[sink])
    assert result.failed == 0
    assert set(sink.predictors.values()) == {plan.predictor}  # every chain got the refit
    arms = {a["arm"]: a for a in result.summary["arms"]}
    assert arms["ref/crn"]["identical_to_baseline"] == 4 * 3  # token for token, every chain
    samples = RunDir(result.run_dir).samples()
    assert all(s["stats"]["transitions"] == 16 for s in samples)


@pytest.mark.slow
async def test_the_predictive_chain_with_a_refit_predictor_keeps_the_exact_law() -> None:
    """The predictive traversal with a refit (here: a skewed one) still samples the chain's
    exact law: the predictor only chooses what is prefetched."""
    model = ReferenceModel(3, seed=1)
    config = SamplerConfig(block_size=3, steps_per_block=8)
    skewed = fit_predictor([0.1, 0.2, 0.3, 0.7, 0.8, 0.9], [0, 0, 0, 1, 1, 1])  # late: reject
    assert skewed.branch_probability(0.9) < 0.5 < skewed.branch_probability(0.1)
    law = exact.law_after(model, (0,), config)
    engine = ReferenceEngine(model)
    counts = np.zeros(model.vocab_size**config.response_length)
    for seed in range(1500):
        result = await run_chain(
            engine, (0,), config, traversal="predictive", size=8, seed=seed, predictor=skewed
        )
        counts[exact.state_index(result.full_token_ids, model.vocab_size)] += 1
    assert exact.chi_square_test(counts, law) > 1e-4


def _write(path: Path, data: dict[str, object]) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_the_fingerprint_is_unchanged_without_a_predictor(tmp_path: Path) -> None:
    plan = plan_of(make_config(tmp_path / "run"))
    assert plan.predictor is None
    assert "predictor" not in plan.fingerprint["sampler"]


def test_a_missing_or_malformed_predictor_file_is_a_config_error(tmp_path: Path) -> None:
    data = _job(tmp_path, ["predictive"], predictor="nope.json")
    with pytest.raises(ConfigError, match=r"sampler\.predictor: no file"):
        plan_of(load_job_config(_write(tmp_path / "a.yaml", data)))
    (tmp_path / "bad.json").write_text(json.dumps({"intercepts": [1, 2], "slopes": [0, 0, 0]}))
    data = _job(tmp_path, ["predictive"], predictor="bad.json")
    with pytest.raises(ConfigError, match="'intercepts' must be 3 finite numbers"):
        plan_of(load_job_config(_write(tmp_path / "b.yaml", data)))


async def test_early_rejections_keep_log_a_and_their_bound_apart(tmp_path: Path) -> None:
    """A stream chain rejects early from a bound that depends on timing; its records keep that
    bound out of the ``log A`` column, so its decisions are recognised as the sequential
    chain's copy and counted once."""
    run_dir = await _run(tmp_path, _job(tmp_path, ["sequential", "stream"]))
    rows = list(RunDir(run_dir).samples())
    early = 0
    for row in rows:
        for t in row["transitions"]:
            assert len(t) == 6
            if t[4] is None:  # an early rejection: its bound, never a log A
                early += 1
                assert row["traversal"] == "stream" and t[3] == 0 and t[5] is not None
            else:
                assert t[5] is None
    assert early > 0  # the scenario happened
    decisions = read_decisions(RunDir(run_dir))
    # stream replays sequential: 4 prompts x 3 chains x 16 decisions, each counted once
    assert len(decisions) == 4 * 3 * 16
