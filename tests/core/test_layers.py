"""The layers of docs/architecture.md, checked: each package imports only the ones below it.

Every ``import`` and ``from ... import`` of a package's modules (at any depth, lazy ones too) is
read with :mod:`ast`; a module may not import a layer above its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FORBIDDEN: dict[str, tuple[str, ...]] = {
    # the math and the engine protocol know no I/O layer
    "presto_client/core": (
        "presto_client.orchestration",
        "presto_client.reporting",
        "presto_client.cli",
        "presto_client.embedded",
        "backends",
    ),
    # the dialects know the core, never the orchestration or the faces
    "backends": ("presto_client.orchestration", "presto_client.reporting", "presto_client.cli"),
    # the orchestration drives the core and the backends' registry, never a face
    "presto_client/orchestration": ("presto_client.reporting", "presto_client.cli"),
    "presto_client/reporting": ("presto_client.cli",),
    # the embedded engine is a server: the client reaches it over HTTP only
    "presto_client/embedded": (
        "presto_client.orchestration",
        "presto_client.reporting",
        "presto_client.cli",
        "backends",
    ),
}


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    bad = [
        f"{f.relative_to(ROOT)} imports {name}"
        for f in files
        for name in _imports(f)
        if any(name == up or name.startswith(up + ".") for up in FORBIDDEN[package])
    ]
    assert not bad, "\n".join(bad)


def test_test_doubles_and_benchmarks_are_not_imported_by_the_packages() -> None:
    bad = [
        f"{f.relative_to(ROOT)} imports {name}"
        for package in ("presto_client", "backends")
        for f in sorted((ROOT / package).rglob("*.py"))
        for name in _imports(f)
        if name.split(".")[0] in ("tests", "benchmarks")
    ]
    assert not bad, "\n".join(bad)
