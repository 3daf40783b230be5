"""Issue 49: ``presto run`` (the orchestrator, local or on a Ray worker) and ``presto serve`` run
a chain one way, :class:`~presto_client.orchestration.executors.orchestrator.ChainStep`: a face
that places a chain, bounds its engine or calls a runner itself grows a second chain step (serve
had one: no predictor, a budget per chain where the pool had none)."""

from __future__ import annotations

import ast
from pathlib import Path

from presto_client.orchestration.executors.orchestrator import ChainStep, Orchestrator
from presto_client.serve.chains import ServedEngine
from tests.support.layout import ROOT, source_files

# What only the chain step does: place a chain (its replica and route), bound its engine, run
# the method's runner.
CHAIN_STEP_CALLS = {"chain_engine", "LimitedEngine", "run_chain", "runner"}
HOME = ROOT / "presto_client" / "orchestration" / "executors" / "orchestrator.py"


def _calls(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in CHAIN_STEP_CALLS:
                out.append((node.lineno, name))
    return out


def test_only_the_chain_step_places_bounds_and_runs_a_chain() -> None:
    outside = []
    for path in source_files():
        parts = path.relative_to(ROOT).parts
        if parts[0] != "presto_client" or parts[1] == "core" or path.name == "__init__.py":
            continue  # (the runners live in core; the package's docstring shows run_chain)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if path == HOME:
            step = next(
                n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "ChainStep"
            )
            inside = {id(n) for n in ast.walk(step)}
            calls = [
                (n.lineno, n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id)
                for n in ast.walk(tree)
                if isinstance(n, ast.Call)
                and id(n) not in inside
                and (
                    n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                )
                in CHAIN_STEP_CALLS
            ]
        else:
            calls = _calls(tree)
        outside += [f"{path.relative_to(ROOT)}:{line} calls {name}" for line, name in calls]
    assert not outside, "a chain step outside ChainStep:\n" + "\n".join(outside)


def test_both_faces_hold_chain_steps() -> None:
    # (the faces' chains go through these; the test above forbids any other way)
    assert "steps" in Orchestrator.__init__.__code__.co_names
    assert "ChainStep" in ServedEngine.__init__.__code__.co_names
    assert callable(ChainStep.run) and callable(ChainStep.place) and callable(ChainStep.warm)


def test_this_test_finds_a_second_chain_step(tmp_path: Path) -> None:
    grown = "async def _one(view, prompt):\n    return await run_chain(view, prompt, sampler)\n"
    assert _calls(ast.parse(grown)) == [(2, "run_chain")]
