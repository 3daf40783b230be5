"""scripts/llamacpp.sh without building anything: a set-up cache is reused as it is, and the
commands that cannot work say why. Run against a fake cache (``PRESTO_LLAMACPP_HOME`` in a
temporary folder)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "llamacpp.sh"

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("flock") is None, reason="needs bash and flock"
)


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PRESTO_LLAMACPP_HOME": str(home)}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_set_up_cache_is_reused_without_building(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    binary = tmp_path / "bin" / "llama-server-0.3.36"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    result = run(tmp_path, "setup")
    assert result.returncode == 0, result.stderr
    assert "already set up" in result.stderr
    assert not (tmp_path / "downloads").exists()


def test_start_before_setup_and_status_of_nothing_say_so(tmp_path: Path) -> None:
    port = str(free_port())
    start = run(tmp_path, "start", "--port", port)
    assert start.returncode != 0 and "not set up" in start.stderr
    status = run(tmp_path, "status", "--port", port)
    assert status.returncode == 3 and "health=000" in status.stdout
    usage = run(tmp_path, "bogus")
    assert usage.returncode != 0 and "usage" in usage.stderr


def fake_cache(home: Path) -> None:
    """A cache whose "llama-server" prints its command line and exits."""
    (home / "bin").mkdir()
    binary = home / "bin" / "llama-server-0.3.36"
    binary.write_text('#!/bin/sh\necho "ARGS $*"\n')
    binary.chmod(0o755)
    (home / "model").mkdir()
    (home / "model" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")


def test_serve_runs_the_server_with_the_flags_of_start(tmp_path: Path) -> None:
    fake_cache(tmp_path)
    port = str(free_port())
    serve = run(tmp_path, "serve", "--port", port, "--parallel", "3")
    assert serve.returncode == 0, serve.stderr
    (served,) = [line for line in serve.stdout.splitlines() if line.startswith("ARGS ")]
    assert f"--port {port} -np 3 -c 6144 --poll 0" in served and " -t " not in served
    one = run(tmp_path, "serve", "--port", port, "--parallel", "3", "--threads", "1")
    # one distribution per context: flash attention on a bf16 KV cache (docs/backends.md)
    assert "-fa on --cache-type-k bf16 --cache-type-v bf16" in served
    # no host prompt cache: it swaps another prompt's KV into a generation that waits on a
    # pinned busy slot (docs/backends.md; tests/integration/test_llamacpp_real.py checks it)
    assert " --cache-ram 0" in served
    assert one.returncode == 0 and one.stdout.strip().endswith("--cache-ram 0 -t 1"), one.stdout
    start = run(tmp_path, "start", "--port", port, "--parallel", "3", "--timeout", "10")
    # The fake exits at once: start reports it died, with its log (the same command line).
    assert start.returncode != 0 and "server died" in start.stderr
    (started,) = [line for line in start.stderr.splitlines() if line.startswith("ARGS ")]
    assert started == served


def test_serve_before_setup_says_so(tmp_path: Path) -> None:
    serve = run(tmp_path, "serve", "--port", str(free_port()))
    assert serve.returncode != 0 and "not set up" in serve.stderr


FAKE_CMAKE = """#!/bin/sh
# cmake as the build sees it: records its calls; a build that finds FAIL_BUILD set leaves an
# object behind and fails (an interrupted build), otherwise it "links" llama-server.
echo "cmake $*" >> "$CALLS"
case " $* " in
  *" --build "*)
    b=$2
    [ -f "$b/partial.o" ] && echo "found partial.o" >> "$CALLS"
    if [ -n "$FAIL_BUILD" ]; then touch "$b/partial.o"; exit 1; fi
    mkdir -p "$b/bin" && printf '#!/bin/sh\\n' > "$b/bin/llama-server"
    chmod +x "$b/bin/llama-server"
    ;;
  *) mkdir -p "$4" && touch "$4/CMakeCache.txt" ;;
esac
"""


def test_an_interrupted_build_resumes_on_every_core(tmp_path: Path) -> None:
    """Issue 40: the server target alone on every core, and a set-up stopped mid-build (Ctrl-C,
    a timeout) keeps what it compiled: the next one resumes in the same build folder."""
    import tarfile

    home = tmp_path / "home"
    (home / "downloads").mkdir(parents=True)
    (home / "model").mkdir()
    (home / "model" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    source = tmp_path / "src" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
    source.mkdir(parents=True)
    (source / "CMakeLists.txt").write_text("# fake\n")
    with tarfile.open(home / "downloads" / "llama_cpp_python-0.3.36.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "src" / "llama_cpp_python-0.3.36", "llama_cpp_python-0.3.36")
    tools = tmp_path / "tools"
    tools.mkdir()
    fakes = {
        "cmake": FAKE_CMAKE,
        "g++": "#!/bin/sh\n",
        "make": "#!/bin/sh\n",
        "curl": "#!/bin/sh\n",
    }
    for name, text in fakes.items():
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "PRESTO_LLAMACPP_HOME": str(home),
        "PATH": f"{tools}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "PRESTO_LLAMACPP_PYTHON": sys.executable,  # (its pip: the tools check asks for one)
    }

    def setup(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT), "setup"],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )

    failed = setup(FAIL_BUILD="1")
    assert failed.returncode != 0
    work = home / "build-0.3.36"
    assert (work / "b" / "partial.o").is_file()  # what it compiled is kept
    cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    assert f"--target llama-server -j{cores}" in calls.read_text()
    done = setup()
    assert done.returncode == 0, done.stderr
    assert "resuming the interrupted build" in done.stderr
    assert "found partial.o" in calls.read_text()  # built in the same folder
    assert (home / "bin" / "llama-server-0.3.36").is_file() and not work.exists()
