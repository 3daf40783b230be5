"""Reading a job config: YAML, overrides, validation with errors that name the file, the field
path and the fix; the prompts it names; the resolved config with secrets removed.

Every error is a :class:`~presto_client.errors.ConfigError`. Secrets never enter a config: an
engine names the *environment variable* holding its API key (``api_key_env``), and
:func:`redacted_dump` strips credentials from URLs.
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import (
    BaseModel,
    ValidationError,
)

from presto_client.errors import ConfigError
from presto_client.orchestration import input_files
from presto_client.orchestration.config.overrides import apply_override, format_loc, parse_path
from presto_client.orchestration.config.schema import ENGINE_TAGS, JobConfig, engine_kinds
from presto_client.orchestration.input_files import load_yaml, read_text_file
from presto_client.urls import redact_url


def _unwrap(tp: Any) -> list[Any]:
    """The model classes an annotation can hold (through Optional/list/Annotated/Union)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (Union, types.UnionType, list, tuple, dict):
        return [m for a in typing.get_args(tp) for m in _unwrap(a)]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return []


def _models_at(loc: Sequence[str | int]) -> list[type[BaseModel]]:
    """The model class(es) owning the last component of ``loc`` (union tags followed)."""
    models: list[type[BaseModel]] = [JobConfig]
    parts = list(loc)
    for part in parts[:-1]:
        if isinstance(part, int):
            continue
        if len(models) > 1:
            tagged = [m for m in models if ENGINE_TAGS.get(str(part)) is m]
            if tagged:
                models = tagged
                continue
        nxt: list[type[BaseModel]] = []
        for m in models:
            f = m.model_fields.get(part)
            if f is not None:
                nxt.extend(_unwrap(f.annotation))
        if not nxt:
            break
        models = nxt
    return models


def _clean_loc(loc: Sequence[str | int]) -> list[str | int]:
    out: list[str | int] = []
    for i, part in enumerate(loc):
        # pydantic puts the union tag after the list index: engines.1.http.base_url
        if (
            isinstance(part, str)
            and part in ENGINE_TAGS
            and i >= 2
            and isinstance(loc[i - 1], int)
            and loc[i - 2] == "engines"
        ):
            continue
        out.append(part)
    return out


def _field_names(models: list[type[BaseModel]]) -> list[str]:
    names: list[str] = []
    for m in models:
        for n in m.model_fields:
            if n not in names:
                names.append(n)
    return names


def _describe(models: list[type[BaseModel]], field: str) -> str | None:
    for m in models:
        f = m.model_fields.get(field)
        if f is not None and f.description:
            return f.description
    return None


def _engine_of(err: Any) -> tuple[str | int, ...] | None:
    """``("engines", i)`` of an error inside an engine entry."""
    loc = _clean_loc(err["loc"])
    return tuple(loc[:2]) if len(loc) >= 2 and loc[0] == "engines" else None


def _unknown_kind(err: Any) -> bool:
    loc = _clean_loc(err["loc"])
    return (
        len(loc) == 3
        and loc[0] == "engines"
        and loc[2] == "kind"
        and "unknown engine kind" in str(err["msg"])
    )


def _relevant(errors: list[Any]) -> list[Any]:
    """The errors worth reporting: of an engine whose kind is unknown, only that (its other
    fields were checked against some other kind's and would be reported as unknown)."""
    unknown = {_engine_of(e) for e in errors if _unknown_kind(e)}
    return [e for e in errors if _unknown_kind(e) or _engine_of(e) not in unknown]


def _format_error(err: Any, overridden: dict[str, str]) -> str:
    loc = _clean_loc(err["loc"])
    models = _models_at(list(err["loc"]))
    path = format_loc(loc)
    etype = err["type"]
    msg = str(err["msg"])
    last = loc[-1] if loc else None
    hint = ""
    if etype == "extra_forbidden" and isinstance(last, str):
        valid = _field_names(models)
        close = difflib.get_close_matches(last, valid, n=1)
        msg = f"unknown field {last!r}"
        hint = (f"did you mean {close[0]!r}? " if close else "") + (
            f"valid fields here: {', '.join(valid)}" if valid else "remove it"
        )
    elif etype == "missing" and isinstance(last, str):
        msg = "required field missing"
        desc = _describe(models, last)
        hint = f"add {last}: ..." + (f" ({desc})" if desc else "")
    elif _unknown_kind(err):
        msg = msg.removeprefix("Value error, ")
        given = err.get("input")
        close = difflib.get_close_matches(str(given), engine_kinds(), n=1)
        hint = f"did you mean {close[0]!r}?" if close else ""
    elif etype == "union_tag_invalid" or etype == "union_tag_not_found":
        msg = f"unknown engine kind {err.get('input', {}).get('kind')!r}"
        if etype == "union_tag_not_found":
            msg = "engine has no kind"
        hint = f"set kind to one of: {', '.join(engine_kinds())}"
    else:
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        desc = _describe(models, last) if isinstance(last, str) else None
        inp = err.get("input")
        if not isinstance(inp, dict) and etype != "value_error":
            msg += f" (got {inp!r})"
        if desc:
            hint = desc
    for key, text in overridden.items():
        if path == key or path.startswith(key + ".") or path.startswith(key + "["):
            msg += f" [from --set {text}]"
            break
    return f"  {path}: {msg}" + (f"\n      hint: {hint}" if hint else "")


def validate_job_config(
    data: Any, *, source: str = "<config>", overridden: dict[str, str] | None = None
) -> JobConfig:
    """Validate a parsed config mapping; errors become one :class:`ConfigError`."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: a job config must be a YAML mapping (engines:, prompts:, sampler:, ...), "
            f"got {type(data).__name__}"
        )
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        lines = [_format_error(e, overridden or {}) for e in _relevant(list(exc.errors()))]
        raise ConfigError(
            f"{source}: invalid job config ({len(lines)} problem(s)):\n" + "\n".join(lines)
        ) from None


def load_job_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> JobConfig:
    """Read, override and validate a job config file.

    Relative ``prompts.file`` paths are resolved against the config file's folder; a missing
    ``output_dir`` becomes ``runs/<name>``.
    """
    p = Path(path)
    text = read_text_file(p, what="config file", max_bytes=input_files.MAX_CONFIG_BYTES)
    data = load_yaml(text, source=str(p))
    return load_job_data(
        {} if data is None else data, overrides, source=str(p), base=p.parent, name=p.stem
    )


def load_job_data(
    data: Any, overrides: Sequence[str] = (), *, source: str, base: Path, name: str
) -> JobConfig:
    """Override and validate a parsed job config (``source`` names it in errors); relative
    paths in it are taken against ``base``, and ``name`` is the job's name if it has none."""
    overridden: dict[str, str] = {}
    if isinstance(data, dict):
        for ov in overrides:
            apply_override(data, ov)
            key = ov.partition("=")[0].strip()
            overridden[format_loc(parse_path(key))] = ov
    cfg = validate_job_config(data, source=source, overridden=overridden)
    if cfg.name is None:
        cfg.name = name
    if cfg.prompts.file is not None and not cfg.prompts.file.is_absolute():
        cfg.prompts.file = (base / cfg.prompts.file).resolve()
    ds = cfg.prompts.dataset
    if ds is not None and ds.path is not None:
        ds.path = ds.path.expanduser()
        if not ds.path.is_absolute():
            ds.path = (base / ds.path).resolve()
    if cfg.sampler.predictor is not None and not cfg.sampler.predictor.is_absolute():
        cfg.sampler.predictor = (base / cfg.sampler.predictor).resolve()
    if cfg.output_dir is None:
        cfg.output_dir = Path("runs") / cfg.name
    return cfg


_SECRET_WORDS = ("api_key", "password", "secret", "token")


def _redact(node: Any, key: str = "") -> Any:
    if isinstance(node, dict):
        return {k: _redact(v, str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [_redact(v, key) for v in node]
    if isinstance(node, str):
        lowered = key.lower()
        if key != "api_key_env" and key != "token_ids" and any(w in lowered for w in _SECRET_WORDS):
            return "***"
        if "://" in node:
            return redact_url(node)
    return node


def redacted_dump(cfg: JobConfig) -> dict[str, Any]:
    """The resolved config as plain data with secrets removed (credentials in URLs)."""
    data = typing.cast(dict[str, Any], _redact(cfg.model_dump(mode="json")))
    if not data["sampler"]["options"]:
        del data["sampler"]["options"]  # (a sampler without options, recorded as it always was)
    return data
