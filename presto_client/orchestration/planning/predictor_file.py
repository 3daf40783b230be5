"""A certainty predictor's JSON file (``presto fit-predictor`` writes it, ``sampler.predictor``
reads it) turned into the plain :class:`CertaintyPredictor` the chains get."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from presto_client.core.predictor import CertaintyPredictor
from presto_client.errors import ConfigError


def _three_numbers(data: dict[str, Any], key: str, path: Path) -> tuple[float, float, float]:
    value = data.get(key)
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        or not all(math.isfinite(v) for v in value)
    ):
        raise ConfigError(
            f"sampler.predictor: {path}: {key!r} must be 3 finite numbers (accept, reject, "
            f"uncertain), got {value!r}"
        )
    return float(value[0]), float(value[1]), float(value[2])


def load_predictor(path: Path) -> CertaintyPredictor:
    """Read a predictor file; a missing or malformed one is a config error naming the field."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"sampler.predictor: no file {path} (write one with `presto fit-predictor RUN_DIR "
            "-o FILE`; relative paths are relative to the config file)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"sampler.predictor: cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"sampler.predictor: {path} must hold a JSON object")
    return CertaintyPredictor(
        _three_numbers(data, "intercepts", path), _three_numbers(data, "slopes", path)
    )


def predictor_fingerprint(predictor: CertaintyPredictor) -> dict[str, list[float]]:
    """The coefficients, not the file's path: a job is the same wherever its file lies."""
    return {"intercepts": list(predictor.intercepts), "slopes": list(predictor.slopes)}
