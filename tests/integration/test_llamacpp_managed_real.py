"""A job on the llama.cpp engine that presto builds and starts itself (``kind: llamacpp``
without base_url): ``presto run`` sets it up (cached here; scripts/test.sh builds it before
the tier), serves llama-server on a loopback port of its own, runs both arms, and the server
is gone when the run returns."""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

import pytest
import yaml

from presto_client.child_servers import lifecycle
from presto_client.cli import main

pytestmark = pytest.mark.llamacpp


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def server_processes(port: int) -> list[int]:
    """Pids of llama-servers on ``port`` (their command lines in /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"llama-server" in a for a in argv[:1]) and str(port).encode() in argv:
            found.append(int(proc.name))
    return found


def test_a_job_on_the_managed_engine_runs_and_stops_its_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = lifecycle.free_port()
    seen: list[bool] = []
    real_healthy = lifecycle.health_ok

    def healthy(url: str, timeout: float = 2.0) -> bool:
        ok = real_healthy(url, timeout)
        if ok:
            seen.append(bool(server_processes(port)))
        return ok

    monkeypatch.setattr(lifecycle, "free_port", lambda: port)
    monkeypatch.setattr(lifecycle, "health_ok", healthy)
    config = {
        "name": "managed-llamacpp",
        "engines": [{"kind": "llamacpp", "parallel": 2}],
        "prompts": {
            "chat_template": True,
            "texts": ["What is 17 times 23?"],
        },
        "sampler": {
            "sampler": "power_mh",
            "alpha": 4.0,
            "block_size": 8,
            "num_blocks": 1,
            "steps_per_block": 3,
            "traversals": ["sequential", "stream"],
        },
        "seed": 0,
        "output_dir": str(tmp_path / "run"),
        "max_active_chains": 1,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    out = io.StringIO()
    assert main(["run", str(path), "--no-progress"], out=out) == 0, out.getvalue()
    # It was our llama-server that answered, on the port presto chose.
    assert seen and all(seen)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    assert len(samples) == 2 and all(s["status"] == "ok" for s in samples)
    tokens = {s["traversal"]: s["token_ids"] for s in samples}
    assert len(tokens["sequential"]) == 8
    # stream replays the sequential chain on the same server, token for token
    assert tokens["stream"] == tokens["sequential"]
    assert not listening(port) and server_processes(port) == []


def test_the_demo_runs_on_the_llamacpp_engine_it_starts(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    out = io.StringIO()
    status = main(
        [
            "run",
            str(root / "configs" / "demo.yaml"),
            "--output",
            str(tmp_path / "demo"),
            "--no-progress",
            "--set",
            'prompts.texts=["What is 2+2?"]',
            "--set",
            "sampler.block_size=8",
            "--set",
            "sampler.steps_per_block=3",
            "--set",
            "sampler.traversals=[sequential, crn, stream]",
        ],
        out=out,
    )
    assert status == 0, out.getvalue()
    assert all(f"llamacpp/{t}" in out.getvalue() for t in ("sequential", "crn", "stream"))
    samples = [json.loads(x) for x in (tmp_path / "demo" / "samples.jsonl").open()]
    assert [s["status"] for s in samples] == ["ok", "ok", "ok"]
    assert all(isinstance(s["text"], str) and s["text"] for s in samples)
    assert samples[0]["prompt_len"] > 5  # the chat template was applied by /tokenize
