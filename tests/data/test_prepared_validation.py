"""`nemo-topr data validate|stats --tokenizer T --max-seq-length N` through the prepared form
(`nemo_topr.data.prepared_validation`): the report and token lengths are the in-memory ones, the
set is found again without tokenizing, and it is the set `train` (`data prepare`) finds."""

from __future__ import annotations

import json

import pytest

from tests.conftest import placeholder_hf_model
from tests.data.test_prepared import tokenizer_calls  # noqa: F401 (a fixture)
from nemo_topr.cli import main
from nemo_topr.data.packing import pack_sequences, padding_share
from nemo_topr.data.records import load_records
from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer
from nemo_topr.data.tokenization import load_tokenizer, tokenize_records
from tests.data.test_cli import MALFORMED, SCORED


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tiny_tokenizer(directory, chat_template=False)
    return directory


def _in_memory_report(path, tokenizer_dir, seq_length: int, *, strict: bool) -> str:
    """The report as validate computed it from token lists: tokenize, pack, count the padding."""
    records = load_records([str(path)], strict=strict)
    tokenized = tokenize_records(records, load_tokenizer(tokenizer_dir), max_seq_length=seq_length, strict=strict)
    rows = pack_sequences(tokenized.sequences, seq_length, 0)
    share = padding_share(tokenized.sequences, rows, seq_length)
    return records.report.format() + f"\npacked into {len(rows)} rows of {seq_length} tokens, padding share {share:.2%}"


@pytest.mark.parametrize("path, seq_length, strict", [(SCORED, 512, True), (SCORED, 2048, True),
                                                      (MALFORMED, 256, False)], ids=["512", "2048", "drops"])
def test_the_report_read_from_the_set_is_the_in_memory_one(path, seq_length, strict, tokenizer_dir, tmp_path,
                                                           capsys, monkeypatch):
    monkeypatch.delenv("NEMO_TOPR_PREPARED_DIR", raising=False)
    strictness = [] if strict else ["--no-strict"]
    argv = ["data", "validate", str(path), *strictness, "--tokenizer", str(tokenizer_dir),
            "--max-seq-length", str(seq_length), "--prepared-dir", str(tmp_path / "sets")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(_in_memory_report(path, tokenizer_dir, seq_length, strict=strict) + "\n")
    assert len(list((tmp_path / "sets").iterdir())) == 1  # kept for train
    assert main(argv[:-2]) == 0  # in a temporary directory, removed at the end
    assert capsys.readouterr().out == printed


def test_rows_and_padding_share_by_hand(tokenizer_dir, tmp_path, capsys):
    """Two records of 4 + 3 tokens (prompt + completion + EOS) in rows of 5: one row each, padding 3/10."""
    data = tmp_path / "two.jsonl"
    data.write_text('{"prompt": "a b", "completion": " c", "reward": 1.0, "behavior_logprob": -1.0}\n'
                    '{"prompt": "a", "completion": " c", "reward": -1.0, "behavior_logprob": -1.0}\n')
    tokenizer = load_tokenizer(tokenizer_dir)
    lengths = [len(tokenizer(prompt)["input_ids"]) + 2 for prompt in ("a b", "a")]  # " c" and EOS
    assert main(["data", "validate", str(data), "--tokenizer", str(tokenizer_dir), "--max-seq-length",
                 str(max(lengths)), "--prepared-dir", str(tmp_path / "sets")]) == 0
    share = 1 - sum(lengths) / (2 * max(lengths))
    assert f"packed into 2 rows of {max(lengths)} tokens, padding share {share:.2%}" in capsys.readouterr().out


def test_a_second_validate_finds_the_set_and_data_prepare_finds_it_for_train(tmp_path, monkeypatch, capsys,
                                                                              tokenizer_calls,  # noqa: F811
                                                                              megatron_world):
    """validate --tokenizer MODEL --prepared-dir D writes the set once; a second validate reads it
    without tokenizing, and `data prepare` with a config of that model, data and seq_length finds it."""
    model = placeholder_hf_model(tmp_path / "model", {"architectures": ["LlamaForCausalLM"],
                                                      "max_position_embeddings": 4096})
    sets = tmp_path / "sets"
    argv = ["data", "validate", str(SCORED), "--tokenizer", str(model), "--max-seq-length", "1024",
            "--prepared-dir", str(sets)]
    monkeypatch.delenv("NEMO_TOPR_PREPARED_DIR", raising=False)
    assert main(argv) == 0 and tokenizer_calls
    printed = capsys.readouterr().out
    (key,) = [path.name for path in sets.iterdir()]
    tokenizer_calls.clear()
    assert main(argv) == 0 and tokenizer_calls == []
    assert capsys.readouterr().out == printed
    monkeypatch.setenv("NEMO_TOPR_PREPARED_DIR", str(sets))
    overrides = [f"base_model={model}", f"run_dir={tmp_path / 'runs' / 'a'}", f"dataset.train_path={SCORED}",
                 "dataset.seq_length=1024", "model.seq_length=1024"]
    assert main(["data", "prepare", "--config-name", "tiny_cpu", *overrides]) == 0
    assert capsys.readouterr().out.startswith(f"found {sets / key}: 24 sequences")
    assert tokenizer_calls == []



def test_stats_token_lengths_read_from_the_set_are_the_in_memory_ones(tokenizer_dir, tmp_path, capsys, monkeypatch):
    """At a length every record fits (the fixture's longest is 293 tokens), stats through the
    prepared set writes the stats.json that tokenizing in memory writes."""
    monkeypatch.delenv("NEMO_TOPR_PREPARED_DIR", raising=False)
    common = ["data", "stats", str(SCORED), "--tokenizer", str(tokenizer_dir)]
    assert main([*common, "--out", str(tmp_path / "in_memory")]) == 0
    assert main([*common, "--max-seq-length", "2048", "--prepared-dir", str(tmp_path / "sets"),
                 "--out", str(tmp_path / "prepared")]) == 0
    assert len(list((tmp_path / "sets").iterdir())) == 1
    in_memory, prepared = (json.loads((tmp_path / name / "stats.json").read_text())
                           for name in ("in_memory", "prepared"))
    assert prepared == in_memory and prepared["tokens"]["total"]["count"] == 24
    tokens = prepared["tokens"]
    assert tokens["total"]["mean"] == pytest.approx(tokens["prompt"]["mean"] + tokens["completion"]["mean"])
    assert tokens["total"]["max"] == 293


def test_stats_with_a_length_counts_the_records_over_it(tokenizer_dir, tmp_path, capsys, monkeypatch):
    """--no-strict --max-seq-length 200 drops the 12 records over 200 tokens, as validate counts them."""
    monkeypatch.delenv("NEMO_TOPR_PREPARED_DIR", raising=False)
    assert main(["data", "stats", str(SCORED), "--no-strict", "--tokenizer", str(tokenizer_dir), "--max-seq-length",
                 "200", "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert summary["validation"]["dropped"] == {"too_long": 12} and summary["tokens"]["total"]["count"] == 12
    assert summary["tokens"]["total"]["max"] <= 200 and summary["composition"]["records"] == 24
    assert "records dropped: 12" in capsys.readouterr().out
