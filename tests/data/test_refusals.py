"""The data layer's refusals (prompts, tokenization, curation, packing, prepared sets, `nemo-topr data`'s
options, grading) as a table: one row per problem, its minimal bad input → the problem's key and where.

The rows assert the key and where only; the words are in tests/golden/refusals.txt (tests/refusal_table.py),
so rewording a message changes that file and no test (``NEMO_TOPR_UPDATE_GOLDEN=1 .venv/bin/python -m pytest
tests/data/test_refusals.py`` rewrites this table's section). Every key the SOURCES can raise has a row, but
those NEEDS_MEGATRON names: a new refusal without one fails `test_the_table_covers_every_key_the_code_raises`.
The rows' files are written into one directory the rows run in, named relatively, so the golden text is stable.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.conftest import REPO, placeholder_hf_model
from tests.refusal_table import assert_covers, assert_golden, raised, rendered, row_tests

from nemo_topr import grading
from nemo_topr.data import cli as data_cli
from nemo_topr.data import packing, prompts, shared_prefix, tokenization
from nemo_topr.data.curation import Curation, curate, subsample_to_share
from nemo_topr.data.packing import TokenizedSequence
from nemo_topr.data.positives import require_signed_grades
from nemo_topr.data.prepared import PrepareSpec, data_files_digest, find_or_prepare
from nemo_topr.data.records import Record, RecordSet, RenderedPrompt, ValidationReport
from nemo_topr.errors import UserError

SOURCES = [REPO / path for path in (
    "nemo_topr/data/prompts.py", "nemo_topr/data/tokenization.py", "nemo_topr/data/curation.py",
    "nemo_topr/data/packing.py", "nemo_topr/data/shared_prefix.py", "nemo_topr/data/sequence_table.py",
    "nemo_topr/data/prepared.py", "nemo_topr/data/positives.py", "nemo_topr/data/cli.py", "nemo_topr/grading.py",
    "nemo_topr/training/data.py")]
ERRORS = {"DataError", "BenchmarkNotFound", "BenchmarkError", "TokenizerError", "CurationError", "PackingError",
          "PreparedSetError", "UsageError", "OutputError", "GradingError", "GraderErrorRateExceeded", "ConfigError"}
# keys the table cannot reach without Megatron, and why
NEEDS_MEGATRON = {
    "dataset.train_path.unset": "ToprDatasetConfig (nemo_topr.training.data) is a Megatron-Bridge DatasetProvider",
    "dataset.epochs.below_1": "ToprDatasetConfig (nemo_topr.training.data) is a Megatron-Bridge DatasetProvider",
    "dataset.shared_prefix.unpacked": "ToprDatasetConfig (nemo_topr.training.data) is a Megatron-Bridge "
                                      "DatasetProvider (tests/data/test_shared_prefix.py asserts this key); train's "
                                      "validate() refuses it first (test_refusals_train)"}

GOOD_GSM8K = '{"question": "1 + 1?", "answer": "So 2.\\n#### 2"}\n'
# the prepared set of graded.jsonl and the empty tokenizer directory `tok` (make_inputs): its key, a digest of
# their content and PrepareSpec's defaults, changes with them (and with prepared.FORMAT_VERSION)
PREPARED_SET = "prepared/562d2c6239dc5236accb01d0"


def make_inputs(root: Path) -> None:
    """The files the rows name, relative to `root` (the rows run there)."""
    for name, second in (("not_object", '["2 + 2?", "4"]\n'), ("no_answer", '{"question": "2 + 2?"}\n'),
                         ("no_final_line", '{"question": "2 + 2?", "answer": "4"}\n'),
                         ("final_line_no_number", '{"question": "2 + 2?", "answer": "so\\n#### n/a"}\n')):
        (root / name).mkdir()
        (root / name / "gsm8k_test.jsonl").write_text(GOOD_GSM8K + second)
    (root / "short").mkdir()
    (root / "short" / "gsm8k_train.jsonl").write_text(GOOD_GSM8K * 3)
    (root / "eight").mkdir()
    (root / "eight" / "gsm8k_train.jsonl").write_text(GOOD_GSM8K * 8)
    (root / "empty").mkdir()
    (root / "tok").mkdir()
    (root / "graded.jsonl").write_text('{"prompt": "1 + 1?", "completion": " 2", "reward": 1.0}\n')
    (root / "notes.txt").write_text("not a directory\n")
    import datasets

    datasets.Dataset.from_list([{"problem": "1 + 1?", "solution": "2"}]).save_to_disk(root / "saved_no_answer")
    placeholder_hf_model(root / "tok_model")  # the tiny chat tokenizer: a 27-token prompt for "1 + 1?"
    placeholder_hf_model(root / "big_vocab", {"vocab_size": 100})  # a 300-token tokenizer
    config = placeholder_hf_model(root / "no_eos") / "tokenizer_config.json"
    config.write_text(json.dumps({key: value for key, value in json.loads(config.read_text()).items()
                                  if key != "eos_token"}))

def records(*rewards: float, baseline: float | None = None, prompt: object = "1 + 1?", path: str = "",
            line: int = 0) -> RecordSet:
    """A RecordSet of one prompt's records with `rewards`, read from `path` (graded.jsonl's report)."""
    rows = [Record(prompt=prompt, completion=f" {i}", reward=reward, baseline=baseline, path=path, line=line,
                   index=i) for i, reward in enumerate(rewards)]
    return RecordSet(rows, ValidationReport(files=["graded.jsonl"], records_in=len(rows), records_used=len(rows)))


# a tokenizer as far as the checks before tokenizing read one
TOKENIZER = SimpleNamespace(eos_token_id=1, chat_template=None, added_tokens_decoder={}, all_special_tokens=[])
CHAT = [{"role": "user", "content": "1 + 1?"}]


@functools.cache
def chat_tokenizer():
    return tokenization.load_tokenizer(Path("tok_model").resolve())


def tokenized(prompt: object, completion: str, **limits: int) -> Callable[[], list[UserError]]:
    """The problem of tokenizing one record of line 1 of graded.jsonl with the tiny chat tokenizer."""
    def tokenize() -> None:
        rows = [Record(prompt=prompt, completion=completion, reward=1.0, path="graded.jsonl", line=1)]
        tokenization.tokenize_records(RecordSet(rows, ValidationReport(files=["graded.jsonl"], records_in=1)),
                                      chat_tokenizer(), **limits)
    return raised(tokenize)


def sequence(*loss_mask: int) -> TokenizedSequence:
    return TokenizedSequence(input_ids=list(range(len(loss_mask))), loss_mask=list(loss_mask), reward=1.0,
                             behavior_logprob=math.nan, prompt_id=0, sample_id=7)


def prepared_wait() -> None:
    spec = PrepareSpec(train_path="graded.jsonl", tokenizer_dir="tok")
    find_or_prepare(spec, "prepared", write=False, wait_timeout=0)


# (key, where, the problem's source: the pure function given the bad input)
ROWS = [
    ("benchmark.file.not_found", "empty/gsm8k_test.jsonl", raised(prompts.load_gsm8k, "test", "empty")),
    ("benchmark.record.not_an_object", "not_object/gsm8k_test.jsonl:2: record",
     raised(prompts.load_gsm8k, "test", "not_object")),
    ("benchmark.answer.not_text", "no_answer/gsm8k_test.jsonl:2: answer",
     raised(prompts.load_gsm8k, "test", "no_answer")),
    ("benchmark.answer.no_final_line", "no_final_line/gsm8k_test.jsonl:2: answer",
     raised(prompts.load_gsm8k, "test", "no_final_line")),
    ("benchmark.answer.final_line_unreadable", "final_line_no_number/gsm8k_test.jsonl:2: answer",
     raised(prompts.load_gsm8k, "test", "final_line_no_number")),
    ("benchmark.split.single_split_dataset", "saved_no_answer: split",
     raised(prompts.load_gsm8k, "test", "saved_no_answer")),
    ("benchmark.answer.column_missing", "saved_no_answer: answer", raised(prompts.load_math500, "saved_no_answer")),
    ("benchmark.split.unknown", "split", raised(prompts.load_gsm8k, "validation", "empty")),
    ("gsm8k_answer.no_final_line", "answer", raised(prompts.gsm8k_final_answer, "no final line")),
    ("benchmark.file.too_few_rows", "short/gsm8k_train.jsonl: file",
     raised(lambda: prompts.gsm8k_exemplars(prompts.load_gsm8k("train", "short")))),
    ("benchmark.file.only_the_exemplars", "eight/gsm8k_train.jsonl: file",
     raised(lambda: prompts.gsm8k_exemplars(prompts.load_gsm8k("train", "eight"), leaving_out=0))),
    ("tokenizer.directory_missing", "nope: tokenizer", raised(tokenization.load_tokenizer, "nope")),
    ("tokenizer.unloadable", "empty: tokenizer", raised(tokenization.load_tokenizer, "empty")),
    ("tokenizer.more_tokens_than_embedding_rows", "big_vocab: tokenizer",
     raised(tokenization.load_tokenizer, "big_vocab")),
    ("tokenizer.no_eos_token", "no_eos: tokenizer", raised(tokenization.load_tokenizer, "no_eos")),
    ("prompt.chat_without_template", "prompt", raised(tokenization.prompt_token_ids, TOKENIZER, [CHAT])),
    ("too_long.unknown", "too_long", raised(tokenization.tokenize_records, records(1.0), TOKENIZER, too_long="Error")),
    ("tokenize.tokenizer_without_eos", "tokenizer",
     raised(tokenization.tokenize_records, records(1.0), SimpleNamespace(eos_token_id=None))),
    ("record.prompt.chat_without_template", "chat.jsonl:3: prompt",
     raised(tokenization.tokenize_records, records(1.0, prompt=CHAT, path="chat.jsonl", line=3), TOKENIZER)),
    ("record.prompt.special_token", "graded.jsonl:1: prompt", tokenized("1 + 1?<|eot_id|>", " 2")),
    ("record.completion.special_token", "graded.jsonl:1: completion", tokenized("1 + 1?", " 2<|eot_id|>")),
    ("record.prompt.not_rendered", "graded.jsonl:1: prompt", tokenized(RenderedPrompt("1 + 1?"), " 2")),
    ("record.completion.empty_completion", "graded.jsonl:1: completion", tokenized("1 + 1?", "")),
    ("record.completion.too_long", "graded.jsonl:1: completion",
     tokenized("1 + 1?", " 2 and 3 and 4", max_seq_length=35)),  # 27 + 14 + EOS tokens
    ("record.prompt.too_long", "graded.jsonl:1: prompt", tokenized("1 + 1?", " 2", max_seq_length=20)),
    ("record.completion.beyond_model_context", "graded.jsonl:1: completion",
     tokenized("1 + 1?", " 2 and 3 and 4", model_context=35)),
    ("dataset.no_completion_tokens", "graded.jsonl: dataset",
     raised(tokenization.tokenize_records, records(), TOKENIZER)),
    ("curation.mode.several_chosen", "target_p, target_p_tilde, anna_karenina",
     raised(Curation, target_p=0.5, anna_karenina=True)),
    ("curation.target_p_tilde.outside_0_1", "target_p_tilde", raised(Curation, target_p_tilde=1.5)),
    ("curation.baseline.outside_open_minus_1_1", "baseline", raised(Curation, baseline=1.0)),
    ("curation.per_prompt.without_target", "per_prompt", raised(Curation, per_prompt=True)),
    ("curation.reward.one_side_only", "reward",
     raised(lambda: subsample_to_share(records(1.0, 1.0).records, 0.5, lambda p: p, per_prompt=False, rng=None))),
    ("curation.target_p_tilde.records_carry_baseline", "baseline",
     raised(lambda: curate(records(1.0, -1.0, baseline=0.1).records, Curation(target_p_tilde=0.5)))),
    ("curation.target_p_tilde.rewards_not_plus_minus_1", "reward",
     raised(lambda: curate(records(1.0, 0.5, -1.0).records, Curation(target_p_tilde=0.5)))),
    ("reward.grades_without_sign", "graded.jsonl: reward", raised(require_signed_grades, records(0.0, 1.0), "so")),
    ("reward.all_zero", "graded.jsonl: reward", raised(require_signed_grades, records(0.0, 0.0), "so")),
    ("sequence.longer_than_seq_length", "seq_length",
     raised(packing.PackedBatches, [sequence(0, 1, 1)], seq_length=2, rows_per_batch=1, pad_id=0)),
    ("rows_per_batch.below_1", "rows_per_batch",
     raised(packing.PackedBatches, [sequence(0, 1)], seq_length=2, rows_per_batch=0, pad_id=0)),
    ("shared_prefix.sequence.no_completion_token", "sequence 4",
     raised(shared_prefix.prompt_length, sequence(0, 0), 4)),
    ("shared_prefix.sequence.not_prompt_then_completion", "sequence 4",
     raised(shared_prefix.prompt_length, sequence(0, 1, 0, 1), 4)),
    ("dataset.train_path.no_local_files", "no_such/*.jsonl: path", raised(data_files_digest, "no_such/*.jsonl")),
    ("prepared_set.not_written_in_time", PREPARED_SET, raised(prepared_wait)),
    ("--max-seq-length.without_tokenizer", "--max-seq-length",
     raised(data_cli.main, ["validate", "graded.jsonl", "--max-seq-length", "8"])),
    ("--prepared-dir.without_max_seq_length", "--prepared-dir",
     raised(data_cli.main, ["validate", "graded.jsonl", "--tokenizer", "tok", "--prepared-dir", "sets"])),
    ("--prepared-dir.several_paths", "--prepared-dir",
     raised(data_cli.main, ["validate", "graded.jsonl", "graded.jsonl", "--tokenizer", "tok", "--max-seq-length", "8",
                            "--prepared-dir", "sets"])),
    ("--prepared-dir.is_a_file", "--prepared-dir",
     raised(data_cli.main, ["validate", "graded.jsonl", "--tokenizer", "tok", "--max-seq-length", "8",
                            "--prepared-dir", "notes.txt"])),
    ("--out.is_a_file", "--out", raised(data_cli.main, ["stats", "graded.jsonl", "--out", "notes.txt"])),
    ("data.several_problems", "missing.jsonl: path, --out",
     raised(data_cli.main, ["curate", "missing.jsonl", "--out", "notes.txt"])),
    ("reference_answer.gsm8k.no_number", "reference_answer", raised(grading.gsm8k_reference_answer, "so\n#### n/a")),
    ("reference_answer.math.empty", "reference_answer", raised(grading.math_reference_answer, " ")),
    ("task.unknown", "task", raised(grading.grader_of, "gsm9k")),
    ("grader_error_rate.above_max", "--max-grader-error-rate",
     raised(grading.check_grader_errors, [grading.GradeResult(None, "error", "TimeoutError: 5 s"),
                                          grading.GradeResult("2", "correct")], 0.01)),
]


inputs, test_each_bad_input_raises_its_problem = row_tests(ROWS, make_inputs)


def test_nothing_is_written_where_a_refusal_says_nothing_is(inputs, monkeypatch):
    """A refused `data stats` writes no stats, a prepared set waited for is not written by the waiter."""
    monkeypatch.chdir(inputs)
    before = sorted(str(path) for path in Path().rglob("*"))
    for key, _, problem in ROWS:
        if key in ("--out.is_a_file", "--max-seq-length.without_tokenizer", "prepared_set.not_written_in_time",
                   "--prepared-dir.without_max_seq_length", "--prepared-dir.several_paths", "--prepared-dir.is_a_file"):
            assert problem(), key
    assert sorted(str(path) for path in Path().rglob("*")) == before


def test_the_rows_inputs_pass_but_for_their_change(inputs, monkeypatch):
    """What each row changes is its problem: the same calls with the change undone raise nothing."""
    monkeypatch.chdir(inputs)
    assert prompts.gsm8k_final_answer("so\n#### 2") == "2"
    assert len(prompts.gsm8k_exemplars(prompts.load_gsm8k("train", "eight"))) == 8
    assert tokenization.prompt_token_ids(TOKENIZER, []) == []
    Curation(target_p=0.5), Curation(target_p_tilde=1.0), Curation(baseline=0.99), Curation(per_prompt=True, target_p=1)
    require_signed_grades(records(-1.0, 1.0), "so")
    assert shared_prefix.prompt_length(sequence(0, 1, 1), 4) == 1
    assert packing.PackedBatches([sequence(0, 1)], seq_length=2, rows_per_batch=1, pad_id=0) is not None
    assert grading.gsm8k_reference_answer("so\n#### 2") == "2" and grading.grader_of("math") is not None


def test_the_table_covers_every_key_the_code_raises():
    assert_covers(ROWS, SOURCES, ERRORS, unreachable=NEEDS_MEGATRON)


def test_the_messages_are_the_golden_files(inputs, monkeypatch):
    monkeypatch.chdir(inputs)
    assert_golden("tests/data/test_refusals.py",
                  [rendered("data", key, where, *problem(), inputs) for key, where, problem in ROWS])


def test_the_table_imports_no_megatron(inputs, monkeypatch):
    """Each problem comes out of the data layer's own checks: running the whole table imports neither
    Megatron nor Transformer Engine (none that the session had not imported already)."""
    monkeypatch.chdir(inputs)

    def megatron() -> set[str]:
        return {name for name in sys.modules if name.startswith(("megatron", "transformer_engine"))}

    before = megatron()
    assert [problem()[0].key for _, _, problem in ROWS] == [key for key, _, _ in ROWS]
    assert megatron() - before == set()
