"""Every third-party import of the installed packages is declared in pyproject.toml.

The imports of ``presto_client/`` and ``backends/`` (at any depth, lazy ones and
``importlib.import_module("literal")`` too) are read with :mod:`ast`; the standard library is
``sys.stdlib_module_names``; an import name maps to its distribution with
``importlib.metadata.packages_distributions()`` (or, for a distribution not installed here, to
the import name normalised as PEP 503 does, which is how ``math_verify``/``lm_eval``/``uvloop``
are spelled as distributions).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("presto_client", "backends")
"""The source folders of the installed packages (backends/ installs as presto_client.backends)."""
FIRST_PARTY = frozenset({"presto_client"})

# Files imported only by a user who installed an extra: their module-level imports may come from
# that extra. Everywhere else a module-level import must be a core dependency, because
# `import presto_client` / `presto run` reaches it on a plain install.
EXTRA_OF_FILE = {
    "presto_client/embedded": "embedded",
    "presto_client/lm_eval_model.py": "eval",
    "presto_client/orchestration/results/predictor_fit.py": "fit",
}


@dataclass(frozen=True, slots=True)
class ThirdPartyImport:
    file: str
    name: str  # top-level import name
    lazy: bool  # inside a function or a try block: only reached when that path runs


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return _normalise(match.group(1))


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = {_requirement_name(r) for r in project["dependencies"]}
    extras = {
        extra: {_requirement_name(r) for r in reqs}
        for extra, reqs in project.get("optional-dependencies", {}).items()
    }
    return core, extras


def _imports_of(tree: ast.AST) -> Iterator[tuple[str, bool]]:
    """(top-level import name, lazy) of every import in a module."""

    def visit(node: ast.AST, lazy: bool) -> Iterator[tuple[str, bool]]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], lazy
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0], lazy
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value.split(".")[0], True
        inner = lazy or isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.Try | ast.If
        )
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner)

    yield from visit(tree, False)


def _third_party_imports() -> list[ThirdPartyImport]:
    out: list[ThirdPartyImport] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            rel = path.relative_to(ROOT).as_posix()
            for name, lazy in _imports_of(tree):
                if name in sys.stdlib_module_names or name in FIRST_PARTY or name == "__future__":
                    continue
                out.append(ThirdPartyImport(rel, name, lazy))
    return out


# The distribution of an import whose name differs from it, for when it is not installed (a
# light install: `.[dev]` alone has no scikit-learn to ask).
NOT_ITS_IMPORT_NAME = {"sklearn": "scikit-learn"}


def _distributions(import_name: str) -> set[str]:
    found = importlib.metadata.packages_distributions().get(import_name)
    if found:
        return {_normalise(d) for d in found}
    return {_normalise(NOT_ITS_IMPORT_NAME.get(import_name, import_name))}


def _extra_of(file: str) -> str | None:
    for prefix, extra in EXTRA_OF_FILE.items():
        if file == prefix or file.startswith(prefix + "/"):
            return extra
    return None


def test_the_walk_finds_lazy_and_string_imports() -> None:
    tree = ast.parse(
        "import numpy\n"
        "def f():\n    from scipy import stats\n"
        "try:\n    import uvloop\nexcept ImportError:\n    pass\n"
        "importlib.import_module('math_verify')\n"
    )
    assert sorted(_imports_of(tree)) == [
        ("math_verify", True),
        ("numpy", False),
        ("scipy", True),
        ("uvloop", True),
    ]


def test_every_third_party_import_is_declared() -> None:
    core, extras = _declared()
    in_any_extra = set().union(*extras.values())
    found = _third_party_imports()
    assert {imp.name for imp in found} >= {"numpy", "aiohttp", "pydantic"}
    bad: list[str] = []
    for imp in found:
        dists = _distributions(imp.name)
        extra = _extra_of(imp.file)
        if dists & core:
            continue
        if extra is not None and dists & extras[extra]:
            continue
        if imp.lazy and extra is None and dists & in_any_extra:
            continue
        where = f"extra {extra!r}" if extra else ("an extra" if imp.lazy else "dependencies")
        bad.append(f"{imp.file} imports {imp.name} ({sorted(dists)}), not declared in {where}")
    assert not bad, "\n".join(bad)


def test_every_core_dependency_is_imported_by_the_packages() -> None:
    """A hard dependency nothing imports is dead weight for every user."""
    core, _ = _declared()
    used = set().union(*(_distributions(imp.name) for imp in _third_party_imports()))
    assert core - used == set()
