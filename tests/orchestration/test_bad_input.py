"""Hostile or malformed input files are refused with one line naming the file and what is wrong,
exit 2, no traceback; valid JSONL with unusual line breaks inside strings is accepted."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
import yaml
from orch_helpers import job_dict

from presto_client.cli import main


def _validate(config: Path | str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(["validate", str(config)], out=io.StringIO())
    return status, capsys.readouterr().err


def _refused(status: int, err: str, *needles: str) -> None:
    assert status == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("presto: error:"), err
    for needle in needles:
        assert needle in lines[0], err


def _config(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_dict(tmp_path / "run", **changes), sort_keys=False))
    return path


def test_a_latin1_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(_config(tmp_path).read_bytes() + "# café\n".encode("latin-1"))
    _refused(*_validate(path, capsys), str(path), "not UTF-8", "line ")


def test_a_device_is_refused_without_reading_it(capsys: pytest.CaptureFixture[str]) -> None:
    start = time.perf_counter()
    _refused(*_validate("/dev/zero", capsys), "/dev/zero", "not a regular file")
    assert time.perf_counter() - start < 5


def test_a_config_over_the_size_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from presto_client.orchestration import input_files

    monkeypatch.setattr(input_files, "MAX_CONFIG_BYTES", 100)
    path = _config(tmp_path)
    _refused(*_validate(path, capsys), str(path), "limit of 100 bytes")


def test_yaml_nested_500_deep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("name: " + "[" * 500 + "]" * 500 + "\n")
    _refused(*_validate(path, capsys), str(path), "nested deeper than")


def test_a_yaml_alias_bomb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    start = time.perf_counter()
    _refused(*_validate(path, capsys), str(path), "aliases", "limit")
    assert time.perf_counter() - start < 2


def test_a_few_aliases_are_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = _config(tmp_path).read_text()
    text = text.replace("chains_per_prompt: 2", "chains_per_prompt: &two 2")
    text = text.replace("max_concurrency: 8", "max_concurrency: *two")
    path = tmp_path / "aliases.yaml"
    path.write_text(text)
    status, err = _validate(path, capsys)
    assert status == 0, err


def test_duplicate_yaml_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = _config(tmp_path).read_text()
    path = tmp_path / "dup.yaml"
    path.write_text(text + "seed: 8\n")
    line = text.splitlines().index("seed: 7") + 1
    _refused(*_validate(path, capsys), str(path), "duplicate key 'seed'", f"line {line}")


def _prompts_config(tmp_path: Path, content: bytes) -> Path:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(content)
    return _config(
        tmp_path,
        engines=[{"kind": "embedded"}],
        prompts={"token_ids": None, "file": str(prompts), "field": "prompt"},
    )


def test_a_prompt_file_with_non_utf8_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _prompts_config(tmp_path, b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    _refused(*_validate(config, capsys), "prompts.jsonl", "line 2", "not UTF-8")


@pytest.mark.parametrize("sep", ["\u2028", "\u0085", "\u2029"])
def test_jsonl_with_unicode_line_breaks_inside_strings(
    sep: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"prompt": f"one{sep}two"}, {"prompt": "three"}]
    content = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
    config = _prompts_config(tmp_path, content)
    status, err = _validate(config, capsys)
    assert status == 0, err
