"""The user-error root and the one did-you-mean helper."""

import pytest

from nemo_topr.errors import UserError, did_you_mean, nearest, run_refusing, suggestion


def test_user_error_carries_its_key_and_place_and_prints_its_message():
    error = UserError("dataset.train_path is not set", key="dataset.train_path.missing", where="dataset.train_path")
    assert (str(error), error.key, error.where, error.exit_code) == (
        "dataset.train_path is not set", "dataset.train_path.missing", "dataset.train_path", 1)


def test_did_you_mean_names_the_nearest_choices_or_nothing():
    assert nearest("tarin", ["train", "plan", "eval"]) == ["train"]
    assert did_you_mean("tarin", ["train", "plan"]) == "; did you mean train?"
    assert did_you_mean("lrr", ["lr", "min_lr"], prefix="optimizer.", quote=True) == "; did you mean 'optimizer.lr'?"
    assert did_you_mean("zzz", ["train", "plan"]) == ""
    assert did_you_mean("evall", ["eval", "evals", "plan"], n=2) == "; did you mean eval or evals?"
    assert suggestion(["dataset.epochs", "train.epochs"], joiner=", ") == "; did you mean dataset.epochs, train.epochs?"
    assert suggestion([]) == ""


def test_every_refusal_class_is_a_user_error_and_keeps_the_base_its_callers_catch():
    from nemo_topr.data.curation import CurationError
    from nemo_topr.data.prepared import PreparedSetError
    from nemo_topr.data.prompts import BenchmarkNotFound
    from nemo_topr.data.schema import DataError
    from nemo_topr.data.sources import KeyGivenTwice
    from nemo_topr.data.tokenization import TokenizerError
    from nemo_topr.evaluation.evaluate import EvalError
    from nemo_topr.grading import GraderErrorRateExceeded
    from nemo_topr.miniature.study3_placebo import PlaceboError
    from nemo_topr.model.attention_check import AttentionError
    from nemo_topr.model.device import DeviceError
    from nemo_topr.model.hf_weights import WeightsError
    from nemo_topr.model.source import ModelSourceError
    from nemo_topr.training.checkpoints import DamagedCheckpointError
    from nemo_topr.training.export import ExportWriteError
    from nemo_topr.training.nonfinite import NonFiniteTrainingError
    from nemo_topr.training.run_state import RunStateError
    from nemo_topr.utils.distributed import RendezvousError

    bases = {ValueError: [CurationError, DataError, KeyGivenTwice, TokenizerError, EvalError, GraderErrorRateExceeded,
                          PlaceboError, AttentionError, DeviceError, WeightsError, ModelSourceError],
             RuntimeError: [PreparedSetError, DamagedCheckpointError, ExportWriteError, NonFiniteTrainingError,
                            RunStateError, RendezvousError],
             FileNotFoundError: [BenchmarkNotFound]}
    for base, classes in bases.items():
        for error in classes:
            assert issubclass(error, UserError) and issubclass(error, base), error


def test_run_refusing_prints_a_refusal_as_one_line_with_its_exit_code(capsys):
    from nemo_topr.utils.arguments import UsageError

    def refuses(argv):
        raise UsageError(f"--k {argv[0]}: k must be at least 1")

    assert run_refusing("nemo-topr eval", refuses, ["0"]) == 2
    assert capsys.readouterr() == ("", "nemo-topr eval: --k 0: k must be at least 1\n")
    assert run_refusing("nemo-topr eval", lambda argv: None, []) == 0
    with pytest.raises(KeyError):  # not a user's to act on: its traceback is the report
        run_refusing("nemo-topr eval", lambda argv: {}[argv[0]], ["k"])


def test_the_demo_refuses_an_output_directory_not_its_own_in_the_line_its_entry_point_prints(tmp_path, capsys):
    from nemo_topr import demo
    from nemo_topr.utils.outputs import OutputError

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("the user's\n")
    with pytest.raises(OutputError):
        demo.main(["--out", str(taken)])
    assert run_refusing("python -m nemo_topr.demo", demo.main, ["--out", str(taken)]) == 1
    line = capsys.readouterr().err
    assert line.startswith(f"python -m nemo_topr.demo: {taken} is not empty") and line.count("\n") == 1
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]


def test_refuse_raises_the_one_problem_or_one_of_the_first_ones_class_naming_all():
    from nemo_topr.errors import Problems, refuse
    from nemo_topr.utils.arguments import UsageError

    refuse([])  # nothing found: nothing to refuse
    one = UserError("a", key="a.bad", where="a")
    with pytest.raises(UserError) as raised:
        refuse([one])
    assert raised.value is one
    problems = Problems()
    for problem in (UsageError("--k 0", key="option.below_1", where="--k"), one):
        with problems.check():
            raise problem
    with pytest.raises(UsageError) as raised:  # the first one's class: its callers' catch and exit code
        refuse(problems, key="verb.several_problems", separator="; ")
    assert (str(raised.value), raised.value.key, raised.value.where, raised.value.exit_code) == (
        "--k 0; a", "verb.several_problems", "--k, a", 2)
    from nemo_topr.data.schema import DataError

    with pytest.raises(DataError) as raised:  # a class whose __init__ takes a record's place
        refuse([DataError("r.jsonl", 2, "reward", "not a number", key="record.reward"), one])
    assert (str(raised.value), raised.value.key, raised.value.where) == (
        "r.jsonl:2: reward: not a number\na", "several_problems", "r.jsonl:2: reward, a")
