"""Text a server sends (its model id, its error bodies) never reaches the terminal raw: a model
id holding an ESC sequence and a newline cannot clear the screen or forge an output line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from orch_helpers import write_http_job

from presto_client.terminal_text import server_text

emulation = pytest.importorskip("tests.support.emulation")

ROOT = Path(__file__).resolve().parents[2]
EVIL = "m\x1b[2J\nFAKE LINE"


def _config(tmp_path: Path, url: str, **engine: object) -> Path:
    return write_http_job(tmp_path, url, **engine)


def _presto(*args: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "presto_client.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        },
        cwd=ROOT,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _assert_not_forged(output: str) -> None:
    assert "\x1b" not in output
    assert not any(line.startswith("FAKE LINE") for line in output.splitlines()), output
    assert "\\x1b[2J\\nFAKE LINE" in output  # shown, escaped


def test_a_model_id_with_escapes_is_shown_escaped_by_validate_and_run(tmp_path: Path) -> None:
    with emulation.EmulationServer("vllm", vocab_size=32, model_name=EVIL) as server:
        config = _config(tmp_path, server.base_url)
        status, out = _presto("-v", "validate", str(config), "--probe")
        assert status == 0, out
        _assert_not_forged(out)
        status, out = _presto("-v", "run", str(config))
        assert status == 0, out
        _assert_not_forged(out)


def test_a_model_id_with_escapes_in_the_wrong_model_error(tmp_path: Path) -> None:
    with emulation.EmulationServer("vllm", vocab_size=32, model_name=EVIL) as server:
        status, out = _presto(
            "validate", str(_config(tmp_path, server.base_url, model="x")), "--probe"
        )
        assert status != 0, out
        _assert_not_forged(out)


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain model-1", "plain model-1"),
        ("a\x1b[31mred", "a\\x1b[31mred"),
        ("one\r\ntwo\tthree", "one\\r\\ntwo\\tthree"),
        ("nul\x00del\x7fcsi\x9b", "nul\\x00del\\x7fcsi\\x9b"),
        ("bidi\u202eevil\u2066x\u2069", "bidi\\u202eevil\\u2066x\\u2069"),
        ("sep\u2028para\u2029", "sep\\u2028para\\u2029"),
        ("naïve 模型", "naïve 模型"),
    ],
)
def test_server_text_escapes_control_and_bidi_characters(raw: str, shown: str) -> None:
    assert server_text(raw) == shown


def test_server_text_caps_the_length_after_escaping() -> None:
    assert server_text("x" * 500, limit=20) == "x" * 19 + "…"
    assert server_text("\x1b" * 50, limit=20) == ("\\x1b" * 5)[:19] + "…"
    assert len(server_text("ab" * 10, limit=20)) == 20 and "…" not in server_text("ab" * 10, 20)
    assert server_text(404) == "404"


def test_an_error_body_is_shown_escaped() -> None:
    from presto_client.backends.http_errors import body_message

    body = {"error": {"message": "bad\x1b]0;title\x07\rFAKE LINE\u202e"}}
    shown = body_message(body, "", "application/json", "Bad Request")
    assert shown == "bad\\x1b]0;title\\x07 FAKE LINE\\u202e"
    assert body_message(None, "plain \x1b[2J text", "text/plain", "") == "plain \\x1b[2J text"
