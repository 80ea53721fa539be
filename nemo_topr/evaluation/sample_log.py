"""Every graded sample of `generate` and `eval --benchmark`, written as each prompt finishes.

The log is `OUT.samples` (JSON lines, not `.jsonl`, so a directory of datasets never reads it
as records): a first line with the options that decide the samples, then one line per finished
prompt with all its samples, empty completions and grader errors included (`grade: "error"`,
with what the grader raised). A crash or a time limit loses at most the prompt in progress: the
same command resumes after the last complete line, and refuses options other than the logged
ones (a log without a finished prompt, from a run that failed before sampling, starts over), and a
prompt whose text or reference answer changed since it was logged (each line holds the text's
SHA-256 and the reference: the samples answer the text, and their grades follow the reference).
Each line names the task whose grader graded it: a line of another task, or from before lines
named it, is graded again with this command's grader and rewritten (the samples do not depend on
the task; the stop strings that do are among the options). The log is kept after the command
ends: it is the only place that holds the samples the grader failed on, and a rerun reads it
instead of sampling again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from nemo_topr.errors import UserError
from nemo_topr.evaluation.samples import Completion, GradedCompletion, Problem, grade_completions
from nemo_topr.utils.outputs import OutputWriteError, filesystem_remedy, write_whole


class SampleLogError(UserError, ValueError):
    """A log that cannot be resumed with these options or these prompts."""


def log_path(out: Path) -> Path:
    return out.with_name(out.name + ".samples")


def _sample_row(sample: GradedCompletion) -> dict[str, Any]:
    return {"text": sample.completion.text, "sampler_logprob": sample.completion.sampler_logprob,
            "answer": sample.answer, "grade": sample.grade, "grader_error": sample.grader_error}


def _sample_of(row: dict[str, Any]) -> GradedCompletion:
    return GradedCompletion(Completion(row["text"], row["sampler_logprob"]), row["answer"], row["grade"],
                            row["grader_error"])


def _identity(problem: Problem) -> dict[str, str]:
    """What a prompt's logged samples and grades hold for: its text (a digest), its reference and
    the task whose grader graded them."""
    text = json.dumps(problem.prompt, sort_keys=True, ensure_ascii=False)
    return {"prompt_sha256": hashlib.sha256(text.encode()).hexdigest(), "reference_answer": problem.reference_answer,
            "task": problem.task}


def _differences(logged: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    """Each option that differs, a nested one by its dotted name (`settings.seed`), not the whole section."""
    differences = []
    for key in sorted(logged.keys() | now.keys()):
        then, current = logged.get(key), now.get(key)
        if isinstance(then, dict) and isinstance(current, dict):
            differences += _differences(then, current, f"{prefix}{key}.")
        elif then != current:
            differences.append(f"{prefix}{key}: {then!r} then, {current!r} now")
    return differences


def logged_samples(path: Path) -> list[list[GradedCompletion]]:
    """The graded samples of each prompt the log holds, in the order they were logged."""
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    return [[_sample_of(sample) for sample in json.loads(line)["samples"]] for line in lines]


class SampleLog:
    """The log of one command's samples: `done` holds {prompt index: its graded samples}."""

    def __init__(self, path: Path, options: dict[str, Any], problems: list[Problem]):
        self.path = path
        self.done: dict[int, list[GradedCompletion]] = {}
        self.regraded: dict[str | None, int] = {}  # {the task a line was graded for: lines graded again}
        if path.exists():
            self._resume(options, problems)
        else:  # whole or not at all: a log cut in its first line would not resume
            write_whole(path, json.dumps({"options": options}) + "\n")

    def _resume(self, options: dict[str, Any], problems: list[Problem]) -> None:
        text = self.path.read_text(encoding="utf-8")
        complete = text[: text.rfind("\n") + 1]  # a line cut by a crash is sampled again
        lines = complete.splitlines()
        logged = json.loads(lines[0])["options"] if lines else None
        if logged != options and len(lines) <= 1:  # stopped before a prompt finished: no sample to keep
            write_whole(self.path, json.dumps({"options": options}) + "\n")
            return
        if logged != options:
            details = "; ".join(_differences(logged, options))
            raise SampleLogError(f"{self.path} holds samples drawn with other options ({details}): rerun with the "
                                 "logged options to resume, or choose another --out (or delete the log to start over)",
                                 key="sample_log.options.differ", where=f"{self.path}:1: options")
        rows = [json.loads(line) for line in lines[1:]]
        for number, row in enumerate(rows, start=2):
            index = row["index"]
            if index < len(problems):
                problem = problems[index]
                self._check_same_problem(number, index, row, problem)
                samples = [_sample_of(sample) for sample in row["samples"]]
                if row.get("task") != problem.task:  # graded for another task (--task changed), or unnamed
                    self.regraded[row.get("task")] = self.regraded.get(row.get("task"), 0) + 1
                    samples = grade_completions(problem, [sample.completion for sample in samples])
                    row |= {"task": problem.task, "samples": [_sample_row(sample) for sample in samples]}
                self.done[index] = samples
        if self.regraded:  # whole or not at all, as the first line: `iterate` counts the log's grades
            write_whole(self.path, "".join(json.dumps(row) + "\n" for row in [{"options": logged}, *rows]))
        elif len(complete) < len(text):
            self.path.write_text(complete, encoding="utf-8")

    def _check_same_problem(self, number: int, index: int, row: dict[str, Any], problem: Problem) -> None:
        """Line `number` of the log holds prompt `index`'s samples: the same prompt id, text and reference."""
        if problem.prompt_id != row["prompt_id"]:
            raise SampleLogError(f"{self.path}:{number}: prompt {index} is {row['prompt_id']!r} in the log but "
                                 f"{problem.prompt_id!r} now: the prompts changed; choose another --out",
                                 key="sample_log.prompt_id.changed", where=f"{self.path}:{number}: prompt_id")
        where, now = f"{self.path}:{number}: prompt {problem.prompt_id!r}", _identity(problem)
        remedy = "choose another --out, or delete the log to sample again"
        if "prompt_sha256" not in row:
            raise SampleLogError(f"{where} was logged by an earlier nemo-topr without its text's digest, so whether "
                                 f"the prompts changed cannot be told: {remedy}",
                                 key="sample_log.prompt_sha256.missing", where=f"{self.path}:{number}: prompt_sha256")
        if row["prompt_sha256"] != now["prompt_sha256"]:
            raise SampleLogError(f"{where} has other text than when it was sampled: the logged samples answer "
                                 f"another question; {remedy}",
                                 key="sample_log.prompt_sha256.changed", where=f"{self.path}:{number}: prompt_sha256")
        if row["reference_answer"] != now["reference_answer"]:
            raise SampleLogError(f"{where}: reference answer {row['reference_answer']!r} in the log, "
                                 f"{now['reference_answer']!r} now: the logged grades follow the old one; {remedy}",
                                 key="sample_log.reference_answer.changed",
                                 where=f"{self.path}:{number}: reference_answer")

    def append(self, index: int, problem: Problem, samples: list[GradedCompletion]) -> None:
        try:
            with self.path.open("a", encoding="utf-8") as log:
                log.write(json.dumps({"index": index, "prompt_id": problem.prompt_id, **_identity(problem),
                                      "samples": [_sample_row(sample) for sample in samples]}) + "\n")
        except OSError as error:  # a line cut short is sampled again on resume
            if not (remedy := filesystem_remedy(error)):
                raise
            raise OutputWriteError(f"writing {self.path}: {error.strerror}; the {len(self.done)} prompts logged so far "
                                   f"are kept: {remedy} and rerun the same command to resume",
                                   key="sample_log.write_failed", where=str(self.path)) from error
        self.done[index] = samples
