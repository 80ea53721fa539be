"""`nemo-topr plan`'s and `nemo-topr submit`'s refusals as a table: one row per problem, its bad input → the
problem's key and where.

The rows assert the key and where only; the words are in tests/golden/refusals.txt (tests/refusal_table.py),
whose section for this table ``NEMO_TOPR_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/cluster/test_refusals.py``
rewrites. Every key nemo_topr/cluster raises has a row: a new refusal without one fails
`test_the_table_covers_every_key_the_code_raises`. tests/iterate/test_refusals.py runs these rows with its own
in a fresh interpreter that must not import Megatron. The problems `submit`'s pre-flight finds (`preflight`: not
queued, the job would fail) are lines of one report, not raised: each is a UserError with its key and where all the
same, and its row gives the pure check the bad input and asserts the problems it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import REPO, placeholder_hf_model
from tests.refusal_table import assert_covers, assert_golden, raised, rendered
from tests.iterate.test_refusals import found_once

from nemo_topr.cluster import submit
from nemo_topr.cluster.environment import training_environment
from nemo_topr.cluster.venv_check import check_venv
from nemo_topr.cluster.plan import check_machine, parse_args, resolve_architecture
from nemo_topr.errors import UserError

SOURCES = sorted((REPO / "nemo_topr" / "cluster").glob("*.py"))
ERRORS = {"ConfigError", "UserError", "EnvironmentScriptError", "UsageError"}
# keys the table cannot reach without a subprocess, and what needs it
NEEDS_A_SUBPROCESS = {
    "sbatch.failed": "sbatch itself (tests/slurm/test_scripts.py's fake sbatch)",
    "run_dir.resume_refused": "a run directory holding an earlier start's run state and checkpoint, which "
                              "tests/slurm/test_scripts.py's test_submit_into_a_run_says_it_resumes_... trains first",
}
# a pre-flight problem's venv: a python that prints the packages it lacks, as venv_check's probe does
FAKE_PYTHON = "#!/bin/sh\necho '{}'\n"


def make_inputs(root: Path) -> None:
    """The files the rows name, relative to `root` (the rows run there)."""
    placeholder_hf_model(root / "hf_model")  # a config.json without a Llama's sizes
    (root / "notes.txt").write_text("not a model\n")
    (root / "broken.yaml").write_text("defaults: [\n")
    (root / "own_run_dir.yaml").write_text("defaults:\n  - tiny_cpux\nrun_dir: mine\n")
    (root / "environment.sh").write_text("export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}\nexport NCCL_DEBUG=INFO\n")
    for venv, lacking in (("venv_without_megatron", '["megatron.core"]'), ("venv_without_te", '["transformer_engine"]')):
        (root / venv / "bin").mkdir(parents=True)
        (root / venv / "bin" / "python").write_text(FAKE_PYTHON.format(lacking))
        (root / venv / "bin" / "python").chmod(0o755)


def machine(*options: str):
    """A row's problem: `plan`'s options (for the preset llama31_8b_bf16), which `check_machine` refuses."""
    return raised(lambda: check_machine(parse_args(["llama31_8b_bf16", *options])))


def found_by(check, *args, first: bool = False):
    """A row's problem: the pre-flight problems `check(*args)` finds (lines of submit's one report, not
    raised); `first`: the first of them only."""
    def problem() -> list[UserError]:
        found = check(*args)
        found = found[0] if isinstance(found, tuple) else found  # (problems, warnings or paths)
        return found[:1] if first else found
    return problem


def job(**settings) -> submit.ClusterJob:
    return submit.ClusterJob("tiny_cpu", **settings)


# (verb, key, where, the problem's source: the pure function given the bad input)
ROWS = [
    ("plan", "base_model.config_json.not_llama", "base_model",
     raised(resolve_architecture, {"base_model": "hf_model"}, "exp", None)),
    ("plan", "architecture.unknown", "base_model", raised(resolve_architecture, {}, "my_experiment", None)),
    ("plan", "base_model.unusable", "base_model",
     raised(resolve_architecture, {"base_model": "notes.txt"}, "exp", None)),
    ("plan", "--config.value.missing", "--config", raised(parse_args, ["--config", "--nodes", "1"])),
    ("plan", "--config.twice", "--config-name", raised(parse_args, ["--config", "a", "--config-name=b"])),
    ("plan", "--nodes.below_1", "--nodes", machine("--nodes", "0")),
    ("plan", "--gpus-per-node.below_1", "--gpus-per-node", machine("--gpus-per-node", "-2")),
    ("plan", "--gpu-memory-gb.not_positive", "--gpu-memory-gb", machine("--gpu-memory-gb", "nan")),
    ("plan", "--reserve-gb.out_of_range", "--reserve-gb", machine("--gpu-memory-gb", "40", "--reserve-gb", "40")),
    ("submit", "run_dir.empty", "run_dir", raised(submit.job_run_dir, None, ["run_dir="])),
    ("submit", "run_dir.twice", "run_dir", raised(submit.job_run_dir, None, ["run_dir=a", "++run_dir=b"])),
    ("submit", "run_dir.differs_from_option", "--run-dir", raised(submit.job_run_dir, Path("a"), ["run_dir=b"])),
    ("submit", "config.refused", "--config", raised(submit.own_run_dir, Path("own_run_dir.yaml"), [])),
    ("submit", "--job-name.not_a_file_name", "--job-name",
     raised(submit.main, ["--config", "tiny_cpu", "--job-name", "../mine", "--dry-run"])),
    # submit's pre-flight: the problems of one report, "not queued, the job would fail"
    ("submit", "--venv.no_python", "--venv", found_by(submit.check_environment, job(venv=Path("no_venv")), {}, [])),
    ("submit", "--container-mounts.source_missing", "--container-mounts",
     found_by(submit.check_environment, job(container_image="img"), {}, [submit.Mount(Path("no_dir"), Path("/m"))])),
    ("submit", "base_model.not_mounted", "base_model",
     found_by(submit.check_environment, job(container_image="img"), {"base_model": Path("/models/m")}, [])),
    ("submit", "--venv.python_does_not_run", "--venv", found_by(check_venv, Path("no_venv"), {})),
    ("submit", "--venv.lacks_rank_packages", "--venv", found_by(check_venv, Path("venv_without_megatron"), {})),
    ("submit", "model.fp8.needs_transformer_engine", "model.fp8",
     found_by(check_venv, Path("venv_without_te"), {"model": {"fp8": "hybrid"}})),
    ("submit", "base_model.not_a_model", "base_model",
     found_by(submit.check_inputs, {"base_model": Path("notes.txt")}, {"base_model": "notes.txt"})),
    ("submit", "dataset.train_path.missing", "dataset.train_path",
     found_by(submit.check_inputs, {"dataset.train_path": Path("no_data.jsonl")},
              {"dataset": {"train_path": "no_data.jsonl"}})),
    # (train's own refusal, run_dir.refused_by_train, follows: no directory can be made under a file)
    ("submit", "run_dir.not_creatable", "run_dir",
     found_by(submit.check_inputs, {"run_dir": Path("notes.txt/run")}, {"run_dir": "notes.txt/run"}, first=True)),
    ("submit", "run_dir.refused_by_train", "run_dir",
     found_by(submit.check_inputs, {"run_dir": Path("hf_model")}, {"run_dir": "hf_model"})),
    ("submit", "--time.not_a_slurm_time", "--time", found_by(submit.check_time, job(time="soon"))),
    ("submit", "--preemption-warning.not_below_time", "--preemption-warning",
     found_by(submit.check_time, job(time="10:00", preemption_warning_s=600))),
    ("submit", "--job-name.not_an_sbatch_word", "--job-name", found_by(submit.check_sbatch_words, job(job_name='a"b'))),
    ("submit", "--run-dir.not_an_sbatch_word", "--run-dir",
     found_by(submit.check_sbatch_words, job(run_dir=Path("runs\nx")))),
    ("submit", "layout.rule_broken", "world size = TP·PP·CP·DP",
     found_by(submit.check_layout, {"model": {"tensor_model_parallel_size": 4}}, "llama31_8b_bf16",
              job(gpus_per_node=6))),
    ("submit", "dataset.train_path.not_set", "dataset.train_path",
     found_by(submit.check_settings_set, {"run_dir": "r", "base_model": "m", "dataset": {"train_path": "???"}})),
    ("submit", "run_config.refused", "--config", found_by(submit.preflight, submit.ClusterJob("broken.yaml"))),
    # the ranks' environment, which `nemo-topr iterate` reads for the ranks it starts
    ("iterate", "environment.export.overrides_a_set_value", "environment.sh:2",
     raised(training_environment, Path("environment.sh"))),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("refusal_inputs")
    make_inputs(root)
    return root


@pytest.fixture(scope="module")
def found(inputs) -> Callable[[str], tuple[list[UserError], list[Path]]]:
    return found_once({key: problem for _, key, _, problem in ROWS}, inputs)


@pytest.mark.parametrize("key, where", [row[1:3] for row in ROWS], ids=[row[1] for row in ROWS])
def test_each_bad_input_raises_its_problem(key, where, found):
    problems, written = found(key)
    assert [(error.key, error.where) for error in problems] == [(key, where)]
    assert written == []


def test_the_table_covers_every_key_the_code_raises():
    assert_covers([row[1:] for row in ROWS], SOURCES, ERRORS, unreachable=NEEDS_A_SUBPROCESS)


def test_the_messages_are_the_golden_files(inputs, found):
    assert_golden("tests/cluster/test_refusals.py",
                  [rendered(verb, key, where, *found(key)[0], inputs) for verb, key, where, _ in ROWS])
