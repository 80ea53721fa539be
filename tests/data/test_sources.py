"""Records from other shapes: Parquet/Arrow with other column names, save_to_disk directories,
TRL- and verl-style rows, through an explicit column mapping. The expected records are those the
plain JSONL fixtures give (read by the reader every other test checks), so each route must
reproduce them exactly, with errors naming the source, the row and the field."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import forked
from tests.conftest import REPO
from tests.data.test_refusals_records import refused

from nemo_topr.cli import main
from nemo_topr.data.records import DataError, load_records

FIXTURES = Path(__file__).parents[1] / "fixtures" / "data"
SCORED = FIXTURES / "gsm8k_scored.jsonl"
CHAT = FIXTURES / "math500_chat.jsonl"
# a TRL-style naming of our fields: TRL keeps prompt and completion, the rest is the user's
TRL_COLUMNS = {"reward": "score", "behavior_logprob": "ref_logp", "prompt_id": "question_id", "sample_id": "n"}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _renamed(rows: list[dict], columns: dict[str, str]) -> list[dict]:
    """Rows under the source's column names (the inverse of the mapping under test)."""
    return [{columns.get(key, key): value for key, value in row.items()} for row in rows]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _json(records) -> list[dict]:
    return [record.to_json() for record in records.records]


EXPECTED = _json(load_records(SCORED))


# ---------------------------------------------------------------------------------------------
# Every source type gives the records of the plain JSONL


def test_parquet_with_other_column_names(tmp_path):
    path = tmp_path / "scored.parquet"
    pq.write_table(pa.Table.from_pylist(_renamed(_rows(SCORED), TRL_COLUMNS)), path)
    records = load_records(path, columns=TRL_COLUMNS)
    assert _json(records) == EXPECTED
    assert [(r.path, r.line) for r in records.records] == [(str(path), n) for n in range(1, 25)]


@pytest.mark.parametrize("kind", ["file", "stream"])
def test_arrow_ipc_file_and_stream(tmp_path, kind):
    table = pa.Table.from_pylist(_rows(SCORED))
    path = tmp_path / "scored.arrow"
    with pa.OSFile(str(path), "wb") as sink:
        open_writer = pa.ipc.new_file if kind == "file" else pa.ipc.new_stream
        with open_writer(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=5):  # rows numbered across batches
                writer.write_batch(batch)
    records = load_records(path)
    assert _json(records) == EXPECTED and [r.line for r in records.records] == list(range(1, 25))


def test_a_file_named_twice_is_refused_naming_both_spellings(tmp_path, monkeypatch):
    """Each of these is named as the one file it is, not as `duplicate sample_id 0 ...; first at
    a.jsonl:1`, the same line (with --no-strict, the second copy dropped as duplicates)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    _write_jsonl(tmp_path / "d" / "a.jsonl", _rows(SCORED))
    for paths, named, first in ((["d/a.jsonl", "d/a.jsonl"], "d/a.jsonl", "d/a.jsonl"),
                                (["d/a.jsonl", str(tmp_path / "d" / ".." / "d" / "a.jsonl")],
                                 str(tmp_path / "d" / ".." / "d" / "a.jsonl"), "d/a.jsonl"),
                                (["d", "d/*.jsonl"], "d/a.jsonl", "d/a.jsonl")):
        for strict in (True, False):
            with pytest.raises(DataError) as caught:
                load_records(paths, strict=strict)
            assert (caught.value.key, caught.value.where) == ("path.named_twice", f"{named}: path")
            assert f"(also as {first})" in caught.value.problem
    # a copy is another file: its records are duplicates of the first's, refused as such
    _write_jsonl(tmp_path / "copy.jsonl", _rows(SCORED))
    assert refused(["d/a.jsonl", "copy.jsonl"]) == ("record.sample_id.duplicate", "copy.jsonl:1: sample_id")


def test_save_to_disk_dataset(tmp_path):
    import datasets

    datasets.Dataset.from_list(_rows(SCORED)).save_to_disk(tmp_path / "ds")
    records = load_records(tmp_path / "ds")
    assert _json(records) == EXPECTED
    assert records.report.files == [str(tmp_path / "ds")] and records.records[5].line == 6


def test_save_to_disk_dataset_dict_needs_a_split(tmp_path):
    import datasets

    rows = _renamed(_rows(SCORED), TRL_COLUMNS)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:20]),
                          "test": datasets.Dataset.from_list(rows[20:])}).save_to_disk(tmp_path / "dd")
    records = load_records(tmp_path / "dd", split="train", columns=TRL_COLUMNS)
    assert _json(records) == EXPECTED[:20]
    assert records.records[0].path == str(tmp_path / "dd" / "train")
    assert refused(tmp_path / "dd", columns=TRL_COLUMNS) == ("split.not_chosen", f"{tmp_path / 'dd'}: split")
    assert refused(tmp_path / "dd", split="validation", columns=TRL_COLUMNS) == ("split.unknown",
                                                                                f"{tmp_path / 'dd'}: split")
    assert refused(SCORED, split="train") == ("split.without_splits", f"{SCORED}: split")


def test_trl_style_jsonl_with_a_mapping_and_conversational_completions(tmp_path):
    rows = _renamed(_rows(SCORED), TRL_COLUMNS)
    for row in rows[::2]:  # TRL's conversational form: the completion as one assistant message
        row["completion"] = [{"role": "assistant", "content": row["completion"]}]
    for row in rows:
        row["origin"] = "trl"  # a column that is no field, carried under meta
    path = _write_jsonl(tmp_path / "trl.jsonl", rows)
    records = load_records(path, columns=",".join(f"{f}={c}" for f, c in TRL_COLUMNS.items()),
                           extra_columns="meta")
    assert _json(records) == [{**row, "meta": {**row["meta"], "origin": "trl"}} for row in EXPECTED]
    assert refused(path, columns=TRL_COLUMNS) == ("record.unknown_field", f"{path}:1: origin")


def test_verl_style_parquet(tmp_path):
    """verl's RL parquet (data_source, prompt as chat messages, reward_model.ground_truth,
    extra_info) with a response and its score added by a rollout."""
    expected = _json(load_records(CHAT))
    rows = [{"data_source": "HuggingFaceH4/MATH-500", "prompt": r["prompt"], "response": r["completion"],
             "score": r["reward"], "reward_model": {"style": "rule", "ground_truth": "x"},
             "extra_info": {"index": i}, "prompt_id": r["prompt_id"], "sample_id": r["sample_id"]}
            for i, r in enumerate(expected)]
    path = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    records = load_records(path, columns={"completion": "response", "reward": "score"}, extra_columns="meta")
    assert [{k: v for k, v in r.items() if k != "meta"} for r in _json(records)] == expected
    assert records.records[4].meta == {"data_source": "HuggingFaceH4/MATH-500", "extra_info": {"index": 4},
                                      "reward_model": {"style": "rule", "ground_truth": "x"}}


# ---------------------------------------------------------------------------------------------
# Errors: the mapping before any row, then rows named by source, row and field (and column)


@pytest.mark.parametrize("columns, key, field", [
    ({"reward": "scor"}, "columns.mapped_column_missing", "reward"),
    ({"prompt": "text", "completion": "text"}, "columns.column_mapped_twice", "columns"),
    ({"promt": "prompt"}, "columns.unknown_field", "columns"),
    ("prompt", "columns.not_field_equals_column", "columns"),
    ({"reward": "score", "completion": "prompt_id"}, "columns.column_named_as_mapped_field", "completion"),
])
def test_a_wrong_mapping_is_an_error_before_any_row_is_read(tmp_path, monkeypatch, columns, key, field):
    path = tmp_path / "scored.parquet"
    pq.write_table(pa.Table.from_pylist(_renamed(_rows(SCORED), {"reward": "score"})), path)

    def no_bulk_read(*args, **kwargs):
        raise AssertionError("rows were read before the mapping was checked")

    monkeypatch.setattr(pq, "ParquetFile", no_bulk_read)
    assert refused(path, columns=columns, strict=False) == (key, f"{path}: {field}")  # the file as a whole: no row


def test_a_wrong_mapping_on_jsonl_is_found_at_the_first_record(tmp_path):
    path = _write_jsonl(tmp_path / "trl.jsonl", _renamed(_rows(SCORED), TRL_COLUMNS))
    with path.open("a") as out:
        out.write("{not json\n")  # strict reading would stop here, were the rows read first
    assert refused(path, columns={**TRL_COLUMNS, "reward": "reward"}) == ("columns.mapped_column_missing",
                                                                          f"{path}:1: reward")


def test_a_dataset_missing_a_mapped_column_names_the_directory(tmp_path):
    import datasets

    datasets.Dataset.from_list(_rows(SCORED)).save_to_disk(tmp_path / "ds")
    assert refused(tmp_path / "ds", columns={"reward": "score"}) == ("columns.mapped_column_missing",
                                                                     f"{tmp_path / 'ds'}: reward")


def test_row_errors_name_the_column_a_field_came_from(tmp_path):
    rows = _renamed(_rows(SCORED), TRL_COLUMNS)
    rows[1]["score"] = "1.0"
    rows[3]["completion"] = [{"role": "user", "content": "not an answer"}]
    path = _write_jsonl(tmp_path / "trl.jsonl", rows)
    assert refused(path, columns=TRL_COLUMNS) == ("record.reward.not_a_number", f"{path}:2: reward (column 'score')")
    records = load_records(path, columns=TRL_COLUMNS, strict=False)
    assert records.report.dropped == {"wrong_type": 2} and records.report.records_used == 22
    rows[1]["score"] = 1.0
    _write_jsonl(path, rows)
    assert refused(path, columns=TRL_COLUMNS) == ("record.completion.not_one_assistant_message",
                                                  f"{path}:4: completion")


def test_a_missing_required_column_in_a_dataset(tmp_path):
    import datasets

    datasets.Dataset.from_list([{k: v for k, v in r.items() if k != "reward"} for r in _rows(SCORED)]).save_to_disk(
        tmp_path / "ds")
    assert refused(tmp_path / "ds") == ("columns.required_missing", f"{tmp_path / 'ds'}: reward")


def test_a_hub_dataset_is_read_when_named_hub_owner_name(tmp_path, monkeypatch):
    """`datasets.load_dataset` stands in for the hub (no network here): it is asked for the name
    after the prefix, streamed, and its rows are read like any other source's."""
    import datasets

    asked = []

    def load_dataset(name, split=None, streaming=False):
        asked.append((name, split, streaming))
        return datasets.Dataset.from_list(_renamed(_rows(SCORED), TRL_COLUMNS)).to_iterable_dataset()

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    records = load_records("hub:someone/graded", split="train", columns=TRL_COLUMNS)
    assert asked == [("someone/graded", "train", True)]
    assert _json(records) == EXPECTED and records.records[5].path == "hub:someone/graded[train]"
    assert refused("hub:a/b/c") == ("path.not_a_hub_name", "hub:a/b/c: path")


def test_a_hub_name_on_an_offline_machine_is_a_clear_error(tmp_path):
    """Runs `datasets` in offline mode with an empty cache: the hub is never contacted."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-m", "nemo_topr.cli", "data", "validate", "hub:nemo-topr-test/no-such-set"],
                          cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.startswith("nemo-topr data validate: hub:nemo-topr-test/no-such-set: path: "), proc.stderr


def test_a_missing_local_path_is_never_taken_for_a_hub_name(tmp_path, monkeypatch, capsys):
    """A typo that looks like `name` or `owner/name` (`graded.jsnl`, `data/graded`, `openai/gsm8k`)
    never reaches the hub (30 s of retries, then a hub error): only `hub:` does; a missing path says
    what was probably meant."""
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: pytest.fail(f"hub asked for {args}"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "graded.jsonl").write_text("")
    (tmp_path / "scores").mkdir()
    for missing, meant in [  # what the refusal names as probably meant
        ("graded.jsnl", "graded.jsonl?"),
        ("score", "scores?"),
        (tmp_path / "grade.json", f"{tmp_path / 'graded.jsonl'}?"),
        ("openai/gsm8k", "hub:openai/gsm8k)"),
        ("data/graded", "hub:data/graded)"),
        ("runs/demo/missing", "runs/demo)"),
        (tmp_path / "dir", "does not exist"),
    ]:
        with pytest.raises(DataError) as caught:
            load_records(missing)
        assert (caught.value.key, caught.value.where) == ("path.missing", f"{missing}: path")
        assert caught.value.problem.endswith(meant)
    assert main(["data", "stats", "graded.jsnl"]) == 1
    assert capsys.readouterr().err.startswith("nemo-topr data stats: graded.jsnl: path: ")


def test_a_path_that_is_neither_file_nor_directory_says_so(tmp_path, capsys):
    """A FIFO or a device exists: it was reported as "does not exist; did you mean <itself>?"."""
    fifo = tmp_path / "graded.jsonl"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/null")):
        assert refused(path) == ("path.not_a_file_or_directory", f"{path}: path")
    assert main(["data", "validate", str(fifo)]) == 1
    assert capsys.readouterr().err.startswith(f"nemo-topr data validate: {fifo}: path: ")


# ---------------------------------------------------------------------------------------------
# The data verbs and the training config take the same options


def test_data_cli_takes_a_mapping(tmp_path, capsys):
    path = _write_jsonl(tmp_path / "trl.jsonl", _renamed(_rows(SCORED), TRL_COLUMNS))
    argv = ["data", "validate", str(path), "--columns", "reward=score,behavior_logprob=ref_logp",
            "--column", "prompt_id=question_id", "--column", "sample_id=n"]
    assert main(argv) == 0
    assert "records in: 24\nrecords used: 24\nrecords dropped: 0" in capsys.readouterr().out
    out = tmp_path / "ours.jsonl"  # curate without sub-sampling: a conversion into our schema
    assert main(["data", "curate", *argv[2:], "--no-dedup", "--out", str(out)]) == 0
    assert _json(load_records(out)) == EXPECTED
    assert main(["data", "validate", str(path), "--columns", "reward=score,reward=ref_logp"]) == 1
    assert capsys.readouterr().err.startswith(f"nemo-topr data validate: {path}: columns: ")


def test_training_dataset_config_takes_a_mapping(tmp_path, megatron_world):
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer
    from nemo_topr.training.data import ToprDatasetConfig

    tokenizer_dir = tmp_path / "tokenizer"
    build_tiny_tokenizer(tokenizer_dir, chat_template=False)
    trl = _write_jsonl(tmp_path / "trl.jsonl", _renamed(_rows(SCORED), TRL_COLUMNS))
    mapped = ToprDatasetConfig(train_path=str(trl), tokenizer_dir=str(tokenizer_dir), seq_length=512,
                               columns=TRL_COLUMNS).prepare(global_batch_size=4)
    plain = ToprDatasetConfig(train_path=str(SCORED), tokenizer_dir=str(tokenizer_dir),
                              seq_length=512).prepare(global_batch_size=4)
    assert mapped.rows == plain.rows and mapped.dataset.sequences == plain.dataset.sequences
    wrong = ToprDatasetConfig(train_path=str(trl), tokenizer_dir=str(tokenizer_dir), seq_length=512,
                              columns={**TRL_COLUMNS, "reward": "reward"})
    with pytest.raises(DataError) as caught:
        wrong.prepare(global_batch_size=4)
    assert (caught.value.key, caught.value.where) == ("columns.mapped_column_missing", f"{trl}:1: reward")


# ---------------------------------------------------------------------------------------------
# End to end: `nemo-topr train` from a save_to_disk dataset and from a TRL-style JSONL


def _train(model_dir: Path, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    return forked.run(["-m", "nemo_topr.cli", "train", "--config-name", "tiny_cpu", f"hf_model={model_dir}",
                       f"run_dir={run_dir}", "dataset.epochs=1", "dataset.packed=false", *overrides])


@pytest.mark.slow
def test_training_from_a_saved_dataset_and_from_a_mapped_trl_jsonl(tmp_path):
    import datasets

    from nemo_topr.demo import _tensorboard_series, build_graded_records
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    model_dir = build_tiny_hf_llama(tmp_path / "tiny_llama_hf", build_tiny_tokenizer())
    records = [{**r, "behavior_logprob": -50.0 - i} for i, r in enumerate(build_graded_records(4))]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(records)}).save_to_disk(tmp_path / "saved")
    trl = _renamed(records, TRL_COLUMNS)
    for row in trl:
        row["completion"] = [{"role": "assistant", "content": row["completion"]}]
    _write_jsonl(tmp_path / "trl.jsonl", trl)
    mapping = "{" + ", ".join(f"{f}: {c}" for f, c in TRL_COLUMNS.items()) + "}"

    runs = {"saved": ("dataset.split=train",), "trl.jsonl": (f"dataset.columns={mapping}",)}
    for name, overrides in runs.items():
        proc = _train(model_dir, tmp_path / "runs" / name, f"dataset.train_path={tmp_path / name}", *overrides)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        report = json.loads((tmp_path / "runs" / name / "data_report.json").read_text())
        assert report["records_in"] == report["records_used"] == 12 and report["sequences"] == 12
        ledger = (tmp_path / "runs" / name / "samples_dp0.jsonl").read_text().splitlines()
        assert sorted(s for line in ledger for s in json.loads(line)["sample_ids"]) == list(range(12))
    # two routes to the same records: the same three steps, bit for bit
    losses = {name: _tensorboard_series(tmp_path / "runs" / name, "topr_loss") for name in runs}
    assert len(losses["saved"]) == 3 and losses["saved"] == losses["trl.jsonl"]

    # TRL data without mu: score-logprobs with the same mapping writes our schema with mu set
    no_mu = _write_jsonl(tmp_path / "trl_no_mu.jsonl", [{k: v for k, v in r.items() if k != "ref_logp"} for r in trl])
    scored = tmp_path / "scored.jsonl"
    columns = ",".join(f"{f}={c}" for f, c in TRL_COLUMNS.items() if f != "behavior_logprob")
    proc = forked.run(["-m", "nemo_topr.cli", "score-logprobs", "--model", str(model_dir), "--data", str(no_mu),
                       "--out", str(scored), "--seq-length", "512", "--columns", columns, "--device", "cpu"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    without_mu = [{k: v for k, v in r.items() if k != "behavior_logprob"} for r in records]
    assert [{k: v for k, v in r.items() if k != "behavior_logprob"} for r in _json(load_records(scored))] == without_mu

    proc = _train(model_dir, tmp_path / "wrong" / "run", f"dataset.train_path={tmp_path / 'trl.jsonl'}",
                  "dataset.columns={reward: scores}")
    assert proc.returncode != 0
    assert f"{tmp_path / 'trl.jsonl'}:1: reward: mapped to column 'scores', which is not there" in proc.stderr
