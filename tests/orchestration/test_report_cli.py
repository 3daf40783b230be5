"""``presto`` via ``main([...])`` on reference-engine configs, and plots from saved runs."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from presto_client.cli import main
from presto_client.orchestration.results.summary import summarize
from presto_client.orchestration.run_dir.rundir import RunDir
from presto_client.reporting.plots import cumulative_curves, write_plots

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = main(list(argv), out=out)
    return status, out.getvalue()


def test_run_prints_the_summary_table(tmp_path: Path) -> None:
    status, out = run_cli(
        "run",
        str(ROOT / "configs" / "reference.yaml"),
        "--output",
        str(tmp_path / "r"),
        "--no-progress",
        "--set",
        "chains_per_prompt=1",
    )
    assert status == 0
    assert "ref/sequential" in out and "ref/crn" in out and "speedup vs sequential" in out
    assert "12 chain(s) run" in out
    assert (tmp_path / "r" / "summary.csv").exists()
    # rerun: resumes, nothing to do, same table
    status, out2 = run_cli(
        "run",
        str(ROOT / "configs" / "reference.yaml"),
        "--output",
        str(tmp_path / "r"),
        "--no-progress",
        "--set",
        "chains_per_prompt=1",
    )
    assert status == 0 and "0 chain(s) run, 12 already finished" in out2


def test_seed_and_concurrency_flags(write_config: Callable[..., Path], tmp_path: Path) -> None:
    status, _ = run_cli(
        "run",
        str(write_config()),
        "--seed",
        "11",
        "--max-concurrency",
        "2",
        "--no-progress",
        "-q",
    )
    assert status == 0
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["fingerprint"]["seed"] == 11
    resolved = (tmp_path / "run" / "config.resolved.yaml").read_text()
    assert "max_concurrency: 2" in resolved


def test_validate_describes_the_job(write_config: Callable[..., Path]) -> None:
    status, out = run_cli("validate", str(write_config()), "--probe")
    assert status == 0
    assert "valid" in out
    assert "4 prompt(s) x 2 chain(s) x 2 arm(s) = 16 chain(s)" in out
    assert "ref/sequential, ref/crn" in out
    assert "ref: ok (in-process)" in out


def test_config_errors_exit_2_with_one_message(
    write_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    status, _ = run_cli("run", str(write_config(sampler={"alhpa": 1})), "--no-progress")
    err = capsys.readouterr().err
    assert status == 2
    assert "presto: error:" in err and "sampler.alhpa" in err and "Traceback" not in err
    status, _ = run_cli("validate", str(write_config()), "--set", "nonsense")
    assert status == 2 and "expected KEY=VALUE" in capsys.readouterr().err


def test_compare_prints_side_by_side(write_config: Callable[..., Path], tmp_path: Path) -> None:
    status, out = run_cli(
        "compare",
        str(write_config()),
        "--traversals",
        "sequential,crn,bfs",
        "--baseline",
        "ref/sequential",
        "--no-progress",
    )
    assert status == 0, out
    header = out.splitlines()[0]
    assert "ref/sequential" in header and "ref/crn" in header and "ref/bfs" in header
    assert "transitions per call" in out and "replays baseline" in out
    assert "speedup vs ref/sequential" in out
    status, _ = run_cli("compare", str(write_config()), "--traversals", "crn", "--no-progress")
    assert status == 2


def test_report_writes_pngs_from_a_saved_run(
    write_config: Callable[..., Path], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib", reason="plots need the extra 'plots'")
    assert run_cli("run", str(write_config()), "--no-progress", "-q")[0] == 0
    before = (tmp_path / "run" / "samples.jsonl").read_text()
    status, out = run_cli("report", str(tmp_path / "run"))
    assert status == 0
    plots = sorted(p.name for p in (tmp_path / "run" / "plots").glob("*.png"))
    assert plots == ["cumulative_time.png", "speedup_per_prompt.png", "transitions_per_call.png"]
    for p in (tmp_path / "run" / "plots").glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ref/crn" in out and "prompt 0" in out
    assert (tmp_path / "run" / "samples.jsonl").read_text() == before  # never re-runs
    # several runs, plots elsewhere
    status, out = run_cli(
        "report", str(tmp_path / "run"), str(tmp_path / "run"), "--output", str(tmp_path / "p")
    )
    assert status == 0 and "== all runs" in out
    assert len(list((tmp_path / "p").rglob("*.png"))) == 6


def test_report_on_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _ = run_cli("report", str(tmp_path / "nope"))
    assert status == 1 and "not a run directory" in capsys.readouterr().err


def test_cumulative_curves_and_summary_from_records() -> None:
    samples = [
        {
            "chain_id": "a",
            "arm": "e/sequential",
            "engine": "e",
            "traversal": "sequential",
            "prompt_index": 0,
            "chain_index": 0,
            "status": "ok",
            "token_ids": [1],
            "stats": {"model_call_time_s": 4.0, "transitions": 2, "rounds": 2},
        },
        {
            "chain_id": "b",
            "arm": "e/crn",
            "engine": "e",
            "traversal": "crn",
            "prompt_index": 0,
            "chain_index": 0,
            "status": "ok",
            "token_ids": [1],
            "stats": {"model_call_time_s": 1.0, "transitions": 2, "rounds": 1},
        },
        {
            "chain_id": "c",
            "arm": "e/crn",
            "engine": "e",
            "traversal": "crn",
            "prompt_index": 1,
            "chain_index": 0,
            "status": "failed",
            "error": "x",
        },
    ]
    records = [
        {"chain_id": "a", "round": 0, "kind": "extend", "wall_s": 9.0, "transitions": 0},
        {"chain_id": "a", "round": 1, "kind": "propose", "wall_s": 1.0, "transitions": 1},
        {"chain_id": "a", "round": 2, "kind": "propose", "wall_s": 3.0, "transitions": 1},
        {"chain_id": "b", "round": 0, "kind": "propose", "wall_s": 1.0, "transitions": 2},
        {"chain_id": "c", "round": 0, "kind": "propose", "wall_s": 5.0, "transitions": 1},
    ]
    curves = cumulative_curves(records, samples)
    assert curves["e/sequential"] == ([0, 1, 2], [0.0, 1.0, 4.0])
    assert curves["e/crn"] == ([0, 1, 2], [0.0, 1.0, 1.0])
    s = summarize(samples, [{"engine": "e", "queries": 10, "hits": 7}])
    crn = next(a for a in s["arms"] if a["arm"] == "e/crn")
    assert crn["speedup_median"] == 4.0 and crn["chains_failed"] == 1
    assert crn["prefix_cache_hit_rate"] == 0.7 and crn["identical_to_baseline"] == 1


def test_write_plots_needs_only_the_files(
    write_config: Callable[..., Path], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib", reason="plots need the extra 'plots'")
    assert run_cli("run", str(write_config()), "--no-progress", "-q")[0] == 0
    files = write_plots(RunDir(tmp_path / "run"), tmp_path / "plots")
    assert len(files) == 3 and all(f.stat().st_size > 1000 for f in files)


def test_validate_the_demo_without_starting_anything() -> None:
    status, out = run_cli("validate", str(ROOT / "configs" / "demo.yaml"), "-o", "/nonexistent")
    assert status == 0
    assert "llama.cpp's llama-server (built and started by presto" in out
    assert "llamacpp/sequential, llamacpp/stream, llamacpp/crn, llamacpp/predictive" in out
    path = str(ROOT / "configs" / "demo_embedded.yaml")
    status, out = run_cli("validate", path, "-o", "/nonexistent")
    assert status == 0
    assert "embedded CPU server (started by presto)" in out
    assert "embedded/sequential, embedded/stream, embedded/crn, embedded/predictive" in out


def test_serve_embedded_delegates_every_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    import presto_client.embedded.__main__ as embedded_main

    seen: list[list[str]] = []

    def fake_main(argv: list[str] | None = None) -> int:
        seen.append(list(argv or []))
        return 0

    monkeypatch.setattr(embedded_main, "main", fake_main)
    assert main(["serve-embedded", "--port", "8001", "--help"]) == 0
    assert seen == [["--port", "8001", "--help"]]


def test_an_arm_has_one_colour_in_every_plot(
    write_config: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    assert run_cli("run", str(write_config()), "--no-progress", "-q")[0] == 0
    seen: dict[str, set[str]] = {}
    for method in ("step", "bar"):
        original = getattr(Axes, method)

        def spy(self: Axes, *args: object, _original: object = original, **kw: object) -> object:
            seen.setdefault(str(kw.get("label")), set()).add(str(kw.get("color")))
            return _original(self, *args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(Axes, method, spy)
    write_plots(RunDir(tmp_path / "run"), tmp_path / "plots")
    assert "ref/crn" in seen
    assert all(len(colours) == 1 for colours in seen.values()), seen
    assert len({c for colours in seen.values() for c in colours}) == len(seen)


def test_exit_status_tells_an_incomplete_run() -> None:
    from types import SimpleNamespace

    from presto_client.cli import EXIT_ERROR, EXIT_OK, EXIT_PARTIAL, _exit_status

    assert _exit_status(SimpleNamespace(failed=0, completed=4)) == EXIT_OK
    assert _exit_status(SimpleNamespace(failed=1, completed=3)) == EXIT_PARTIAL == 3
    assert _exit_status(SimpleNamespace(failed=2, completed=0)) == EXIT_ERROR
