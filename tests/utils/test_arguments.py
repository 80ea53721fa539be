"""Counts and limits on the command line: 0 or a negative batch size or length, a time limit that
is not above 0, a baseline that is no finite number or a negative iteration is a usage error
before anything runs.

`verifier score --batch-size -1` ran no batch (`range(0, n, -2)` is empty), wrote an empty
scored file and a report of no accuracy, and exited 0; `--batch-size 0` and `score-logprobs
--rows-per-batch 0` ended in a ZeroDivisionError or `range()` traceback, `--rows-per-batch -1`
after writing an empty scored file. `doctor --timeout 0` built its model, then failed every
check ("no result within 0 s") and skipped the rest. `generate` and `eval` with
`--max-grader-error-rate -1` sampled everything, then failed on an empty list of grader errors
(IndexError); NaN compared false and never failed."""

import pytest

from tests.conftest import placeholder_hf_model
from nemo_topr.evaluation import verifier
from nemo_topr.training import scoring


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_batch_size_below_one_is_a_usage_error_and_nothing_is_written(tmp_path, capsys, value):
    model, data = placeholder_hf_model(tmp_path / "model"), tmp_path / "graded.jsonl"
    data.write_text('{"prompt": "Q", "completion": " a", "reward": 1}\n')
    commands = {
        "nemo-topr verifier score: error: argument --batch-size": lambda out: verifier.main(
            ["score", "--model", str(model), "--records", str(data), "--out", str(out), "--batch-size", value,
             "--device", "cpu"]),
        "nemo-topr score-logprobs: error: argument --rows-per-batch": lambda out: scoring.main(
            ["--model", str(model), "--data", str(data), "--out", str(out), "--rows-per-batch", value,
             "--device", "cpu"]),
    }
    for number, (message, command) in enumerate(commands.items()):
        out = tmp_path / f"out{number}.jsonl"
        with pytest.raises(SystemExit) as exit_:
            command(out)
        assert exit_.value.code == 2
        assert f"{message}: " in capsys.readouterr().err  # the option named (its problem: the model table's rows)
        assert not out.exists() and not out.with_suffix(".report.json").exists()


@pytest.mark.parametrize("value", ["0", "-5", "inf", "nan"])
def test_a_doctor_time_limit_not_above_zero_is_a_usage_error_before_any_check(tmp_path, capsys, value):
    from nemo_topr.doctor import command as doctor

    with pytest.raises(SystemExit) as exit_:
        doctor.main(["--device", "cpu", "--timeout", value, "--work-dir", str(tmp_path / "work")])
    assert exit_.value.code == 2
    assert "nemo-topr doctor: error: argument --timeout: " in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("value", ["-1", "1.5", "nan"])
def test_a_grader_error_rate_outside_zero_to_one_is_a_usage_error_before_sampling(tmp_path, capsys, value):
    from nemo_topr.evaluation import evaluate, generate

    model = placeholder_hf_model(tmp_path / "model")
    for name, command in (("generate", generate.main), ("eval", evaluate.main)):
        with pytest.raises(SystemExit) as exit_:
            command(["--model", str(model), "--benchmark" if name == "eval" else "--prompts",
                     "gsm8k" if name == "eval" else "gsm8k-test", "--device", "cpu", "--out",
                     str(tmp_path / f"{name}.jsonl"), "--max-grader-error-rate", value])
        assert exit_.value.code == 2
        assert f"nemo-topr {name}: error: argument --max-grader-error-rate: " in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]


@pytest.mark.parametrize("command, message", [
    # `data validate --baseline nan` printed p~ for no baseline without a word (`stats` refused it)
    (["data", "validate", "{data}", "--baseline", "nan"], "data validate: error: argument --baseline"),
    (["data", "curate", "{data}", "--baseline=-inf", "--out", "{out}"],
     "data curate: error: argument --baseline"),
    # a limit of 0 or below read as "every record is too long" (or all dropped with --no-strict)
    (["data", "validate", "{data}", "--tokenizer", "{model}", "--max-seq-length", "0", "--no-strict"],
     "data validate: error: argument --max-seq-length"),
    (["score-logprobs", "--model", "{model}", "--data", "{data}", "--out", "{out}", "--device", "cpu",
      "--seq-length", "-4"], "score-logprobs: error: argument --seq-length"),
    # a negative iteration was looked for as iter_-000001
    (["export", "--ckpt", "{model}", "--hf-out", "{out}", "--iteration", "-1"],
     "export: error: argument --iteration"),
])
def test_a_baseline_length_or_iteration_out_of_range_is_a_usage_error(tmp_path, capsys, command, message):
    from nemo_topr import cli

    model, data = placeholder_hf_model(tmp_path / "model"), tmp_path / "graded.jsonl"
    data.write_text('{"prompt": "Q", "completion": " a", "reward": 1}\n')
    paths = {"data": str(data), "model": str(model), "out": str(tmp_path / "out.jsonl")}
    with pytest.raises(SystemExit) as exit_:
        cli.main([word.format(**paths) for word in command])
    assert exit_.value.code == 2
    assert f"nemo-topr {message}: " in capsys.readouterr().err  # the option named
    assert sorted(path.name for path in tmp_path.iterdir()) == ["graded.jsonl", "model"]


@pytest.mark.parametrize(("command", "message"), [
    # argparse alone: "unrecognized arguments: --devcie", or only the missing required ones
    (["score-logprobs", "--model", "M", "--data", "D.jsonl", "--out", "O.jsonl", "--devcie", "cpu"],
     "score-logprobs: error: unrecognized arguments: --devcie cpu (--devcie: did you mean --device?)"),
    (["export", "--hf_out", "x"],
     "export: error: the following arguments are required: --ckpt, --hf-out; "
     "unknown: --hf_out (did you mean --hf-out?)"),
    # the sub-command's options, not every sub-command's: --target-p is curate's
    (["data", "stats", "D.jsonl", "--tokeniser", "M", "--target_p", "0.5"],
     "data: error: unrecognized arguments: --tokeniser M --target_p 0.5 (--tokeniser: did you mean --tokenizer?)"),
    (["data", "curate", "D.jsonl", "--out", "O.jsonl", "--target_p", "0.5"],
     "data: error: unrecognized arguments: --target_p 0.5 (--target_p: did you mean --target-p?)"),
    # a verb taking KEY=VALUE overrides: a setting written as an option names the override
    (["train", "--config-name", "tiny_cpu", "--device", "cpu"],
     "train: error: unrecognized arguments: --device (--device: did you mean the override device=cpu?)"),
    (["plan", "tiny_cpu", "--base-model=/models/llama"],
     "plan: error: unrecognized arguments: --base-model=/models/llama "
     "(--base-model: did you mean the override base_model=/models/llama?)"),
    # a section's key by its last name (conf/topr.yaml's keys); no key of that name, no suggestion
    (["train", "--config-name", "tiny_cpu", "--seq-length", "512"],
     "train: error: unrecognized arguments: --seq-length (--seq-length: did you mean the override "
     "dataset.seq_length=512 or the override model.seq_length=512?)"),
    (["submit", "--config", "tiny_cpu", "--lr=1e-4", "--dry-run"],
     "submit: error: unrecognized arguments: --lr=1e-4 (--lr: did you mean the override optimizer.lr=1e-4?)"),
    (["train", "--config-name", "tiny_cpu", "--dry-run"], "train: error: unrecognized arguments: --dry-run"),
    (["iterate", "iterate_tiny_cpu", "--rounds", "3"],
     "iterate: error: unrecognized arguments: --rounds 3 (--rounds: did you mean the override rounds=3?)"),
    # argparse's own words where they are right: an ambiguous abbreviation, an option's missing value
    (["generate", "--s", "1"], "generate: error: ambiguous option: --s could match --seed, --stop, --sampler-logprobs"),
    (["generate", "--stop", "--x"], "generate: error: argument --stop: expected one argument"),
    # nothing close, and after `--` nothing is an option
    (["generate", "--xyzzy", "--", "--model"],
     "generate: error: the following arguments are required: --prompts, --model, --out; unknown: --xyzzy"),
    # an abbreviation of exactly one option is argparse's own, and no unknown option
    (["eval", "--num-samp", "3", "--out", "x"],
     "eval: error: one of the arguments --benchmark --prompts --records --plot is required"),
])
def test_a_usage_error_names_the_option_meant_by_a_mistyped_one(capsys, command, message):
    from nemo_topr import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(command)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"nemo-topr {message}"


def test_every_verb_suggests_the_option_meant(capsys):
    """Each verb's parser is `arguments.Parser` (a new verb's plain ArgumentParser would not say)."""
    from nemo_topr import cli

    for verb in cli.VERBS:
        with pytest.raises(SystemExit):
            cli.main([verb, "--hepl"])
        last = capsys.readouterr().err.splitlines()[-1]
        assert last.endswith(("(--hepl: did you mean --help?)", "unknown: --hepl (did you mean --help?)")), verb
