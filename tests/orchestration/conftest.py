"""Fixtures of the orchestration tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from orch_helpers import job_dict


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[..., Path]:
    def write(name: str = "job.yaml", **changes: Any) -> Path:
        path = tmp_path / name
        data = job_dict(tmp_path / "run", **changes)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write
