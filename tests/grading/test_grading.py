"""Graders on hand-written cases (issue 11)."""

from __future__ import annotations

import sys
import types

import pytest
from pydantic import ValidationError

from presto_client.orchestration import grading
from presto_client.orchestration.grading import (
    Grade,
    GraderConfig,
    build_grader,
    extract_choice,
    extract_math_answer,
    grade_choice,
    grade_exact,
    grade_math,
    last_boxed,
    math_equal_fallback,
)


def test_last_boxed_nested_braces() -> None:
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert last_boxed(r"\fbox{x^{2}}") == "x^{2}"
    assert last_boxed("no box") is None
    assert last_boxed(r"\boxed{unclosed") is None


def test_an_empty_trailing_box_does_not_override_the_answer() -> None:
    # (issue 50: "... \\boxed{12}. Final answer: \\boxed{}" graded the empty box)
    assert last_boxed(r"so \boxed{12}. Final answer: \boxed{ }") == "12"
    assert last_boxed(r"\boxed{}") is None
    assert grade_math(r"so \boxed{12}. Answer: \boxed{}", "12").correct


def test_extract_math_answer_prefers_boxed_then_last_number() -> None:
    assert extract_math_answer(r"so 3 apples... \boxed{7} and 9") == "7"
    assert extract_math_answer("She has 3 then 12 apples.") == "12"
    assert extract_math_answer("costs 1,250 dollars") == "1,250"
    assert extract_math_answer("-4.5 degrees") == "-4.5"
    assert extract_math_answer("no numbers") is None


@pytest.mark.parametrize(
    ("completion", "reference", "correct"),
    [
        (r"The answer is \boxed{\frac{1}{2}}.", "0.5", True),
        (r"\boxed{\dfrac{3}{4}}", "0.75", True),
        (r"\boxed{0.5}", r"\frac{1}{2}", True),
        ("So the total is 1,000.", "1000", True),
        (r"\boxed{42}", "42.0", True),
        (r"\boxed{x = 3}", "3", True),
        ("She ends with 12 apples.", "12", True),
        ("She ends with 13 apples.", "12", False),
        ("no answer here", "12", False),
    ],
)
def test_grade_math(completion: str, reference: str, correct: bool) -> None:
    assert grade_math(completion, reference).correct is correct


@pytest.mark.skipif(not grading.HAVE_MATH_VERIFY, reason="math-verify not installed")
def test_math_verify_equates_symbolic_forms() -> None:
    assert grade_math(r"\boxed{2\sqrt{2}}", r"\sqrt{8}").correct
    assert grade_math(r"\boxed{\frac12}", "1/2").correct
    assert not grade_math(r"\boxed{\sqrt{2}}", r"\sqrt{3}").correct


def test_math_fallback_without_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grading, "HAVE_MATH_VERIFY", False)
    assert grade_math(r"\boxed{\frac{1}{2}}", "0.5").correct
    assert grade_math(r"\boxed{\dfrac{3}{4}}", "3/4").correct
    assert grade_math("total 1,000", "1000").correct
    assert not grade_math(r"\boxed{\frac{1}{3}}", "0.3").correct
    assert math_equal_fallback("x = 3", "3")
    assert math_equal_fallback(r"\text{Paris}", "paris")


def test_grade_exact_normalises() -> None:
    assert grade_exact("  Paris. ", "paris").correct
    assert grade_exact("New   York", "new york").correct
    assert not grade_exact("Paris, France", "Paris").correct
    assert grade_exact("Paris", "paris").extracted == "paris"


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("The answer is (C).", "C"),
        ("Answer: B", "B"),
        (r"Therefore \boxed{D}", "D"),
        ("I think (A) is wrong, and the answer is (B)", "B"),
        ("B", "B"),
        ("nothing chosen", None),
        # issue 50: what a reader would not call a choice, and a boxed choice with its text
        ("The answer is a bit tricky", None),
        ("Vitamin D.", None),
        ("Options: (A) iron (B) zinc (C) copper (D) lead", None),
        (r"\boxed{B) 10^-8 eV}", "B"),
        ("Answer: c", "C"),
    ],
)
def test_extract_choice(text: str, letter: str | None) -> None:
    assert extract_choice(text) == letter


def test_grade_choice() -> None:
    assert grade_choice("The answer is (C).", "C").correct
    assert grade_choice("Answer: c", "(C)").correct
    assert not grade_choice("The answer is (A).", "C").correct
    assert grade_choice("nothing", "C") == Grade(False, None)


def test_regex_grader_last_match_first_group() -> None:
    g = build_grader("regex: ANSWER=(\\w+)")
    assert g("ANSWER=foo then ANSWER=Bar", "bar") == Grade(True, "Bar")
    assert g("no match", "bar") == Grade(False, None)


def test_python_grader(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("my_test_grader_mod")
    mod.by_bool = lambda text, ref: text.endswith(ref)  # type: ignore[attr-defined]
    mod.by_pair = lambda text, ref: (text == ref, text)  # type: ignore[attr-defined]
    mod.bad = lambda text, ref: 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "my_test_grader_mod", mod)
    assert build_grader("python: my_test_grader_mod:by_bool")("abc", "bc") == Grade(True, None)
    assert build_grader("python:my_test_grader_mod:by_pair")("x", "x") == Grade(True, "x")
    with pytest.raises(TypeError):
        build_grader("python: my_test_grader_mod:bad")("x", "x")
    with pytest.raises(ValueError, match="not a function"):
        build_grader("python: my_test_grader_mod:missing")
    with pytest.raises(ValueError, match="cannot import"):
        build_grader("python: no_such_module_xyz:f")


def test_grader_config_forms() -> None:
    assert GraderConfig.model_validate("math").kind == "math"
    cfg = GraderConfig.model_validate("python: pkg.mod:fn")
    assert (cfg.kind, cfg.function, cfg.label()) == ("python", "pkg.mod:fn", "python: pkg.mod:fn")
    cfg = GraderConfig.model_validate({"kind": "regex", "pattern": "(\\d+)"})
    assert cfg.pattern == "(\\d+)"
    for bad in ("nope", "regex", "regex: no_group", "python: nocolon", "math: arg"):
        with pytest.raises(ValidationError):
            GraderConfig.model_validate(bad)
    with pytest.raises(ValidationError):
        GraderConfig.model_validate({"kind": "math", "pattern": "(x)"})


@pytest.mark.parametrize(
    ("kind", "text", "reference", "lenient", "strict"),
    [
        # issue 50's false positives: no \boxed{}, the last number happens to be the key
        ("math", "Let me try 3, 5, 7, 9", "9", True, False),
        ("gsm8k", "She buys 3 bags of 4 apples, so she has 12 apples and", "#### 12", True, False),
        ("integer", "Trying n = 1, 2, ..., 33", "33", True, False),
        ("choice", "Options (A) 1 (B) 2 (C) 3 (D) 4, and I pick\nD", "D", True, True),
        ("choice", "I think (B) is right but let me think more about it", "B", True, False),
        # what the reference evaluations read is right in both modes
        ("math", "so the answer is \\boxed{\\frac{1}{2}}", "0.5", True, True),
        ("gsm8k", "12 apples.\n#### 12", "#### 12", True, True),
        ("integer", "\\boxed{033}", "33", True, True),
        ("choice", "\\boxed{B) 10^-8 eV}", "B", True, True),
        ("choice", "After all that,\nThe answer is (C).", "C", True, True),
    ],
)
def test_strict_graders_read_only_what_the_reference_evaluations_read(
    kind: str, text: str, reference: str, lenient: bool, strict: bool
) -> None:
    loose = build_grader(kind)(text, reference)
    tight = build_grader(f"strict {kind}")(text, reference)
    assert loose.correct is lenient and tight.correct is strict
    if lenient and not strict:
        assert loose.fallback and loose.as_dict()["fallback"] is True  # counted as such
    assert not tight.fallback


def test_strict_is_refused_where_it_means_nothing() -> None:
    with pytest.raises(ValueError, match="no strict mode"):
        GraderConfig.model_validate({"kind": "exact", "strict": True})
    assert GraderConfig.model_validate("strict math").to_spec().label() == "strict math"
