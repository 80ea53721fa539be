"""Prompt builders for the paper's two benchmarks, read from local files (never downloaded).

The files ship with the repository in `data/benchmarks/` (data/benchmarks/README.md: origin,
licences, checksums); $NEMO_TOPR_DATA_DIR or `data_dir` points elsewhere: a directory of the same
JSONL files, or a directory written by `datasets`' save_to_disk.

GSM8K: the paper's 8-shot chain-of-thought prompt, exemplars drawn from the train split.
MATH-500: zero-shot, final answer in \\boxed{}.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

from nemo_topr.errors import UserError
from nemo_topr.data.schema import DataError, RejectedRow
from nemo_topr.data.sources import jsonl_rows, load_saved_dataset, saved_dataset_kind
from nemo_topr.grading import reference_problem

# Found from the package's location: the recipe runs from its clone (an editable install), so the
# repository's files sit beside the package; a wheel installed elsewhere sets NEMO_TOPR_DATA_DIR.
BENCHMARK_DIR = Path(__file__).resolve().parents[2] / "data" / "benchmarks"
DATA_DIR_ENV = "NEMO_TOPR_DATA_DIR"
GSM8K_SPLITS = ("train", "test")
GSM8K_SHOTS = 8
GSM8K_EXEMPLAR_SEED = 0

MATH_INSTRUCTION = (
    "Solve the following math problem. Reason step by step, and put your final answer "
    "within \\boxed{}."
)

_CALCULATOR_ANNOTATION = re.compile(r"<<[^>]*>>")
# the question column: ours and openai/gsm8k's, then HuggingFaceH4/MATH-500's
QUESTION_COLUMNS = ("question", "problem")


class BenchmarkNotFound(UserError, FileNotFoundError):
    """No benchmark file where the data directory should hold it (the data is never downloaded)."""


class BenchmarkError(UserError, ValueError):
    """A benchmark split or answer that the prompts and graders cannot read."""


class BenchmarkRows(list):
    """A benchmark file's rows and the file (`source`): a check made after reading, such as the
    exemplars' row count, names it."""

    def __init__(self, rows: list[dict], source: str | Path):
        super().__init__(rows)
        self.source = str(source)


def default_data_dir() -> Path:
    """$NEMO_TOPR_DATA_DIR, else the repository's `data/benchmarks`."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    return BENCHMARK_DIR


def _read_benchmark(benchmark: str, split: str, data_dir: str | Path | None) -> BenchmarkRows:
    directory = Path(data_dir or default_data_dir())
    if saved_dataset_kind(directory):
        return _saved_benchmark_rows(directory, benchmark, split)
    path = directory / f"{benchmark}_{split}.jsonl"
    if not path.is_file():
        raise BenchmarkNotFound(
            f"{path}: benchmark file not found; set {DATA_DIR_ENV} or pass --data-dir: a directory of the "
            f"benchmark JSONL files or a save_to_disk dataset (the data is never downloaded)",
            key="benchmark.file.not_found", where=str(path))
    rows = []
    for number, row in jsonl_rows(path):
        if isinstance(row, RejectedRow):
            raise row.error
        rows.append(benchmark_row(row, path, number, benchmark))
    return BenchmarkRows(rows, path)


def benchmark_row(row: object, where: str | Path, number: int, benchmark: str) -> dict:
    """`row` with its question under `question` (QUESTION_COLUMNS), checked as the prompts and
    graders read it: a user's copy of a benchmark failed on its first odd row with a KeyError."""
    if not isinstance(row, dict):
        raise DataError(where, number, "record", f"expected a JSON object, got {type(row).__name__}",
                        key="benchmark.record.not_an_object", where=f"{where}:{number}: record")
    question = next((column for column in QUESTION_COLUMNS if column in row), "question")
    for column in (question, "answer"):
        if not isinstance(row.get(column), str) or not row[column].strip():
            found = "missing" if column not in row else f"expected a non-empty string, got {row[column]!r:.40}"
            raise DataError(where, number, column, f"{found} (fields: {', '.join(row)})",
                            key=f"benchmark.{column}.not_text", where=f"{where}:{number}: {column}")
    if benchmark == "gsm8k":
        if "####" not in row["answer"]:
            raise DataError(where, number, "answer", "a GSM8K answer ends with a '#### N' line; this one has none",
                            key="benchmark.answer.no_final_line", where=f"{where}:{number}: answer")
        # eval grades against the text after '####' (gsm8k_final_answer): unchecked, a bad one failed after sampling
        if problem := reference_problem("gsm8k", gsm8k_final_answer(row["answer"])):
            raise DataError(where, number, "answer", f"its '#### N' line: {problem}",
                            key="benchmark.answer.final_line_unreadable", where=f"{where}:{number}: answer")
    return row if question == "question" else {"question": row.pop(question), **row}


def _saved_benchmark_rows(directory: Path, benchmark: str, split: str) -> BenchmarkRows:
    """Rows of a save_to_disk directory: a DatasetDict with the split, or (MATH-500, one split) a
    Dataset; a `problem` column (HuggingFaceH4/MATH-500) becomes `question`."""
    single = saved_dataset_kind(directory) == "Dataset"
    if single and benchmark == "gsm8k":
        raise DataError(directory, 0, "split", "a saved Dataset holds one split; GSM8K needs a DatasetDict "
                        "with 'train' (few-shot exemplars) and 'test' splits",
                        key="benchmark.split.single_split_dataset", where=f"{directory}: split")
    dataset, name = load_saved_dataset(directory, None if single else split)
    question = next((column for column in QUESTION_COLUMNS if column in dataset.column_names), None)
    for field, column in (("question", question), ("answer", "answer")):
        if column not in dataset.column_names:
            raise DataError(name, 0, field, f"missing column (columns: {', '.join(dataset.column_names)})",
                            key=f"benchmark.{field}.column_missing", where=f"{name}: {field}")
    return BenchmarkRows([benchmark_row(row, name, number, benchmark)
                          for number, row in enumerate(dataset.to_list(), start=1)], name)


def load_gsm8k(split: str = "train", data_dir: str | Path | None = None) -> list[dict]:
    """GSM8K rows {question, answer}; `answer` is the chain of thought ending in `#### N`."""
    if split not in GSM8K_SPLITS:
        raise BenchmarkError(f"GSM8K split must be one of {GSM8K_SPLITS}; got {split!r}",
                             key="benchmark.split.unknown", where="split")
    return _read_benchmark("gsm8k", split, data_dir)


def load_math500(data_dir: str | Path | None = None) -> list[dict]:
    """MATH-500 rows {id, question, answer, metadata}; `answer` is the final answer in LaTeX."""
    return _read_benchmark("math500", "test", data_dir)


def gsm8k_final_answer(answer: str) -> str:
    """The number after `####` in a GSM8K answer."""
    _, separator, final = answer.rpartition("####")
    if not separator:
        raise BenchmarkError(f"GSM8K answer has no '####' line: {answer[-80:]!r}",
                             key="gsm8k_answer.no_final_line", where="answer")
    return final.strip()


def gsm8k_gold_completion(answer: str) -> str:
    """A GSM8K answer rewritten as the completion the 8-shot prompt asks for.

    Calculator annotations `<<48/2=24>>` are removed and `#### N` becomes the final line
    `The answer is N.`. The leading space continues the prompt's trailing `Answer:`.
    """
    reasoning = _CALCULATOR_ANNOTATION.sub("", answer.rpartition("####")[0]).strip()
    return f" {reasoning}\nThe answer is {gsm8k_final_answer(answer)}."


def gsm8k_exemplars(train_rows: list[dict], shots: int = GSM8K_SHOTS, seed: int = GSM8K_EXEMPLAR_SEED,
                    leaving_out: int | None = None) -> list[dict]:
    """`shots` train rows chosen by a seeded draw: fixed for a given train file. `leaving_out`: the
    train row whose own prompt this is; when drawn, the draw's next row takes its place, so that
    no prompt holds its own worked solution (8 gsm8k-train prompts did)."""
    source = getattr(train_rows, "source", "GSM8K train rows")
    if len(train_rows) < shots:  # random.sample's "Sample larger than population" names neither file nor need
        problem = f"the {shots}-shot prompt needs at least {shots} rows (its exemplars); it has {len(train_rows)}"
        raise DataError(source, 0, "file", problem, key="benchmark.file.too_few_rows", where=f"{source}: file")
    draw = random.Random(seed)
    indices = draw.sample(range(len(train_rows)), shots)
    if leaving_out in indices:
        if len(train_rows) == shots:
            raise DataError(source, 0, "file", f"the {shots}-shot prompt of train row {leaving_out}, one of its "
                                               f"exemplars, needs a row besides them: at least {shots + 1} rows",
                            key="benchmark.file.only_the_exemplars", where=f"{source}: file")
        while (substitute := draw.randrange(len(train_rows))) in indices:
            pass
        indices[indices.index(leaving_out)] = substitute
    return [train_rows[i] for i in indices]


def gsm8k_prompt(question: str, exemplars: list[dict]) -> str:
    """Few-shot chain-of-thought prompt; the model continues after the final `Answer:`."""
    shots = [f"Question: {row['question']}\nAnswer:{gsm8k_gold_completion(row['answer'])}" for row in exemplars]
    return "\n\n".join([*shots, f"Question: {question}\nAnswer:"])


def math500_prompt(question: str) -> str:
    """Zero-shot MATH prompt (the user turn when the tokenizer has a chat template)."""
    return f"{MATH_INSTRUCTION}\n\nProblem: {question}"
