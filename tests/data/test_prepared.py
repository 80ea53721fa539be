"""Prepared data sets (`nemo_topr.data.prepared`): found again by content without tokenizing, a
changed data file or tokenizer is another set, concurrent writers end with one whole set, a
damaged set is rebuilt, and `nemo-topr data prepare` writes the set `train` reads."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.conftest import REPO, checkout_env, placeholder_hf_model
from nemo_topr.data.prepared import PrepareSpec, PreparedSetError, find_or_prepare, key_of, set_problem

DATA = REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl"
SEQ_LENGTH = 512


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    directory = tmp_path_factory.mktemp("tokenizer")
    build_tiny_tokenizer(directory)
    return directory


@pytest.fixture
def tokenizer_calls(monkeypatch):
    """How often a tokenizer encodes (its __call__), in this process."""
    from transformers import PreTrainedTokenizerBase

    calls = []
    encode = PreTrainedTokenizerBase.__call__

    def counted(self, *args, **kwargs):
        calls.append(1)
        return encode(self, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", counted)
    return calls


def _spec(tokenizer_dir, data=DATA, **settings) -> PrepareSpec:
    return PrepareSpec(train_path=str(data), tokenizer_dir=str(tokenizer_dir), **{"seq_length": SEQ_LENGTH, **settings})


def _sets(prepared_dir) -> list[str]:
    return sorted(path.name for path in prepared_dir.iterdir())


def test_a_second_start_finds_the_set_without_tokenizing(tmp_path, tokenizer_dir, tokenizer_calls):
    first, written = find_or_prepare(_spec(tokenizer_dir), tmp_path)
    assert written and len(tokenizer_calls) == 2  # the prompts, then the completions: one chunk
    tokenizer_calls.clear()
    again, written = find_or_prepare(_spec(tokenizer_dir), tmp_path)
    assert not written and tokenizer_calls == []
    assert again.path == first.path and _sets(tmp_path) == [first.path.name]
    lines = DATA.read_text().splitlines()
    assert again.manifest["sequences"] == len(lines) == len(again.table)
    # the arrays are what the records say, read back from disk
    assert again.table.rewards.tolist() == [json.loads(line)["reward"] for line in lines]
    assert isinstance(again.table.tokens, np.memmap) and again.table.tokens.dtype == np.uint32


def _with_too_long_records(path, lines_too_long: tuple[int, ...]):
    """The fixture's records with the completions of `lines_too_long` (1-based) over SEQ_LENGTH tokens."""
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    for line in lines_too_long:
        rows[line - 1]["completion"] = " and so on" * SEQ_LENGTH
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _set_files(prepared) -> dict[str, bytes]:
    """Every file of a set, the manifest without its time of writing."""
    files = {path.name: path.read_bytes() for path in prepared.path.iterdir() if path.name != "manifest.json"}
    manifest = dict(prepared.manifest)
    del manifest["prepared_at"]
    return {**files, "manifest.json": json.dumps(manifest).encode()}


def test_every_core_writes_the_bytes_one_process_writes_with_the_same_drops(tmp_path, tokenizer_dir, monkeypatch):
    """Chunks tokenized in two worker processes give the files, drops and report of one process;
    both hold the sequences the in-memory path tokenizes."""
    from nemo_topr.data import prepared as prepared_module
    from nemo_topr.data.packing import set_group_mean_rewards
    from nemo_topr.data.records import load_records
    from nemo_topr.data.sequence_table import SequenceTable
    from nemo_topr.data.tokenization import load_tokenizer, tokenize_records

    monkeypatch.setattr(prepared_module, "CHUNK_RECORDS", 5)  # 24 records: 5 chunks, drops in two
    data = _with_too_long_records(tmp_path / "data.jsonl", (4, 17))
    spec = _spec(tokenizer_dir, data, strict=False)
    one, _ = find_or_prepare(spec, tmp_path / "one", processes=1)
    two, _ = find_or_prepare(spec, tmp_path / "two", processes=2)
    assert _set_files(one) == _set_files(two)
    assert two.report.dropped == {"too_long": 2} and two.manifest["sequences"] == 22
    assert two.report.first_error["too_long"].startswith(f"{data}:4: completion:")
    records = load_records(str(data), strict=False)
    in_memory = tokenize_records(records, load_tokenizer(tokenizer_dir), max_seq_length=SEQ_LENGTH, strict=False)
    set_group_mean_rewards(in_memory.sequences)
    expected = SequenceTable.from_sequences(in_memory.sequences)
    assert two.table.digest() == expected.digest() and two.prompt_keys == in_memory.prompt_keys
    assert two.table.sample_ids.tolist() == [k for k in range(24) if k not in (3, 16)]


def test_in_strict_mode_the_first_refused_record_is_named_and_nothing_is_written(tmp_path, tokenizer_dir,
                                                                                 monkeypatch):
    from nemo_topr.data import prepared as prepared_module
    from nemo_topr.data.schema import DataError

    monkeypatch.setattr(prepared_module, "CHUNK_RECORDS", 5)
    data = _with_too_long_records(tmp_path / "data.jsonl", (9, 17))  # the second chunk's fourth record first
    for processes in (1, 2):
        with pytest.raises(DataError) as refused:
            find_or_prepare(_spec(tokenizer_dir, data), tmp_path / "sets", processes=processes)
        assert (refused.value.key, refused.value.where) == ("record.completion.too_long", f"{data}:9: completion")
        assert _sets(tmp_path / "sets") == []


def test_the_row_order_digest_block_by_block_is_that_of_its_rows(monkeypatch):
    """A start digests all epochs' rows a block at a time; the digest is that of the rows as lists."""
    from nemo_topr.data import sequence_table
    from nemo_topr.data.sequence_table import RowOrder, rows_digest

    monkeypatch.setattr(sequence_table, "BLOCK_ROWS", 3)
    sizes = [3, 1, 2, 4, 1, 1, 2]  # an epoch of 7 rows over 14 sequences, shuffled 2 epochs: 5 blocks
    row_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    members = np.random.default_rng(0).permutation(14).astype(np.int64)
    order = RowOrder(row_offsets, members, epochs=2, seed=7, filler=2)
    rows = [list(row) for row in order]
    assert len(rows) == 16 and rows[-2:] == [[], []]
    assert sorted(i for row in rows for i in row) == sorted(2 * list(range(14)))
    assert rows_digest(order) == rows_digest(rows)


def test_a_changed_data_file_tokenizer_or_setting_is_another_set(tmp_path, tokenizer_dir):
    found, _ = find_or_prepare(_spec(tokenizer_dir), tmp_path / "sets")
    lines = DATA.read_text().splitlines()
    record = json.loads(lines[0])
    record["reward"] = -record["reward"]  # one reward of one record
    changed = tmp_path / "changed.jsonl"
    changed.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    other_data, written = find_or_prepare(_spec(tokenizer_dir, changed), tmp_path / "sets")
    assert written and other_data.path != found.path
    assert other_data.table.rewards[0] == -found.table.rewards[0]
    assert other_data.table.digest() != found.table.digest()

    edited = tmp_path / "tokenizer"
    edited.mkdir()
    for file in tokenizer_dir.iterdir():
        (edited / file.name).write_bytes(file.read_bytes())
    config = json.loads((edited / "tokenizer_config.json").read_text())
    (edited / "tokenizer_config.json").write_text(json.dumps({**config, "padding_side": "left"}))
    other_tokenizer, written = find_or_prepare(_spec(edited), tmp_path / "sets")
    assert written and other_tokenizer.path != found.path
    shorter, written = find_or_prepare(_spec(tokenizer_dir, seq_length=1024), tmp_path / "sets")
    assert written and shorter.path != found.path
    assert len(_sets(tmp_path / "sets")) == 4


def test_a_truncated_set_is_rebuilt_and_a_waiting_rank_names_what_it_waits_for(tmp_path, tokenizer_dir,
                                                                              tokenizer_calls):
    found, _ = find_or_prepare(_spec(tokenizer_dir), tmp_path)
    tokens = found.path / "tokens.bin"
    whole = tokens.read_bytes()
    del found
    tokens.write_bytes(whole[:-4])  # one token short, as an interrupted copy leaves it
    assert "tokens.bin holds" in set_problem(tokens.parent)
    with pytest.raises(PreparedSetError) as waited:  # a rank that does not write waits, then names the set
        find_or_prepare(_spec(tokenizer_dir), tmp_path, write=False, wait_timeout=0.3, poll=0.1)
    assert (waited.value.key, waited.value.where) == ("prepared_set.not_written_in_time", str(tokens.parent))
    assert "tokens.bin" in str(waited.value)  # what it waits for
    tokenizer_calls.clear()
    rebuilt, written = find_or_prepare(_spec(tokenizer_dir), tmp_path)
    assert written and tokenizer_calls and rebuilt.path == tokens.parent
    assert tokens.read_bytes() == whole and set_problem(rebuilt.path) is None
    assert _sets(tmp_path) == [rebuilt.path.name]  # the damaged copy moved aside and removed
    (rebuilt.path / "manifest.json").unlink()  # a set without its manifest was never published
    assert "manifest.json is missing" in set_problem(rebuilt.path)


WRITER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from nemo_topr.data import prepared

    data, tokenizer, out, go, role = sys.argv[1:]
    write_set = prepared.write_set

    def slow_write(*args):  # both writers are past the check for a set before either publishes
        write_set(*args)
        time.sleep(1.5)

    prepared.write_set = slow_write
    while not Path(go).exists():
        time.sleep(0.01)
    spec = prepared.PrepareSpec(train_path=data, tokenizer_dir=tokenizer, seq_length=512)
    found, written = prepared.find_or_prepare(spec, out, write=role == "writer", poll=0.01)
    tokens = Path(found.path / "tokens.bin").read_bytes()  # what a reader reads, whole or not at all
    print(json.dumps({"written": written, "tokens": len(tokens), "manifest": found.manifest["tokens"]}))
""")


@pytest.mark.slow
def test_two_processes_preparing_at_once_end_with_one_whole_set(tmp_path, tokenizer_dir):
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(DATA), str(tokenizer_dir), str(tmp_path / "sets"),
                               str(go), role], cwd=REPO, env=checkout_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for role in ("writer", "writer", "reader")]
    time.sleep(3)  # the imports
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.splitlines()[-1]))
    assert sorted(result["written"] for result in results) == [False, False, True]  # one rename won
    assert all(result["tokens"] == 4 * result["manifest"] > 0 for result in results)
    (only,) = _sets(tmp_path / "sets")  # no partial directory left behind
    assert set_problem(tmp_path / "sets" / only) is None
    manifest = json.loads((tmp_path / "sets" / only / "manifest.json").read_text())
    assert key_of(manifest["key"]) == only


def test_data_prepare_writes_the_set_train_finds(tmp_path, monkeypatch, capsys, megatron_world):
    """`nemo-topr data prepare` with a training config and ToprDatasetConfig set up as
    `build_training_run` sets it up find the same set."""
    from nemo_topr.cli import main
    from nemo_topr.training.data import ToprDatasetConfig

    model = placeholder_hf_model(tmp_path / "model")
    monkeypatch.delenv("NEMO_TOPR_PREPARED_DIR", raising=False)
    overrides = [f"base_model={model}", f"run_dir={tmp_path / 'runs' / 'a'}", f"dataset.train_path={DATA}",
                 "dataset.seq_length=1024", "model.seq_length=1024"]
    assert main(["data", "prepare", "--config-name", "tiny_cpu", *overrides]) == 0
    printed = capsys.readouterr().out
    (key,) = _sets(tmp_path / "runs" / "prepared_data")
    assert printed.startswith(f"wrote {tmp_path / 'runs' / 'prepared_data' / key}: 24 sequences")
    config = ToprDatasetConfig(train_path=str(DATA), tokenizer_dir=str(model), seq_length=1024,
                               prepared_dir=str(tmp_path / "runs" / "prepared_data"))  # the model names no context
    assert config.prepare(global_batch_size=2).written is False
    assert main(["data", "prepare", "--config-name", "tiny_cpu", *overrides]) == 0
    assert capsys.readouterr().out.startswith(f"found {tmp_path / 'runs' / 'prepared_data' / key}")


def test_prepare_spec_defaults_are_the_dataset_configs(megatron_world):
    """`data prepare` fills in what a config leaves out as `ToprDatasetConfig` does."""
    import dataclasses

    from nemo_topr.training.data import ToprDatasetConfig

    config = {field.name: field.default for field in dataclasses.fields(ToprDatasetConfig)}
    spec = {field.name: field.default for field in dataclasses.fields(PrepareSpec)
            if field.default is not dataclasses.MISSING and field.name != "columns"}  # {} and None: no mapping
    assert spec == {name: config[name] for name in spec}
