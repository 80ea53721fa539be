"""Synthetic reasoning task: 2-3 step add/subtract word problems with an exact final answer.

    Question: Ann has 7 apples. She gets 5 more. She loses 3. How many apples does Ann have now?
    Answer: 7 + 5 = 12. 12 - 3 = 9. The answer is 9.

The completion (everything after "Answer:") is a chain of thought, one equation per step, and a
GSM8K-style final line "The answer is N.", so the project's GSM8K grader extracts the answer;
`grade` adds an exact check of that answer against the problem's true value. Splits are drawn
from one seeded stream and are disjoint by question text.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from nemo_topr.grading import Grade, graded_answer

NAMES = ("Ann", "Ben", "Cara", "Dan", "Eve", "Finn", "Gus", "Hana", "Ivy", "Jon")
ITEMS = ("apples", "pens", "coins", "books", "cards", "shells", "stamps", "marbles")
GAIN = ("{n} gets {b} more.", "{n} finds {b} more.", "{n} buys {b} more.")
LOSS = ("{n} gives away {b}.", "{n} loses {b}.", "{n} sells {b}.")
TASK = "gsm8k"  # the grader family: "The answer is N."
_FINAL_STATEMENT = re.compile(r"The answer is -?\d+\.")


@dataclass(frozen=True)
class Problem:
    question: str
    solution: str  # the gold chain of thought, ending "The answer is N."
    answer: int

    @property
    def prompt(self) -> str:
        return prompt_of(self.question)


def prompt_of(question: str) -> str:
    return f"Question: {question}\nAnswer:"


def make_problem(rng: random.Random, *, max_start: int = 20, max_step: int = 9) -> Problem:
    """One problem with 2 or 3 steps; every intermediate value stays >= 0."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    value = rng.randint(2, max_start)
    sentences = [f"{name} has {value} {item}."]
    equations = []
    for _ in range(rng.choice((2, 3))):
        b = rng.randint(1, max_step)
        if rng.random() < 0.5 or b > value:
            sentences.append(rng.choice(GAIN).format(n=name, b=b))
            equations.append(f"{value} + {b} = {value + b}.")
            value += b
        else:
            sentences.append(rng.choice(LOSS).format(n=name, b=b))
            equations.append(f"{value} - {b} = {value - b}.")
            value -= b
    sentences.append(f"How many {item} does {name} have now?")
    return Problem(" ".join(sentences), " " + " ".join(equations) + f" The answer is {value}.", value)


def make_splits(sizes: dict[str, int], seed: int = 0) -> dict[str, list[Problem]]:
    """Disjoint splits (by question text) of the given sizes, in the order given."""
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[Problem]] = {}
    for name, size in sizes.items():
        problems: list[Problem] = []
        while len(problems) < size:
            problem = make_problem(rng)
            if problem.question not in seen:
                seen.add(problem.question)
                problems.append(problem)
        splits[name] = problems
    return splits


def grade(completion: str, answer: int) -> tuple[str | None, Grade]:
    """(extracted answer, grade) with the project's GSM8K grader, then an exact integer check."""
    result = graded_answer(TASK, completion, str(answer))
    extracted, grade_ = result.answer, result.grade
    if extracted is not None:
        try:
            exact = float(extracted) == answer
        except ValueError:
            exact = False
        if exact != (grade_ == "correct"):  # never expected; fail loudly rather than mis-grade
            raise AssertionError(f"grader disagreement on {completion!r}: {extracted} vs {answer}")
    return extracted, grade_


def is_well_formed(completion: str) -> bool:
    """Does the completion state its answer in the task's format ("The answer is N.")?

    The GSM8K grader falls back to the last number of a completion without an answer marker, so
    degenerate text that happens to contain digits still gets graded; the miniature's invalid
    rate counts such completions too (no parseable answer *or* degenerate text)."""
    return _FINAL_STATEMENT.search(completion) is not None


def corpus(problems: list[Problem]) -> list[str]:
    """Text to train the tiny BPE tokenizer on: prompts and gold solutions."""
    return [p.prompt + p.solution for p in problems]
