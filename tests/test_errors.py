"""The user-error root and the one did-you-mean helper."""

from nemo_topr.errors import UserError, did_you_mean, nearest


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
