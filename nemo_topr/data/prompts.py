"""Prompt builders for the paper's two benchmarks, read from local files (never downloaded).

GSM8K: the paper's 8-shot chain-of-thought prompt, exemplars drawn from the train split.
MATH-500: zero-shot, final answer in \\boxed{}.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

DATA_DIR_ENV = "NEMO_TOPR_DATA_DIR"
GSM8K_SPLITS = ("train", "test")
GSM8K_SHOTS = 8
GSM8K_EXEMPLAR_SEED = 0

MATH_INSTRUCTION = (
    "Solve the following math problem. Reason step by step, and put your final answer "
    "within \\boxed{}."
)

_CALCULATOR_ANNOTATION = re.compile(r"<<[^>]*>>")


def default_data_dir() -> Path:
    """$NEMO_TOPR_DATA_DIR, else `../shared/data` next to the repository."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    return Path(__file__).resolve().parents[3] / "shared" / "data"


def _read_benchmark(name: str, data_dir: str | Path | None) -> list[dict]:
    path = Path(data_dir or default_data_dir()) / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: benchmark file not found; set {DATA_DIR_ENV} or pass data_dir "
            "(the data is never downloaded)"
        )
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def load_gsm8k(split: str = "train", data_dir: str | Path | None = None) -> list[dict]:
    """GSM8K rows {question, answer}; `answer` is the chain of thought ending in `#### N`."""
    if split not in GSM8K_SPLITS:
        raise ValueError(f"GSM8K split must be one of {GSM8K_SPLITS}; got {split!r}")
    return _read_benchmark(f"gsm8k_{split}.jsonl", data_dir)


def load_math500(data_dir: str | Path | None = None) -> list[dict]:
    """MATH-500 rows {id, question, answer, metadata}; `answer` is the final answer in LaTeX."""
    return _read_benchmark("math500_test.jsonl", data_dir)


def gsm8k_final_answer(answer: str) -> str:
    """The number after `####` in a GSM8K answer."""
    _, separator, final = answer.rpartition("####")
    if not separator:
        raise ValueError(f"GSM8K answer has no '####' line: {answer[-80:]!r}")
    return final.strip()


def gsm8k_gold_completion(answer: str) -> str:
    """A GSM8K answer rewritten as the completion the 8-shot prompt asks for.

    Calculator annotations `<<48/2=24>>` are removed and `#### N` becomes the final line
    `The answer is N.`. The leading space continues the prompt's trailing `Answer:`.
    """
    reasoning = _CALCULATOR_ANNOTATION.sub("", answer.rpartition("####")[0]).strip()
    return f" {reasoning}\nThe answer is {gsm8k_final_answer(answer)}."


def gsm8k_exemplars(train_rows: list[dict], shots: int = GSM8K_SHOTS, seed: int = GSM8K_EXEMPLAR_SEED) -> list[dict]:
    """`shots` train rows chosen by a seeded draw: fixed for a given train file."""
    indices = random.Random(seed).sample(range(len(train_rows)), shots)
    return [train_rows[i] for i in indices]


def gsm8k_prompt(question: str, exemplars: list[dict]) -> str:
    """Few-shot chain-of-thought prompt; the model continues after the final `Answer:`."""
    shots = [f"Question: {row['question']}\nAnswer:{gsm8k_gold_completion(row['answer'])}" for row in exemplars]
    return "\n\n".join([*shots, f"Question: {question}\nAnswer:"])


def math500_prompt(question: str) -> str:
    """Zero-shot MATH prompt (the user turn when the tokenizer has a chat template)."""
    return f"{MATH_INSTRUCTION}\n\nProblem: {question}"
