"""`score-logprobs` in chunks of records (`nemo_topr.training.scoring`): the records written, their
order and the report do not depend on the chunk size, nor do the scores beyond float rounding (a
sequence's place in its packed row orders the CPU attention's sums); data that fits one chunk is
scored as it was whole. `validate(ScoreLogprobsSpec)` names every problem of a scoring at once, before
Megatron, with nothing written (SPEC_ROWS).
"""

import contextlib
import io
import itertools
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from tests.conftest import REPO, placeholder_hf_model

from nemo_topr.errors import UserError
from nemo_topr.training import scoring

SEQ_LENGTH = 512
CHUNKS = {"whole": 10_000, "by_5": 5}
# lines of the records file that are no usable record, and the drop each is counted under
BAD_LINES = {4: "invalid_json", 11: "empty_completion", 21: "too_long", 31: "schema_mismatch"}


def _records_file(graded, path, bad_lines=tuple(BAD_LINES)):
    """`graded`'s records with those of BAD_LINES numbered `bad_lines` among them; returns (path,
    the graded rows in order)."""
    rows = [json.loads(line) for line in graded.read_text().splitlines()]
    bad = {4: "{not json", 11: json.dumps({**rows[0], "completion": "", "sample_id": 999}),
           21: json.dumps({**rows[1], "completion": "word " * 400, "sample_id": 998}),  # over SEQ_LENGTH tokens
           31: json.dumps({**rows[2], "sample_id": 997, "behavior_logprob": -3.0})}  # a field the others lack
    good = iter(rows)
    lines = [bad[n] if n in bad_lines else json.dumps(next(good)) for n in range(1, len(rows) + len(bad_lines) + 1)]
    path.write_text("\n".join(lines) + "\n")
    return path, rows


@pytest.fixture(scope="module")
def scored(tiny_graded, megatron_world, tmp_path_factory):
    """The data scored non-strict in each of CHUNKS: (graded rows, {name: (output rows, report,
    stderr, sizes of the chunks read)})."""
    from nemo_topr.training import scoring

    model_dir, graded = tiny_graded
    root = tmp_path_factory.mktemp("scoring_chunks")
    data, rows = _records_file(graded, root / "records.jsonl")
    runs = {}
    for name, chunk_records in CHUNKS.items():
        sizes, stderr = [], io.StringIO()

        def counted(records, n, sizes=sizes):
            for chunk in itertools.batched(records, n):
                sizes.append(len(chunk))
                yield chunk

        out = root / f"{name}.jsonl"
        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(stderr):
            patch.setattr(scoring, "batched", counted)
            summary = scoring.score_logprobs(model_dir, data, out, seq_length=SEQ_LENGTH, device="cpu", strict=False,
                                             chunk_records=chunk_records)
        report = json.loads((root / f"{name}.jsonl.report.json").read_text())
        assert summary == report
        runs[name] = ([json.loads(line) for line in out.read_text().splitlines()], report, stderr.getvalue(), sizes)
    return rows, runs


@pytest.mark.slow  # the module's two scorings of the tiny model: ~15 s
def test_every_usable_record_is_written_in_input_order_with_its_score(scored):
    rows, runs = scored
    for name, (written, _, _, _) in runs.items():
        assert [{k: v for k, v in row.items() if k != "behavior_logprob"} for row in written] == rows, name
        assert all(row["behavior_logprob"] < 0 for row in written), name


@pytest.mark.slow  # the module's two scorings of the tiny model: ~15 s
def test_the_report_counts_the_same_drops_whatever_the_chunk_size(scored):
    _, runs = scored
    reports = {name: report for name, (_, report, _, _) in runs.items()}
    for name, report in reports.items():
        assert (report["records_in"], report["records_used"], report["records_scored"]) == (52, 48, 48), name
        assert report["dropped"] == Counter(BAD_LINES.values()), name
        assert {reason: int(re.match(r".*?:(\d+): ", error)[1]) for reason, error in report["first_error"].items()} \
            == {reason: line for line, reason in BAD_LINES.items()}, name
    whole, by_5 = ({k: v for k, v in report.items() if k not in ("out", "mean_behavior_logprob")}
                   for report in reports.values())
    assert whole == by_5


@pytest.mark.slow  # the module's two scorings of the tiny model: ~15 s
def test_scores_do_not_depend_on_the_chunk_size_beyond_rounding(scored):
    _, runs = scored
    whole, by_5 = ([row["behavior_logprob"] for row in written] for written, _, _, _ in runs.values())
    torch.testing.assert_close(by_5, whole, rtol=1e-6, atol=0)
    means = [report["mean_behavior_logprob"] for _, report, _, _ in runs.values()]
    torch.testing.assert_close(means[1], means[0], rtol=1e-6, atol=0)
    assert means[0] == sum(whole) / len(whole)


@pytest.mark.slow  # the module's two scorings of the tiny model: ~15 s
def test_the_records_are_read_a_chunk_at_a_time_and_every_micro_batch_counted(scored):
    _, runs = scored
    sizes = {name: run[3] for name, run in runs.items()}
    # 52 lines less the 3 that fail validation (the too-long one is tokenized), read by the pass that packs
    # them (to count the micro-batches before the model is built) and by the one that scores them
    assert sizes["whole"] == [49] * 2
    assert sizes["by_5"] == ([5] * 9 + [4]) * 2
    counted = {}
    for name, (_, _, stderr, _) in runs.items():
        last = [line for line in stderr.splitlines() if line.startswith("[nemo-topr score-logprobs]")][-1]
        match = re.fullmatch(r"\[nemo-topr score-logprobs\] (\d+)/\1 micro-batches \(100.0%\), .*", last)
        assert match, last
        counted[name] = int(match[1])
    # 4 rows a micro-batch: the 48 sequences (118 to 411 tokens, 10,961 in all) fill fewer than 40 rows of 512 packed
    # together; in chunks of 5, each of the 10 chunks has its own rows and at least one micro-batch
    assert counted["whole"] < 10 <= counted["by_5"]


def test_a_record_too_long_past_the_first_chunk_is_refused_before_the_model_is_built(
        tiny_graded, megatron_world, tmp_path, monkeypatch):
    from nemo_topr.data.records import DataError
    from nemo_topr.model import providers
    from nemo_topr.training.scoring import score_logprobs

    model_dir, graded = tiny_graded
    data, _ = _records_file(graded, tmp_path / "records.jsonl", bad_lines=(21,))
    monkeypatch.setattr(providers, "load_model", lambda *a, **k: pytest.fail("the model was built"))
    with pytest.raises(DataError) as refused:
        score_logprobs(model_dir, data, tmp_path / "out.jsonl", seq_length=SEQ_LENGTH, device="cpu",
                       chunk_records=5)
    assert (refused.value.key, refused.value.line) == ("record.completion.too_long", 21)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["records.jsonl"]


# `validate(ScoreLogprobsSpec)`: every problem of a scoring at once, before Megatron, nothing written. The rows'
# paths are relative to a folder holding a Hugging Face model (model), good records (records.jsonl), a record that
# is no JSON (bad.jsonl), a file (notes.txt) and a report left by an earlier scoring (scored.jsonl.report.json).
SPEC_ROWS = [
    ({}, []),
    ({"device": "tpu"}, [("device.invalid", "--device")]),
    ({"model": "absent"}, [("model.no_such_directory", "--model")]),
    ({"data": "absent.jsonl"}, [("path.missing", "absent.jsonl: path")]),
    ({"data": "bad.jsonl"}, [("record.invalid_json", "bad.jsonl:1: record")]),
    ({"out": "records.jsonl"}, [("output.is_an_input", "records.jsonl")]),
    ({"out": "notes.txt/scored.jsonl"}, [("output.directory_unmakeable", "--out")]),
    ({"out": "scored.json"}, [("output.records.not_jsonl", "--out")]),
    ({"out": "scored.jsonl"}, [("output.exists", "--out's report")]),
    # a flag --train-config replaces is named on the device asked for, even where it cannot be had
    ({"device": "cuda", "train_config": "llama31_8b_bf16", "tensor_parallel": 2},
     [("train_config.with_layout_flags", "--train-config"), ("device.cuda_unavailable", "--device")]),
    # the data and the outputs apart, told in one refusal
    ({"data": "bad.jsonl", "out": "bad.jsonl"},
     [("output.is_an_input", "bad.jsonl"), ("record.invalid_json", "bad.jsonl:1: record")]),
    # the data is read only for a device and a model it can be scored with
    ({"device": "tpu", "model": "absent", "data": "bad.jsonl", "out": "bad.jsonl"},
     [("model.no_such_directory", "--model"), ("device.invalid", "--device")]),
]
SIZED_LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_attention_heads": 2,
               "num_hidden_layers": 1, "intermediate_size": 16, "vocab_size": 32}


@pytest.fixture(scope="module")
def spec_inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scoring_spec")
    placeholder_hf_model(root / "model", SIZED_LLAMA)
    (root / "records.jsonl").write_bytes((REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl").read_bytes())
    (root / "bad.jsonl").write_text("{not json\n")
    (root / "notes.txt").write_text("notes\n")
    (root / "scored.jsonl.report.json").write_text("{}\n")
    return root


def _tree(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def _spec(**given) -> scoring.ScoreLogprobsSpec:
    return scoring.ScoreLogprobsSpec(**{"model": "model", "data": "records.jsonl", "out": "out/scored.jsonl",
                                        "device": "cpu", **given})


@pytest.mark.parametrize("given, problems", SPEC_ROWS, ids=[str(given) for given, _ in SPEC_ROWS])
def test_validate_names_every_problem_of_a_scoring_before_megatron_and_writes_nothing(spec_inputs, given, problems,
                                                                                      monkeypatch):
    monkeypatch.chdir(spec_inputs)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what device cpu sets, put back after the test
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same rows on a machine with a GPU
    before, megatron = _tree(spec_inputs), {name for name in sys.modules if name.startswith("megatron")}
    assert [(problem.key, problem.where) for problem in scoring.validate(_spec(**given))] == problems
    assert _tree(spec_inputs) == before and not (spec_inputs / "out").exists()
    assert {name for name in sys.modules if name.startswith("megatron")} <= megatron


def test_several_problems_of_a_scoring_are_refused_as_one_naming_each(spec_inputs, monkeypatch):
    monkeypatch.chdir(spec_inputs)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UserError) as refused:
        scoring.score_logprobs("model", "bad.jsonl", "bad.jsonl", device="cpu")
    assert (refused.value.key, refused.value.where) == ("score-logprobs.several_problems",
                                                        "bad.jsonl, bad.jsonl:1: record")
    assert len(str(refused.value).splitlines()) == 2
