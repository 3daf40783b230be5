"""Where the installed modules' sources lie: ``presto_client/`` and ``backends/``, which
installs as ``presto_client.backends`` (pyproject's package-dir). The layout tests read source
files and name them as Python imports them."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = {"presto_client": "presto_client", "backends": "presto_client.backends"}
"""Folder of the repository -> the package it installs as."""


def source_files() -> list[Path]:
    """Every ``.py`` file of the installed packages, sorted."""
    return [f for folder in SOURCE_DIRS for f in sorted((ROOT / folder).rglob("*.py"))]


def module_name(path: Path) -> str:
    """The import name of the source file ``path``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    package = SOURCE_DIRS[parts[0]]
    return ".".join([package, *parts[1:]])


def module_file(name: str) -> Path | None:
    """The source file of the module or package ``name`` (``None``: not one of ours)."""
    for folder, package in sorted(SOURCE_DIRS.items(), key=lambda kv: -len(kv[1])):
        if name == package or name.startswith(package + "."):
            rest = name[len(package) :].lstrip(".").split(".") if name != package else []
            base = ROOT.joinpath(folder, *[p for p in rest if p])
            if base.with_suffix(".py").is_file():
                return base.with_suffix(".py")
            if (base / "__init__.py").is_file():
                return base / "__init__.py"
            return None
    return None
