"""One responsibility per module, checked where it can be: no module of the packages (the
embedded engine aside, a server with its own batching) grows past 600 lines."""

from __future__ import annotations

from tests.support.layout import ROOT, source_files

MAX_LINES = 600


def test_no_module_outside_embedded_is_over_600_lines() -> None:
    long = []
    for path in source_files():
        if "embedded" in path.relative_to(ROOT).parts:
            continue
        lines = path.read_text(encoding="utf-8").count("\n")
        if lines > MAX_LINES:
            long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not long, "split by concept:\n" + "\n".join(long)
