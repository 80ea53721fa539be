"""`nemo-topr data validate|stats|curate` end to end, and the statistics they print."""

import json
import re
from pathlib import Path

import pytest

from nemo_topr.cli import main
from nemo_topr.data import cli as data_cli
from nemo_topr.data.records import DataError, Record, load_records
from nemo_topr.data.stats import summarize
from nemo_topr.objective import effective_positive_share
from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer
from nemo_topr.utils.arguments import UsageError
from nemo_topr.utils.outputs import OutputError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "data"
SCORED = FIXTURES / "gsm8k_scored.jsonl"
MALFORMED = FIXTURES / "malformed.jsonl"


def _problems(err: str) -> str:
    """stderr without the line said before torch and transformers load (tests/test_cli.py)."""
    return "".join(line for line in err.splitlines(keepends=True)
                   if not re.match(r"nemo-topr data (validate|stats): \d+ records read; ", line))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tiny_tokenizer(out, chat_template=False)
    return out


def test_summary_of_the_real_gsm8k_fixture():
    summary = summarize(load_records(SCORED).records, baseline=0.2)
    composition = summary["composition"]
    assert (composition["records"], composition["prompts"], composition["positives"]) == (24, 6, 11)
    assert composition["p"] == pytest.approx(11 / 24)
    assert composition["p_tilde"] == pytest.approx(effective_positive_share(11 / 24, 0.2))
    assert summary["positives_per_prompt"] == {0: 1, 1: 2, 2: 1, 3: 1, 4: 1}
    assert summary["samples_per_prompt"] == {4: 6}
    assert summary["reward"] == {"count": 24, "values": {"-1.0": 13, "1.0": 11}}
    assert summary["chars"]["completion"]["count"] == 24 and summary["behavior_logprob"]["max"] < 0
    assert "tokens" not in summary


def test_p_tilde_is_the_share_the_loss_sees_for_any_rewards_and_the_records_own_baselines(tmp_path, capsys):
    """p~ = sum_{R >= 0} |R - c| / sum |R - c|. The closed form holds for +-1 rewards only, and
    records with a baseline field are trained at their own c, not at --baseline."""
    from nemo_topr.data.stats import composition

    def records(rewards, baselines=None):
        return [Record(prompt=f"q{i}", completion="a", reward=r, index=i,
                       baseline=None if baselines is None else baselines[i]) for i, r in enumerate(rewards)]

    # +2, -1, -1 at c = 0: 2 / (2 + 1 + 1); the +-1 closed form would give p = 1/3
    assert composition(records([2.0, -1.0, -1.0]))["p_tilde"] == pytest.approx(0.5)
    # +-1 at c = 0.2: |1 - 0.2| = 0.8 against 2 x 1.2, the closed form's 0.8 / 3.2
    assert composition(records([1.0, -1.0, -1.0]), 0.2)["p_tilde"] == pytest.approx(0.25)
    assert effective_positive_share(1 / 3, 0.2) == pytest.approx(0.25)
    # own baselines 0.5, 0.5, 0, 0, -0.5, -0.5: |A| = 0.5, 1.5, 1, 1, 0.5, 0.5; positives 0.5 + 1 of 5
    own = records([1.0, -1.0, -1.0, 1.0, -1.0, -1.0], [0.5, 0.5, 0.0, 0.0, -0.5, -0.5])
    mixed = composition(own, 0.2)
    assert mixed["p_tilde"] == pytest.approx(0.3) and mixed["p"] == pytest.approx(1 / 3)
    assert mixed["baseline"] == "the records' own baseline field"

    data = tmp_path / "own.jsonl"
    data.write_text("".join(json.dumps({"prompt": r.prompt, "completion": r.completion, "reward": r.reward,
                                        "baseline": r.baseline}) + "\n" for r in own))
    assert main(["data", "stats", str(data), "--baseline", "0.2"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["p_tilde"] == pytest.approx(0.3)
    assert "--baseline 0.2 is not the records' c: they carry their own baseline field" in err
    assert main(["data", "stats", str(data)]) == 0
    assert "not the records' c" not in capsys.readouterr().err  # no --baseline given, nothing to say


def test_validate_prints_the_report(capsys, tokenizer_dir):
    assert main(["data", "validate", str(SCORED), "--tokenizer", str(tokenizer_dir), "--max-seq-length", "2048"]) == 0
    out = capsys.readouterr().out
    assert "records in: 24\nrecords used: 24\nrecords dropped: 0" in out
    assert "packed into 3 rows of 2048 tokens, padding share" in out


def test_validate_strict_fails_with_the_located_error(capsys):
    assert main(["data", "validate", str(MALFORMED)]) == 1
    assert capsys.readouterr().err.startswith(f"nemo-topr data validate: {MALFORMED}:2: record: ")


def test_validate_non_strict_counts_drops_including_too_long(capsys, tokenizer_dir):
    argv = ["data", "validate", str(MALFORMED), "--no-strict", "--tokenizer", str(tokenizer_dir), "--max-seq-length", "256"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "records in: 16\nrecords used: 3\nrecords dropped: 13" in out
    assert f"too_long: 1  (first: {MALFORMED}:14: completion:" in out


@pytest.mark.parametrize("verb", ["stats", "curate"])
def test_stats_and_curate_non_strict_print_the_drops_as_validate_does(verb, tmp_path, capsys):
    good = SCORED.read_text().splitlines()[0]
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join([good, good[:40], json.dumps({**json.loads(good), "reward": "1.0"}),
                               json.dumps({**json.loads(good), "reward": float("nan")})]) + "\n")
    out = ["--out", str(tmp_path / "c.jsonl")] if verb == "curate" else []
    assert main(["data", verb, "--no-strict", str(data), *out]) == 0
    printed = capsys.readouterr().out
    assert "records in: 4\nrecords used: 1\nrecords dropped: 3\n" in printed
    assert f"  invalid_json: 1  (first: {data}:2: record: invalid JSON" in printed
    assert f"  nonfinite_reward: 1  (first: {data}:4: reward: must be finite, got nan)\n" in printed
    assert f"  wrong_type: 1  (first: {data}:3: reward: expected a number, got string '1.0')\n" in printed
    assert main(["data", "validate", "--no-strict", str(data)]) == 0
    assert capsys.readouterr().out in printed  # validate's very report, on its stream


def test_validate_with_a_models_tokenizer_finds_records_beyond_its_context(capsys, tmp_path, tokenizer_dir):
    """What score-logprobs and train refuse (`beyond_model_context`) is found by validate when
    --tokenizer names a model; a bare tokenizer directory has no context to check."""
    from nemo_topr.model.providers import build_tiny_hf_llama

    model = build_tiny_hf_llama(tmp_path / "short", build_tiny_tokenizer(chat_template=False),
                                max_position_embeddings=200)  # the fixture's records: 125 to 293 tokens
    capsys.readouterr()  # the model's build
    assert main(["data", "validate", str(SCORED), "--tokenizer", str(model)]) == 1
    assert _problems(capsys.readouterr().err).startswith(
        f"nemo-topr data validate: {SCORED}:9: completion: 221 tokens (130 prompt + 90 completion + EOS) > the "
        "model's context 200 (max_position_embeddings")
    assert main(["data", "validate", str(SCORED), "--tokenizer", str(model), "--too-long", "drop"]) == 0
    assert re.search(r"^  beyond_model_context: 12 ", capsys.readouterr().out, re.MULTILINE)  # 12 over 200
    assert main(["data", "validate", str(SCORED), "--tokenizer", str(tokenizer_dir)]) == 0


def test_validate_reports_a_missing_tokenizer(capsys, tmp_path):
    assert main(["data", "validate", str(SCORED), "--tokenizer", str(tmp_path / "none")]) == 1
    with pytest.raises(DataError) as refused:
        data_cli.main(["validate", str(SCORED), "--tokenizer", str(tmp_path / "none")])
    assert (refused.value.key, refused.value.where) == ("tokenizer.directory_missing",
                                                        f"{tmp_path / 'none'}: tokenizer")


def test_stats_refuses_an_out_that_is_a_file_and_an_unwritable_out_is_one_line(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert main(["data", "stats", str(SCORED), "--out", str(notes)]) == 1
    capsys.readouterr()
    with pytest.raises(OutputError) as refused:
        data_cli.main(["stats", str(SCORED), "--out", str(notes)])
    assert (refused.value.key, refused.value.where) == ("--out.is_a_file", "--out")
    assert notes.read_text() == "mine"
    assert main(["data", "stats", str(SCORED), "--out", str(notes / "stats")]) == 1  # a directory under a file
    assert capsys.readouterr().err == (f"nemo-topr data stats: --out {notes}/stats/stats.json: its directory cannot "
                                       f"be made (File exists: {notes})\n")


def test_stats_writes_json_and_png(tmp_path, tokenizer_dir, capsys):
    out = tmp_path / "stats"
    assert main(["data", "stats", str(SCORED), "--baseline", "0.2", "--tokenizer", str(tokenizer_dir), "--out", str(out)]) == 0
    summary = json.loads((out / "stats.json").read_text())
    assert summary["composition"]["p"] == pytest.approx(11 / 24)
    assert summary["composition"]["baseline"] == 0.2
    assert summary["tokens"]["completion"]["count"] == 24
    assert summary["validation"]["records_in"] == 24
    assert (out / "stats.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert '"p_tilde"' in capsys.readouterr().out


def test_curate_writes_a_dataset_and_its_stats(tmp_path):
    out = tmp_path / "curated.jsonl"
    assert main(["data", "curate", str(SCORED), "--target-p", "0.25", "--seed", "1", "--out", str(out)]) == 0
    stats = json.loads(out.with_suffix(".stats.json").read_text())
    curated = load_records(out).records
    assert stats["records_in"] == 24 == len(curated) + sum(stats["dropped"].values())
    assert stats["after"]["positives"] == sum(r.reward > 0 for r in curated) == 4  # 4 / (4 + 13) is nearest 0.25
    assert stats["settings"]["seed"] == 1

    again = tmp_path / "again.jsonl"
    main(["data", "curate", str(SCORED), "--target-p", "0.25", "--seed", "1", "--out", str(again)])
    assert again.read_bytes() == out.read_bytes()


def test_curate_anna_karenina_and_bad_settings(tmp_path, capsys):
    out = tmp_path / "ak.jsonl"
    assert main(["data", "curate", str(SCORED), "--anna-karenina", "--out", str(out), "--stats", str(tmp_path / "s.json")]) == 0
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["after"]["positives"] == 5 and stats["dropped"] == {"anna_karenina": 6}  # 5 prompts with a positive
    with pytest.raises(SystemExit):
        main(["data", "curate", str(SCORED), "--anna-karenina", "--target-p", "0.2", "--out", str(out)])
    assert main(["data", "curate", str(SCORED), "--target-p-tilde", "0.2", "--baseline", "1", "--out", str(out)]) == 1
    assert "baseline must be in (-1, 1)" in capsys.readouterr().err
    # usage errors naming the flag: --seed -1 drew what --seed 1 draws (random.Random takes |seed|)
    for option, value, message in (("--seed", "-1", "must be at least 0; got -1"),
                                   ("--target-p", "1.5", "must be a share in [0, 1]; got 1.5"),
                                   ("--target-p-tilde", "nan", "must be a share in [0, 1]; got nan")):
        extra = [] if option != "--seed" else ["--target-p", "0.3"]
        with pytest.raises(SystemExit) as usage:
            main(["data", "curate", str(SCORED), *extra, option, value, "--out", str(tmp_path / "x.jsonl")])
        assert usage.value.code == 2 and f"argument {option}: {message}" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


def _graded_01(tmp_path: Path) -> Path:
    """The real fixture with its -1/+1 rewards turned into 0/1 grades."""
    path = tmp_path / "graded_01.jsonl"
    rows = [json.loads(line) for line in SCORED.read_text().splitlines()]
    path.write_text("".join(json.dumps({**row, "reward": (row["reward"] + 1) / 2}) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("verb", ["stats", "validate"])
def test_zero_one_grades_with_a_baseline_above_zero_warn_that_there_are_no_negatives(verb, tmp_path, capsys):
    graded = _graded_01(tmp_path)
    assert main(["data", verb, str(graded), "--baseline", "0.5"]) == 0
    err = capsys.readouterr().err
    assert "warning: no record is negative (reward < 0), yet the baseline 0.5 is above the smallest reward 0" in err
    assert "reward = 2 * grade - 1" in err
    # at baseline 0 the wrong answers (reward 0 = c) train nothing: said, never unsaid
    assert main(["data", verb, str(graded)]) == 0
    assert _problems(capsys.readouterr().err) == (
        "warning: no record is negative (reward < 0), and the records with the smallest reward 0, the baseline, get "
        "an advantage R - c = 0: they train nothing, so only the others train (SFT on them) and no wrong answer is "
        "pushed down; if they are wrong answers, map 0/1 grades to -1/+1 (reward = 2 * grade - 1; docs/data.md, "
        "'Rewards graded 0/1'), or set objective.negative_rule=advantage with a baseline between the grades "
        "(objective.baseline=0.5)\n")
    # +-1 rewards at 0.5 or 0, and 0/1 grades below their smallest reward, warn of nothing
    assert main(["data", verb, str(SCORED), "--baseline", "0.5"]) == 0
    assert main(["data", verb, str(SCORED)]) == 0
    assert main(["data", verb, str(graded), "--baseline", "-0.5"]) == 0
    own = tmp_path / "own_baselines.jsonl"  # each record's own c (a group mean): --baseline is not what they get
    own.write_text("".join(json.dumps({**json.loads(line), "baseline": 0.5}) + "\n"
                           for line in graded.read_text().splitlines()))
    assert main(["data", verb, str(own)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_curate_refuses_anna_karenina_on_zero_one_grades_and_warns_of_them(tmp_path, capsys):
    graded = _graded_01(tmp_path)
    out = tmp_path / "curated.jsonl"
    # no reward < 0: every record a "positive", so it would keep each prompt's first record, right or wrong
    assert main(["data", "curate", str(graded), "--anna-karenina", "--out", str(out)]) == 1
    with pytest.raises(DataError) as refused:
        data_cli.main(["curate", str(graded), "--anna-karenina", "--out", str(out)])
    assert (refused.value.key, refused.value.where) == ("reward.grades_without_sign", f"{graded}: reward")
    assert not out.exists()
    capsys.readouterr()
    # de-duplication alone is kept, with the warning stats and validate give
    assert main(["data", "curate", str(graded), "--out", str(out)]) == 0
    assert "warning: no record is negative (reward < 0), and the records with the smallest reward 0" in (
        capsys.readouterr().err)
    assert len(load_records(out).records) == 24
    one_grade = tmp_path / "all_right.jsonl"  # one reward throughout reads one way: kept
    one_grade.write_text("".join(json.dumps({**json.loads(line), "reward": 1.0}) + "\n"
                                 for line in SCORED.read_text().splitlines()))
    assert main(["data", "curate", str(one_grade), "--anna-karenina", "--out", str(tmp_path / "one.jsonl")]) == 0
    assert len(load_records(tmp_path / "one.jsonl").records) == 6  # one per prompt


def test_train_warns_of_zero_one_grades_in_check_baseline(capsys):
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.recipe import check_baseline

    check_baseline(ObjectiveConfig(baseline=0.5), {0.0, 1.0})
    assert "[nemo-topr] WARNING: no record is negative (reward < 0), yet" in capsys.readouterr().out
    for variant in ("topr", "tis"):  # c = 0 = the wrong answers' reward: they train nothing
        check_baseline(ObjectiveConfig(variant=variant), {0.0, 1.0})
        assert "the baseline, get an advantage R - c = 0: they train nothing" in capsys.readouterr().out
    check_baseline(ObjectiveConfig(baseline=0.5, negative_rule="advantage"), {0.0, 1.0})  # R - c < 0 is negative
    check_baseline(ObjectiveConfig(baseline=0.5), {-1.0, 1.0})
    check_baseline(ObjectiveConfig(), {-1.0, 1.0})
    # c is not what the records get (their own baselines, asymre's group means), or negatives are dropped by design
    check_baseline(ObjectiveConfig(), {0.0, 1.0}, record_baselines=True)
    check_baseline(ObjectiveConfig(variant="asymre"), {0.0, 1.0})
    check_baseline(ObjectiveConfig(variant="sft_positive"), {0.0, 1.0})
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("rewards, refused, accepted", [
    ({-1.0, 1.0}, [1.0, 1.5, -1.0, -3.0], [0.99, 0.0, -0.99]),  # the paper's +-1: c in (-1, 1)
    ({0.0, 1.0}, [1.0, 2.0], [0.0, 0.5, -0.5]),  # 0/1 grades: c = 0 is SFT on the correct ones
    ({-0.5, 0.25, 3.0}, [3.0, -0.5, -2.0], [2.9, -0.4, 0.25]),  # graded rewards: their own range
])
def test_train_refuses_a_baseline_that_gives_every_record_one_sign(rewards, refused, accepted):
    """c >= the largest reward: the best completions pushed down (c = 2 with +-1 rewards trains
    the model away from its correct answers); c <= the smallest negative one: the worst pushed up."""
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.config_error import ConfigError
    from nemo_topr.training.recipe import check_baseline

    for baseline in refused:
        with pytest.raises(ConfigError) as refusal:
            check_baseline(ObjectiveConfig(baseline=baseline), rewards, warn=False)
        assert refusal.value.key == "objective.baseline.flips_signs"
    for baseline in accepted:
        check_baseline(ObjectiveConfig(baseline=baseline), rewards, warn=False)


def test_data_stats_warns_of_a_baseline_train_would_refuse(capsys):
    assert main(["data", "stats", str(SCORED), "--baseline", "1"]) == 0  # +-1 rewards
    assert _problems(capsys.readouterr().err) == (
        "warning: the baseline 1 is not below the largest reward 1: every record gets an advantage R - c <= 0, so "
        "the best completions get no signal or are pushed down; `train` refuses this baseline\n")


def test_data_validate_warns_when_every_advantage_is_zero(tmp_path, capsys):
    """All rewards 0 at --baseline 0 (0/1 grades, none correct): nothing would train."""
    rows = [json.loads(line) for line in SCORED.read_text().splitlines()]
    zeros = tmp_path / "zeros.jsonl"
    zeros.write_text("".join(json.dumps({**row, "reward": 0.0}) + "\n" for row in rows))
    assert main(["data", "validate", str(zeros)]) == 0
    assert capsys.readouterr().err == (
        "warning: every record's advantage R - c is 0 (each reward equals its baseline c): the loss and its "
        "gradients are 0 for every variant, so training would change nothing; if these are 0/1 grades with no "
        "correct answer, sample more or map 0/1 grades to -1/+1 (reward = 2 * grade - 1; docs/data.md, 'Rewards "
        "graded 0/1'); `train` refuses these records\n")
    assert main(["data", "validate", str(zeros), "--baseline", "-1"]) == 0  # R - c = 1: SFT on every record
    assert "advantage R - c is 0" not in capsys.readouterr().err


@pytest.mark.parametrize("option", [["--max-seq-length", "16"], ["--too-long", "drop"]], ids=["limit", "too-long"])
def test_validate_length_options_without_a_tokenizer_are_a_usage_error(capsys, option):
    """--too-long without --tokenizer was ignored: nothing counts the tokens."""
    assert main(["data", "validate", str(SCORED), *option]) == 2
    with pytest.raises(UsageError) as refused:
        data_cli.main(["validate", str(SCORED), *option])
    assert (refused.value.key, refused.value.where) == (f"{option[0]}.without_tokenizer", option[0])


# `validate(DataSpec)`: every problem of a command line before a record is read, nothing written; run in a
# folder holding records (r.jsonl) and a file (notes.txt)
SPEC_ROWS = [
    ("validate r.jsonl", []),
    ("stats r.jsonl --out stats", []),
    ("curate r.jsonl --out c.jsonl", []),
    ("validate r.jsonl --max-seq-length 8 --too-long drop",
     [("--max-seq-length.without_tokenizer", "--max-seq-length"), ("--too-long.without_tokenizer", "--too-long")]),
    ("stats missing.jsonl --out notes.txt", [("path.missing", "missing.jsonl: path"), ("--out.is_a_file", "--out")]),
    ("curate r.jsonl --out r.jsonl --overwrite", [("output.is_an_input", "r.jsonl")]),
    ("curate r.jsonl --out c.jsonl --stats c.jsonl", [("output.same_path", "--stats")]),
]


@pytest.mark.parametrize("argv, problems", SPEC_ROWS, ids=[argv for argv, _ in SPEC_ROWS])
def test_validate_names_every_problem_before_a_record_is_read_and_writes_nothing(tmp_path, monkeypatch, argv,
                                                                                 problems):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.jsonl").write_text(SCORED.read_text())
    (tmp_path / "notes.txt").write_text("mine\n")
    before = sorted(tmp_path.rglob("*"))
    spec = data_cli.DataSpec.of(data_cli.build_parser().parse_args(argv.split()))
    assert [(problem.key, problem.where) for problem in data_cli.validate(spec)] == problems
    assert sorted(tmp_path.rglob("*")) == before
