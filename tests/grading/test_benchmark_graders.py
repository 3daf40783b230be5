"""The answer normalisation of the ready benchmarks (issue 37): GSM8K's ``#### N`` references,
AIME's integers, GPQA's letters, each on answers written here, right and wrong."""

from __future__ import annotations

import pytest

from presto_client.orchestration.grading import (
    GraderConfig,
    as_integer,
    build_grader,
    extract_choice,
    gsm8k_reference,
)

GSM8K_SOLUTION = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


def test_gsm8k_reference_is_the_number_after_the_hashes() -> None:
    assert gsm8k_reference(GSM8K_SOLUTION) == "72"
    assert gsm8k_reference("so\n#### 1,234") == "1234"
    assert gsm8k_reference("17") == "17"  # a bare answer stays as it is


@pytest.mark.parametrize(
    ("completion", "correct", "extracted"),
    [
        ("48 + 24 = 72, so the answer is \\boxed{72}.", True, "72"),
        ("They sold 72 clips.\n#### 72", True, "72"),
        ("The total is 72.00", True, "72.00"),
        ("so \\boxed{\\$72}", True, "\\$72"),
        ("48 + 24 = 70, \\boxed{70}", False, "70"),
        # the boxed answer wins over a later number
        ("\\boxed{72} (checked with 48 and 24)", True, "72"),
        ("no number at all", False, None),
    ],
)
def test_gsm8k_grader(completion: str, correct: bool, extracted: str | None) -> None:
    grade = build_grader("gsm8k")(completion, GSM8K_SOLUTION)
    assert grade.correct is correct
    assert grade.extracted == extracted


def test_gsm8k_thousands() -> None:
    grade = build_grader("gsm8k")("\\boxed{1,000}", "x\n#### 1000")
    assert grade.correct


@pytest.mark.parametrize(
    ("text", "value"),
    [("033", 33), ("33.0", 33), ("$33$", 33), ("\\boxed{033}", 33), ("1,000", 1000), ("0", 0)],
)
def test_integer_normalisation(text: str, value: int) -> None:
    assert as_integer(text) == value


@pytest.mark.parametrize("text", ["33.5", "\\frac{1}{2}", "x", ""])
def test_not_an_integer(text: str) -> None:
    assert as_integer(text) is None


@pytest.mark.parametrize(
    ("completion", "reference", "correct"),
    [
        ("... so the answer is \\boxed{204}.", "204", True),
        ("\\boxed{033}", "33", True),  # AIME answers are written with leading zeros
        ("\\boxed{33}", "033", True),
        ("the answer is 33.0", "33", True),
        ("\\boxed{34}", "33", False),
        ("\\boxed{33.5}", "33", False),  # not an integer: wrong, never rounded
        ("\\boxed{\\frac{67}{2}}", "33", False),
        ("\\boxed{\\frac{66}{2}}", "33", True),
    ],
)
def test_integer_grader(completion: str, reference: str, correct: bool) -> None:
    assert build_grader("integer")(completion, reference).correct is correct


@pytest.mark.parametrize(
    ("completion", "letter"),
    [
        ("Think... The answer is \\boxed{C}", "C"),
        ("\\boxed{\\text{B}}", "B"),
        ("\\boxed{(D)}", "D"),
        ("Answer: A", "A"),
    ],
)
def test_gpqa_letters(completion: str, letter: str) -> None:
    assert extract_choice(completion) == letter
    grade = build_grader("choice")(completion, letter)
    assert grade.correct
    other = "A" if letter != "A" else "B"
    assert not build_grader("choice")(completion, other).correct


def test_new_graders_are_config_kinds() -> None:
    assert GraderConfig.model_validate("gsm8k").to_spec().kind == "gsm8k"
    assert GraderConfig.model_validate({"kind": "integer"}).label() == "integer"
