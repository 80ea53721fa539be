"""`score-logprobs` in chunks of records (`nemo_topr.training.scoring`): the records written, their
order and the report do not depend on the chunk size, nor do the scores beyond float rounding (a
sequence's place in its packed row orders the CPU attention's sums); data that fits one chunk is
scored as it was whole."""

import contextlib
import io
import itertools
import json
import re
from collections import Counter

import pytest
import torch

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
