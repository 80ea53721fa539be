"""Prompt builders on the real GSM8K and MATH-500 files."""

import hashlib

import pytest

from nemo_topr.data import prompts
from nemo_topr.data.prompts import (
    default_data_dir,
    gsm8k_exemplars,
    gsm8k_final_answer,
    gsm8k_gold_completion,
    gsm8k_prompt,
    load_gsm8k,
    load_math500,
    math500_prompt,
)


@pytest.fixture(scope="module")
def train_rows():
    return load_gsm8k("train")


def test_the_shared_data_files_are_the_published_ones():
    data_dir = default_data_dir()
    for line in (data_dir / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((data_dir / name.lstrip("*")).read_bytes()).hexdigest() == digest, name


def test_split_sizes(train_rows):
    assert (len(train_rows), len(load_gsm8k("test")), len(load_math500())) == (7473, 1319, 500)


def test_gold_completion_strips_calculator_annotations(train_rows):
    answer = train_rows[0]["answer"]
    assert gsm8k_final_answer(answer) == "72"
    assert gsm8k_gold_completion(answer) == (
        " Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\nThe answer is 72."
    )
    assert not any("<<" in gsm8k_gold_completion(row["answer"]) for row in train_rows[:500])
    with pytest.raises(ValueError, match="no '####'"):
        gsm8k_final_answer("no final line")


def test_gsm8k_eight_shot_prompt(train_rows):
    exemplars = gsm8k_exemplars(train_rows)
    assert exemplars == gsm8k_exemplars(load_gsm8k("train"))  # fixed for the file
    assert len({row["question"] for row in exemplars}) == 8
    question = load_gsm8k("test")[0]["question"]
    prompt = gsm8k_prompt(question, exemplars)
    assert prompt.count("Question: ") == 9 and prompt.count("The answer is ") == 8
    assert prompt.startswith(f"Question: {exemplars[0]['question']}\nAnswer: ")
    assert prompt.endswith(f"\n\nQuestion: {question}\nAnswer:")
    assert "<<" not in prompt and "####" not in prompt


def test_math500_prompt_asks_for_a_boxed_answer():
    row = load_math500()[0]
    prompt = math500_prompt(row["question"])
    assert "\\boxed{}" in prompt and prompt.endswith(row["question"])


def test_data_dir_is_configurable_and_never_downloaded(tmp_path, monkeypatch):
    monkeypatch.setenv(prompts.DATA_DIR_ENV, str(tmp_path))
    assert default_data_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match="NEMO_TOPR_DATA_DIR"):
        load_gsm8k("train")
    (tmp_path / "gsm8k_test.jsonl").write_text('{"question": "1 + 1?", "answer": "#### 2"}\n')
    assert load_gsm8k("test") == [{"question": "1 + 1?", "answer": "#### 2"}]
    with pytest.raises(ValueError, match="split"):
        load_gsm8k("validation")
