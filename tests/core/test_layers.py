"""The layers of docs/architecture.md, checked as allow-lists: each folder imports only the
first-party modules its "may import" column names; any other first-party import is refused.

Every ``import`` and ``from ... import`` of a folder's modules (at any depth, lazy ones too,
relative ones resolved) is read with :mod:`ast`. ``from pkg import name`` counts as importing
``pkg.name`` when that is a module of its own (``from presto_client import defaults``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.layout import ROOT, module_file, module_name, source_files

FIRST_PARTY = ("presto_client",)

# The shared leaves below every layer; they import nothing first-party.
LEAVES = (
    "presto_client.errors",
    "presto_client.defaults",
    "presto_client.urls",
    "presto_client.concurrency",
    "presto_client.terminal_text",
)

# An entry allows that module and everything under it; "=name" allows that module only (a
# package's face, not its submodules).
ALLOWED: dict[str, tuple[str, ...]] = {
    "presto_client/core": ("presto_client.core", "presto_client.errors"),
    "backends": ("presto_client.backends", "presto_client.core", *LEAVES),
    "presto_client/orchestration": (
        "presto_client.orchestration",
        "presto_client.core",
        "=presto_client.backends",
        "presto_client.backends.registry",
        "presto_client.backends.spec",
        "presto_client.child_servers",
        *LEAVES,
    ),
    "presto_client/reporting": (
        "presto_client.reporting",
        "presto_client.orchestration.results.summary",
        "presto_client.orchestration.run_dir.rundir",
        "presto_client.orchestration.planning.plan",
        "presto_client.orchestration.config.schema",
        "presto_client.orchestration.config.loading",
        "presto_client.orchestration.prompts.prompt_rows",
        *LEAVES,
    ),
    "presto_client/embedded": ("presto_client.embedded", *LEAVES),
    # The servers presto starts: the embedded engine's is started as a command line; what it
    # reads of that package is only whether the model's cache is ready (no torch).
    "presto_client/child_servers": (
        "presto_client.child_servers",
        "presto_client.embedded.model",
        *LEAVES,
    ),
    # The service is a face beside the CLI: it runs chains through the orchestration.
    "presto_client/serve": (
        "presto_client.serve",
        "presto_client.orchestration",
        "presto_client.core",
        *LEAVES,
    ),
    "presto_client/errors.py": (),
    "presto_client/defaults.py": (),
    "presto_client/urls.py": (),
    "presto_client/concurrency.py": (),
    "presto_client/terminal_text.py": (),
}
# The faces (cli.py, __init__.py, lm_eval_model.py) may import everything: not listed. No
# import outside these lists is tolerated (the last exception, the orchestration starting the
# embedded server through its package, went with presto_client/child_servers/).


def _is_module(name: str) -> bool:
    return module_file(name) is not None


def _imports(path: Path) -> list[str]:
    """Every first-party module ``path`` imports."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                out.append(sub if _is_module(sub) else module)
    return [name for name in out if name.split(".")[0] in FIRST_PARTY]


def _allowed(name: str, allow: tuple[str, ...]) -> bool:
    for entry in allow:
        if entry.startswith("="):
            if name == entry[1:]:
                return True
        elif name == entry or name.startswith(entry + "."):
            return True
    return False


def _files(folder: str) -> list[Path]:
    target = ROOT / folder
    return [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))


def test_from_import_of_a_module_counts_as_that_module() -> None:
    names = _imports(ROOT / "backends" / "spec.py")
    assert "presto_client.defaults" in names
    assert "presto_client" not in names


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_a_layer_imports_only_what_the_doc_allows(folder: str) -> None:
    files = _files(folder)
    assert files
    bad = [
        f"{f.relative_to(ROOT)} imports {name}"
        for f in files
        for name in _imports(f)
        if not _allowed(name, ALLOWED[folder])
    ]
    assert not bad, "\n".join(bad)


def test_test_doubles_and_benchmarks_are_not_imported_by_the_packages() -> None:
    bad: list[str] = []
    for f in source_files():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            bad.extend(
                f"{f.relative_to(ROOT)} imports {n}"
                for n in names
                if n.split(".")[0] in ("tests", "benchmarks", "backends")
            )
    assert not bad, "\n".join(bad)


# Inside the orchestration, its floors from the ground up: a module imports its own floor and
# the floors below, never one above (issue 49: planning/ held the ground-floor data that config/
# imported, and config/ and prompts/ imported each other).
ORCHESTRATION_FLOORS: tuple[tuple[str, ...], ...] = (
    ("planned", "input_files", "grading"),  # plain data, untrusted files, the graders
    ("engines",),  # opening a planned engine's replicas
    ("config",),  # the job config (pydantic) and its loading
    ("prompts",),  # the rows and prompts a config names
    ("planning", "run_dir"),  # the config resolved into a plan; a run's files
    ("results", "executors"),  # what a run's files say; where chains run
    ("job",),  # a job run end to end
)


def _floor(name: str) -> int | None:
    parts = name.split(".")
    if parts[:2] != ["presto_client", "orchestration"] or len(parts) < 3:
        return None
    return next(i for i, floor in enumerate(ORCHESTRATION_FLOORS) if parts[2] in floor)


def test_the_orchestrations_floors_import_only_downwards() -> None:
    files = _files("presto_client/orchestration")
    up = []
    for f in files:
        if f.name == "__init__.py" and f.parent.name == "orchestration":
            continue
        mine = _floor(module_name(f))
        assert mine is not None, f"{f.relative_to(ROOT)}: on no floor of ORCHESTRATION_FLOORS"
        for name in _imports(f):
            theirs = _floor(name)
            if theirs is not None and theirs > mine:
                up.append(f"{f.relative_to(ROOT)} imports {name} (a floor above)")
    assert not up, "\n".join(up)
