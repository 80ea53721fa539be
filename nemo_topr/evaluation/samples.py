"""What sampling yields: the problems sampled, their completions, the grades, and the records made of them.

A `Problem` is one prompt with what grades its completions; `grade_completions` grades a prompt's
completions with its task's grader; `graded_records` turns graded samples into pre-scored records
(empty completions and grader errors are counted, never records). `generate`, `eval --benchmark`,
the sample log and the miniature share these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nemo_topr.data.records import Messages, Record
from nemo_topr.grading import Grade, GradeResult, check_grader_errors, graded_answer, reward_of


@dataclass(frozen=True)
class Problem:
    """One prompt to sample, with what grades its completions."""

    prompt_id: str
    prompt: str | Messages
    reference_answer: str
    task: str


@dataclass(frozen=True)
class Completion:
    """A sampled completion (cut at its stop string), with the sampler's log-prob if asked for."""

    text: str
    sampler_logprob: float | None = None


@dataclass(frozen=True)
class GradedCompletion:
    completion: Completion
    answer: str | None
    grade: Grade
    grader_error: str | None = None  # what the grader raised, for grade "error"

    @property
    def result(self) -> GradeResult:
        return GradeResult(self.answer, self.grade, self.grader_error)


def grade_completions(problem: Problem, completions: Sequence[Completion]) -> list[GradedCompletion]:
    graded = []
    for completion in completions:
        result = graded_answer(problem.task, completion.text, problem.reference_answer)
        graded.append(GradedCompletion(completion, result.answer, result.grade, result.error))
    return graded


def graded_records(problems: Sequence[Problem], graded: Sequence[Sequence[GradedCompletion]]) -> list[Record]:
    """Pre-scored records, sample_id = the sample's index for its prompt; empty completions and
    grader errors (no verdict, so no reward) are not records. An empty completion is still an
    invalid sample: its id is in `meta.empty_sample_ids` of its prompt's records, so that `eval
    --records` counts it as `eval --benchmark` does."""
    records = []
    for problem, samples in zip(problems, graded):
        empty = [sample_id for sample_id, sample in enumerate(samples) if not sample.completion.text]
        for sample_id, sample in enumerate(samples):
            if not _makes_a_record(sample):
                continue
            meta = {"task": problem.task, "reference_answer": problem.reference_answer,
                    "answer": sample.answer, "grade": sample.grade, **({"empty_sample_ids": empty} if empty else {})}
            if sample.completion.sampler_logprob is not None:
                meta["sampler_logprob"] = sample.completion.sampler_logprob
            records.append(Record(prompt=problem.prompt, completion=sample.completion.text,
                                  reward=reward_of(sample.grade), prompt_id=problem.prompt_id,
                                  sample_id=sample_id, meta=meta))
    return records


def _makes_a_record(sample: GradedCompletion) -> bool:
    return bool(sample.completion.text) and sample.grade != "error"


def no_record_note(problems: Sequence[Problem], graded: Sequence[Sequence[GradedCompletion]]) -> str | None:
    """What `graded_records` leaves out whole: prompts whose samples are all empty or failed by the
    grader have no record, so `eval --records` of the records cannot count them. None if none."""
    missing = [problem.prompt_id for problem, samples in zip(problems, graded)
               if not any(_makes_a_record(sample) for sample in samples)]
    if not missing:
        return None
    return (f"{len(missing)} of {len(problems)} prompts have no record, every sample empty or failed by the grader "
            f"(first: {missing[0]}): `eval --records` of these records leaves them out, where `eval --benchmark` "
            "counts one of empty samples as failed")


def grader_error_report(graded: Sequence[Sequence[GradedCompletion]], max_rate: float) -> dict:
    """`check_grader_errors` over every graded sample (raises above `max_rate`)."""
    return check_grader_errors([sample.result for samples in graded for sample in samples], max_rate)
