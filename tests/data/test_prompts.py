"""Prompt builders on the real GSM8K and MATH-500 files (the repository's data/benchmarks)."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

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


# the digests of the files as published with the project's reference data
PUBLISHED_SHA256 = {
    "gsm8k_test.jsonl": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
    "gsm8k_train.jsonl": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
    "math500_test.jsonl": "a864513f783687921021750dc1d54cf3149d87760727f65ad50ebd8a41964a7d",
}
BENCHMARKS = REPO / "data" / "benchmarks"


def test_the_benchmark_files_in_the_repository_are_the_published_ones():
    listed = dict(reversed(line.split()) for line in (BENCHMARKS / "SHA256SUMS").read_text().splitlines())
    assert {name.lstrip("*"): digest for name, digest in listed.items()} == PUBLISHED_SHA256
    for name, digest in PUBLISHED_SHA256.items():
        assert hashlib.sha256((BENCHMARKS / name).read_bytes()).hexdigest() == digest, name
    assert {"README.md", "LICENSE"} <= {path.name for path in BENCHMARKS.iterdir()}


def test_the_default_is_the_repository_copy_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(prompts.DATA_DIR_ENV, raising=False)
    assert default_data_dir() == BENCHMARKS
    env = {key: value for key, value in os.environ.items() if key != prompts.DATA_DIR_ENV}
    code = ("from nemo_topr.data.prompts import load_gsm8k, load_math500; "
            "print(len(load_gsm8k('test')), len(load_math500()))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.stdout.split() == ["1319", "500"], proc.stderr


def test_split_sizes(train_rows):
    assert (len(train_rows), len(load_gsm8k("test")), len(load_math500())) == (7473, 1319, 500)


def test_gold_completion_strips_calculator_annotations(train_rows):
    answer = train_rows[0]["answer"]
    assert gsm8k_final_answer(answer) == "72"
    assert gsm8k_gold_completion(answer) == (
        " Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\nThe answer is 72."
    )
    assert not any("<<" in gsm8k_gold_completion(row["answer"]) for row in train_rows[:500])


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


def test_no_gsm8k_train_prompt_holds_its_own_worked_solution(train_rows):
    """The exemplars are train rows, so 8 gsm8k-train prompts held their own question and gold
    solution: an exemplar's own prompt now draws another row in its place, the rest keep the set."""
    from nemo_topr.evaluation.problems import benchmark_problems

    problems, exemplars = benchmark_problems("gsm8k-train"), gsm8k_exemplars(train_rows)
    own = [i for i, row in enumerate(train_rows) if row in exemplars]
    assert len(problems) == len(train_rows) and len(own) == 8
    for i, (problem, row) in enumerate(zip(problems, train_rows, strict=True)):
        assert problem.prompt.count(f"Question: {row['question']}\n") == 1, i  # the question asked, only
        assert gsm8k_gold_completion(row["answer"]) not in problem.prompt, i
        assert problem.prompt.count("Question: ") == 9 and problem.prompt.count("The answer is ") == 8, i
        if i not in own:
            assert problem.prompt == gsm8k_prompt(row["question"], exemplars), i
        else:  # the seven others of the set, and one row more
            assert sum(f"Question: {e['question']}\n" in problem.prompt for e in exemplars if e != row) == 7, i


def test_math500_prompt_asks_for_a_boxed_answer():
    row = load_math500()[0]
    prompt = math500_prompt(row["question"])
    assert "\\boxed{}" in prompt and prompt.endswith(row["question"])


def test_data_dir_is_configurable_and_never_downloaded(tmp_path, monkeypatch):
    monkeypatch.setenv(prompts.DATA_DIR_ENV, str(tmp_path))
    assert default_data_dir() == tmp_path
    with pytest.raises(FileNotFoundError) as missing:
        load_gsm8k("train")
    assert (missing.value.key, missing.value.where) == ("benchmark.file.not_found", str(tmp_path / "gsm8k_train.jsonl"))
    (tmp_path / "gsm8k_test.jsonl").write_text('{"question": "1 + 1?", "answer": "#### 2"}\n')
    assert load_gsm8k("test") == [{"question": "1 + 1?", "answer": "#### 2"}]


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_save_to_disk_dataset_dict_stands_in_for_the_gsm8k_files(tmp_path):
    import datasets

    splits = {split: _jsonl(BENCHMARKS / f"gsm8k_{split}.jsonl")[:20] for split in ("train", "test")}
    datasets.DatasetDict({split: datasets.Dataset.from_list(rows) for split, rows in splits.items()}).save_to_disk(
        tmp_path / "gsm8k")
    assert load_gsm8k("test", tmp_path / "gsm8k") == splits["test"]
    assert load_gsm8k("train", tmp_path / "gsm8k") == splits["train"]

    datasets.Dataset.from_list(splits["test"]).save_to_disk(tmp_path / "one_split")
    with pytest.raises(prompts.DataError) as one_split:
        load_gsm8k("test", tmp_path / "one_split")
    assert one_split.value.key == "benchmark.split.single_split_dataset"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(splits["test"])}).save_to_disk(tmp_path / "no_train")
    with pytest.raises(prompts.DataError, match=r"no_train: split: no split 'train'; splits: \['test'\]"):
        load_gsm8k("train", tmp_path / "no_train")


def test_a_save_to_disk_dataset_in_the_hub_math500_layout(tmp_path):
    import datasets

    rows = _jsonl(BENCHMARKS / "math500_test.jsonl")[:5]
    # HuggingFaceH4/MATH-500's columns: problem, solution, answer, subject, level, unique_id
    hub_rows = [{"problem": r["question"], "solution": "...", "answer": r["answer"],
                 "subject": r["metadata"]["subject"], "level": r["metadata"]["level"],
                 "unique_id": r["metadata"]["unique_id"]} for r in rows]
    datasets.Dataset.from_list(hub_rows).save_to_disk(tmp_path / "math500")
    loaded = load_math500(tmp_path / "math500")
    assert [(r["question"], r["answer"], r["unique_id"]) for r in loaded] == [
        (r["question"], r["answer"], r["id"]) for r in rows]
    assert "problem" not in loaded[0]

    datasets.Dataset.from_list([{"problem": "1+1?", "solution": "2"}]).save_to_disk(tmp_path / "no_answer")
    with pytest.raises(prompts.DataError) as no_answer:
        load_math500(tmp_path / "no_answer")
    assert (no_answer.value.key, no_answer.value.where) == ("benchmark.answer.column_missing",
                                                            f"{tmp_path / 'no_answer'}: answer")


def test_a_users_benchmark_file_is_read_row_by_row_naming_file_line_and_field(tmp_path):
    """A user's copy of a benchmark (--data-dir): an odd row ended `eval` in a KeyError traceback,
    a broken line in `Expecting value: line 2 column 1`, naming neither file nor line."""
    good = '{"question": "1 + 1?", "answer": "So 2.\\n#### 2"}\n'
    path = tmp_path / "gsm8k_test.jsonl"
    path.write_text(good + '{"question": "2 + 2?", "answer": \n')
    with pytest.raises(prompts.DataError, match=rf"^{path}:2: record: invalid JSON: Expecting value"):
        load_gsm8k("test", tmp_path)
    for second, key, field in (
            ('{"q": "2 + 2?", "answer": "#### 4"}\n', "benchmark.question.not_text", "question"),
            ('{"question": "2 + 2?", "answer": 4}\n', "benchmark.answer.not_text", "answer"),
            ('{"question": " ", "answer": "#### 4"}\n', "benchmark.question.not_text", "question"),
            ('["2 + 2?", "4"]\n', "benchmark.record.not_an_object", "record"),
            ('{"question": "2 + 2?", "answer": "4"}\n', "benchmark.answer.no_final_line", "answer")):
        path.write_text(good + second)
        with pytest.raises(prompts.DataError) as refused:
            load_gsm8k("test", tmp_path)
        assert (refused.value.key, refused.value.where) == (key, f"{path}:2: {field}")
    # MATH-500 as the hub writes it (`problem`), in JSONL too, as a saved dataset already was read
    (tmp_path / "math500_test.jsonl").write_text('{"problem": "1 + 1?", "answer": "2", "unique_id": "a"}\n')
    assert load_math500(tmp_path) == [{"question": "1 + 1?", "answer": "2", "unique_id": "a"}]


def _write_gsm8k(path, answers):
    path.write_text("".join(json.dumps({"question": f"Q{i}?", "answer": answer}) + "\n"
                            for i, answer in enumerate(answers)))


def test_a_train_file_too_short_for_the_eight_shot_prompt_is_refused_naming_it(tmp_path):
    """A 3-row gsm8k_train.jsonl ended `eval` with random.sample's `Sample larger than population or is
    negative`, naming neither the file nor what it lacked."""
    from nemo_topr.evaluation.problems import load_problems

    train = tmp_path / "gsm8k_train.jsonl"
    _write_gsm8k(train, ["So 1.\n#### 1", "So 2.\n#### 2", "So 3.\n#### 3"])
    _write_gsm8k(tmp_path / "gsm8k_test.jsonl", ["So 4.\n#### 4"])
    expected = ("benchmark.file.too_few_rows", f"{train}: file")
    with pytest.raises(prompts.DataError) as short:
        gsm8k_exemplars(load_gsm8k("train", tmp_path))
    assert (short.value.key, short.value.where) == expected
    with pytest.raises(prompts.DataError) as via_eval:  # eval's and generate's reading, before any sampling
        load_problems("gsm8k-test", data_dir=tmp_path)
    assert (via_eval.value.key, via_eval.value.where) == expected
    with pytest.raises(prompts.DataError) as unnamed:  # rows not read from a file: no file to name
        gsm8k_exemplars([{"question": "Q?", "answer": "#### 1"}])
    assert (unnamed.value.key, unnamed.value.where) == ("benchmark.file.too_few_rows", "GSM8K train rows: file")

    _write_gsm8k(train, [f"So {i}.\n#### {i}" for i in range(8)])  # eight are enough: all of them, in a seeded order
    exemplars = gsm8k_exemplars(load_gsm8k("train", tmp_path))
    assert sorted(row["question"] for row in exemplars) == [f"Q{i}?" for i in range(8)]
    with pytest.raises(prompts.DataError) as own:  # but not for their own prompts, which would hold themselves
        load_problems("gsm8k-train", data_dir=tmp_path)
    assert (own.value.key, own.value.where) == ("benchmark.file.only_the_exemplars", f"{train}: file")


def test_a_gsm8k_answer_whose_final_line_has_no_number_is_refused_when_read(tmp_path):
    """`#### ` with no number was read without complaint; `eval` sampled every problem, then failed with
    `GSM8K reference has no number: ''`, naming neither file nor row."""
    from nemo_topr.evaluation.problems import load_problems

    _write_gsm8k(tmp_path / "gsm8k_train.jsonl", [f"So {i}.\n#### {i}" for i in range(8)])
    test = tmp_path / "gsm8k_test.jsonl"
    for final in ("#### ", "#### n/a"):
        _write_gsm8k(test, ["So 1,200.\n#### 1,200", f"so\n{final}"])
        with pytest.raises(prompts.DataError) as read:
            load_gsm8k("test", tmp_path)
        assert (read.value.key, read.value.where) == ("benchmark.answer.final_line_unreadable", f"{test}:2: answer")
        with pytest.raises(prompts.DataError) as via_eval:  # eval's and generate's reading, before any sampling
            load_problems("gsm8k-test", data_dir=tmp_path, limit=1)
        assert str(via_eval.value) == str(read.value)
    # the exemplars' file too: a bad one would show the model "The answer is ."
    train = tmp_path / "gsm8k_train.jsonl"
    _write_gsm8k(train, ["so\n#### ", *(f"So {i}.\n#### {i}" for i in range(8))])
    with pytest.raises(prompts.DataError) as exemplar:
        load_gsm8k("train", tmp_path)
    assert (exemplar.value.key, exemplar.value.where) == ("benchmark.answer.final_line_unreadable",
                                                          f"{train}:1: answer")
