"""What the wheel holds: every presto_client package (backends/ as presto_client.backends,
never a top-level ``backends``, a name another project owns on the package index), the demo's
and the benchmarks' configs and the set-up scripts (so ``presto run demo`` and the managed
llama.cpp work from a wheel install), and ``py.typed``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.support.layout import ROOT


def _setuptools() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]


def test_every_package_of_the_source_tree_is_listed() -> None:
    listed = set(_setuptools()["packages"])  # type: ignore[arg-type]
    found = {
        ".".join(p.relative_to(ROOT).parent.parts)
        for p in (ROOT / "presto_client").rglob("__init__.py")
    }
    assert found <= listed, f"not in pyproject's packages: {sorted(found - listed)}"
    assert {"presto_client.backends", "presto_client.configs", "presto_client.scripts"} <= listed


def test_the_wheel_holds_the_namespace_the_configs_and_the_scripts(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("presto_client-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"presto_client"}, tops  # no top-level backends, configs or scripts
    for needed in (
        "presto_client/py.typed",
        "presto_client/backends/vllm.py",
        "presto_client/configs/demo.yaml",
        "presto_client/configs/benchmarks/math500.yaml",
        "presto_client/scripts/llamacpp.sh",
        "presto_client/scripts/lib.sh",
    ):
        assert needed in names, needed


def test_the_demo_is_found_by_name_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from presto_client.cli_quick_run import resolve_config

    monkeypatch.chdir(tmp_path)  # no configs/ here: the installed ones are used
    assert resolve_config("demo").name == "demo.yaml" and resolve_config("demo").is_file()
    assert resolve_config("math500").name == "math500.yaml"
