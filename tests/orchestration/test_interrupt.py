"""Ctrl-C and SIGTERM on a real ``presto run`` process: a prompt, clean stop, files intact, and a
resume; with the reference engine, and with ``stream`` chains over HTTP whose proposals are in
flight on a server whose streams never end or that went down.

Nothing here assumes how fast the machine is: every signal is sent once the job is seen (on disk,
or in its log) in the state under test, the first session's work is far longer than any pause of
a loaded machine, and the bounds on the stop are generous (a stop that waits for requests to run
out takes tens of seconds, or forever)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

emulation = pytest.importorskip("tests.support.emulation")

STOP_WITHIN_S = 15.0
"""From the signal to the process's exit, start-up of nothing included: a prompt stop takes about
a second; one that waits for an in-flight request takes the request's retries (tens of seconds)."""

# A shell starts a background job with SIGINT ignored (POSIX), and Python keeps an ignored SIGINT
# ignored, so under `pytest ... &` the job would never see the test's Ctrl-C. The child gets
# Ctrl-C's default handler back, as when started from a terminal.
PRESTO = [
    sys.executable,
    "-c",
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from presto_client.cli import main; sys.exit(main())",
]


class Presto:
    """A ``presto run`` process; its stderr read as it comes (a test waits for a log line)."""

    def __init__(self, config: Path, *extra: str) -> None:
        self.cmd = [*PRESTO, "run", str(config), "--no-progress", *extra]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for(self, condition: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.proc.poll() is not None:
                self._reader.join(timeout=10)
                raise AssertionError(
                    f"the job ended (rc {self.proc.returncode}) before {what}:\n{self.stderr}"
                )
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"timed out waiting for {what}:\n{self.stderr}")
            time.sleep(0.02)

    def stop(self, sig: signal.Signals) -> float:
        """Send ``sig``; the seconds until the process exited (killed past the bound)."""
        start = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"no exit within {STOP_WITHIN_S} s of {sig.name}:\n{self.stderr}"
            ) from None
        self._reader.join(timeout=10)
        return time.monotonic() - start

    def rerun(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.cmd, *extra], capture_output=True, text=True, env=self.env, timeout=180
        )


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def _check_stopped(run_dir: Path, err: str, what: str) -> list[dict[str, Any]]:
    assert what in err and "rerun the same command to resume" in err, err
    assert "Traceback" not in err, err
    sessions = json.loads((run_dir / "run.json").read_text())["sessions"]
    assert sessions[-1]["finished"] is not None and sessions[-1]["completed"] is False
    done = _lines(run_dir / "samples.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["chains_ok"] == len([s for s in done if s["status"] == "ok"])
    return done


def _check_resumed(rerun: subprocess.CompletedProcess[str], run_dir: Path, total: int) -> None:
    assert rerun.returncode == 0, rerun.stderr
    assert "already finished" in rerun.stdout, rerun.stdout
    ok = [s["chain_id"] for s in _lines(run_dir / "samples.jsonl") if s["status"] == "ok"]
    assert len(ok) == len(set(ok)) == total


# ---- the reference engine


def _reference_job(write_config: Callable[..., Path]) -> Path:
    """16 chains, 2 at a time, each call 0.3 s: some 17 s of work, done in well under a second
    by the rerun (the latency is no part of what a chain computes)."""
    return write_config(
        engines=[{"kind": "reference", "name": "ref", "vocab_size": 6, "latency_s": 0.3}],
        max_active_chains=2,
    )


@pytest.mark.parametrize(
    ("sig", "rc", "what"),
    [
        (signal.SIGINT, 130, "interrupted"),
        (signal.SIGTERM, 143, "terminated (SIGTERM)"),
    ],
)
def test_a_signal_stops_cleanly_and_rerun_resumes(
    write_config: Callable[..., Path], tmp_path: Path, sig: signal.Signals, rc: int, what: str
) -> None:
    run_dir = tmp_path / "run"
    job = Presto(_reference_job(write_config))
    job.wait_for(lambda: len(_lines(run_dir / "samples.jsonl")) >= 2, "two chains on disk")
    job.stop(sig)
    assert job.proc.returncode == rc, job.stderr
    done = _check_stopped(run_dir, job.stderr, what)
    assert 2 <= len(done) < 16
    _check_resumed(job.rerun("--set", "engines[0].latency_s=0"), run_dir, 16)


# ---- stream chains over HTTP, proposals in flight


@pytest.fixture
def server() -> Iterator[Any]:
    with emulation.EmulationServer("vllm", vocab_size=32, block_size=4) as s:
        s.faults.delay_s = 0.01  # (between streamed tokens): a chain takes a while
        yield s


def _stream_job(write_config: Callable[..., Path], base_url: str) -> Path:
    return write_config(
        engines=[
            {
                "kind": "vllm",
                "name": "vllm",
                "base_url": base_url,
                "max_concurrency": 8,
                "restart_window_s": 20,
            }
        ],
        sampler={"traversals": ["stream"], "window": 4},
        chains_per_prompt=4,
        max_active_chains=2,
    )


def test_ctrl_c_stops_stream_chains_whose_streams_never_end(
    write_config: Callable[..., Path], tmp_path: Path, server: Any
) -> None:
    run_dir = tmp_path / "run"
    job = Presto(_stream_job(write_config, server.base_url))
    job.wait_for(lambda: len(_lines(run_dir / "samples.jsonl")) >= 1, "a chain on disk")
    server.faults.stall_streams = True  # from now on every stream sends only keepalives
    # Counted on the server: how many proposals a chain sends besides its head depends on the
    # engine's measured cost, and a loaded machine may let a chain send its next one early.
    job.wait_for(lambda: server.stats.stalled_streams >= 2, "proposals on the stalled server")
    elapsed = job.stop(signal.SIGINT)
    assert job.proc.returncode == 130, job.stderr
    done = _check_stopped(run_dir, job.stderr, "interrupted")
    assert 1 <= len(done) < 16
    assert elapsed < STOP_WITHIN_S

    server.faults.stall_streams = False
    _check_resumed(job.rerun(), run_dir, 16)


def test_sigterm_stops_stream_chains_on_a_server_gone_down(
    write_config: Callable[..., Path], tmp_path: Path, server: Any
) -> None:
    """The server stops under running chains: their requests are retried for
    ``restart_window_s`` (20 s, per retry of a stream) and the last ``/metrics`` read finds no
    server; neither holds SIGTERM's stop."""
    run_dir = tmp_path / "run"
    job = Presto(_stream_job(write_config, server.base_url))
    job.wait_for(lambda: len(_lines(run_dir / "samples.jsonl")) >= 1, "a chain on disk")
    server.stop()
    job.wait_for(lambda: "restart_window_s" in job.stderr, "a request retried on no server")
    elapsed = job.stop(signal.SIGTERM)
    assert job.proc.returncode == 143, job.stderr
    done = _check_stopped(run_dir, job.stderr, "terminated (SIGTERM)")
    assert 1 <= len(done) < 16
    assert elapsed < STOP_WITHIN_S

    with emulation.EmulationServer("vllm", vocab_size=32, block_size=4) as again:
        _check_resumed(job.rerun("--set", f"engines[0].base_url={again.base_url}"), run_dir, 16)
