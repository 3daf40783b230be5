"""Graders: is a finished chain's answer right?

A grader is a pure function ``(completion text, reference answer) -> Grade``. The built-in ones:

- ``math``: the final answer is the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``),
  else the last number in the text; equivalence by the ``math-verify`` package when it is
  installed (``\\frac{1}{2}`` equals ``0.5``, ``2\\sqrt{2}`` equals ``\\sqrt{8}``), otherwise a
  normalised comparison (numbers as exact fractions, else normalised strings; see
  :func:`math_equal_fallback`).
- ``exact``: the whole completion, normalised (case, surrounding whitespace and punctuation,
  inner whitespace runs), equals the normalised reference.
- ``regex``: the first group of the last match of ``pattern`` is the answer, compared as ``exact``.
- ``choice``: a multiple-choice letter A-D (GPQA style): the last "answer is (X)" / "Answer: X"
  / ``\\boxed{X}`` (also ``\\boxed{\\text{X}}``) / lone letter; compared with the reference
  letter.
- ``gsm8k``: GSM8K's answers: the reference is the number after its ``#### `` line (the whole
  worked solution may be given); the completion's answer is its last ``\\boxed{...}``, else its
  last ``#### N``, else its last number; compared as numbers (``1,000`` equals ``1000.00``).
- ``integer``: an integer answer (AIME: 0-999): the last ``\\boxed{...}``, else the last
  number, read as an integer (``033``, ``33.0``, ``$33$`` and ``\\boxed{033}`` are 33; a number
  that is no integer is wrong); compared with the reference as an integer.
- ``python``: ``module:function``, the user's own; it gets ``(text, reference)`` and returns a
  :class:`Grade`, a bool, or a ``(correct, extracted)`` pair.

:class:`GraderConfig` is the job config's ``grader`` field (a string shorthand, ``"math"``,
``"python: mymod:grade"``, or the mapping form).
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from presto_client.orchestration.planned import GraderSpec

log = logging.getLogger(__name__)

GraderKind = Literal["math", "exact", "regex", "choice", "gsm8k", "integer", "python"]


@dataclass(frozen=True, slots=True)
class Grade:
    """One graded answer: whether it is right and what was extracted (None: nothing found)."""

    correct: bool
    extracted: str | None
    fallback: bool = False
    """The answer was found by a lenient fallback (the last number of a text without a
    ``\\boxed{}``), not where the reference evaluation reads it: counted in the summary."""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"correct": self.correct, "extracted": self.extracted}
        if self.fallback:
            out["fallback"] = True
        return out


GraderFn = Callable[[str, str], Grade]


# ---------------------------------------------------------------------------------------------
# Extraction helpers
# ---------------------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last non-empty ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces), or
    None (an empty trailing ``\\boxed{}``, a template echoed, is not an answer)."""
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    for start in reversed(starts):
        depth = 1
        i = start
        while i < len(text):
            ch = text[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    content = text[start:i].strip()
                    if content:
                        return content
                    break
            i += 1
    return None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (thousands separators and a simple ``a/b`` kept), or None."""
    matches = _NUMBER_RE.findall(text)
    if not matches:
        return None
    return re.sub(r"\s+", "", matches[-1])


def extract_math_answer(text: str) -> str | None:
    """The final answer of a math completion: the last boxed content, else the last number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    return last_number(text)


def normalize_text(s: str) -> str:
    """Lower case, inner whitespace runs collapsed, surrounding whitespace/punctuation/$ dropped."""
    s = re.sub(r"\s+", " ", s.strip().lower())
    return s.strip(" .,;:!?\"'`$")


_LATEX_STRIP = (
    (re.compile(r"\\(?:left|right|displaystyle|,|;|!|\s)"), ""),
    (re.compile(r"\\text\{([^}]*)\}"), r"\1"),
    (re.compile(r"\\[dt]frac"), r"\\frac"),
    (re.compile(r"\\frac\{([^{}]+)\}\{([^{}]+)\}"), r"(\1)/(\2)"),
    (re.compile(r"\\frac(\d)(\d)"), r"\1/\2"),
)


def _as_fraction(s: str) -> Fraction | None:
    t = s.replace(",", "").replace(" ", "")
    t = re.sub(r"^\((-?[\d.]+)\)/\((-?[\d.]+)\)$", r"\1/\2", t)
    try:
        if "/" in t:
            num, den = t.split("/", 1)
            return Fraction(num) / Fraction(den)
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def math_equal_fallback(pred: str, ref: str) -> bool:
    """Equivalence without math-verify: exact rational comparison of numbers (``\\frac{1}{2}``,
    ``1/2``, ``0.5`` and ``1,000``/``1000`` are handled), else normalised string equality."""

    def clean(s: str) -> str:
        s = s.strip().strip("$").strip()
        for pat, rep in _LATEX_STRIP:
            s = pat.sub(rep, s)
        s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # "x = 3" -> "3"
        return s.strip()

    p, r = clean(pred), clean(ref)
    fp, fr = _as_fraction(p), _as_fraction(r)
    if fp is not None and fr is not None:
        return fp == fr
    return normalize_text(p).replace(" ", "") == normalize_text(r).replace(" ", "")


def _have_math_verify() -> bool:
    try:
        importlib.import_module("math_verify")
    except ImportError:
        return False
    return True


HAVE_MATH_VERIFY = _have_math_verify()


def math_equal(pred: str, ref: str) -> bool:
    """``pred`` and ``ref`` denote the same mathematical answer (math-verify when installed)."""
    if not HAVE_MATH_VERIFY:
        return math_equal_fallback(pred, ref)
    from math_verify import parse, verify  # type: ignore[import-untyped]

    # math-verify's timeouts use signal.alarm, which only works in the main thread.
    timeout: int | None = 5 if threading.current_thread() is threading.main_thread() else None

    def _parse(s: str) -> list[Any]:
        s = s.strip()
        wrapped = s if s.startswith("$") or "\\boxed" in s else f"${s}$"
        out: list[Any] = parse(wrapped, parsing_timeout=timeout)  # type: ignore[arg-type]
        if not out:
            out = parse(s, parsing_timeout=timeout)  # type: ignore[arg-type]
        return out

    try:
        gold, target = _parse(ref), _parse(pred)
        if gold and target and verify(gold, target, timeout_seconds=timeout):
            return True
    except Exception:  # math-verify raises on exotic input; a failed parse is not a grade
        log.debug("math-verify failed on %r vs %r", pred, ref, exc_info=True)
    return math_equal_fallback(pred, ref)


_CHOICE_PATTERNS = (
    # \boxed{B}, \boxed{(B)}, \boxed{\text{B}}, \boxed{B) 10^-8 eV}: the letter, then no letter
    re.compile(r"\\boxed\{\s*(?:\\text(?:bf)?\{\s*)?\(?([A-Da-d])(?![A-Za-z0-9])"),
    # "the answer is (c)", "Answer: B", "answer is **C**", "answer: c" (a bare lower-case letter
    # only where the answer ends: "the answer is a bit tricky" chose nothing)
    re.compile(
        r"(?i:answer\s*(?:is|:)?)\s*:?\s*"
        r"(?:\(\s*([A-Da-d])\s*\)|\*{0,2}([A-D])\*{0,2}(?![A-Za-z0-9])|([a-d])(?=\s*(?:$|[.,;!]\s*$|\n)))"
    ),
    re.compile(r"\(([A-D])\)"),
    # a line that is the letter alone ("B", "(B)", "B."), not a sentence ending in one
    re.compile(r"^\s*\(?([A-D])[.)]?\s*$", re.MULTILINE),
)
_LIST_LETTERS = 3
"""A completion naming this many different options in parentheses restates the list: those
are not a choice."""


def extract_choice(text: str) -> str | None:
    """The chosen letter A-D of a multiple-choice answer, upper case, or None."""
    for pat in _CHOICE_PATTERNS:
        found = [m if isinstance(m, str) else next(g for g in m if g) for m in pat.findall(text)]
        if pat is _CHOICE_PATTERNS[2] and len({f.upper() for f in found}) >= _LIST_LETTERS:
            continue
        if found:
            return str(found[-1]).upper()
    return None


# ---------------------------------------------------------------------------------------------
# Graders
# ---------------------------------------------------------------------------------------------


def grade_math(text: str, reference: str, *, strict: bool = False) -> Grade:
    boxed = last_boxed(text)
    extracted = boxed if boxed is not None or strict else last_number(text)
    if extracted is None:
        return Grade(False, None)
    ref = last_boxed(reference) or reference
    return Grade(math_equal(extracted, ref), extracted, fallback=boxed is None)


def grade_exact(text: str, reference: str) -> Grade:
    extracted = normalize_text(text)
    return Grade(extracted == normalize_text(reference), extracted)


def extract_choice_strict(text: str) -> str | None:
    """The letter where GPQA's evaluations read it: the last ``\\boxed{X}``, else an "answer is
    X" / "Answer: X" or a lone letter on the completion's last non-empty line; or None."""
    boxed = _CHOICE_PATTERNS[0].findall(text)
    if boxed:
        return str(boxed[-1]).upper()
    lines = [line for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    for pat in (_CHOICE_PATTERNS[1], _CHOICE_PATTERNS[3]):
        found = [m if isinstance(m, str) else next(g for g in m if g) for m in pat.findall(last)]
        if found:
            return str(found[-1]).upper()
    return None


def grade_choice(text: str, reference: str, *, strict: bool = False) -> Grade:
    extracted = extract_choice_strict(text)
    fallback = False
    if extracted is None and not strict:
        extracted = extract_choice(text)
        fallback = extracted is not None
    ref = extract_choice(reference) or reference.strip().upper()
    return Grade(extracted is not None and extracted == ref, extracted, fallback=fallback)


_GSM8K_RE = re.compile(r"####\s*([^\n]*)")


def gsm8k_reference(reference: str) -> str:
    """The answer of a GSM8K reference: what follows its last ``####`` (the whole solution may
    be given), without thousands separators or a dollar sign; the text itself otherwise."""
    found = _GSM8K_RE.findall(reference)
    answer = found[-1] if found else reference
    return answer.strip().replace(",", "").replace("$", "").strip()


def extract_gsm8k_answer(text: str, *, strict: bool = False) -> str | None:
    """A GSM8K completion's answer: its last ``\\boxed{...}``, else its last ``#### N``, else
    (not ``strict``) its last number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    found = _GSM8K_RE.findall(text)
    if found and last_number(found[-1]) is not None:
        return last_number(found[-1])
    return None if strict else last_number(text)


def _number(text: str) -> Fraction | None:
    """``text`` as an exact number (``$``, ``\\text{}``, units words and separators dropped:
    ``\\$1,000.50``, ``18 dollars``, ``x = 3``), or None."""
    t = text.strip().replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    t = re.sub(r"\\text\{[^}]*\}", "", t)
    t = re.sub(r"^[a-zA-Z]\s*=\s*", "", t.strip())
    t = t.replace("\\!", "").replace("{,}", ",")
    for pat, rep in _LATEX_STRIP:  # \frac{1}{2} -> (1)/(2)
        t = pat.sub(rep, t)
    num = t if _as_fraction(t) is not None else last_number(t)
    if num is None:
        return None
    return _as_fraction(num)


def grade_gsm8k(text: str, reference: str, *, strict: bool = False) -> Grade:
    extracted = extract_gsm8k_answer(text, strict=strict)
    if extracted is None:
        return Grade(False, None)
    fallback = extract_gsm8k_answer(text, strict=True) is None
    ref = gsm8k_reference(reference)
    a, b = _number(extracted), _number(ref)
    if a is not None and b is not None:
        return Grade(a == b, extracted, fallback=fallback)
    return Grade(normalize_text(extracted) == normalize_text(ref), extracted, fallback=fallback)


def as_integer(text: str) -> int | None:
    """``text`` as an integer answer (``033``, ``33.0``, ``$33$``, ``\\boxed{33}``, ``1,000``), or
    None when it is no integer."""
    inner = last_boxed(text)
    value = _number(inner if inner is not None else text)
    if value is None or value.denominator != 1:
        return None
    return int(value)


def grade_integer(text: str, reference: str, *, strict: bool = False) -> Grade:
    boxed = last_boxed(text)
    extracted = boxed if boxed is not None or strict else last_number(text)
    if extracted is None:
        return Grade(False, None)
    got, want = as_integer(extracted), as_integer(reference)
    if got is None:
        return Grade(False, extracted, fallback=boxed is None)
    return Grade(want is not None and got == want, str(got), fallback=boxed is None)


def make_regex_grader(pattern: str) -> GraderFn:
    """A grader taking the first group of the last match of ``pattern`` (compared as exact)."""
    rx = re.compile(pattern)
    if rx.groups < 1:
        raise ValueError(f"grader regex {pattern!r} needs one capturing group")

    def grade_regex(text: str, reference: str) -> Grade:
        matches = list(rx.finditer(text))
        if not matches:
            return Grade(False, None)
        extracted = matches[-1].group(1)
        if extracted is None:
            return Grade(False, None)
        return Grade(normalize_text(extracted) == normalize_text(reference), extracted.strip())

    return grade_regex


def _coerce(result: object) -> Grade:
    if isinstance(result, Grade):
        return result
    if isinstance(result, bool):
        return Grade(result, None)
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], bool):
        extracted = result[1]
        return Grade(result[0], None if extracted is None else str(extracted))
    raise TypeError(
        f"a python grader must return a Grade, a bool or a (correct, extracted) pair, "
        f"got {type(result).__name__}"
    )


def load_python_grader(target: str) -> GraderFn:
    """``module:function`` -> a grader (the function's result coerced to a :class:`Grade`)."""
    mod_name, sep, fn_name = target.strip().partition(":")
    if not sep or not mod_name or not fn_name:
        raise ValueError(f"python grader {target!r}: expected 'module:function'")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ValueError(f"python grader {target!r}: cannot import {mod_name!r}: {exc}") from exc
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ValueError(f"python grader {target!r}: {fn_name!r} is not a function of {mod_name}")

    def grade_python(text: str, reference: str) -> Grade:
        return _coerce(fn(text, reference))

    return grade_python


STRICT_KINDS = ("math", "gsm8k", "integer", "choice")
GRADERS: dict[str, GraderFn] = {
    "math": grade_math,
    "exact": grade_exact,
    "choice": grade_choice,
    "gsm8k": grade_gsm8k,
    "integer": grade_integer,
}


class GraderConfig(BaseModel):
    """The job config's ``grader``: ``"math"``, ``"exact"``, ``"choice"``,
    ``"regex: PATTERN"``, ``"python: module:function"``, or ``{kind: ..., pattern/function: ...}``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: GraderKind
    pattern: str | None = Field(default=None, description="regex: one capturing group")
    function: str | None = Field(default=None, description="python: 'module:function'")
    strict: bool = Field(
        default=False,
        description="math, gsm8k, integer, choice: only the answer where the reference "
        "evaluations read it (the last \\boxed{}; GSM8K's #### too; GPQA's boxed or last-line "
        "letter), no last-number fallback (shorthand: 'strict math')",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: object) -> object:
        if isinstance(value, str):
            kind, sep, arg = value.partition(":")
            kind = kind.strip()
            if not sep and kind.startswith("strict "):
                return {"kind": kind.removeprefix("strict ").strip(), "strict": True}
            if kind == "python":
                return {"kind": "python", "function": arg.strip()} if sep else {"kind": kind}
            if kind == "regex":
                return {"kind": "regex", "pattern": arg.strip()} if sep else {"kind": kind}
            if sep:
                raise ValueError(f"grader {value!r}: only 'regex:' and 'python:' take an argument")
            return {"kind": kind}
        return value

    @model_validator(mode="after")
    def _args(self) -> GraderConfig:
        if self.kind == "regex":
            if not self.pattern:
                raise ValueError("grader 'regex' needs a pattern (grader: 'regex: answer=(\\d+)')")
            try:
                groups = re.compile(self.pattern).groups
            except re.error as exc:
                raise ValueError(f"grader regex {self.pattern!r} does not compile: {exc}") from exc
            if groups < 1:
                raise ValueError(f"grader regex {self.pattern!r} needs one capturing group")
        elif self.pattern is not None:
            raise ValueError(f"grader {self.kind!r} takes no pattern")
        if self.kind == "python":
            if not self.function or ":" not in self.function:
                raise ValueError(
                    "grader 'python' needs 'module:function' (grader: 'python: mymod:grade')"
                )
        elif self.function is not None:
            raise ValueError(f"grader {self.kind!r} takes no function")
        if self.strict and self.kind not in STRICT_KINDS:
            raise ValueError(f"grader {self.kind!r} has no strict mode ({', '.join(STRICT_KINDS)})")
        return self

    def label(self) -> str:
        return self.to_spec().label()

    def to_spec(self) -> GraderSpec:
        """The grader as the plan holds it (plain)."""
        return GraderSpec(str(self.kind), self.pattern, self.function, self.strict)


def build_grader(config: GraderConfig | GraderSpec | str) -> GraderFn:
    """The grading function a config names (imports a python grader)."""
    cfg: GraderConfig | GraderSpec = (
        config
        if isinstance(config, GraderConfig | GraderSpec)
        else GraderConfig.model_validate(config)
    )
    if cfg.kind == "regex":
        assert cfg.pattern is not None
        return make_regex_grader(cfg.pattern)
    if cfg.kind == "python":
        assert cfg.function is not None
        return load_python_grader(cfg.function)
    fn = GRADERS[typing.cast(GraderKind, cfg.kind)]
    if getattr(cfg, "strict", False):
        return functools.partial(fn, strict=True)  # type: ignore[call-arg]
    return fn


def grade(config: GraderConfig | str, text: str, reference: str) -> Grade:
    """Grade one answer (builds the grader each call: use :func:`build_grader` in loops)."""
    return build_grader(config)(text, reference)
