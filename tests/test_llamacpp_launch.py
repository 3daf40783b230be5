"""presto's own llama-server (:mod:`presto_client.child_servers.llamacpp`) against
fake set-up scripts: every way it can fail says why (with the log tail and the fix), the first
set-up's steps reach the progress logger, and every child process group is gone afterwards,
whether the start succeeded, failed, timed out or was interrupted, or presto was killed."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from presto_client.child_servers import lifecycle
from presto_client.child_servers import llamacpp as launch
from presto_client.child_servers.llamacpp import LlamaCppServerError, LlamaServerProcess
from presto_client.child_servers.ports import listening_pid

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

HEALTHY_SERVE = r"""
serve)
    echo $$ > "$PIDS/serve"
    echo "$@" > "$PIDS/serve.args"
    exec PYTHON - "$3" <<'PY'
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
    ;;
"""


def fake_script(tmp_path: Path, setup: str = "exit 0", serve: str | None = None) -> Path:
    """A stand-in for scripts/llamacpp.sh: ``setup`` runs the given shell code, ``serve``
    the given case arm (default: a server whose /health answers 200). Both record their pid
    in ``$PIDS``."""
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    script = tmp_path / "llamacpp.sh"
    script.write_text(
        f'PIDS={pids}\ncase $1 in\nsetup)\n    echo $$ > "$PIDS/setup"\n    {setup}\n    ;;\n'
        f"{serve or HEALTHY_SERVE.replace('PYTHON', sys.executable)}\nesac\n"
    )
    return script


def pid_of(tmp_path: Path, what: str) -> int:
    return int((tmp_path / "pids" / what).read_text())


def gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie is gone too (its parent reaps it): read its state.
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
                return True
        time.sleep(0.05)
    return False


@pytest.fixture(autouse=True)
def own_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The servers' folders in the test's own: a failed start keeps its logs."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))


@pytest.fixture(autouse=True)
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "cache"
    monkeypatch.setenv("PRESTO_LLAMACPP_HOME", str(home))
    return home


@contextlib.contextmanager
def progress_records(
    then: Callable[[logging.LogRecord], None] | None = None,
) -> Iterator[list[logging.LogRecord]]:
    """The progress logger's records while the block runs (each passed to ``then`` too)."""
    records: list[logging.LogRecord] = []

    def emit(record: logging.LogRecord) -> None:
        records.append(record)
        if then is not None:
            then(record)

    handler = logging.Handler()
    handler.emit = emit  # type: ignore[method-assign]
    logger = logging.getLogger("presto_client.progress")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def test_a_missing_script_names_the_alternatives(tmp_path: Path) -> None:
    server = LlamaServerProcess(script=tmp_path / "nowhere" / "llamacpp.sh")
    with pytest.raises(LlamaCppServerError, match="not found") as info:
        server.start()
    assert "pip install -e ." in str(info.value) and "kind: embedded" in str(info.value)
    assert server.pid is None


def test_a_failed_set_up_gives_its_log_and_the_fix(tmp_path: Path) -> None:
    script = fake_script(
        tmp_path,
        setup="echo '[llamacpp] ERROR: missing cmake g++ and no apt-get: install them' >&2; exit 1",
    )
    with pytest.raises(LlamaCppServerError) as info:
        LlamaServerProcess(script=script).start()
    msg = str(info.value)
    assert "failed with status 1" in msg and "missing cmake g++" in msg
    assert "apt-get install -y cmake g++" in msg and "configs/demo_embedded.yaml" in msg
    assert not (tmp_path / "pids" / "serve").exists()


def test_the_first_set_up_says_what_it_does_as_it_goes(tmp_path: Path) -> None:
    script = fake_script(
        tmp_path,
        setup="echo '[llamacpp] building llama-server' >&2; echo '[ 50%] Building CXX object'; "
        "sleep 1; echo '[llamacpp] setup complete in 1.0 s' >&2",
    )
    server = LlamaServerProcess(script=script, note_every_s=0.4)
    with progress_records() as records, server as url:
        assert urllib.request.urlopen(f"{url}/health", timeout=5).status == 200
    said = [r.getMessage() for r in records]
    assert said[0].startswith("first use of llama.cpp: building llama-server")
    assert "llama.cpp set-up: building llama-server" in said
    assert "llama.cpp set-up: setup complete in 1.0 s" in said
    # The build's own output is not shown line by line, only in the periodic note.
    assert not any(s.startswith("llama.cpp set-up: [ 50%]") for s in said)
    assert any("still running" in s and "[ 50%] Building CXX object" in s for s in said)
    assert gone(pid_of(tmp_path, "serve"))


def test_a_cached_set_up_is_not_announced(tmp_path: Path, empty_cache: Path) -> None:
    (empty_cache / "bin").mkdir(parents=True)
    (empty_cache / "bin" / "llama-server-0.3.36").write_text("")
    (empty_cache / "model").mkdir()
    (empty_cache / "model" / launch.MODEL).write_text("")
    assert launch.first_use_note() is None
    script = fake_script(tmp_path, setup="echo '[llamacpp] already set up' >&2")
    with progress_records() as records, LlamaServerProcess(script=script):
        pass
    said = [r.getMessage() for r in records]
    assert said == [said[0]] and said[0].startswith("starting llama.cpp's llama-server")


def test_a_server_that_dies_gives_its_log_tail(tmp_path: Path) -> None:
    script = fake_script(
        tmp_path, serve="serve) echo 'error: failed to load model x.gguf' >&2; exit 7 ;;"
    )
    server = LlamaServerProcess(script=script)
    with pytest.raises(LlamaCppServerError, match="exited with status 7") as info:
        server.start()
    assert "failed to load model x.gguf" in str(info.value)
    assert server.pid is None and server.base_url is None


def test_a_server_that_never_answers_is_stopped_at_the_timeout(tmp_path: Path) -> None:
    script = fake_script(
        tmp_path,
        serve="serve) echo $$ > \"$PIDS/serve\"; echo 'loading model'; exec sleep 60 ;;",
    )
    server = LlamaServerProcess(script=script, startup_timeout_s=1.0)
    with pytest.raises(LlamaCppServerError, match="within 1 s") as info:
        server.start()
    assert "loading model" in str(info.value)
    assert gone(pid_of(tmp_path, "serve"))


def test_a_set_up_past_its_timeout_is_stopped(tmp_path: Path) -> None:
    script = fake_script(tmp_path, setup="exec sleep 60")
    with pytest.raises(LlamaCppServerError, match="setup_timeout_s"):
        LlamaServerProcess(script=script, setup_timeout_s=0.5).start()
    assert gone(pid_of(tmp_path, "setup"))


def test_an_interrupted_set_up_is_stopped(tmp_path: Path) -> None:
    script = fake_script(tmp_path, setup="echo '[llamacpp] building' >&2; exec sleep 20")

    def interrupt(record: logging.LogRecord) -> None:
        if "still running" in record.getMessage():
            raise KeyboardInterrupt

    with progress_records(interrupt), pytest.raises(KeyboardInterrupt):
        LlamaServerProcess(script=script, note_every_s=0.3).start()
    assert gone(pid_of(tmp_path, "setup"))


def test_stop_ends_the_server_and_is_idempotent(tmp_path: Path) -> None:
    server = LlamaServerProcess(script=fake_script(tmp_path), parallel=3, threads=1)
    url = server.start()
    port = url.rsplit(":", 1)[1]
    args = (tmp_path / "pids" / "serve.args").read_text().split()
    assert args == ["serve", "--port", port, "--parallel", "3", "--threads", "1"]
    assert url.startswith("http://127.0.0.1:") and server.base_url == url
    pid = pid_of(tmp_path, "serve")
    assert server.pid == pid  # the script execs the server: the group leader is it
    server.stop()
    server.stop()
    assert gone(pid) and server.pid is None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/health", timeout=2)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_server_dies_with_a_killed_presto(tmp_path: Path) -> None:
    script = fake_script(tmp_path)
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from presto_client.child_servers.llamacpp import LlamaServerProcess\n"
        f"LlamaServerProcess(script=Path({str(script)!r})).start()\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # (a killed presto removes nothing)
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "up"
        server = pid_of(tmp_path, "serve")
        assert not gone(server, within_s=0.2)
        parent.kill()  # SIGKILL: no finally, no atexit
        parent.wait()
        assert gone(server)
    finally:
        parent.kill()
        parent.wait()


def test_a_busy_port_is_refused_naming_its_owner(tmp_path: Path) -> None:
    """A managed server must be the process presto started: a port where another server
    already answers is refused, never used as if it were ours (issue 38 item 2)."""
    (tmp_path / "other").mkdir()
    other = LlamaServerProcess(script=fake_script(tmp_path / "other"))
    url = other.start()
    try:
        port = int(url.rsplit(":", 1)[1])
        mine = LlamaServerProcess(script=fake_script(tmp_path), port=port)
        with pytest.raises(LlamaCppServerError, match=rf"port {port} is in use") as info:
            mine.start()
        if sys.platform.startswith("linux"):
            assert f"by pid {other.pid}" in str(info.value)
        assert not (tmp_path / "pids" / "serve").exists()  # ours never started
    finally:
        other.stop()


def test_what_answers_must_be_the_started_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle, "listening_pid", lambda port: 1)
    server = LlamaServerProcess(script=fake_script(tmp_path))
    with pytest.raises(LlamaCppServerError, match="answered by pid 1, not by the llama-server"):
        server.start()
    assert gone(pid_of(tmp_path, "serve"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_server_that_dies_mid_run_is_said_and_restarted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = LlamaServerProcess(script=fake_script(tmp_path), watch_every_s=0.1)
    url = server.start()
    try:
        first = server.pid
        assert first is not None and listening_pid(int(url.rsplit(":", 1)[1])) == first
        with caplog.at_level(logging.ERROR, logger=lifecycle.__name__):
            os.kill(first, signal.SIGKILL)
            deadline = time.monotonic() + 20
            while (server.pid == first or server.pid is None) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.pid not in (None, first) and server.restarts == 1
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(f"{url}/health", timeout=2)
                    break
                time.sleep(0.1)
            else:
                raise AssertionError("the restarted server never answered")
        said = " ".join(r.getMessage() for r in caplog.records)
        assert f"pid {first}" in said and "exited with status -9" in said and "restarting" in said
        assert server.failure is None
    finally:
        server.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_server_that_keeps_dying_is_given_up_with_its_cause(tmp_path: Path) -> None:
    server = LlamaServerProcess(script=fake_script(tmp_path), watch_every_s=0.1, max_restarts=0)
    server.start()
    try:
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while server.failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.failure is not None and "exited with status -9" in server.failure
    finally:
        server.stop()
