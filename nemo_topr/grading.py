"""Graders for the paper's two benchmarks: a completion's final answer against the reference.

Every grader returns one of three labels:

    correct   an answer was found and it equals the reference
    wrong     an answer was found and it differs
    invalid   no parseable answer (no number for GSM8K, no non-empty \\boxed{} for MATH)

`is_correct_*` is `grade_* == "correct"`; graders never raise on a completion, only on a
reference that has no answer (a data bug).

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
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Literal

Grade = Literal["correct", "wrong", "invalid"]
GRADES: tuple[Grade, ...] = ("correct", "wrong", "invalid")
TASKS = ("gsm8k", "math")

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
        raise ValueError(f"GSM8K reference has no number: {reference_answer[-80:]!r}")
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
        raise ValueError("MATH reference answer is empty")
    return answer


def _math_verify_timeout() -> int | None:
    """math-verify's signal-based timeout in the main thread; none elsewhere (signals fail there)."""
    return MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=4096)
def _parse_latex(answer: str) -> tuple:
    from math_verify import LatexExtractionConfig, parse

    boxed = f"\\boxed{{{answer}}}"
    return tuple(parse(boxed, extraction_config=[LatexExtractionConfig()], parsing_timeout=_math_verify_timeout()))


def math_answers_equal(reference: str, answer: str) -> bool:
    """Whether math-verify finds two LaTeX answers equivalent (both parsed as `\\boxed{...}`).

    `reference` is math-verify's gold side (the comparison is not symmetric for equations).
    Any failure inside math-verify (parse error, timeout) counts as not equal.
    """
    from math_verify import verify

    try:
        gold, predicted = _parse_latex(reference), _parse_latex(answer)
        return bool(gold and predicted) and verify(list(gold), list(predicted), timeout_seconds=_math_verify_timeout())
    except Exception:  # math-verify raises sympy's and its own errors on odd LaTeX
        return False


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
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    return GRADERS[task]


def extract_answer(task: str, completion: str) -> str | None:
    """The completion's final answer in the task's comparable form, or None (invalid)."""
    return grader_of(task).extract(completion)


def same_answer(task: str, reference: str, answer: str) -> bool:
    """Whether two extracted answers are the same answer (`reference` plays math-verify's gold)."""
    return grader_of(task).same(reference, answer)


def graded_answer(task: str, completion: str, reference_answer: str) -> tuple[str | None, Grade]:
    """(the completion's extracted answer or None, its grade)."""
    grader = grader_of(task)
    answer = grader.extract(completion)
    if answer is None:
        return None, "invalid"
    return answer, "correct" if grader.same(grader.reference(reference_answer), answer) else "wrong"


def grade(task: str, completion: str, reference_answer: str) -> Grade:
    """"correct", "wrong" or "invalid" (the completion has no parseable answer)."""
    return graded_answer(task, completion, reference_answer)[1]


def grade_gsm8k(completion: str, reference_answer: str) -> Grade:
    return grade("gsm8k", completion, reference_answer)


def grade_math(completion: str, reference_answer: str) -> Grade:
    return grade("math", completion, reference_answer)


def is_correct_gsm8k(completion: str, reference_answer: str) -> bool:
    return grade_gsm8k(completion, reference_answer) == "correct"


def is_correct_math(completion: str, reference_answer: str) -> bool:
    return grade_math(completion, reference_answer) == "correct"


def reward_of(grade_label: Grade) -> float:
    """The paper's reward: +1 for a correct answer, -1 for a wrong or invalid one."""
    return 1.0 if grade_label == "correct" else -1.0
