"""The speedup-per-prompt plot: bars labelled by the prompts' text, the legend clear of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from presto_client.cli import main
from presto_client.orchestration.run_dir.rundir import RunDir
from presto_client.reporting.plots import excerpt, prompt_labels, write_plots
from tests.support.emulation import EmulationServer

TEXTS = [
    "How many apples are left if Tom eats two of his five?",
    "Name the capital of France.",
    "Write a haiku about\nthe sea.",
]


def test_excerpt() -> None:
    assert excerpt("short") == "short"
    assert excerpt("a  b\nc") == "a b c"
    long = excerpt("How many apples are left if Tom eats two of his five?")
    assert len(long) == 28 and long.endswith("…") and long.startswith("How many apples")


def text_prompt_run(tmp_path: Path, server: EmulationServer) -> RunDir:
    job = {
        "engines": [{"kind": "vllm", "name": "emu", "base_url": server.base_url}],
        "prompts": {"texts": TEXTS},
        "sampler": {
            "alpha": 4.0,
            "block_size": 8,
            "num_blocks": 1,
            "steps_per_block": 4,
            "traversals": ["sequential", "crn", "bfs"],
            "n_pf": 4,
        },
        "chains_per_prompt": 1,
        "seed": 3,
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["run", str(path), "--no-progress", "-q"]) == 0
    return RunDir(tmp_path / "run")


def test_speedup_bars_carry_prompt_text_and_the_legend_covers_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    seen: dict[str, Any] = {}
    original = Figure.savefig

    def spy(self: Figure, fname: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(str(fname)).name == "speedup_per_prompt.png":
            (ax,) = self.axes
            self.canvas.draw()
            renderer = self.canvas.get_renderer()  # type: ignore[attr-defined]
            legend = ax.get_legend().get_window_extent(renderer)
            seen["ticks"] = [t.get_text() for t in ax.get_xticklabels()]
            seen["overlaps"] = [
                bar for bar in ax.patches if bar.get_window_extent(renderer).overlaps(legend)
            ]
            seen["legend_right_of_axes"] = legend.x0 >= ax.get_window_extent(renderer).x1
        return original(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    with EmulationServer("vllm", tokenizer=True) as server:
        run = text_prompt_run(tmp_path, server)
    files = write_plots(run, tmp_path / "plots")
    assert tmp_path / "plots" / "speedup_per_prompt.png" in files
    assert seen["ticks"] == [
        "0: How many apples are left if…",
        "1: Name the capital of France.",
        "2: Write a haiku about the sea.",
    ]
    assert seen["overlaps"] == [] and seen["legend_right_of_axes"]


def test_labels_fall_back_when_the_prompts_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "config.resolved.yaml").write_text(
        yaml.safe_dump({"prompts": {"file": str(tmp_path / "moved.jsonl")}})
    )
    assert prompt_labels(RunDir(tmp_path), [0, 2]) == {0: "prompt 0", 2: "prompt 2"}
