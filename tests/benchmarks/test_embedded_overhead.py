"""The overhead benchmark's CPU accounting of another process (no model needed)."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.embedded_overhead import _child_cpu_s


def test_child_cpu_counts_a_busy_child_and_not_an_idle_one() -> None:
    busy = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.5: pass\ntime.sleep(30)",
        ]
    )
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while _child_cpu_s(busy.pid) < 0.5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _child_cpu_s(busy.pid) >= 0.5
        # The interpreter's start-up only: far below the busy child's spin.
        assert _child_cpu_s(idle.pid) < _child_cpu_s(busy.pid)
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()


def test_child_cpu_of_no_process_is_zero() -> None:
    assert _child_cpu_s(None) == 0.0
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert _child_cpu_s(gone.pid) == 0.0
