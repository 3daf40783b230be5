"""A user grader for the graded-job tests (imported by name, as `python: graded_helpers:...`).

Graders run in a process of their own (``quality.GraderProcess``): the calls are counted in the
file ``$PRESTO_TEST_GRADER_CALLS`` names (the fixture ``grader_calls`` sets it), not in memory.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

CALLS_ENV = "PRESTO_TEST_GRADER_CALLS"


def calls() -> list[str]:
    """The texts graded since the counting file was set (in the order graded)."""
    path = Path(os.environ[CALLS_ENV])
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def first_token(text: str, reference: str) -> tuple[bool, str]:
    """Right when the answer's first token id is the reference (reference engine: ids as text)."""
    if os.environ.get(CALLS_ENV):
        with open(os.environ[CALLS_ENV], "a", encoding="utf-8") as fh:
            fh.write(json.dumps(text) + "\n")
    first = text.split()[0] if text.split() else ""
    return first == reference, first


def sleepy(text: str, reference: str) -> tuple[bool, str]:
    """A grader that hangs on answers whose first token is the reference (the others: wrong)."""
    first = text.split()[0] if text.split() else ""
    if first == reference:
        time.sleep(3600)
    return False, first
