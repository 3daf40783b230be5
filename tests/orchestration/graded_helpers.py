"""A user grader for the graded-job tests (imported by name, as `python: graded_helpers:...`)."""

from __future__ import annotations

CALLS: list[str] = []


def first_token(text: str, reference: str) -> tuple[bool, str]:
    """Right when the answer's first token id is the reference (reference engine: ids as text)."""
    CALLS.append(text)
    first = text.split()[0] if text.split() else ""
    return first == reference, first
