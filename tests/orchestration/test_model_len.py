"""Response length against the server's max_model_len, checked at the probe (issue 10, item 8):
``validate --probe`` and ``run`` both refuse a block_size × num_blocks that cannot fit."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from orch_helpers import write_http_job

from presto_client.cli import main

emulation = pytest.importorskip("tests.support.emulation")


def _config(tmp_path: Path, url: str, block_size: int) -> Path:
    return write_http_job(tmp_path, url, prompt=range(1, 11), block_size=block_size)


def test_too_long_for_the_server_is_caught_at_the_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with emulation.EmulationServer("vllm", vocab_size=32, max_model_len=64) as server:
        config = _config(tmp_path, server.base_url, block_size=30)
        assert main(["validate", str(config), "--probe"], out=io.StringIO()) == 2
        err = capsys.readouterr().err
        assert "max_model_len" in err and "64" in err and "block_size" in err
        assert err.count("[v]") <= 1
        assert main(["run", str(config), "--no-progress"], out=io.StringIO()) == 2
        err = capsys.readouterr().err
        assert "max_model_len" in err and "70" in err  # 10 prompt + 2 x 30 response tokens
        assert not (tmp_path / "run").exists()  # no chain ran: no run directory left
        fits = _config(tmp_path, server.base_url, block_size=16)
        assert main(["validate", str(fits), "--probe"], out=io.StringIO()) == 0
