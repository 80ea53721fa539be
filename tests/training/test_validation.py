"""Training's cross-field rules (`nemo_topr.training.validation`): every problem of a config at
once, from the values alone, without Megatron; and `data prepare` reached through the top CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tests.conftest import REPO, checkout_env

from nemo_topr.training.config_error import ConfigError
from nemo_topr.training.validation import refuse, validate

# three rules apart: a rate below where it decays to, two precisions, a resume flag that is no boolean
THREE_PROBLEMS = {"optimizer": {"lr": 1e-7, "min_lr": 5e-7}, "model": {"fp16": True, "bf16": True},
                  "resume_from_base": "maybe", "device": "cpu", "objective": {}}


def test_validate_returns_each_rules_problem_naming_its_key():
    problems = validate(THREE_PROBLEMS)
    assert [problem.key for problem in problems] == [  # own values, model choices, learning-rate range
        "resume_from_base.not_boolean", "model.precision.two_chosen", "optimizer.lr.below_min_lr"]
    assert all(isinstance(problem, ConfigError) for problem in problems)
    fixed = {**THREE_PROBLEMS, "optimizer": {"lr": 5e-7, "min_lr": 5e-7}, "model": {"bf16": True},
             "resume_from_base": False}
    assert validate(fixed) == []


def test_refuse_raises_the_one_problem_or_all_of_them():
    one = ConfigError("a")
    with pytest.raises(ConfigError) as raised:
        refuse([one])
    assert raised.value is one
    with pytest.raises(ConfigError) as raised:
        refuse(validate(THREE_PROBLEMS))
    assert str(raised.value).splitlines() == [str(problem) for problem in validate(THREE_PROBLEMS)]
    assert (raised.value.key, raised.value.where) == ("config.several_problems",
                                                      "resume_from_base, model.fp16, optimizer.lr")
    refuse([])  # nothing to refuse


def test_validation_imports_no_megatron():
    """`plan` and `submit` decide with it on a login node: Megatron stays unimported."""
    code = ("import sys; from nemo_topr.training.validation import validate; "
            f"assert len(validate({THREE_PROBLEMS!r})) == 3; "
            "print(sorted(m for m in sys.modules if m.startswith(('megatron', 'transformer_engine'))))")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=checkout_env(), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_data_help_lists_prepare_and_the_top_cli_runs_it_from_training(capsys, monkeypatch):
    """`data prepare` reads a training config: `nemo_topr.cli` routes it to `nemo_topr.training.prepare`
    (data sits below training), while `nemo-topr data --help` lists it with the data verb's others."""
    from nemo_topr import cli

    with pytest.raises(SystemExit):
        cli.main(["data", "--help"])
    assert "prepare" in capsys.readouterr().out
    ran = []
    monkeypatch.setattr("nemo_topr.training.prepare.main", lambda argv: ran.append(argv) or 0)
    assert cli.main(["data", "prepare", "--config-name", "tiny_cpu", "run_dir=x"]) == 0
    assert ran == [["--config-name", "tiny_cpu", "run_dir=x"]]
