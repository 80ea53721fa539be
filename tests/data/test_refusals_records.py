"""Scored data's refusals as a table: one row per problem, its bad input → the problem's key and where.

The rows assert the key and where (``FILE:ROW: FIELD``, or ``FILE: FIELD`` for the file as a whole) only; the words
are in tests/golden/refusals.txt (tests/refusal_table.py), read as a whole and compared here
(``NEMO_TOPR_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/data/test_refusals_records.py`` rewrites this table's
section), so rewording a message changes that file and no test. Every key `nemo_topr.data.records` and
`nemo_topr.data.sources` can raise has a row: a new refusal without one fails
`test_the_table_covers_every_key_the_code_raises`.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.conftest import REPO, checkout_env
from tests.refusal_table import assert_covers, assert_golden, raised, rendered, row_tests

from nemo_topr.data.records import DataError, load_records, require_scored
from nemo_topr.data.sources import ColumnMapping, open_sources

SOURCES = [REPO / "nemo_topr" / "data" / name for name in ("records.py", "sources.py")]
# the calls that make a refusal of these files: each names its key= and where=
REFUSING = {"refusal", "rejected", "KeyGivenTwice"}

GOOD = {"prompt": "q", "completion": "a", "reward": 1}


def refused(*args, **kwargs) -> tuple[str, str]:
    """(key, where) of the DataError `load_records(*args, **kwargs)` raises: how the area's other tests
    name a refusal."""
    with pytest.raises(DataError) as caught:
        load_records(*args, **kwargs)
    return caught.value.key, caught.value.where


def row(**changes: object) -> dict:
    """A valid record but for `changes` (a value None: the field left out)."""
    return {name: value for name, value in {**GOOD, **changes}.items() if value is not None}


def messages(*pairs: tuple[object, object]) -> list[dict]:
    return [{"role": role, "content": content} for role, content in pairs]


# file → its records, one JSON line each (bytes: the line as written)
JSONL = {
    "good.jsonl": [GOOD],
    "message_not_object.jsonl": [row(prompt=["q"])],
    "role_not_string.jsonl": [row(prompt=messages((1, "q")))],
    "role_unknown.jsonl": [row(prompt=messages(("usr", "q")))],
    "content_surrogate.jsonl": [b'{"prompt": [{"role": "user", "content": "\\ud83d"}], "completion": "a", "reward": 1}'],
    "assistant_last.jsonl": [row(prompt=messages(("user", "q"), ("assistant", "a")))],
    "last_user_empty.jsonl": [row(prompt=messages(("system", "s"), ("user", "")))],
    "messages_empty.jsonl": [row(prompt=messages(("system", "")))],
    "chat_prompt.jsonl": [row(prompt=messages(("user", "q")))],
    "completion_not_assistant.jsonl": [row(completion=messages(("user", "a")))],
    "not_object.jsonl": [[1]],
    "misspelt.jsonl": [row(rewrad=2)],
    "no_reward.jsonl": [row(reward=None)],
    "prompt_number.jsonl": [row(prompt=5)],
    "completion_number.jsonl": [row(completion=5)],
    "reward_string.jsonl": [row(reward="1")],
    "sample_id_boolean.jsonl": [row(sample_id=True)],
    "meta_array.jsonl": [row(meta=[1])],
    "completion_surrogate.jsonl": [b'{"prompt": "q", "completion": "\\ud83d", "reward": 1}'],
    "reward_nan.jsonl": [b'{"prompt": "q", "completion": "a", "reward": NaN}'],
    "reward_huge.jsonl": [row(reward=1e300)],
    "logprob_positive.jsonl": [row(behavior_logprob=0.5)],
    "baseline_infinite.jsonl": [b'{"prompt": "q", "completion": "a", "reward": 1, "baseline": Infinity}'],
    "baseline_huge.jsonl": [row(baseline=1e7)],
    "prompt_empty.jsonl": [row(prompt="")],
    "completion_empty.jsonl": [row(completion="")],
    "scored.jsonl": [row(behavior_logprob=-1.0)],
    "schema_within.jsonl": [GOOD, row(behavior_logprob=-1.0)],
    "prompt_id_two_prompts.jsonl": [row(prompt_id=5), row(prompt="other", prompt_id=5)],
    "sample_id_twice.jsonl": [row(sample_id=0), row(sample_id=0)],
    "empty.jsonl": [b""],
    "key_twice.jsonl": [b'{"prompt": "q", "completion": "a", "reward": 1, "reward": 0}'],
    "not_utf8.jsonl": [b'{"prompt": "\xff"}'],
    "not_json.jsonl": [b"{"],
    "prompt_and_question.jsonl": [row(question="q2")],
    "meta_clash.jsonl": [row(meta={"x": 1}, x=2)],
}


def make_inputs(root: Path) -> None:
    """The files the rows name, relative to `root` (the rows run there)."""
    for name, records in JSONL.items():
        lines = [record if isinstance(record, bytes) else json.dumps(record).encode() for record in records]
        (root / name).write_bytes(b"\n".join(lines) + b"\n")
    pq.write_table(pa.Table.from_pylist([GOOD]), root / "good.parquet")
    pq.write_table(pa.Table.from_pylist([{"prompt": "q", "completion": "a"}]), root / "no_reward.parquet")
    (root / "corrupt.parquet").write_bytes(b"not parquet")
    (root / "corrupt.arrow").write_bytes(b"not arrow")
    (root / "records.json").write_text(json.dumps(GOOD) + "\n")  # JSON Lines named .json, as to_json writes
    os.mkfifo(root / "fifo")
    (root / "notes").mkdir()
    (root / "notes" / "README.txt").write_text("no data here\n")
    (root / "splits").mkdir()
    (root / "splits" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    (root / "broken_dataset").mkdir()
    for name in ("dataset_info.json", "state.json"):
        (root / "broken_dataset" / name).write_text("{}")


def hub(loaded: Exception | object):
    """`load_records` of a hub dataset whose `datasets.load_dataset` raises or returns `loaded` (no network)."""
    def problem():
        effect = {"side_effect": loaded} if isinstance(loaded, Exception) else {"return_value": loaded}
        with mock.patch.object(datasets, "load_dataset", **effect):
            return raised(load_records, "hub:owner/name")()
    return problem


# (key, where, the problem's source: the pure function given the bad input)
ROWS = [
    ("record.prompt.message.not_an_object", "message_not_object.jsonl:1: prompt[0]",
     raised(load_records, "message_not_object.jsonl")),
    ("record.prompt.message.role.not_a_string", "role_not_string.jsonl:1: prompt[0].role",
     raised(load_records, "role_not_string.jsonl")),
    ("record.prompt.message.role.unknown", "role_unknown.jsonl:1: prompt[0].role",
     raised(load_records, "role_unknown.jsonl")),
    ("record.prompt.message.content.lone_surrogate", "content_surrogate.jsonl:1: prompt[0].content",
     raised(load_records, "content_surrogate.jsonl")),
    ("record.prompt.ends_with_assistant", "assistant_last.jsonl:1: prompt[1].role",
     raised(load_records, "assistant_last.jsonl")),
    ("record.prompt.last_user_message.empty", "last_user_empty.jsonl:1: prompt[1].content",
     raised(load_records, "last_user_empty.jsonl")),
    ("record.prompt.messages.empty", "messages_empty.jsonl:1: prompt", raised(load_records, "messages_empty.jsonl")),
    ("record.completion.not_one_assistant_message", "completion_not_assistant.jsonl:1: completion",
     raised(load_records, "completion_not_assistant.jsonl")),
    ("record.not_an_object", "not_object.jsonl:1: record", raised(load_records, "not_object.jsonl")),
    ("record.unknown_field", "misspelt.jsonl:1: rewrad", raised(load_records, "misspelt.jsonl")),
    ("record.reward.missing", "no_reward.jsonl:1: reward", raised(load_records, "no_reward.jsonl")),
    ("record.prompt.wrong_type", "prompt_number.jsonl:1: prompt", raised(load_records, "prompt_number.jsonl")),
    ("record.completion.wrong_type", "completion_number.jsonl:1: completion",
     raised(load_records, "completion_number.jsonl")),
    ("record.reward.not_a_number", "reward_string.jsonl:1: reward", raised(load_records, "reward_string.jsonl")),
    ("record.sample_id.not_an_id", "sample_id_boolean.jsonl:1: sample_id",
     raised(load_records, "sample_id_boolean.jsonl")),
    ("record.meta.not_an_object", "meta_array.jsonl:1: meta", raised(load_records, "meta_array.jsonl")),
    ("record.completion.lone_surrogate", "completion_surrogate.jsonl:1: completion",
     raised(load_records, "completion_surrogate.jsonl")),
    ("record.reward.not_finite", "reward_nan.jsonl:1: reward", raised(load_records, "reward_nan.jsonl")),
    ("record.reward.out_of_range", "reward_huge.jsonl:1: reward", raised(load_records, "reward_huge.jsonl")),
    ("record.behavior_logprob.not_a_logprob", "logprob_positive.jsonl:1: behavior_logprob",
     raised(load_records, "logprob_positive.jsonl")),
    ("record.baseline.not_finite", "baseline_infinite.jsonl:1: baseline",
     raised(load_records, "baseline_infinite.jsonl")),
    ("record.baseline.out_of_range", "baseline_huge.jsonl:1: baseline", raised(load_records, "baseline_huge.jsonl")),
    ("record.prompt.empty", "prompt_empty.jsonl:1: prompt", raised(load_records, "prompt_empty.jsonl")),
    ("record.completion.empty", "completion_empty.jsonl:1: completion", raised(load_records, "completion_empty.jsonl")),
    ("record.prompt.not_rendered", "chat_prompt.jsonl:1: prompt",
     raised(load_records, "chat_prompt.jsonl", rendered_prompts=True)),
    ("dataset.behavior_logprob.absent", "good.jsonl: behavior_logprob",
     raised(lambda: require_scored(load_records("good.jsonl")))),
    ("dataset.schema.differs_between_files", "scored.jsonl:1: behavior_logprob",
     raised(load_records, ["good.jsonl", "scored.jsonl"])),
    ("record.schema.differs_within_file", "schema_within.jsonl:2: behavior_logprob",
     raised(load_records, "schema_within.jsonl")),
    ("record.prompt.conflicts", "prompt_id_two_prompts.jsonl:2: prompt",
     raised(load_records, "prompt_id_two_prompts.jsonl")),
    ("record.sample_id.duplicate", "sample_id_twice.jsonl:2: sample_id", raised(load_records, "sample_id_twice.jsonl")),
    ("file.empty", "empty.jsonl: file", raised(load_records, "empty.jsonl")),
    ("dataset.no_usable_records", "reward_nan.jsonl: dataset", raised(load_records, "reward_nan.jsonl", strict=False)),
    ("path.named_twice", "good.jsonl: path", raised(load_records, ["good.jsonl", "good.jsonl"])),
    ("format.mixed", "good.jsonl,good.parquet: format", raised(load_records, ["good.jsonl", "good.parquet"])),
    ("split.without_splits", "good.jsonl: split", raised(open_sources, "good.jsonl", split="train")),
    ("path.unknown_format", "records.json: path", raised(load_records, "records.json")),
    ("path.not_a_file_or_directory", "fifo: path", raised(load_records, "fifo")),
    ("path.not_a_hub_name", "hub:a b: path", raised(load_records, "hub:a b")),
    ("path.missing", "note: path", raised(load_records, "note")),
    ("path.no_data_files", "notes: path", raised(load_records, "notes")),
    ("record.key_given_twice", "key_twice.jsonl:1: reward", raised(load_records, "key_twice.jsonl")),
    ("record.invalid_utf8", "not_utf8.jsonl:1: record", raised(load_records, "not_utf8.jsonl")),
    ("record.invalid_json", "not_json.jsonl:1: record", raised(load_records, "not_json.jsonl")),
    ("file.parquet_unreadable", "corrupt.parquet: file", raised(load_records, "corrupt.parquet")),
    ("file.arrow_unreadable", "corrupt.arrow: file", raised(load_records, "corrupt.arrow")),
    ("split.not_chosen", "splits: split", raised(load_records, "splits")),
    ("split.unknown", "splits: split", raised(load_records, "splits", split="test")),
    ("split.of_a_dataset_without_splits", "broken_dataset: split", raised(load_records, "broken_dataset", split="x")),
    ("file.saved_dataset_unloadable", "broken_dataset: file", raised(load_records, "broken_dataset")),
    ("path.hub_unloadable", "hub:owner/name: path", hub(ConnectionError("no network"))),
    ("split.not_chosen_on_hub", "hub:owner/name: split",
     hub(datasets.IterableDatasetDict({"train": None, "test": None}))),
    ("extra_columns.invalid", "good.jsonl: extra_columns",
     raised(ColumnMapping.parse, None, extra_columns="drop", source="good.jsonl")),
    ("columns.not_field_equals_column", "good.jsonl: columns", raised(ColumnMapping.parse, "prompt", source="good.jsonl")),
    ("columns.unknown_field", "good.jsonl: columns", raised(ColumnMapping.parse, {"score": "s"}, source="good.jsonl")),
    ("columns.not_a_column_name", "good.jsonl: columns", raised(ColumnMapping.parse, {"prompt": ""}, source="good.jsonl")),
    ("columns.field_mapped_twice", "good.jsonl: columns",
     raised(ColumnMapping.parse, "prompt=a,prompt=b", source="good.jsonl")),
    ("columns.column_mapped_twice", "good.jsonl: columns",
     raised(ColumnMapping.parse, "prompt=a,completion=a", source="good.jsonl")),
    ("columns.mapped_column_missing", "good.jsonl:1: prompt", raised(load_records, "good.jsonl", columns="prompt=ask")),
    ("columns.column_named_as_mapped_field", "prompt_and_question.jsonl:1: prompt",
     raised(load_records, "prompt_and_question.jsonl", columns="prompt=question")),
    ("extra_columns.key_of_meta", "meta_clash.jsonl:1: meta",
     raised(load_records, "meta_clash.jsonl", extra_columns="meta")),
    ("columns.required_missing", "no_reward.parquet: reward", raised(load_records, "no_reward.parquet")),
]


inputs, test_each_bad_input_raises_its_problem = row_tests(ROWS, make_inputs)


def test_the_rows_inputs_pass_but_for_their_change(inputs, monkeypatch):
    """What each row changes is its problem: the good record loads, from JSONL and from Parquet."""
    monkeypatch.chdir(inputs)
    assert [record.reward for record in load_records("good.jsonl").records] == [1.0]
    assert load_records("good.parquet").report.records_used == 1
    assert ColumnMapping.parse("prompt=question", source="good.jsonl").columns == {"prompt": "question"}


def test_the_table_covers_every_key_the_code_raises():
    assert_covers(ROWS, SOURCES, REFUSING)


def test_a_data_error_is_made_only_by_the_calls_that_name_its_key():
    """`DataError(...)` itself is built only inside `refusal`, `rejected` and `Record.error` (which the
    evaluation's checks call), so the coverage check over `REFUSING` sees every refusal of these files."""
    makers = set()
    for source in SOURCES:
        functions = [node for node in ast.walk(ast.parse(source.read_text())) if isinstance(node, ast.FunctionDef)]
        for function in functions:
            nested = {id(node) for inner in functions if inner is not function and inner in ast.walk(function)
                      for node in ast.walk(inner)}
            makers |= {function.name for node in ast.walk(function) if id(node) not in nested
                       and isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "DataError"}
    assert makers <= REFUSING | {"error"} and {"refusal", "rejected"} <= makers


def test_the_messages_are_the_golden_files(inputs, monkeypatch):
    monkeypatch.chdir(inputs)
    assert_golden("tests/data/test_refusals_records.py",
                  [rendered("data", key, where, *problem(), inputs) for key, where, problem in ROWS])


def test_the_table_imports_no_megatron_and_writes_nothing(tmp_path):
    """Each problem comes out of reading the data: the whole table, run in a fresh interpreter, imports
    neither Megatron nor Transformer Engine, and leaves its inputs as they were."""
    code = ("import json, sys; from pathlib import Path; import tests.data.test_refusals_records as table; "
            "table.make_inputs(Path.cwd()); before = sorted(map(str, Path.cwd().rglob('*'))); "
            "keys = [row[2]()[0].key for row in table.ROWS]; "
            "print(json.dumps([len(keys), sorted(map(str, Path.cwd().rglob('*'))) == before, sorted(m for m in "
            "sys.modules if m.startswith(('megatron', 'transformer_engine')))]))")
    env = checkout_env()
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [len(ROWS), True, []]
