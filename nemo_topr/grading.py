"""Graders for the paper's two benchmarks: a completion's final answer against the reference.

Every grader returns one of four labels:

    correct   an answer was found and it equals the reference
    wrong     an answer was found and it differs
    invalid   no parseable answer (no number for GSM8K, no non-empty \\boxed{} for MATH)
    error     the grader itself failed (math-verify raised or timed out): no verdict at all

`is_correct_*` is `grade_* == "correct"`; graders never raise on a completion, only on a
reference that has no answer (a data bug). An "error" is not a wrong answer: it has no reward
(`reward_of` refuses it), and the commands that grade count these, drop them, and fail above
`--max-grader-error-rate` (:func:`check_grader_errors`).

GSM8K: the final answer is the number after the last answer marker (`#### N`, "the answer is
N", `\\boxed{N}`), else the last number of the completion. Numbers are read with their sign,
thousands separators and decimals, ignoring currency, units and a sentence's final period,
and are compared as exact decimals: "$1,200.00" == "1200", "12.0" == "12".

MATH: the content of the last complete `\\boxed{...}` (nested braces allowed), compared with
math-verify's `parse` and `verify` (symbolic and numeric equivalence: \\frac{1}{2} == 0.5).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any, Literal

from nemo_topr.errors import UserError

Grade = Literal["correct", "wrong", "invalid", "error"]
GRADES: tuple[Grade, ...] = ("correct", "wrong", "invalid", "error")
TASKS = ("gsm8k", "math")
# Share of graded answers whose grader may fail before a command stops (--max-grader-error-rate).
MAX_GRADER_ERROR_RATE = 0.01


class GraderError(RuntimeError):
    """The grader could not decide (math-verify raised or timed out); never a wrong answer."""


class GraderErrorRateExceeded(UserError, ValueError):
    """More grader errors than a command accepts."""


class GradingError(UserError, ValueError):
    """A task or a reference answer that no grader reads."""

# math-verify bounds its sympy work with signal.alarm, which exists only in the main thread.
MATH_VERIFY_TIMEOUT_S = 5

# A number: optional sign, optional currency, digits with or without thousands separators,
# optional decimals. The look-behind keeps `5-3` from reading as 5 and -3, and `x2` as 2.
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-\u2212]?)\$?"
    r"(?P<digits>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
)
# Text after an answer marker, up to the end of its line.
_MARKED_ANSWER = re.compile(r"(?:####|answer is)(?P<rest>[^\n]*)", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\s*\{")


# ---------------------------------------------------------------------------------------------
# GSM8K


def canonical_number(sign: str, digits: str) -> str:
    """The number as a canonical string: no separators, no trailing zeros ("1,200.00" -> "1200")."""
    value = Decimal(digits.replace(",", ""))
    if sign:
        value = -value
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _numbers(text: str) -> list[str]:
    return [canonical_number(m["sign"], m["digits"]) for m in _NUMBER.finditer(text)]


def extract_gsm8k_answer(completion: str) -> str | None:
    """The completion's final answer as a canonical number, or None when it has no number.

    The answer is the first number after the last marker (`#### N`, "the answer is N" on the
    same line, `\\boxed{N}`) that is followed by one; without such a marker, the last number.
    """
    marked = [(m.start(), m["rest"]) for m in _MARKED_ANSWER.finditer(completion)]
    marked += boxed_contents(completion)
    for _, text in sorted(marked, reverse=True):
        numbers = _numbers(text)
        if numbers:
            return numbers[0]
    numbers = _numbers(completion)
    return numbers[-1] if numbers else None


def gsm8k_reference_answer(reference_answer: str) -> str:
    """The canonical number of a reference: a GSM8K `answer` (its `#### N`) or a bare number."""
    answer = extract_gsm8k_answer(reference_answer)
    if answer is None:
        raise GradingError(f"GSM8K reference has no number: {reference_answer[-80:]!r}",
                           key="reference_answer.gsm8k.no_number", where="reference_answer")
    return answer


# ---------------------------------------------------------------------------------------------
# MATH


def boxed_contents(text: str) -> list[tuple[int, str]]:
    """(position, content) of every complete `\\boxed{...}`, nested braces matched.

    Escaped braces `\\{` `\\}` (LaTeX set braces) are content, not grouping. A `\\boxed{` whose
    braces never close (a truncated generation) is skipped.
    """
    found = []
    for match in _BOXED.finditer(text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            if text[i] == "\\":
                i += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found.append((match.start(), text[match.end() : i - 1]))
    return found


def last_boxed(text: str) -> str | None:
    """The stripped content of the last complete `\\boxed{...}`, or None (also when empty)."""
    contents = boxed_contents(text)
    answer = contents[-1][1].strip() if contents else ""
    return answer or None


def extract_math_answer(completion: str) -> str | None:
    """The completion's final answer: its last `\\boxed{...}`, or None."""
    return last_boxed(completion)


def math_reference_answer(reference_answer: str) -> str:
    """A MATH reference: the bare answer (MATH-500's `answer`) or a solution's last `\\boxed{}`."""
    answer = last_boxed(reference_answer) or reference_answer.strip()
    if not answer:
        raise GradingError("MATH reference answer is empty", key="reference_answer.math.empty",
                           where="reference_answer")
    return answer


def _math_verify_timeout() -> int | None:
    """math-verify's signal-based timeout in the main thread; none elsewhere (signals fail there)."""
    return MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=4096)
def _parse_latex(answer: str) -> tuple:
    from math_verify import LatexExtractionConfig, parse

    boxed = f"\\boxed{{{answer}}}"
    return tuple(parse(boxed, extraction_config=[LatexExtractionConfig()], parsing_timeout=_math_verify_timeout(),
                       raise_on_error=True))


def math_answers_equal(reference: str, answer: str) -> bool:
    """Whether math-verify finds two LaTeX answers equivalent (both parsed as `\\boxed{...}`).

    `reference` is math-verify's gold side (the comparison is not symmetric for equations).
    LaTeX that math-verify cannot read is handled inside it, candidate by candidate (an
    unparseable answer is not equal). What still escapes it (a timeout, a broken install, a bug)
    raises GraderError: with the default raise_on_error=False math-verify would return False
    for those too (math_verify/parser.py:719, grader.py:867), silently grading the answer wrong.
    """
    from math_verify.errors import TimeoutException  # a BaseException (math_verify/errors.py:1)

    try:
        from math_verify import verify

        gold, predicted = _parse_latex(reference), _parse_latex(answer)
        return bool(gold and predicted) and verify(list(gold), list(predicted),
                                                   timeout_seconds=_math_verify_timeout(), raise_on_error=True)
    except (Exception, TimeoutException) as error:
        raise GraderError(f"math-verify failed comparing {answer[:80]!r} with {reference[:80]!r}: "
                          f"{type(error).__name__}: {error}") from error


# ---------------------------------------------------------------------------------------------
# Grading, by task


@dataclass(frozen=True)
class TaskGrader:
    """How one task reads answers: from a completion, from a reference, and compares them."""

    extract: Callable[[str], str | None]
    reference: Callable[[str], str]
    same: Callable[[str, str], bool]


GRADERS: dict[str, TaskGrader] = {
    "gsm8k": TaskGrader(extract_gsm8k_answer, gsm8k_reference_answer, str.__eq__),
    "math": TaskGrader(extract_math_answer, math_reference_answer, math_answers_equal),
}


def grader_of(task: str) -> TaskGrader:
    if task not in GRADERS:
        raise GradingError(f"unknown task {task!r}; expected one of {TASKS}", key="task.unknown", where="task")
    return GRADERS[task]


def extract_answer(task: str, completion: str) -> str | None:
    """The completion's final answer in the task's comparable form, or None (invalid)."""
    return grader_of(task).extract(completion)


def same_answer(task: str, reference: str, answer: str) -> bool:
    """Whether two extracted answers are the same answer (`reference` plays math-verify's gold)."""
    return grader_of(task).same(reference, answer)


@dataclass(frozen=True)
class GradeResult:
    """One graded completion: its extracted answer (None: invalid), its grade, and for grade
    "error" what the grader raised."""

    answer: str | None
    grade: Grade
    error: str | None = None


def reference_problem(task: str, reference_answer: str) -> str | None:
    """Why the task's grader cannot read this reference, or None. Grading reads a reference only
    for a completion with an answer, so a bad one would fail the first such sample, after sampling."""
    try:
        grader_of(task).reference(reference_answer)
    except ValueError as error:
        return str(error)
    return None


def graded_answer(task: str, completion: str, reference_answer: str) -> GradeResult:
    """The completion's extracted answer and grade ("error" when the grader failed)."""
    grader = grader_of(task)
    answer = grader.extract(completion)
    if answer is None:
        return GradeResult(None, "invalid")
    reference = grader.reference(reference_answer)  # outside the try: a bad reference is a data bug
    try:
        same = grader.same(reference, answer)
    except GraderError as error:
        return GradeResult(answer, "error", str(error))
    return GradeResult(answer, "correct" if same else "wrong")


def grade(task: str, completion: str, reference_answer: str) -> Grade:
    """"correct", "wrong", "invalid" (the completion has no parseable answer) or "error"."""
    return graded_answer(task, completion, reference_answer).grade


def grade_gsm8k(completion: str, reference_answer: str) -> Grade:
    return grade("gsm8k", completion, reference_answer)


def grade_math(completion: str, reference_answer: str) -> Grade:
    return grade("math", completion, reference_answer)


def is_correct_gsm8k(completion: str, reference_answer: str) -> bool:
    return grade_gsm8k(completion, reference_answer) == "correct"


def is_correct_math(completion: str, reference_answer: str) -> bool:
    return grade_math(completion, reference_answer) == "correct"


def reward_of(grade_label: Grade) -> float:
    """The paper's reward: +1 for a correct answer, -1 for a wrong or invalid one. A grader
    error has no reward: turning it into -1 would train on a verdict nobody made."""
    if grade_label == "error":
        raise GraderError("a grader error has no reward; drop the sample (check_grader_errors counts it)")
    return 1.0 if grade_label == "correct" else -1.0


def check_grader_errors(results: Sequence[GradeResult], max_rate: float, flag: str = "--max-grader-error-rate"
                        ) -> dict[str, Any]:
    """Count the grader errors among `results`; returns {graded, grader_errors, grader_error_rate,
    max_grader_error_rate, first_grader_error} and raises GraderErrorRateExceeded above `max_rate`."""
    errors = [result.error for result in results if result.grade == "error"]
    rate = len(errors) / len(results) if results else 0.0
    report = {"graded": len(results), "grader_errors": len(errors), "grader_error_rate": rate,
              "max_grader_error_rate": max_rate, "first_grader_error": errors[0] if errors else None}
    if rate > max_rate:
        raise GraderErrorRateExceeded(
            f"the grader failed on {len(errors)} of {len(results)} answers ({100 * rate:.2f}%), above {flag} "
            f"{max_rate}; these are grader failures, not wrong answers (check the math-verify install). "
            f"First: {errors[0]}", key="grader_error_rate.above_max", where=flag)
    return report
