"""Nothing below the plan sees the job config's pydantic models: the run, the engines' opening,
the orchestrator and the run directory import neither pydantic nor the modules that hold the
config's models (read with :mod:`ast`, lazy imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BELOW_THE_PLAN = (
    "job.py",
    "engines/opening.py",
    "executors/orchestrator.py",
    "run_dir/rundir.py",
)
# The modules that define or read the config's models (the plan's makers).
CONFIG_SIDE = (
    "pydantic",
    "presto_client.orchestration.config.schema",
    "presto_client.orchestration.config.engine_config",
    "presto_client.orchestration.config.loading",
    "presto_client.orchestration.grading",
    "presto_client.orchestration.planning.plan",
)


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.level:  # relative: inside presto_client.orchestration
                names.add(f"presto_client.orchestration.{node.module}")
            else:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _refused(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in CONFIG_SIDE)


@pytest.mark.parametrize("module", BELOW_THE_PLAN)
def test_no_config_model_below_the_plan(module: str) -> None:
    path = ROOT / "presto_client" / "orchestration" / module
    bad = sorted(n for n in _imported(path) if _refused(n))
    assert not bad, f"{module} imports {bad}: take plain data from the plan (planned.py)"


def test_the_check_sees_a_refused_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f():\n"
        "    from presto_client.orchestration.config import schema\n"
        "    import pydantic\n",
        encoding="utf-8",
    )
    assert {"presto_client.orchestration.config.schema", "pydantic"} <= {
        n for n in _imported(sample) if _refused(n)
    }
