"""The problems `generate` and `eval` sample: a benchmark's (GSM8K with its few-shot prompt,
MATH-500 zero-shot; `nemo_topr.data.prompts`) or a JSONL prompt file's {prompt, reference_answer,
prompt_id} rows, each checked as it is read.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nemo_topr.data.prompts import GSM8K_SHOTS
from nemo_topr.data.records import DataError, RenderedPrompt, check_messages, is_id, is_number, lone_surrogate_problem
from nemo_topr.data.schema import RejectedRow
from nemo_topr.data.sources import jsonl_rows
from nemo_topr.errors import UserError, did_you_mean
from nemo_topr.evaluation.samples import Problem
from nemo_topr.grading import TASKS, reference_problem

BENCHMARKS = ("gsm8k-train", "gsm8k-test", "math500")


class PromptsError(UserError, ValueError):
    """`--prompts` with `--task`, `--limit`, `--num-shots` or `--rendered-prompts` that name no problems to sample."""


def benchmark_problems(name: str, data_dir: str | Path | None = None, shots: int = GSM8K_SHOTS) -> list[Problem]:
    """Every problem of `gsm8k-train`, `gsm8k-test` (a `shots`-shot prompt, the paper's 8 by
    default) or `math500` (zero-shot)."""
    from nemo_topr.data import prompts

    if name == "math500":
        if shots != GSM8K_SHOTS:
            raise PromptsError(f"--num-shots {shots}: math500's prompt is zero-shot; the option sets GSM8K's exemplars",
                               key="--num-shots.math500", where="--num-shots")
        rows = prompts.load_math500(data_dir)
        return [Problem(f"math500-{i}", prompts.math500_prompt(row["question"]), row["answer"], "math")
                for i, row in enumerate(rows)]
    if name not in BENCHMARKS:
        raise PromptsError(f"unknown benchmark {name!r}; expected one of {BENCHMARKS}",
                           key="--prompts.unknown_benchmark", where="--prompts")
    train = prompts.load_gsm8k("train", data_dir)
    exemplars = prompts.gsm8k_exemplars(train, shots)
    rows = train if name == "gsm8k-train" else prompts.load_gsm8k(name.removeprefix("gsm8k-"), data_dir)

    def exemplars_of(index: int, row: dict) -> list[dict]:  # an exemplar's own prompt takes another row
        return (prompts.gsm8k_exemplars(train, shots, leaving_out=index)
                if rows is train and any(row is exemplar for exemplar in exemplars) else exemplars)

    return [Problem(f"{name}-{i}", prompts.gsm8k_prompt(row["question"], exemplars_of(i, row)),
                    prompts.gsm8k_final_answer(row["answer"]), "gsm8k")
            for i, row in enumerate(rows)]


def jsonl_problems(path: str | Path, task: str, rendered_prompts: bool = False) -> list[Problem]:
    """Problems from JSONL rows {prompt, reference_answer, prompt_id (default: the line number)};
    `rendered_prompts`: each prompt is rendered already, to be read as written (`RenderedPrompt`)."""
    problems, lines_of_ids = [], {}
    for number, row in jsonl_rows(Path(path)):
        if isinstance(row, RejectedRow):
            raise row.error
        problem = _problem_of_row(path, number, row, task, rendered_prompts)
        if problem.prompt_id in lines_of_ids:  # records, curation and group baselines tell prompts apart by it
            first = lines_of_ids[problem.prompt_id]
            raise DataError(path, number, "prompt_id", f"{problem.prompt_id!r} is also line {first}'s; each prompt "
                                                       "needs its own",
                            key="prompts.prompt_id.duplicate", where=f"{path}:{number}: prompt_id")
        lines_of_ids[problem.prompt_id] = number
        problems.append(problem)
    if not problems:
        raise DataError(path, 0, "file", "empty (no prompts)", key="prompts.file.empty", where=str(path))
    return problems


PROMPT_FIELDS = ("prompt", "reference_answer", "prompt_id")


def _problem_of_row(path: str | Path, number: int, row: object, task: str, rendered_prompts: bool) -> Problem:
    if not isinstance(row, dict):
        raise DataError(path, number, "row", f"expected a JSON object, got {type(row).__name__}",
                        key="prompts.row.not_an_object", where=f"{path}:{number}: row")
    prompt, answer = row.get("prompt"), row.get("reference_answer")
    prompt_id = number if row.get("prompt_id") is None else row["prompt_id"]
    for name, value in (("prompt", prompt), ("reference_answer", answer)):
        if value is None:
            raise DataError(path, number, name, f"missing; the row has {', '.join(map(repr, row)) or 'no fields'}",
                            key=f"prompts.{name}.missing", where=f"{path}:{number}: {name}")
    if unknown := sorted(set(row) - set(PROMPT_FIELDS)):  # a misspelt prompt_id would become the line number
        raise DataError(path, number, unknown[0], "unknown field (a prompt file's rows hold prompt, reference_answer "
                        "and prompt_id)" + did_you_mean(unknown[0], PROMPT_FIELDS, quote=True),
                        key="prompts.field.unknown", where=f"{path}:{number}: {unknown[0]}")
    if isinstance(prompt, list):  # the messages a record's prompt may be, checked as records check them
        if rendered_prompts:
            raise DataError(path, number, "prompt", "a list of messages, but --rendered-prompts is set: a rendered "
                                                    "prompt is one string, as the sampler read it",
                            key="prompts.prompt.messages_when_rendered", where=f"{path}:{number}: prompt")
        try:
            check_messages(path, number, prompt)
        except RejectedRow as rejected:
            raise rejected.error from None
    elif not isinstance(prompt, str):
        raise DataError(path, number, "prompt", "expected a string or a list of {role, content} messages",
                        key="prompts.prompt.not_text", where=f"{path}:{number}: prompt")
    elif problem := lone_surrogate_problem(prompt):  # the tokenizer's TypeError traceback otherwise
        raise DataError(path, number, "prompt", problem,
                        key="prompts.prompt.lone_surrogate", where=f"{path}:{number}: prompt")
    # a number is an answer (0 among them); a boolean or an object is no answer a grader compares
    if not (isinstance(answer, str) or is_number(answer)):
        raise DataError(path, number, "reference_answer", f"expected a string or a number, got {answer!r}",
                        key="prompts.reference_answer.not_text", where=f"{path}:{number}: reference_answer")
    if not is_id(prompt_id):
        raise DataError(path, number, "prompt_id", f"expected a string or an integer, got {prompt_id!r}",
                        key="prompts.prompt_id.not_an_id", where=f"{path}:{number}: prompt_id")
    for name, empty in (("prompt", not prompt), ("reference_answer", not str(answer).strip())):
        if empty:
            raise DataError(path, number, name, "empty", key=f"prompts.{name}.empty", where=f"{path}:{number}: {name}")
    if problem := reference_problem(task, str(answer)):
        raise DataError(path, number, "reference_answer", problem,
                        key="prompts.reference_answer.invalid", where=f"{path}:{number}: reference_answer")
    return Problem(str(prompt_id), RenderedPrompt(prompt) if rendered_prompts else prompt, str(answer), task)


def check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise PromptsError(f"--limit must be at least 1; got {limit}", key="--limit.below_1", where="--limit")


def load_problems(source: str, *, task: str | None = None, data_dir: str | Path | None = None,
                  limit: int | None = None, rendered_prompts: bool = False, shots: int = GSM8K_SHOTS
                  ) -> list[Problem]:
    """The first `limit` problems of a benchmark name (GSM8K's with `shots` exemplars) or of a
    JSONL file (which needs `task`)."""
    check_prompt_source(source, task=task, limit=limit, rendered_prompts=rendered_prompts, shots=shots)
    if source in BENCHMARKS:
        problems = benchmark_problems(source, data_dir, shots)
        if task is not None and task != problems[0].task:  # was ignored: graded as the benchmark, unsaid
            raise PromptsError(f"--task {task}: {source}'s problems are graded as {problems[0].task}; drop --task (a "
                             "benchmark sets its own)", key="--task.not_the_benchmarks", where="--task")
    else:
        problems = jsonl_problems(source, task, rendered_prompts)
    return problems[:limit]


def check_prompt_source(source: str, *, task: str | None = None, limit: int | None = None,
                        rendered_prompts: bool = False, shots: int = GSM8K_SHOTS) -> None:
    """The problems of `load_problems`' arguments that none of the prompts' data shows: a benchmark
    name or an existing prompt file, with the options it takes."""
    check_limit(limit)
    if source in BENCHMARKS:
        if rendered_prompts:
            raise PromptsError(f"--rendered-prompts is for a prompt file of rendered prompts; {source}'s are plain "
                               "text", key="--rendered-prompts.benchmark", where="--rendered-prompts")
    elif Path(source).is_dir():
        raise PromptsError(f"{source}: a directory; --prompts takes a JSONL file or a benchmark name "
                         f"({', '.join(BENCHMARKS)}), whose local copy (JSONL files or a save_to_disk dataset) "
                         "--data-dir names", key="--prompts.directory", where="--prompts")
    elif not Path(source).is_file():
        raise PromptsError(f"{source}: no such prompt file, and not a benchmark ({', '.join(BENCHMARKS)})"
                           + did_you_mean(source, BENCHMARKS), key="--prompts.no_such_file", where="--prompts")
    elif shots != GSM8K_SHOTS:
        raise PromptsError(f"--num-shots {shots} sets the exemplars of GSM8K's benchmark prompts; a prompt file's "
                         "prompts are sampled as written", key="--num-shots.prompt_file", where="--num-shots")
    elif task not in TASKS:
        raise PromptsError(f"{source}: a prompt file needs --task {'|'.join(TASKS)}",
                           key="--task.unset_for_prompt_file", where="--task")


def prompt_problems(args: argparse.Namespace) -> list[Problem]:
    """The problems of a command's `--prompts`, read with its --task, --data-dir, --limit and
    --rendered-prompts (generate, eval --prompts, and iterate's check of both)."""
    return load_problems(args.prompts, task=args.task, data_dir=args.data_dir, limit=args.limit,
                         rendered_prompts=args.rendered_prompts, shots=args.num_shots)


def check_prompts(args: argparse.Namespace) -> None:
    """`check_prompt_source` of a command's `--prompts` with its options (what `prompt_problems` reads)."""
    check_prompt_source(args.prompts, task=args.task, limit=args.limit, rendered_prompts=args.rendered_prompts,
                        shots=args.num_shots)


def prompt_source(prompts: str) -> str:
    """`--prompts` as the sample log and the results name it: a benchmark, or a file's absolute path."""
    return prompts if prompts in BENCHMARKS else str(Path(prompts).resolve())
