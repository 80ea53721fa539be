"""`nemo-topr iterate`'s refusals as a table: one row per problem, its bad input → the problem's key and where.

The rows assert the key and where only; the words are in tests/golden/refusals.txt (tests/refusal_table.py),
whose section for this table ``NEMO_TOPR_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/iterate/test_refusals.py``
rewrites. Every key the driver's modules (nemo_topr/iterate) can raise has a row: a new refusal without one fails
`test_the_table_covers_every_key_the_code_raises`. The validation rows stand in for the training config's
composition (`training_config`, which imports Bridge for its schema); its own rows stand in for the composed
values where Bridge would be needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
from tests.conftest import REPO, checkout_env, placeholder_hf_model
from tests.refusal_table import assert_covers, assert_golden, raised, rendered

from nemo_topr.errors import UserError
from nemo_topr.iterate import processes
from nemo_topr.iterate.base_model import check_same_base_model
from nemo_topr.iterate.config import TrainOptions, read_config
from nemo_topr.iterate.processes import check_launch
from nemo_topr.iterate.stages import Stage
from nemo_topr.iterate.validation import load_config, training_config, validate
from nemo_topr.training.validation import objective_from

SOURCES = sorted((REPO / "nemo_topr" / "iterate").glob("*.py"))
# keys the table cannot reach without a subprocess, and what needs it
NEEDS_A_SUBPROCESS = {
    "stage.failed": "a stage's `nemo-topr` command that fails (tests/iterate/test_iterate.py "
                    "test_a_failed_stage_leaves_no_marker_and_a_done_stage_is_not_rerun)"}


def driver(*overrides: str, objective: dict | None = None) -> Callable[[], list[UserError]]:
    """`validate` of iterate_tiny_cpu on the placeholder model with `overrides`, the training config's
    composition standing in: its values `{}` and the objective `objective` (the training's default)."""
    def problem() -> list[UserError]:
        config = read_config("iterate_tiny_cpu", ["base_model=hf_model", "out=out", *overrides])
        with stand_in_training(objective):
            return validate(config)
    return problem


def stand_in_training(objective: dict | None = None):  # noqa: ANN201 - a mock patcher
    return mock.patch("nemo_topr.iterate.validation.training_config",
                      lambda train, ranks: ({}, objective_from(objective or {})))


def first(problem: Callable[[], list[UserError]]) -> Callable[[], list[UserError]]:
    """The first of `problem`'s problems: for a bad input that the sampling commands refuse too."""
    return lambda: problem()[:1]


def loaded(*overrides: str) -> Callable[[], list[UserError]]:
    """`load_config` (every problem of `validate` in one refusal) with the training's stand-in."""
    def run() -> None:
        with stand_in_training():
            load_config("iterate_tiny_cpu", ["base_model=hf_model", "out=out", *overrides])
    return raised(run)


def composed(values: dict) -> Callable[[], list[UserError]]:
    """`training_config` of the training config composed to `values` (its checks passed)."""
    def run() -> None:
        with mock.patch("nemo_topr.cluster.plan.compose_config", lambda name, overrides, path: (values, name)):
            training_config(TrainOptions(), 1)
    return raised(run)


def launched(environ: dict[str, str], *overrides: str) -> Callable[[], list[UserError]]:
    """`check_launch` of iterate_tiny_cpu with `overrides` in the process environment `environ` on a
    machine without GPUs."""
    def run() -> None:
        config = read_config("iterate_tiny_cpu", ["base_model=hf_model", *overrides])
        with mock.patch("torch.cuda.device_count", return_value=0):
            check_launch(config, environ)
    return raised(run)


def without_task_script() -> None:
    with mock.patch.object(processes, "TASK_SCRIPT", Path("no_such_task_script.sh")):
        check_launch(read_config("iterate_tiny_cpu", ["base_model=hf_model", "nodes=2"]),
                     {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2"})


def stage(*args: str) -> Stage:
    """The generate stage of the inputs' stage/ directory, marked done with `generate --out graded.jsonl`,
    its output since deleted."""
    return Stage("generate", Path("stage"), args, (Path("stage/graded.jsonl"),))


def make_inputs(root: Path) -> None:
    """The files the rows name, relative to `root` (the rows run there)."""
    placeholder_hf_model(root / "hf_model")
    (root / "bad_driver.yaml").write_text("train:\n  config_name: [tiny_cpu\n")
    (root / "stage").mkdir()
    (root / "stage" / "generate.done.json").write_text(json.dumps(
        {"stage": "generate", "args": ["generate", "--out", "stage/graded.jsonl"], "outputs": ["stage/graded.jsonl"]}))
    (root / "rounds").mkdir()
    (root / "rounds" / "base_model.json").write_text(json.dumps({"base_model": "/elsewhere/model", "files": []}))


TARGET = ("curate.mode=target_p_tilde", "curate.target=0.2")

# (key, where, the problem's source: the pure function given the bad input)
ROWS = [
    ("config.not_found", "config", raised(read_config, "no_such_driver")),
    ("config.not_yaml", "config", raised(read_config, "bad_driver.yaml")),
    ("config.a_training_config", "config", raised(read_config, "tiny_cpu")),
    ("config.key_refused", "roundz", raised(read_config, "iterate_tiny_cpu", ["roundz=2"])),
    ("overrides.empty_value", "out", raised(read_config, "iterate_tiny_cpu", ["out="])),
    ("overrides.list_set_to_null", "generate.args", raised(read_config, "iterate_tiny_cpu", ["generate.args=null"])),
    ("overrides.list_without_brackets", "train.overrides",
     raised(read_config, "iterate_tiny_cpu", ["train.overrides=dataset.epochs=2"])),
    ("rounds.below_1", "rounds", driver("rounds=0")),
    ("nodes.below_1", "nodes", driver("nodes=0")),
    ("device.invalid", "device", first(driver("device=tpu"))),  # generate's and eval's --device too
    ("curate.mode.invalid", "curate.mode", driver("curate.mode=best")),
    ("curate.target.not_for_mode", "curate.target", driver("curate.mode=target_p")),
    ("curate.target.not_a_share", "curate.target", driver("curate.mode=target_p", "curate.target=1.5")),
    ("curate.per_prompt.without_subsampling", "curate.per_prompt", driver("curate.per_prompt=true")),
    ("generate.zero_shot.not_gsm8k", "generate.zero_shot", driver("generate.prompts=math500")),
    ("eval.benchmark.invalid", "eval.benchmark", driver("eval.benchmark=gsm8k-test", "eval.zero_shot=false")),
    ("eval.zero_shot.with_prompts", "eval.zero_shot", driver("eval.prompts=gsm8k-test")),
    ("eval.zero_shot.not_gsm8k", "eval.zero_shot", driver("eval.benchmark=math500")),
    ("eval.rendered_prompts.without_prompts", "eval.rendered_prompts", driver("eval.rendered_prompts=true")),
    ("generate.options.refused", "generate", driver("generate.num_samples=0")),
    ("eval.options.refused", "eval", driver("eval.args=[--k,8]")),
    ("generate.args.ambiguous", "generate.args", driver("generate.args=[--num,3]")),
    ("eval.args.set_by_the_driver", "eval.args", driver("eval.args=[--samples-out=x]")),
    ("verifier.args.without_model", "verifier.args", driver("verifier.args=[--batch-size,2]")),
    ("verifier.model.not_hugging_face", "verifier.model", driver("verifier.model=nowhere")),
    ("verifier.args.refused", "verifier.args", driver("verifier.model=hf_model", "verifier.args=[--bach-size,2]")),
    ("base_model.unusable", "base_model", driver("base_model=nowhere")),
    ("out.inside_base_model", "out", driver("out=hf_model/rounds")),
    ("curate.mode.target_p_tilde_with_asymre", "curate.mode", driver(*TARGET, objective={"variant": "asymre"})),
    ("curate.baseline.differs_from_training", "curate.baseline", driver(*TARGET, "curate.baseline=0.3")),
    ("config.several_problems", "rounds, nodes", loaded("rounds=0", "nodes=0")),
    ("train.overrides.set_by_the_driver", "train.overrides",
     raised(training_config, TrainOptions(overrides=["run_dir=mine"]), 1)),
    ("train.resume_from_base.true", "train.overrides", composed({"resume_from_base": True})),
    ("train.config.refused", "train.overrides", raised(training_config, TrainOptions(config_name="no_such_config"), 1)),
    ("nproc_per_node.above_gpus", "nproc_per_node", launched({}, "device=cuda")),
    ("driver.under_srun_tasks", "SLURM_STEP_NUM_TASKS", launched({"SLURM_STEP_NUM_TASKS": "8"})),
    ("nodes.driver_in_srun_step", "SLURM_STEP_ID", launched({"SLURM_STEP_ID": "0"}, "nodes=2")),
    ("nodes.not_in_allocation", "nodes", launched({}, "nodes=2")),
    ("nodes.above_allocation", "nodes", launched({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2"}, "nodes=3")),
    ("nodes.task_script_missing", "nodes", raised(without_task_script)),
    ("stage.output.changed", "stage/generate.done.json",
     raised(stage("generate", "--out", "stage/graded.jsonl").is_done)),
    ("stage.arguments.changed", "stage/generate.done.json",
     raised(stage("generate", "--out", "stage/graded.jsonl", "--limit", "3").is_done)),
    ("base_model.changed_since_out_started", "base_model",
     raised(check_same_base_model, Path("rounds/base_model.json"), "hf_model", write=False)),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("refusal_inputs")
    make_inputs(root)
    return root


def found_once(problems: dict[str, Callable[[], list[UserError]]],
               inputs: Path) -> Callable[[str], tuple[list[UserError], list[Path]]]:
    """Each key's (problems, files its problem wrote in `inputs`), run there once for a table's row
    and golden tests (tests/cluster/test_refusals.py's too)."""
    results = {}

    def of(key: str) -> tuple[list[UserError], list[Path]]:
        if key not in results:
            with contextlib.chdir(inputs):
                before = set(inputs.rglob("*"))
                results[key] = problems[key](), sorted(set(inputs.rglob("*")) - before)
        return results[key]
    return of


@pytest.fixture(scope="module")
def found(inputs) -> Callable[[str], tuple[list[UserError], list[Path]]]:
    return found_once({key: problem for key, _, problem in ROWS}, inputs)


@pytest.mark.parametrize("key, where", [row[:2] for row in ROWS], ids=[row[0] for row in ROWS])
def test_each_bad_input_raises_its_problem(key, where, found):
    problems, written = found(key)
    assert [(error.key, error.where) for error in problems] == [(key, where)]
    assert written == []


def test_the_rows_inputs_pass_but_for_their_change(inputs, monkeypatch):
    """What each row changes is its problem: the driver config, its stand-in training and the launch
    checks pass every rule without it."""
    monkeypatch.chdir(inputs)
    assert driver()() == []
    assert launched({})() == []
    assert raised(check_same_base_model, Path("rounds/new_base_model.json"), "hf_model", write=False)() == []


def test_a_stop_names_the_stage_it_stopped():
    stopped = processes.Stopped(signal.SIGTERM, "train", -signal.SIGTERM)
    assert (stopped.key, stopped.where, stopped.exit_code) == ("stage.stopped", "train", 128 + signal.SIGTERM)


def test_the_table_covers_every_key_the_code_raises():
    assert_covers(ROWS, SOURCES, {"IterateError"}, unreachable=NEEDS_A_SUBPROCESS)


def test_the_messages_are_the_golden_files(inputs, found):
    assert_golden("tests/iterate/test_refusals.py",
                  [rendered("iterate", key, where, *found(key)[0], inputs) for key, where, _ in ROWS])


@pytest.mark.slow
def test_the_table_imports_no_megatron(tmp_path):
    """Each problem comes out of the pure checks: the whole table and tests/cluster/test_refusals.py's
    (`plan`, `submit`: the layer below), run in one fresh interpreter, import neither Megatron nor
    Transformer Engine."""
    from tests.cluster.test_refusals import ROWS as CLUSTER_ROWS  # it imports this module: not at the top

    code = textwrap.dedent("""
        import json, os, sys
        from pathlib import Path
        import tests.cluster.test_refusals as cluster, tests.iterate.test_refusals as iterate
        keys = []
        for table in (iterate, cluster):
            root = Path(table.__name__).resolve()
            table.make_inputs(root)
            os.chdir(root)
            keys += [row[-1]()[0].key for row in table.ROWS]
        imported = sorted(m for m in sys.modules if m.startswith(("megatron", "transformer_engine")))
        print(json.dumps([len(keys), imported]))
    """)
    env = checkout_env()
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [len(ROWS) + len(CLUSTER_ROWS), []]
