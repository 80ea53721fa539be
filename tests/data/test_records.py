"""Reading and validating pre-scored records: every malformed class names file, line and field."""

import gzip
import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.data.test_refusals_records import refused

from nemo_topr.data.records import DataError, Record, load_records, schema_of, write_jsonl

FIXTURES = Path(__file__).parents[1] / "fixtures" / "data"
SCORED = FIXTURES / "gsm8k_scored.jsonl"
MALFORMED = FIXTURES / "malformed.jsonl"

# line of malformed.jsonl -> (reason counted in non-strict mode, field named, the problem's key)
MALFORMED_LINES = {
    2: ("invalid_json", "record", "record.invalid_json"),
    3: ("invalid_utf8", "record", "record.invalid_utf8"),
    4: ("missing_field", "reward", "record.reward.missing"),
    5: ("wrong_type", "completion", "record.completion.wrong_type"),
    6: ("wrong_type", "reward", "record.reward.not_a_number"),
    7: ("nonfinite_reward", "reward", "record.reward.not_finite"),
    8: ("nonfinite_reward", "reward", "record.reward.not_finite"),
    9: ("invalid_behavior_logprob", "behavior_logprob", "record.behavior_logprob.not_a_logprob"),
    10: ("invalid_behavior_logprob", "behavior_logprob", "record.behavior_logprob.not_a_logprob"),
    11: ("empty_completion", "completion", "record.completion.empty"),
    12: ("duplicate_id", "sample_id", "record.sample_id.duplicate"),
    13: ("schema_mismatch", "behavior_logprob", "record.schema.differs_within_file"),
}
MALFORMED_VALID_LINES = [1, 14, 15, 16]


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _scored_rows() -> list[dict]:
    return [json.loads(line) for line in _lines(SCORED)]


def test_real_gsm8k_rows_load_with_full_report():
    records = load_records(SCORED)
    assert [r.index for r in records.records] == list(range(24))
    assert records.report.records_in == records.report.records_used == 24
    assert not records.report.dropped
    first = records.records[0]
    assert first.prompt.startswith("Question: Natalia sold clips") and first.prompt.endswith("\nAnswer:")
    assert first.completion.endswith("The answer is 72.") and first.reward == 1.0
    assert (first.path, first.line, first.prompt_id, first.sample_id) == (str(SCORED), 1, "gsm8k-train-0", 0)
    assert schema_of(first) == {"prompt": "string", "behavior_logprob": "number", "prompt_id": "string", "sample_id": "integer"}
    assert len({r.prompt_key for r in records.records}) == 6


@pytest.mark.parametrize("line", sorted(MALFORMED_LINES))
def test_strict_mode_raises_naming_file_line_and_field(tmp_path, line):
    _, field, key = MALFORMED_LINES[line]
    path = tmp_path / "one_bad.jsonl"
    path.write_bytes(_lines(MALFORMED)[0] + _lines(MALFORMED)[line - 1])
    assert refused(path, strict=True) == (key, f"{path}:2: {field}")


def test_strict_mode_stops_at_the_first_problem_of_the_fixture():
    assert refused(MALFORMED) == ("record.invalid_json", f"{MALFORMED}:2: record")


def test_non_strict_mode_counts_every_drop_by_reason():
    records = load_records(MALFORMED, strict=False)
    report = records.report
    expected = {}
    for reason, _, _ in MALFORMED_LINES.values():
        expected[reason] = expected.get(reason, 0) + 1
    assert dict(report.dropped) == expected
    assert report.records_in == 16 == len(records.records) + sum(report.dropped.values())
    assert report.records_used == len(records.records) == len(MALFORMED_VALID_LINES)
    assert [r.line for r in records.records] == MALFORMED_VALID_LINES
    for line, (reason, field, _) in MALFORMED_LINES.items():
        if line == min(k for k, v in MALFORMED_LINES.items() if v[0] == reason):
            assert report.first_error[reason].startswith(f"{MALFORMED}:{line}: {field}: ")
    assert "records dropped: 12" in report.format()


def test_record_index_counts_dropped_records_too():
    records = load_records(MALFORMED, strict=False)
    assert [r.index for r in records.records] == [line - 1 for line in MALFORMED_VALID_LINES]


@pytest.mark.parametrize("strict", [True, False])
def test_empty_file_missing_path_and_no_match_raise_in_both_modes(tmp_path, strict):
    empty = FIXTURES / "empty.jsonl"
    assert refused(empty, strict=strict) == ("file.empty", f"{empty}: file")
    assert refused(tmp_path / "nope.jsonl", strict=strict) == ("path.missing", f"{tmp_path / 'nope.jsonl'}: path")
    assert refused(str(tmp_path / "*.jsonl"), strict=strict) == ("path.no_data_files", f"{tmp_path}/*.jsonl: path")
    assert refused(tmp_path, strict=strict) == ("path.no_data_files", f"{tmp_path}: path")
    (tmp_path / "data.csv").write_text("prompt,completion,reward\n")
    assert refused(tmp_path / "data.csv", strict=strict) == ("path.unknown_format", f"{tmp_path / 'data.csv'}: path")


@pytest.mark.parametrize("strict", [True, False])
def test_schema_differing_between_files_names_both(strict):
    assert refused(FIXTURES / "schema_mismatch", strict=strict) == (
        "dataset.schema.differs_between_files", f"{FIXTURES / 'schema_mismatch' / 'b.jsonl'}:1: behavior_logprob")


def test_a_null_field_differs_from_a_number_as_an_absent_one_does(tmp_path):
    rows = _scored_rows()[:2]
    rows[1] = {**rows[1], "behavior_logprob": None}
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert refused(tmp_path / "data.jsonl") == ("record.schema.differs_within_file",
                                                f"{tmp_path / 'data.jsonl'}:2: behavior_logprob")


def test_misspelt_field_is_a_schema_error(tmp_path):
    row = {**_scored_rows()[0], "behaviour_logprob": -3.0}
    path = tmp_path / "typo.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert refused(path, strict=False) == ("record.unknown_field", f"{path}:1: behaviour_logprob")


def test_directory_with_mixed_formats_names_both(tmp_path):
    (tmp_path / "part-0.jsonl").write_bytes(SCORED.read_bytes())
    _write_parquet(tmp_path / "part-1.parquet", _scored_rows())
    assert refused(tmp_path) == ("format.mixed", f"{tmp_path}: format")


def test_parquet_reads_like_jsonl(tmp_path):
    parquet = load_records(_write_parquet(tmp_path / "scored.parquet", _scored_rows())).records
    jsonl = load_records(SCORED).records
    assert [r.to_json() for r in parquet] == [r.to_json() for r in jsonl]
    assert [r.line for r in parquet] == list(range(1, 25))


def test_parquet_errors_name_the_row_and_column(tmp_path):
    rows = _scored_rows()
    rows[2]["reward"] = math.nan
    path = _write_parquet(tmp_path / "nan.parquet", rows)
    assert refused(path) == ("record.reward.not_finite", f"{path}:3: reward")
    assert load_records(path, strict=False).report.dropped == {"nonfinite_reward": 1}

    missing = _write_parquet(tmp_path / "missing.parquet", [{k: v for k, v in r.items() if k != "reward"} for r in rows])
    assert refused(missing, strict=False) == ("columns.required_missing", f"{missing}: reward")

    as_string = _write_parquet(tmp_path / "string.parquet", [{**r, "reward": str(r["reward"])} for r in rows])
    assert refused(as_string) == ("record.reward.not_a_number", f"{as_string}:1: reward")


def test_chat_message_prompts_are_validated(tmp_path):
    row = {"prompt": [{"role": "user", "content": 3}], "completion": "x", "reward": 1}
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert refused(path) == ("record.prompt.message.content.not_a_string", f"{path}:1: prompt[0].content")
    assert load_records(FIXTURES / "math500_chat.jsonl").records[0].prompt[1]["role"] == "user"


def test_globs_and_lists_read_files_in_order_with_one_index(tmp_path):
    rows = _scored_rows()
    for part in range(2):
        (tmp_path / f"part-{part}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[part * 12 : part * 12 + 12]))
    by_glob = load_records(str(tmp_path / "part-*.jsonl")).records
    by_list = load_records([tmp_path / "part-0.jsonl", tmp_path / "part-1.jsonl"]).records
    assert [r.index for r in by_glob] == [r.index for r in by_list] == list(range(24))
    assert by_glob[12].path.endswith("part-1.jsonl") and by_glob[12].line == 1


def test_files_of_a_directory_or_pattern_that_are_not_read_are_named_in_the_report(tmp_path):
    """A shard left compressed beside the others was skipped unsaid, and the run trained on part
    of the data: now the report (which `data validate` prints and every run saves) names it."""
    rows = [json.dumps(r) + "\n" for r in _scored_rows()]
    (tmp_path / "part-0.jsonl").write_text("".join(rows[:12]))
    (tmp_path / "part-1.jsonl.gz").write_bytes(gzip.compress("".join(rows[12:24]).encode()))
    (tmp_path / "README.md").write_text("where the data came from")
    loaded = load_records(tmp_path)
    note = f"{tmp_path}: 2 not read, not a .jsonl, .parquet or .arrow file: README.md, part-1.jsonl.gz"
    assert len(loaded.records) == 12 and loaded.report.notes == [note]
    assert loaded.report.format().endswith("\n" + note) and loaded.report.to_dict()["notes"] == [note]
    by_glob = load_records(str(tmp_path / "part-*"))
    assert by_glob.report.notes == [f"{tmp_path}/part-*: 1 not read, not a .jsonl, .parquet or .arrow file: "
                                    "part-1.jsonl.gz"]
    assert load_records(tmp_path / "part-0.jsonl").report.notes == []
    compressed = tmp_path / "compressed"
    compressed.mkdir()
    (compressed / "part-1.jsonl.gz").write_bytes((tmp_path / "part-1.jsonl.gz").read_bytes())
    assert refused(compressed) == ("path.no_data_files", f"{compressed}: path")
    assert refused(compressed / "part-1.jsonl.gz") == ("path.unknown_format", f"{compressed / 'part-1.jsonl.gz'}: path")
    for n in range(4):  # shards one level down are not searched for: said, with the rest
        (tmp_path / f"notes-{n}.txt").write_text("")
    assert load_records(tmp_path).report.notes[0].endswith(": 7 not read, not a .jsonl, .parquet or .arrow file: "
                                                           "README.md, compressed/, notes-0.txt, notes-1.txt, "
                                                           "notes-2.txt and 2 more")


def test_duplicate_ids_are_found_across_files(tmp_path):
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_bytes(_lines(SCORED)[0])
    assert refused(tmp_path) == ("record.sample_id.duplicate", f"{tmp_path / 'b.jsonl'}:1: sample_id")


def test_sample_ids_repeat_across_prompts_but_not_within_one(tmp_path):
    rows = [{"prompt": p, "completion": "x", "reward": 1, "sample_id": 0} for p in ("q1", "q2", "q1")]
    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert refused(path) == ("record.sample_id.duplicate", f"{path}:3: sample_id")


def test_a_prompt_id_names_one_prompt(tmp_path):
    rows = [{"prompt": p, "completion": "x", "reward": 1, "prompt_id": 5, "sample_id": i} for i, p in enumerate("aba")]
    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert refused(path) == ("record.prompt.conflicts", f"{path}:2: prompt")
    assert load_records(path, strict=False).report.dropped == {"conflicting_prompt": 1}


def test_a_prompt_ids_messages_are_one_prompt_whatever_the_order_of_their_keys(tmp_path):
    messages = [{"role": "user", "content": "q"}], [{"content": "q", "role": "user"}], [{"role": "user", "content": "Q"}]
    rows = [{"prompt": m, "completion": "x", "reward": 1, "prompt_id": 5, "sample_id": i} for i, m in enumerate(messages)]
    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert refused(path) == ("record.prompt.conflicts", f"{path}:3: prompt")


def test_written_records_read_back_identically(tmp_path):
    records = load_records(SCORED).records
    write_jsonl(records, tmp_path / "out.jsonl")
    assert [r.to_json() for r in load_records(tmp_path / "out.jsonl").records] == [r.to_json() for r in records]


def test_a_write_that_fails_half_way_leaves_the_earlier_file_and_no_part(tmp_path):
    records = load_records(SCORED).records
    out = tmp_path / "scored.jsonl"
    out.write_text("an earlier result\n")

    class Unwritable(Record):
        def to_json(self):
            raise OSError("No space left on device")

    broken = Unwritable(prompt="q", completion="c", reward=1.0)
    with pytest.raises(OSError, match="No space left"):
        write_jsonl([*records[:5], broken], out)  # five records written before it fails
    assert out.read_text() == "an earlier result\n" and sorted(p.name for p in tmp_path.iterdir()) == ["scored.jsonl"]
    write_jsonl(records, out)
    assert len(out.read_text().splitlines()) == len(records)


def test_records_convert_to_a_hugging_face_dataset():
    dataset = load_records(FIXTURES / "math500_chat.jsonl").to_hf_dataset()
    assert len(dataset) == 6 and dataset[0]["prompt"][0]["role"] == "system"
    assert json.loads(load_records(SCORED).to_hf_dataset()[0]["meta"]) == {"source": "gsm8k_train", "row": 0}


def test_prompt_key_groups_by_prompt_id_else_prompt_text():
    assert Record(prompt="q", completion="c", reward=1.0, prompt_id=7).prompt_key == "7"
    assert Record(prompt="q", completion="c", reward=1.0).prompt_key == "q"


def test_baseline_field_is_validated_and_all_or_none(tmp_path):
    """The optional per-record baseline (docs/objective.md): a finite number on every record or none."""
    rows = [{"prompt": "q", "completion": "a", "reward": 1, "sample_id": 0, "baseline": 0.25},
            {"prompt": "q", "completion": "b", "reward": -1, "sample_id": 1, "baseline": "high"},
            {"prompt": "q", "completion": "c", "reward": -1, "sample_id": 2, "baseline": math.inf},
            {"prompt": "q", "completion": "d", "reward": 1, "sample_id": 3}]
    path = tmp_path / "baselines.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert refused(path) == ("record.baseline.not_a_number", f"{path}:2: baseline")
    loaded = load_records(path, strict=False)
    assert [r.baseline for r in loaded.records] == [0.25]
    assert loaded.report.dropped == {"wrong_type": 1, "nonfinite_baseline": 1, "schema_mismatch": 1}
    assert loaded.records[0].to_json()["baseline"] == 0.25  # written back by write_jsonl


def test_rewards_that_overflow_float32_training_are_rejected_naming_file_row_and_field(tmp_path):
    """Issue 29: one record with reward 1e300 trained to COMPLETED with a NaN model. |R| <= 1e6 is
    the limit (records.MAX_ABS_REWARD); 1e6 itself is kept."""
    rows = [json.loads(line) for line in SCORED.read_text().splitlines()]
    rows[3]["reward"], rows[5]["reward"] = 1e300, -1e6
    path = tmp_path / "huge.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert refused(path) == ("record.reward.out_of_range", f"{path}:4: reward")
    loaded = load_records(path, strict=False)
    assert loaded.report.dropped == {"reward_out_of_range": 1} and len(loaded.records) == len(rows) - 1
    baselines = tmp_path / "baselines.jsonl"
    baselines.write_text("".join(json.dumps({**r, "reward": 1.0, "baseline": -3e7 if i == 1 else 0.5}) + "\n"
                                 for i, r in enumerate(rows)))
    assert refused(baselines) == ("record.baseline.out_of_range", f"{baselines}:2: baseline")


def test_integers_beyond_float_range_are_out_of_range_not_a_traceback(tmp_path):
    """JSON allows integers of any size: a reward, log-prob or baseline of 10**400 ended `data validate`,
    `stats` and `curate` in OverflowError (math.isfinite on the int). Each is now the field's own
    out-of-range error, shown as 1.000e+400 rather than 401 digits; -10**300 still fits a float and is kept."""
    rows = _scored_rows()[:6]
    rows[1]["reward"], rows[2]["behavior_logprob"], rows[3]["baseline"] = 10**400, -10**400, -10**400
    rows[4]["behavior_logprob"] = -10**300
    for row in rows:
        row.setdefault("baseline", 0)
    path = tmp_path / "huge_ints.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as caught:
        load_records(path)
    assert (caught.value.key, caught.value.where) == ("record.reward.out_of_range", f"{path}:2: reward")
    assert "|1.000e+400|" in caught.value.problem
    loaded = load_records(path, strict=False)
    assert loaded.report.dropped == {"reward_out_of_range": 1, "invalid_behavior_logprob": 1,
                                     "baseline_out_of_range": 1}
    assert all("-1.000e+400" in loaded.report.first_error[reason]
               for reason in ("invalid_behavior_logprob", "baseline_out_of_range"))
    assert [r.line for r in loaded.records] == [1, 5, 6] and loaded.records[1].behavior_logprob == -1e300


def test_a_byte_order_mark_opening_a_file_is_ignored_and_one_inside_is_named(tmp_path):
    row = json.dumps({"prompt": "Q?", "completion": " A", "reward": 1.0})
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + row.encode() + b"\n")
    assert load_records(path).records[0].prompt == "Q?"
    path.write_bytes(row.encode() + b"\n\xef\xbb\xbf" + row.encode() + b"\n")
    with pytest.raises(DataError) as error:
        load_records(path)
    assert (error.value.key, error.value.where) == ("record.invalid_json", f"{path}:2: record")
    assert "BOM" in error.value.problem and "utf-8-sig" not in error.value.problem


def test_a_key_given_twice_with_different_values_is_refused_not_read_as_the_last(tmp_path):
    """Python's json keeps a repeated key's last value: a reward written twice (say a grader's -1,
    then a re-grader's 1) was read as 1 without a word."""
    path = tmp_path / "twice.jsonl"
    path.write_text('{"prompt": "Q?", "completion": " A", "reward": 1.0}\n'
                    '{"prompt": "Q?", "completion": " B", "reward": -1.0, "reward": 1.0}\n'
                    '{"prompt": "Q?", "completion": " C", "reward": -1.0, "reward": -1.0}\n'  # the same value
                    '{"prompt": "Q?", "completion": " D", "reward": 1.0, "meta": {"k": 1, "k": 2}}\n')
    assert refused(path) == ("record.key_given_twice", f"{path}:2: reward")
    records = load_records(path, strict=False)
    assert [r.completion for r in records.records] == [" A", " C"]
    assert records.report.dropped == {"invalid_json": 2}


def test_per_token_behavior_logprobs_are_refused_saying_it_is_one_sum(tmp_path):
    """A sampler's per-token log-probs (vLLM's, a Parquet list column): TOPR's ratio is over the
    whole sequence, so the message says what the field holds and how to score it."""
    rows = [{"prompt": "1 + 1 =", "completion": " 2", "reward": 1.0, "behavior_logprob": [-0.25, -0.5]}]
    path = _write_parquet(tmp_path / "per_token.parquet", rows)
    with pytest.raises(DataError) as caught:
        load_records(path)
    assert (caught.value.key, caught.value.where) == ("record.behavior_logprob.not_a_number",
                                                      f"{path}:1: behavior_logprob")
    assert "score-logprobs" in caught.value.problem
    mixed = tmp_path / "per_token.jsonl"
    mixed.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[0], "behavior_logprob": -0.75}) + "\n")
    assert load_records(mixed, strict=False).report.dropped == {"wrong_type": 1}  # counted as the wrong type it is


@pytest.mark.parametrize("change, field, key", [
    ({"completion": " 4 \ud83d"}, "completion", "record.completion.lone_surrogate"),
    ({"prompt": "Q\ud83d"}, "prompt", "record.prompt.lone_surrogate"),
    ({"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q\ud83d"}]}, "prompt[1].content",
     "record.prompt.message.content.lone_surrogate"),
    ({"sample_id": "s\ud83d"}, "sample_id", "record.sample_id.lone_surrogate"),
    ({"meta": {"source": ["ok", "\ud83d"]}}, "meta.source[1]", "record.meta.lone_surrogate"),
    ({"meta": {"\ud83d": 1}}, "meta", "record.meta.lone_surrogate"),
], ids=["completion", "prompt", "message", "sample_id", "meta", "meta-key"])
def test_a_lone_surrogate_in_any_text_is_named_as_the_field_not_a_tokenizer_traceback(tmp_path, change, field, key):
    """A JSON escape of half an emoji (`"\\ud83d"`, text cut inside a surrogate pair) passed validation:
    with a tokenizer (`data validate --tokenizer`, `data stats`, `score-logprobs`, `train`) it ended in
    `TypeError: TextEncodeInput must be Union[...]`, and `data curate` in a bare "surrogates not
    allowed". Non-strict, it is a counted drop like undecodable bytes."""
    rows = [{"prompt": "Q", "completion": " 4", "reward": 1.0}, {"prompt": "Q", "completion": " 4", "reward": 1.0,
                                                                 **change}]
    path = tmp_path / "surrogate.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))  # ASCII: the surrogate as its JSON escape
    assert "\\ud83d" in path.read_text()
    assert refused(path) == (key, f"{path}:2: {field}")
    loaded = load_records(path, strict=False)
    assert loaded.report.dropped == {"invalid_utf8": 1} and [r.line for r in loaded.records] == [1]
    write_jsonl(loaded.records, tmp_path / "curated.jsonl")  # what is kept can be written


def test_a_whole_surrogate_pair_is_one_character_and_kept(tmp_path):
    path = tmp_path / "emoji.jsonl"
    path.write_text('{"prompt": "Q", "completion": " 4 \\ud83d\\ude00", "reward": 1.0}\n')
    assert load_records(path).records[0].completion == " 4 \U0001F600"


@pytest.mark.parametrize("prompt, reason, key, field", [
    ([{"role": "narrator", "content": "hi"}], "invalid_message", "record.prompt.message.role.unknown", "prompt[0].role"),
    ([{"role": "user", "content": ""}], "empty_prompt", "record.prompt.last_user_message.empty", "prompt[0].content"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": ""}, {"role": "tool", "content": "7"}],
     "empty_prompt", "record.prompt.last_user_message.empty", "prompt[1].content"),
    ([{"role": "system", "content": ""}], "empty_prompt", "record.prompt.messages.empty", "prompt"),
    ([{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "Let me think."}], "invalid_message",
     "record.prompt.ends_with_assistant", "prompt[1].role"),
], ids=["unknown", "empty", "empty-last-user", "all-empty", "ends-with-assistant"])
def test_chat_prompts_need_known_roles_a_question_and_no_final_assistant_turn(tmp_path, prompt, reason, key, field):
    """A role typo was rendered as its own header (`<|start_header_id|>usr<|end_header_id|>`); an
    empty user message was accepted where an empty string prompt is `empty_prompt`; and a prompt
    ending in an assistant message was rendered as that finished turn (`...<|eot_id|>`) before the
    generation prompt's new assistant header (tokenization.prompt_token_ids), so the completion
    trained as a second turn, not the continuation the data meant."""
    good = {"prompt": [{"role": "user", "content": "hi"}], "completion": " 4", "reward": 1.0}
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "prompt": prompt}) + "\n")
    assert refused(path) == (key, f"{path}:2: {field}")
    assert load_records(path, strict=False).report.dropped == {reason: 1}


def test_chat_prompts_of_every_known_role_and_empty_earlier_messages_are_kept(tmp_path):
    prompt = [{"role": "system", "content": ""}, {"role": "user", "content": "2 + 2?"},
              {"role": "assistant", "content": ""}, {"role": "ipython", "content": "4"},
              {"role": "user", "content": "and 3 + 3?"}, {"role": "tool", "content": "6"}]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": prompt, "completion": " 6", "reward": 1.0}) + "\n")
    assert load_records(path).records[0].prompt == prompt


def test_check_messages_which_prompt_files_share_names_a_lone_surrogate():
    """`nemo-topr generate --prompts` checks its message prompts with check_messages too."""
    from nemo_topr.data.records import check_messages
    from nemo_topr.data.schema import RejectedRow

    with pytest.raises(RejectedRow) as refused:
        check_messages("prompts.jsonl", 3, [{"role": "user", "content": "Q \udc00"}])
    assert (refused.value.reason, refused.value.error.key, refused.value.error.where) == (
        "invalid_utf8", "record.prompt.message.content.lone_surrogate", "prompts.jsonl:3: prompt[0].content")
