"""The README's Python API example runs as written (extracted from README.md, not copied)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.emulation import EmulationServer

ROOT = Path(__file__).resolve().parents[1]


def readme_python_api_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Python API") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "README.md's Python API section has no ```python block"
    return match.group(1)


def test_python_api_block_is_a_complete_script() -> None:
    source = readme_python_api_block()
    compile(source, "README.md", "exec")  # a top-level await is a SyntaxError here
    tree = ast.parse(source)
    assigned = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    assert "prompt_ids" in assigned  # every name the call uses is defined in the block


def test_python_api_block_runs_against_a_vllm_server(tmp_path: Path) -> None:
    script = tmp_path / "api_example.py"
    script.write_text(readme_python_api_block(), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with EmulationServer("vllm", tokenizer=True, deterministic=True) as server:
        proc = subprocess.run(
            [sys.executable, str(script), server.base_url],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            cwd=tmp_path,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        requests = dict(server.stats.requests)
    text, stats = proc.stdout.strip().splitlines()[-2:]
    # 32 x 2 tokens of the toy tokenizer's "<tN>" pieces, then the chain's statistics
    assert len(re.findall(r"<t\d+>", text)) == 64
    assert requests.get("/tokenize") == 1 and requests.get("/detokenize") == 1
    assert requests.get("/v1/completions", 0) > 1
    assert stats.startswith("{") and "accept" in stats


def test_the_demo_scripts_gpu_model_part_runs_as_written(tmp_path: Path) -> None:
    """``scripts/demo.sh``'s second part (issue 47), its options as the script gives them, on a
    faster clock and one prompt: it prints the speed-up table, with the replay column."""
    script = (ROOT / "scripts" / "demo.sh").read_text(encoding="utf-8").replace("\\\n", " ")
    line = next(x for x in script.splitlines() if "-m benchmarks.bench_stream" in x)
    args = line.split("-m benchmarks.bench_stream", 1)[1].split()
    args[args.index("--out") + 1] = str(tmp_path / "out")
    faster = ["--time-scale", "0.05", "--prompts", "1", "--T", "32", "--K", "4"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_stream", *args, *faster],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [x for x in proc.stdout.splitlines() if x.startswith("| stream@auto |")]
    assert rows and rows[0].split("|")[7].strip() == "1/1", proc.stdout  # replays sequential
    assert "prompt 0" not in proc.stdout  # --quiet: the tables only
