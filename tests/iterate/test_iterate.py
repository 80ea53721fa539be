"""`nemo-topr iterate`: the driver config, resumable stages, rounds without positives or records,
and two real rounds on CPU with a tiny model."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, checkout_env, placeholder_hf_model, tensorboard_scalars
from nemo_topr import cli, iterate
from nemo_topr.data.records import Record, load_records, write_jsonl
from nemo_topr.evaluation.samples import Completion, GradedCompletion, Problem, graded_records
from nemo_topr.evaluation.sample_log import SampleLog, log_path
from nemo_topr.iterate import processes, rounds, stages, summary
from nemo_topr.iterate.config import CurateOptions, IterateError, read_config
from nemo_topr.iterate.driver import Driver, curation_flags
from nemo_topr.iterate.stages import Stage, run_stage
from nemo_topr.iterate.validation import load_config, validate
from nemo_topr.training.config_error import ConfigError


@pytest.fixture
def fake_model(tmp_path):
    return placeholder_hf_model(tmp_path / "base_model")


def tiny_config(model, out, *overrides):
    return load_config("iterate_tiny_cpu", [f"base_model={model}", f"out={out}", *overrides])


def problem_keys(model, out, *overrides):
    """The key of each problem of iterate_tiny_cpu with `overrides` (read_config's refusal, or every
    problem `validate` finds), a training config's problem as "train.config.refused: ITS KEY"."""
    try:
        config = read_config("iterate_tiny_cpu", [f"base_model={model}", f"out={out}", *overrides])
    except IterateError as error:
        return [error.key]
    return [f"{problem.key}: {problem.__context__.key}" if isinstance(problem.__context__, ConfigError)
            else problem.key for problem in validate(config)]


# ---------------------------------------------------------------------------------------------
# Config


def test_the_driver_config_is_its_own_format_naming_the_training_config(fake_model, tmp_path):
    config = tiny_config(fake_model, tmp_path / "out", "rounds=3", "generate.num_samples=2")
    assert (config.rounds, config.generate.num_samples, config.train.config_name) == (3, 2, "tiny_cpu")
    with pytest.raises(IterateError) as error:
        load_config("tiny_cpu", [f"base_model={fake_model}", "out=x"])
    assert error.value.key == "config.a_training_config"


@pytest.mark.parametrize("override, keys", [
    ("generate.limt=3", ["config.key_refused"]),
    ("roundz=2", ["config.key_refused"]),
    ("rounds=two", ["config.key_refused"]),
    # the training config's own checks, at the start rather than in round 1's train stage
    ("train.config_name=tiny_cpux", ["train.config.refused: config.not_found"]),
    ("train.overrides=[optimizer.lrr=0.1]", ["train.config.refused: optimizer.lrr.unknown"]),
    ("train.overrides=[train.global_batch_size=3]",
     ["train.config.refused: train.global_batch_size.not_whole_micro_batches"]),
    ("train.overrides=[objective.ratio_level=token]", ["train.config.refused: objective.ratio_level.token"]),
    # the driver sets these per round: train then refused the key given twice, in round 1
    ("train.overrides=[run_dir=mine]", ["train.overrides.set_by_the_driver"]),
    ("curate.mode=target_p_tilde", ["curate.target.not_for_mode"]),
    # as `data curate --target-p` refuses them; the run failed in the first round with both kinds of sample
    ("curate.mode=target_p curate.target=1.5", ["curate.target.not_a_share"]),
    ("curate.mode=target_p_tilde curate.target=nan", ["curate.target.not_a_share"]),
    # train refused it in round 0, after the start's eval, generate, curate and score
    ("train.overrides=[resume_from_base=true]", ["train.resume_from_base.true"]),
    ("curate.mode=best", ["curate.mode.invalid"]),
    # per_prompt spreads a target's sub-sampling: with anna_karenina (the default) it did nothing
    ("curate.per_prompt=true", ["curate.per_prompt.without_subsampling"]),
    ("eval.benchmark=gsm8k-test", ["eval.benchmark.invalid", "eval.zero_shot.not_gsm8k"]),
    ("eval.benchmark=math500", ["eval.zero_shot.not_gsm8k"]),
    ("eval.prompts=test.jsonl", ["eval.zero_shot.with_prompts", "eval.options.refused"]),
    ("eval.rendered_prompts=true", ["eval.rendered_prompts.without_prompts"]),
    ("eval.zero_shot=false eval.prompts=test.jsonl", ["eval.options.refused"]),
    ("rounds=0", ["rounds.below_1"]),
    ("nproc_per_node=0", ["nproc_per_node.below_1"]),
    ("nodes=0", ["nodes.below_1"]),
    # the batch (4 = 2 x 2) divides over the train stage's ranks as train checks it, at the start
    ("nproc_per_node=3", ["train.config.refused: train.global_batch_size.not_whole_micro_batches"]),
    ("nodes=3", ["train.config.refused: train.global_batch_size.not_whole_micro_batches"]),  # nodes x nproc_per_node
    # generate's and eval's options through those commands' own parsers and checks, at the start:
    # not the round's generate after the start's eval, or eval after the training
    ("generate.num_samples=0", ["generate.options.refused"]),
    ("generate.limit=-1", ["generate.options.refused"]),
    ("generate.args=[--temprature,0.5]", ["generate.options.refused"]),
    ("eval.args=[--temperature,-1]", ["eval.options.refused"]),
    ("eval.args=[--max-grader-error-rate,-1]", ["eval.options.refused"]),
    ("eval.args=[--tensor-parallel-size,4]", ["eval.options.refused"]),  # the transformers backend: device=cpu
    ("eval.args=[--k,8]", ["eval.options.refused"]),  # pass@k needs k samples of the 4
    # after the driver's own options, argparse kept these: every round sampled Morig, 3 samples, not 4
    ("generate.args=[--model,Morig,--num-sa,3]", ["generate.args.set_by_the_driver"] * 2),
    ("generate.args=[--num,3]", ["generate.args.ambiguous"]),  # --num-samples or --num-shots
    ("eval.args=[--samples-out=x,--prompts,p.jsonl]", ["eval.args.set_by_the_driver"] * 2),
    ("generate.prompts=my_prompts.jsonl generate.zero_shot=false generate.task=math", ["generate.options.refused"]),
])
def test_config_mistakes_are_errors(fake_model, tmp_path, override, keys):
    assert problem_keys(fake_model, tmp_path, *override.split()) == keys


@pytest.mark.parametrize(("override", "key", "where"), [
    # OmegaConf's words were "out: Incompatible value 'None' for field of type 'str'"
    ("out=", "overrides.empty_value", "out"),
    ("curate.target=", "overrides.empty_value", "curate.target"),
    # "AnyNode is not a ListConfig, list or tuple"
    ("generate.args=--top-k 50", "overrides.list_without_brackets", "generate.args"),
    ("generate.args=", "overrides.empty_value", "generate.args"),
    ("generate.args=null", "overrides.list_set_to_null", "generate.args"),
    ("train.overrides=dataset.epochs=2", "overrides.list_without_brackets", "train.overrides"),
])
def test_an_empty_value_or_a_list_without_brackets_says_what_to_write(fake_model, tmp_path, override, key, where):
    with pytest.raises(IterateError) as error:
        load_config("iterate_tiny_cpu", [f"base_model={fake_model}", override])
    assert (error.value.key, error.value.where) == (key, where)


def test_an_out_inside_the_base_model_is_refused(fake_model):
    """The rounds' files would count as the model's (`model_files`): changed since it started, so
    no rerun could resume, and the message blamed the model."""
    assert problem_keys(fake_model, fake_model / "rounds") == ["out.inside_base_model"]
    tiny_config(fake_model, fake_model.parent / "rounds")


@pytest.mark.parametrize(("overrides", "flags"), [
    ("[]", []),
    ("[dataset.too_long=drop]", ["--no-strict"]),
    ("[dataset.strict=false]", ["--no-strict"]),  # too_long follows strict
    ("[dataset.strict=false,dataset.too_long=error]", []),
])
def test_scoring_drops_over_long_records_where_training_would(fake_model, tmp_path, overrides, flags):
    """Scoring was always strict: with dataset.too_long=drop the round stopped at score-logprobs's
    first over-long record, which training would have dropped (and counted)."""
    driver = Driver(tiny_config(fake_model, tmp_path, f"train.overrides={overrides}"), dry_run=True)
    assert driver.score_flags == flags


def test_target_p_tilde_curates_at_the_baseline_training_uses(fake_model, tmp_path):
    """p~ depends on c: curating to p~ at another c than training's trains at another share."""
    share = ("curate.mode=target_p_tilde", "curate.target=0.15")
    config = tiny_config(fake_model, tmp_path, *share, "train.overrides=[objective.baseline=0.2]")
    assert config.curate.baseline is None and Driver(config, dry_run=True).baseline == 0.2
    tiny_config(fake_model, tmp_path, *share, "curate.baseline=0.2", "train.overrides=[objective.baseline=0.2]")
    differs = ["curate.baseline.differs_from_training"]
    assert problem_keys(fake_model, tmp_path, *share, "curate.baseline=0.3",
                        "train.overrides=[objective.baseline=0.2]") == differs
    assert problem_keys(fake_model, tmp_path, *share, "curate.baseline=0.3") == differs  # the training's 0.0
    assert problem_keys(fake_model, tmp_path, *share, "curate.baseline=0.0") == []
    assert problem_keys(fake_model, tmp_path, *share, "train.overrides=[objective.variant=asymre]") == [
        "curate.mode.target_p_tilde_with_asymre"]
    tiny_config(fake_model, tmp_path, "curate.mode=target_p", "curate.target=0.3",
                "train.overrides=[objective.variant=asymre]")  # p itself does not depend on c


def test_overrides_may_follow_dry_run(fake_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(stages, "run_command", lambda args, log, ranks: pytest.fail(f"ran {args}"))
    assert iterate.main(["iterate_tiny_cpu", "--dry-run", f"base_model={fake_model}", f"out={tmp_path / 'out'}",
                         "rounds=1", "nproc_per_node=2"]) == 0
    listed = capsys.readouterr().out
    assert "[round_0] generate: to run: python -m nemo_topr.cli generate " in listed
    assert not (tmp_path / "out").exists()
    for verb in ("score-logprobs", "train"):  # the stages that take several ranks; sampling stays one process
        assert f"to run: python -m torch.distributed.run --standalone --nproc-per-node=2 -m nemo_topr.cli {verb} " in (
            listed)


def test_on_several_nodes_score_and_train_run_under_srun_and_the_rest_on_the_drivers_node(fake_model, tmp_path,
                                                                                          monkeypatch, capsys):
    monkeypatch.setattr(stages, "run_command", lambda args, log, ranks: pytest.fail(f"ran {args}"))
    assert iterate.main(["iterate_tiny_cpu", "--dry-run", f"base_model={fake_model}", f"out={tmp_path / 'out'}",
                         "rounds=1", "nodes=2"]) == 0
    commands = {line.split(": ")[0]: line.split(": to run: ")[1] for line in capsys.readouterr().out.splitlines()}
    srun = f"srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 --label {REPO}/slurm/task.sh python "
    assert commands["[round_0] score"].startswith(srun + "score-logprobs ")
    assert commands["[round_0] train"].startswith(srun + "train ")
    for stage in ("generate", "curate", "export", "eval"):
        assert commands[f"[round_0] {stage}"].startswith("python -m nemo_topr.cli "), commands


def test_a_stage_on_several_nodes_meets_at_the_allocations_first_node(monkeypatch):
    """srun starts the ranks; the rendezvous (which torchrun --standalone makes itself) is the
    driver's, as slurm/topr_job.sh's: the first host of SLURM_JOB_NODELIST, 29500 + job id mod 10000."""
    seen = []

    def scontrol(command, **kwargs):
        seen.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="gpu-a07\ngpu-a08\n")

    monkeypatch.setattr(processes.subprocess, "run", scontrol)
    environ = {"SLURM_JOB_ID": "1234567", "SLURM_JOB_NODELIST": "gpu-a[07-08]"}
    ranks = processes.Ranks(per_node=8, nodes=2)
    assert ranks.total == 16
    assert ranks.environment(environ) == {"MASTER_ADDR": "gpu-a07", "MASTER_PORT": str(29500 + 4567),
                                         "LOCAL_WORLD_SIZE": "8"}
    assert seen == [["scontrol", "show", "hostnames", "gpu-a[07-08]"]]
    assert ranks.environment({**environ, "NEMO_TOPR_MASTER_PORT": "40000"})["MASTER_PORT"] == "40000"
    assert processes.Ranks(per_node=8).environment(environ) == {}  # torchrun's own


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_driver_started_as_several_srun_tasks_is_refused(fake_model, tmp_path, nodes):
    """`srun -n 8 nemo-topr iterate ...` would start eight drivers on one `out`."""
    config = tiny_config(fake_model, tmp_path / "out", f"nodes={nodes}")
    environ = {"SLURM_JOB_ID": "17", "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8"}
    with pytest.raises(IterateError) as error:
        processes.check_launch(config, environ)
    assert error.value.key == "driver.under_srun_tasks"
    # one driver: under `srun -n1` with nodes=1, as the batch script (no step) with nodes=2
    one = {**environ, "SLURM_STEP_NUM_TASKS": "1"} if nodes == 1 else {"SLURM_JOB_ID": "17", "SLURM_JOB_NUM_NODES": "2"}
    processes.check_launch(config, one)


def test_gpu_ranks_get_the_training_jobs_environment(fake_model, tmp_path):
    """On cuda, the score and train ranks get what slurm/topr_job.sh gives a training job's ranks
    (slurm/environment.sh; the values by hand from docs/cluster.md's table), a variable the user
    set kept; on cpu, nothing (torchrun's own OMP_NUM_THREADS=1 for gloo ranks stays)."""
    cuda = processes.Ranks.of(tiny_config(fake_model, tmp_path / "out", "device=cuda", "nproc_per_node=2"))
    assert cuda.environment({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}) == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_NVLS_ENABLE": "0", "NCCL_GRAPH_REGISTER": "0",
        "TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "TORCH_NCCL_HIGH_PRIORITY": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8"}
    assert processes.Ranks.of(tiny_config(fake_model, tmp_path / "out", "nproc_per_node=2")).environment({}) == {}
    assert processes.Ranks(cuda=False).environment({}) == {}


@pytest.mark.parametrize("environ, key", [
    ({}, "nodes.not_in_allocation"),
    ({"SLURM_JOB_ID": "17", "SLURM_JOB_NUM_NODES": "1"}, "nodes.above_allocation"),
    ({"SLURM_JOB_ID": "17", "SLURM_JOB_NUM_NODES": "2"}, None),
    ({"SLURM_JOB_ID": "17", "SLURM_JOB_NUM_NODES": "4"}, None),
    # `srun nemo-topr iterate ...`: a nested srun waits for the outer step's resources (on the real
    # one-node Slurm, `srun -n1 bash -c "srun -n1 hostname"` in a job was still waiting after 20 s)
    ({"SLURM_JOB_ID": "17", "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1"},
     "nodes.driver_in_srun_step"),
])
def test_several_nodes_need_an_allocation_of_them(fake_model, tmp_path, environ, key):
    config = tiny_config(fake_model, tmp_path / "out", "nodes=2")
    if key is None:
        processes.check_launch(config, environ)
    else:
        with pytest.raises(IterateError) as error:
            processes.check_launch(config, environ)
        assert error.value.key == key


@pytest.mark.parametrize("overrides, form", [(["eval.zero_shot=false"], "zero-shot"), ([], None),
                                             (["generate.zero_shot=false", "eval.zero_shot=false"], None)])
def test_rounds_trained_in_one_prompt_form_and_measured_in_another_are_named(fake_model, tmp_path, monkeypatch,
                                                                             capsys, overrides, form):
    monkeypatch.setattr(stages, "run_command", lambda args, log, ranks: pytest.fail(f"ran {args}"))
    assert iterate.main(["iterate_tiny_cpu", "--dry-run", f"base_model={fake_model}", f"out={tmp_path / 'out'}",
                         *overrides]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == ([] if form is None else [
        f"note: the rounds train on {form} prompts (generate), and eval measures them with gsm8k's own prompt "
        "(8-shot); to measure them in training's form set eval.zero_shot=true (GSM8K) or eval.prompts to a prompt "
        "file of the benchmark's problems"])


@pytest.mark.parametrize("overrides, warned", [
    ([], False),  # gsm8k-train, measured on gsm8k-test
    (["generate.prompts=gsm8k-test"], True),
    (["generate.prompts=math500", "generate.zero_shot=false", "eval.benchmark=math500", "eval.zero_shot=false"], True),
    (["generate.prompts=math500", "generate.zero_shot=false"], False),  # measured on GSM8K
])
def test_rounds_that_train_on_the_problems_eval_measures_are_warned_of(fake_model, tmp_path, monkeypatch, capsys,
                                                                        overrides, warned):
    monkeypatch.setattr(stages, "run_command", lambda args, log, ranks: pytest.fail(f"ran {args}"))
    assert iterate.main(["iterate_tiny_cpu", "--dry-run", f"base_model={fake_model}", f"out={tmp_path / 'out'}",
                         *overrides]) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING:")]
    split = overrides[0].split("=")[1] if warned else None
    benchmark = "math500" if split == "math500" else "gsm8k"
    instead = "gsm8k-train" if benchmark == "gsm8k" else "a prompt file of MATH's training problems"
    assert warnings == ([f"WARNING: generate.prompts={split} is the split eval measures ({benchmark}): the rounds "
                         f"train on the test problems, so eval's scores say nothing of unseen problems; sample "
                         f"{instead}"] if warned else [])


# ---------------------------------------------------------------------------------------------
# Stages


def graded_line(reward, sample_id, completion=" The answer is 4."):
    return json.dumps({"prompt": "Question: 2+2?\nAnswer:", "completion": completion, "reward": reward,
                       "prompt_id": "q", "sample_id": sample_id}) + "\n"


@pytest.mark.slow
def test_a_failed_stage_leaves_no_marker_and_a_done_stage_is_not_rerun(tmp_path, monkeypatch):
    graded, curated = tmp_path / "graded.jsonl", tmp_path / "curated.jsonl"
    stage = Stage("curate", tmp_path, ("data", "curate", str(graded), "--out", str(curated)), (curated,))
    with pytest.raises(IterateError) as error:  # the real command: no such file
        run_stage(stage)
    assert (error.value.key, error.value.where) == ("stage.failed", str(stage.log))
    assert not stage.marker.exists() and "graded.jsonl" in stage.log.read_text()

    graded.write_text(graded_line(1.0, 0) + graded_line(-1.0, 1, " 5"))
    curated.write_text('{"prompt": "half a rec')  # what a try killed while writing left: replaced by the rerun
    run_stage(stage)
    marker = json.loads(stage.marker.read_text())
    assert marker["args"] == list(stage.args) and marker["outputs"] == [str(curated)]  # --overwrite: not recorded
    assert [json.loads(line)["sample_id"] for line in curated.read_text().splitlines()] == [0, 1]
    assert stage.log.read_text().startswith("{")  # `data curate` ran and printed its summary

    def no_subprocess(args, log, ranks):
        raise AssertionError(f"ran {args}")

    monkeypatch.setattr(stages, "run_command", no_subprocess)
    run_stage(stage)  # done: not run again
    changed = Stage("curate", tmp_path, (*stage.args, "--no-dedup"))
    with pytest.raises(IterateError) as error:
        run_stage(changed)
    assert (error.value.key, error.value.where) == ("stage.arguments.changed", str(stage.marker))


@pytest.mark.parametrize(("change", "refused"), [
    # emptied: read as "generation wrote no records", the round skipped and the next one trained on the base model
    (lambda path: path.write_text(""), True),
    (lambda path: path.write_text(path.read_text() + '{"prompt": "x"'), True),
    # the same size, another content (a reward's sign flipped): its SHA-256 tells
    (lambda path: path.write_text(path.read_text().replace("-1.0", "+1.0")), True),
    (lambda path: path.unlink(), True),  # was a FileNotFoundError traceback, --dry-run too
    # the same content: a `touch`, a copy without -p
    (lambda path: os.utime(path, ns=(1, 1)), False),
    (lambda path: path.write_text(path.read_text()), False),
], ids=["emptied", "appended", "edited-in-place", "deleted", "touched", "rewritten-the-same"])
def test_a_finished_stage_whose_output_changed_since_is_named_not_built_on(tmp_path, monkeypatch, change, refused):
    graded, report = tmp_path / "graded.jsonl", tmp_path / "graded.md"

    def generate(args, log, ranks):
        graded.write_text(graded_line(1.0, 0) + graded_line(-1.0, 1, " 5"))
        report.write_text("# what a person reads")

    monkeypatch.setattr(stages, "run_command", generate)
    stage = Stage("generate", tmp_path, ("generate", "--out", str(graded)), (graded, report), read_later=(graded,))
    run_stage(stage)
    assert stage.is_done()
    report.write_text("# edited in an editor")  # no later stage reads it
    change(graded)
    if not refused:
        assert stage.is_done()
        return
    with pytest.raises(IterateError) as error:
        stage.is_done()
    assert (error.value.key, error.value.where) == ("stage.output.changed", str(stage.marker))


def test_a_marker_from_before_the_stamps_checks_only_that_the_outputs_are_there(tmp_path):
    graded = tmp_path / "graded.jsonl"
    graded.write_text(graded_line(1.0, 0))
    stage = Stage("generate", tmp_path, ("generate", "--out", str(graded)), (graded,))
    stage.marker.write_text(json.dumps({"stage": "generate", "args": list(stage.args), "outputs": [str(graded)]}))
    assert stage.is_done()
    graded.unlink()
    with pytest.raises(IterateError) as error:
        stage.is_done()
    assert error.value.key == "stage.output.changed"


def test_a_plot_deleted_since_is_drawn_again(tmp_path, monkeypatch):
    """Nothing depends on the plot: it is redrawn, where the summary said it wrote a file that was gone."""
    plot, calls = tmp_path / "rounds.png", []

    def draw(args, log, ranks):
        calls.append(args)
        plot.write_bytes(b"png")

    monkeypatch.setattr(stages, "run_command", draw)
    stage = Stage("plot", tmp_path, ("eval", "--plot", "a.json", "--out", str(plot)), (plot,), redo_if_changed=True)
    run_stage(stage)
    run_stage(stage)
    plot.unlink()
    run_stage(stage)
    assert len(calls) == 2 and plot.read_bytes() == b"png"


# The driver, with every stage's command a stand-in that takes a while to stop, as train does
STOPPING_DRIVER = """
import signal, sys
from nemo_topr import cli
from nemo_topr.iterate import processes
# a driver started at a terminal: one started in the background (as a test run may be, by a
# non-interactive shell's `&`) ignores SIGINT, and so would its stage (the next test)
signal.signal(signal.SIGINT, signal.default_int_handler)
from nemo_topr.training import config
# the training config's check against Bridge's dataclasses imports Bridge (tests/training test it):
# what is tested here is the driver's stop, not its validation
config.check_schema = lambda values: None
stage = sys.argv[1]
processes.Ranks.command = lambda self, python=sys.executable: [sys.executable, stage]
sys.exit(cli.main(["iterate", *sys.argv[2:]]))
"""
SLOW_STAGE = """
import os, signal, sys, time
from pathlib import Path
report, exit_code = Path(os.environ["STAGE_REPORT"]), os.environ["STAGE_EXIT"]
def stop(signum, frame):
    time.sleep(1)  # a checkpoint saved before it exits
    report.write_text(report.read_text() + f" {signal.Signals(signum).name}")
    sys.exit(int(exit_code))
if exit_code != "default":  # else killed by the signal
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
report.write_text(str(os.getpid()))
time.sleep(120)
"""


@pytest.mark.parametrize(("stop", "exit_code", "ended"), [
    (signal.SIGTERM, "75", "it was stopped too (exit 75) and is not marked done: the same command resumes"),
    (signal.SIGINT, "75", "it was stopped too (exit 75) and is not marked done: the same command resumes"),
    (signal.SIGTERM, "default", "it was stopped too (killed by SIGTERM) and is not marked done: the same command "
                                "resumes"),  # Popen's -15
    # its work was done when the signal came: kept, not thrown away
    (signal.SIGINT, "0", "it finished first and is marked done: the same command goes on after it"),
], ids=["sigterm", "sigint", "killed", "finished"])
@pytest.mark.slow
def test_a_stop_of_the_driver_stops_its_stage_and_waits_for_it(fake_model, tmp_path, stop, exit_code, ended):
    """`kill` (or `timeout`, a supervisor) signals the driver alone: its stage ran on, writing into
    `out`, with no driver to mark it. Ctrl-C made subprocess.run SIGKILL the stage 0.25 s later,
    before train could save. The stage now gets the driver's signal once and is waited for."""
    (tmp_path / "driver.py").write_text(STOPPING_DRIVER)
    (tmp_path / "stage.py").write_text(SLOW_STAGE)
    report, out = tmp_path / "report", tmp_path / "out"
    report.write_text("")
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "stage.py"),
                               "iterate_tiny_cpu", f"base_model={fake_model}", f"out={out}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=checkout_env(STAGE_REPORT=str(report), STAGE_EXIT=exit_code))
    deadline = time.monotonic() + 120
    while not report.read_text() and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.1)
    stage_pid = int(report.read_text())
    driver.send_signal(stop)
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 128 + stop, err
    assert err.strip().splitlines()[-1] == f"nemo-topr iterate: stopped by {stop.name} while `nemo-topr eval` ran; {ended}"
    # one signal, handled: the stage's own stop
    assert report.read_text() == (str(stage_pid) if exit_code == "default" else f"{stage_pid} {stop.name}")
    with pytest.raises(ProcessLookupError):
        os.kill(stage_pid, 0)
    assert (out / "start" / "eval.done.json").exists() == (exit_code == "0")


def test_a_stop_the_driver_was_started_ignoring_stays_ignored():
    """A background job starts with SIGINT ignored, and so does its stage: `kill -INT` stopped the
    driver alone, which threw away the stage that then finished."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        with processes.forwarding_stops(process) as received:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # forwarded
        assert received == [] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
        process.wait()


def test_a_stage_nothing_depends_on_is_redone_when_its_arguments_change(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(stages, "run_command", lambda args, log, ranks: calls.append(args))
    run_stage(Stage("plot", tmp_path, ("eval", "--plot", "a.json"), redo_if_changed=True))
    run_stage(Stage("plot", tmp_path, ("eval", "--plot", "a.json", "b.json"), redo_if_changed=True))
    run_stage(Stage("plot", tmp_path, ("eval", "--plot", "a.json", "b.json"), redo_if_changed=True))
    assert calls == [("eval", "--plot", "a.json", "--overwrite"), ("eval", "--plot", "a.json", "b.json", "--overwrite")]


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["run", "dry-run"])
def test_an_out_the_driver_did_not_make_is_refused_before_any_stage(fake_model, tmp_path, monkeypatch, capsys,
                                                                     dry_run):
    """Its stages rerun with --overwrite, so `out=` naming a directory of the user's (a typo,
    a home directory) is refused, as it is, rather than written into."""
    monkeypatch.setattr(stages, "run_command", lambda args, log, ranks: pytest.fail(f"ran {args}"))
    home = tmp_path / "home"
    (home / "round_0").mkdir(parents=True)
    (home / "round_0" / "graded.jsonl").write_text("my records\n")
    assert cli.main(["iterate", "iterate_tiny_cpu", f"base_model={fake_model}", f"out={home}", *dry_run]) == 1
    # the last line: Bridge's import may log before it where no earlier test imported it (cli.main quiets that)
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"nemo-topr iterate: {home} is not empty and has no .nemo-topr-output file from a nemo-topr command: "
        "nemo-topr iterate resumes in")
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == ["round_0", "round_0/graded.jsonl"]


def test_a_rerun_on_other_weights_at_the_same_base_model_path_is_refused(fake_model, tmp_path, monkeypatch, capsys):
    """Stages resume by their arguments, and base_model's path is the same when the weights there
    changed (an `export --overwrite`): every finished stage counted as done on the earlier model."""
    def first_stage_fails(args, log, ranks):
        raise IterateError(f"`nemo-topr {args[0]}` failed (stand-in)")

    monkeypatch.setattr(stages, "run_command", first_stage_fails)
    out = tmp_path / "out"
    argv = ["iterate_tiny_cpu", f"base_model={fake_model}", f"out={out}"]
    assert cli.main(["iterate", *argv]) == 1 and "failed (stand-in)" in capsys.readouterr().err
    recorded = json.loads((out / "base_model.json").read_text())
    assert recorded == {"base_model": str(fake_model), "files": [
        [path.name, path.stat().st_size, path.stat().st_mtime_ns] for path in sorted(fake_model.iterdir())]}
    # the same model: resumed
    assert cli.main(["iterate", *argv]) == 1 and "failed (stand-in)" in capsys.readouterr().err
    (fake_model / "model.safetensors").write_bytes(b"other weights")
    for dry_run in ([], ["--dry-run"]):
        assert cli.main(["iterate", *argv, *dry_run]) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"nemo-topr iterate: base_model={fake_model} is not what {out} started from ({fake_model}): "
            f"model.safetensors changed since (size or time; {out / 'base_model.json'}). Its stages were built on "
            "the earlier model: use a new `out`")
    assert json.loads((out / "base_model.json").read_text()) == recorded


def test_more_ranks_than_the_nodes_gpus_are_refused_before_any_stage(fake_model, tmp_path, monkeypatch, capsys):
    """A cuda run with nproc_per_node above this node's GPUs; a dry run (a login node) lists the stages."""
    monkeypatch.setattr(stages, "run_command", lambda args, log, ranks: pytest.fail(f"ran {args}"))
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    argv = ["iterate_tiny_cpu", f"base_model={fake_model}", f"out={tmp_path / 'out'}", "device=cuda",
            "nproc_per_node=2"]
    assert cli.main(["iterate", *argv]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "nemo-topr iterate: nproc_per_node=2, but torch sees 1 GPU(s) on this node: score and train run one rank "
        "per GPU")
    assert not (tmp_path / "out").exists()
    assert iterate.main([*argv, "--dry-run"]) == 0


# ---------------------------------------------------------------------------------------------
# Rounds a weak model produces


def records(*rewards):
    return [Record(prompt="p", completion=f" {i}", reward=reward, prompt_id="q", sample_id=i)
            for i, reward in enumerate(rewards)]


def test_a_round_without_positives_trains_on_its_negatives():
    share = CurateOptions(mode="target_p_tilde", target=0.15)
    assert curation_flags(share, records(1.0, -1.0, -1.0), 0.2) == (
        ["--target-p-tilde", "0.15", "--baseline", "0.2"], None)
    flags, note = curation_flags(share, records(-1.0, -1.0, -1.0), 0.2)
    assert flags == [] and note.startswith("curate.mode target_p_tilde skipped: 0 positives and 3 negatives")
    # --per-prompt goes with the target only: `data curate` refuses it without one
    spread = CurateOptions(mode="target_p", target=0.5, per_prompt=True)
    assert curation_flags(spread, records(1.0, -1.0), 0.0) == (["--per-prompt", "--target-p", "0.5"], None)
    assert curation_flags(spread, records(-1.0, -1.0), 0.0)[0] == []
    # anna_karenina keeps every negative
    assert curation_flags(CurateOptions(), records(-1.0, -1.0), 0.0) == (["--anna-karenina"], None)


def test_the_summary_gives_p_tilde_with_the_baselines_training_used(tmp_path):
    """asymre's c is each record's group mean + deltaV: p~ is the data report's, not the closed
    form at the config's scalar `objective.baseline` (0.5 here would give 0.25 from p = 0.5)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("objective: {variant: asymre, baseline: 0.5}\n")
    baselines = "the whole-group mean reward of the records used + objective.asymre_delta_v (-0.1)"
    (run / "data_report.json").write_text(json.dumps({"records_used": 6, "sequences": 6, "positives": 3,
                                                      "baselines": baselines, "p_tilde": 0.4123}))
    row = summary.training_composition(run)
    assert row == {"training_records": 6, "positives": 3, "p": 0.5, "baseline": baselines, "p_tilde": 0.4123}
    assert "| 6 | 0.500 | 0.412 |" in summary.summary_markdown([{"round": "round_0", "note": "", **row}])
    # a report from before p~ was in it: unknown, not the closed form
    (run / "data_report.json").write_text(json.dumps({"records_used": 6, "sequences": 6, "positives": 3}))
    assert summary.training_composition(run)["p_tilde"] is None


def sample(text, answer, grade, grader_error=None):
    return GradedCompletion(Completion(text, None), answer, grade, grader_error)


def fake_stage_outputs(args, log, ranks):
    """Stand-in for the real commands: generation writes no records (every completion empty)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    out = Path(args[args.index("--out") + 1])
    out.parent.mkdir(parents=True, exist_ok=True)
    if args[0] == "generate":
        out.write_text("")
        log = SampleLog(log_path(out), {}, [])
        for index in range(2):
            log.append(index, Problem(f"q{index}", "Q?", "4", "gsm8k"), [sample("", None, "invalid")] * 3)
    elif args[:2] == ("eval", "--model"):
        out.write_text(json.dumps({"ks": [1], "metrics": {"pass@1": 0.0, "invalid_rate": 1.0}}))
    fake_stage_outputs.calls.append(args)


def test_a_round_that_generated_no_records_is_skipped_and_counted(fake_model, tmp_path, monkeypatch):
    fake_stage_outputs.calls = []
    monkeypatch.setattr(stages, "run_command", fake_stage_outputs)
    results = Driver(tiny_config(fake_model, tmp_path / "out", "rounds=2")).run()
    verbs = [args[0] if args[0] != "eval" else " ".join(args[:2]) for args in fake_stage_outputs.calls]
    assert verbs == ["eval --model", "generate", "generate", "eval --plot"]
    assert [r.model for r in results] == [fake_model] * 3  # nothing trained: round 1 starts from the base model
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [row["note"] for row in summary["rounds"]] == [None] + ["no records generated: training skipped"] * 2
    assert summary["rounds"][1]["samples"] == {"drawn": 6, "records": 0, "correct": 0, "wrong": 0, "invalid": 6,
                                               "error": 0}


def test_the_summary_counts_every_sample_drawn_empty_and_grader_failed_ones_included(tmp_path):
    """Empty completions (invalid samples) and grader errors (no verdict) are no records: the
    counts come from generate's sample log, and from the records only when the log is gone."""
    problems = [Problem("a", "Q: 1+1?", "2", "gsm8k"), Problem("b", "Q: 2+2?", "4", "gsm8k")]
    graded = [[sample(" 2", "2", "correct"), sample("", None, "invalid"), sample(" x", None, "invalid")],
              [sample(" 5", "5", "wrong"), sample(" 4!", None, "error", "sympy exploded"), sample("", None, "invalid")]]
    round_dir = tmp_path / "round_0"
    round_dir.mkdir()
    write_jsonl(graded_records(problems, graded), round_dir / "graded.jsonl")
    log = SampleLog(log_path(round_dir / "graded.jsonl"), {}, problems)
    for index, (problem, samples) in enumerate(zip(problems, graded)):
        log.append(index, problem, samples)
    result = rounds.RoundResult("round_0", round_dir, tmp_path / "model", str(tmp_path / "run"))
    row = summary.summary_row(result)
    assert row["samples"] == {"drawn": 6, "records": 3, "correct": 1, "wrong": 1, "invalid": 3, "error": 1}
    assert "| round_0 | 1 / 1 / 3 / 1 | — |" in summary.summary_markdown([row])
    log_path(round_dir / "graded.jsonl").unlink()
    row = summary.summary_row(result)
    assert row["samples"] == {"drawn": None, "records": 3, "correct": 1, "wrong": 1, "invalid": 1, "error": None}
    assert "| round_0 | 1 / 1 / 1 / — (no sample log) | — |" in summary.summary_markdown([row])


class StopAfterTrain(Exception):
    pass


def test_rendered_prompts_reach_every_stage_that_reads_the_records(fake_model, tmp_path, monkeypatch):
    """generate.rendered_prompts: `generate` samples the prompt file as written, and `score-logprobs`
    and `train` tokenize its records so (each verb's reading is tested in its own module:
    test_generate_eval, test_config). Here each stage's arguments go through the verb's own parser
    or config, and curate (which does not tokenize) runs for real; generate writes fixed records,
    score-logprobs' checks and work are a stand-in that copies them (its spec built from its own
    parser), and the round stops at train's config."""
    from nemo_topr.cluster.plan import compose_config
    from nemo_topr.data import cli as data_cli
    from nemo_topr.evaluation import evaluate, generate
    from nemo_topr.training import scoring

    rendered = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
    prompts = tmp_path / "rendered.jsonl"
    prompts.write_text(json.dumps({"prompt": rendered, "reference_answer": "5"}) + "\n")
    seen = {}

    def score(spec):
        seen["score"] = spec.source
        Path(spec.out).write_text(Path(spec.data).read_text())
        return {}

    monkeypatch.setattr(scoring, "validate", lambda spec: [])  # the placeholder model holds no weights to check
    monkeypatch.setattr(scoring, "run", score)

    def run(args, log, ranks):
        out = Path(args[args.index("--out") + 1]) if "--out" in args else log
        out.parent.mkdir(parents=True, exist_ok=True)
        if args[0] == "generate":
            seen["generate"] = generate.build_parser().parse_args(args[1:]).rendered_prompts
            out.write_text("".join(json.dumps({"prompt": rendered, "completion": answer, "reward": reward,
                                               "prompt_id": "p0", "meta": {"grade": grade}}) + "\n"
                                   for answer, reward, grade in (("5", 1.0, "correct"), ("6", -1.0, "wrong"))))
        elif args[0] == "data":
            assert data_cli.main(list(args[1:])) == 0
            seen["curate"] = [record.prompt for record in load_records(out).records]
        elif args[0] == "score-logprobs":
            assert scoring.main(list(args[1:])) == 0
        elif args[0] == "train":
            seen["train"] = compose_config(args[2], list(args[3:]), None)[0]["dataset"]["rendered_prompts"]
            raise StopAfterTrain
        elif args[:2] == ("eval", "--model"):
            parsed = evaluate.build_parser().parse_args(args[1:])
            seen["eval"] = (parsed.benchmark, parsed.prompts, parsed.task, parsed.rendered_prompts)
            out.write_text(json.dumps({"ks": [1], "metrics": {"pass@1": 0.0, "invalid_rate": 1.0}}))

    monkeypatch.setattr(stages, "run_command", run)
    config = tiny_config(fake_model, tmp_path / "out", f"generate.prompts={prompts}", "generate.task=math",
                         "generate.zero_shot=false", "generate.rendered_prompts=true", "curate.mode=none",
                         "eval.zero_shot=false", f"eval.prompts={prompts}", "eval.rendered_prompts=true")
    with pytest.raises(StopAfterTrain):
        Driver(config).run()
    # the start's evaluation samples the eval prompt file as written, graded as the benchmark (gsm8k)
    assert seen["eval"] == (None, str(prompts), "gsm8k", True)
    assert seen["generate"] is True and seen["curate"] == [rendered, rendered]
    assert seen["score"]["rendered_prompts"] is True and seen["train"] is True
    assert problem_keys(fake_model, tmp_path / "out", "generate.rendered_prompts=true") == ["generate.options.refused"]


# The stand-in eval's samples: (answer, grade) per sample; None for an empty completion
EVAL_SAMPLES = {"two_two": [[("5", "wrong"), ("5", "wrong"), ("6", "correct"), ("6", "correct")]],
                "one_all_empty": [[("5", "wrong"), ("5", "wrong"), ("6", "correct"), ("6", "correct")],
                                  [None] * 4],
                "all_empty": [[None] * 4]}


@pytest.mark.parametrize("samples, pass_1, maj, weighted, ran_verifier", [
    # by hand: 2 of 4 correct; the 2-2 vote goes to the first answer, 5 (wrong); weighted, 6 has 1.8 to 0.2
    ("two_two", 0.5, 0.0, 1.0, True),
    # a second problem whose 4 samples are all empty: no record to score, and no answer to vote for
    ("one_all_empty", 0.25, 0.0, 0.5, True),
    # no sample to score at all: the verifier stages are skipped, not failed
    ("all_empty", 0.0, 0.0, 0.0, False),
])
def test_a_verifier_scores_every_evaluation_and_the_round_reports_its_weighted_vote(
        fake_model, tmp_path, monkeypatch, capsys, samples, pass_1, maj, weighted, ran_verifier):
    """verifier.model: after each `eval`, `verifier score` of its samples, then `eval --records` of
    the scored samples, whose weighted_maj@k the round reports beside eval's own metrics, over eval's
    problems. Each stage's arguments go through its command's parser; the stand-in eval writes what
    eval's own functions make of the samples, `eval --records` runs for real, and the run stops at
    round 0's generate."""
    from nemo_topr.evaluation import evaluate, verifier

    verifier_model = placeholder_hf_model(tmp_path / "verifier")
    ran = []

    def run(args, log, ranks):
        ran.append(tuple(args[:2]))
        options = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
        if args[:2] == ("eval", "--model"):
            assert evaluate.usage_problem(evaluate.build_parser().parse_args(args[1:])) is None
            problems = [Problem(f"p{i}", f"Q{i}: 2 * 3?", "6", "gsm8k") for i in range(len(EVAL_SAMPLES[samples]))]
            graded = [[GradedCompletion(Completion("" if sample is None else f" The answer is {sample[0]}."),
                                        None if sample is None else sample[0], "invalid" if sample is None else sample[1])
                       for sample in problem] for problem in EVAL_SAMPLES[samples]]
            write_jsonl(graded_records(problems, graded), options["--samples-out"])
            results = evaluate.benchmark_results(evaluate.outcomes_of_completions(graded), "gsm8k", [1, 4])
            Path(options["--out"]).write_text(json.dumps(results))
            Path(options["--out"]).with_suffix(".md").write_text("")
        elif args[:2] == ("verifier", "score"):
            parsed = verifier.build_parser().parse_args(args[1:])
            assert (parsed.model, parsed.batch_size, parsed.device) == (verifier_model.resolve(), 2, "cpu")
            records = load_records(parsed.records).records
            write_jsonl([dataclasses.replace(r, meta={**r.meta, "verifier_score": 0.9 if r.reward > 0 else 0.1})
                         for r in records], parsed.out)
            parsed.out.with_suffix(".report.json").write_text("{}")
        elif args[:2] == ("eval", "--records"):
            assert evaluate.main(list(args[1:])) == 0
        elif args[0] == "generate":
            raise StopAfterTrain

    monkeypatch.setattr(stages, "run_command", run)
    config = tiny_config(fake_model, tmp_path / "out", f"verifier.model={verifier_model}",
                         "verifier.args=[--batch-size,'2']")
    with pytest.raises(StopAfterTrain):
        Driver(config).run()
    verifier_stages = [("verifier", "score"), ("eval", "--records")] if ran_verifier else []
    assert ran == [("eval", "--model"), *verifier_stages, ("generate", "--model")]
    start = tmp_path / "out" / "start"
    row, = Driver(config).summary_rows([rounds.RoundResult("start", start, fake_model, str(fake_model))])
    assert (row["eval"]["pass@1"], row["eval"]["maj@k"], row["eval"]["weighted_maj@k"]) == (pass_1, maj, weighted)
    table = summary.summary_markdown([row])
    assert "| pass@1 % | maj@4 % | weighted maj@4 % | invalid % |" in table
    assert f"| {100 * pass_1:.1f} | {100 * maj:.1f} | {100 * weighted:.1f} |" in table
    # what the plot draws: the verified results where they cover eval's problems
    plotted = Driver(config).plotted_results(start).name
    assert plotted == ("eval_verified.json" if samples == "two_two" else "eval.json")
    if not ran_verifier:
        assert "[start] verifier: eval wrote no sample to score (every completion empty); weighted maj is 0" in (
            capsys.readouterr().out)


# ---------------------------------------------------------------------------------------------
# Two real rounds


def check_two_rounds(out: Path) -> list[Path]:
    """What conf/iterate_tiny_cpu.yaml's two rounds must leave in `out`, score and train having run
    in two data-parallel ranks; returns the stages' done-markers."""
    summary = json.loads((out / "summary.json").read_text())
    start, first, second = summary["rounds"]
    assert [row["round"] for row in summary["rounds"]] == ["start", "round_0", "round_1"]
    for row in (first, second):
        assert row["samples"]["records"] > 0 and 0 < row["training_records"] <= row["samples"]["records"]
        # conf/iterate_tiny_cpu.yaml: 4 questions, 4 samples each; every sample has one grade
        counts = row["samples"]
        assert counts["drawn"] == 16 == sum(counts[grade] for grade in ("correct", "wrong", "invalid", "error"))
        assert row["p"] == row["positives"] / row["training_records"]
        # TOPR at c = 0 with +-1 rewards: p~ = p
        assert row["baseline"] == "objective.baseline (0.0) for every record" and row["p_tilde"] == round(row["p"], 4)
    for row in summary["rounds"]:
        assert set(row["eval"]) == {"pass@1", "maj_k", "maj@k", "weighted_maj@k", "invalid_rate"}
        assert row["eval"]["maj_k"] == 4 and row["eval"]["weighted_maj@k"] is None  # no verifier
    assert (out / "rounds.png").read_bytes().startswith(b"\x89PNG")
    assert "| round_1 |" in (out / "summary.md").read_text()
    # round 1 samples from round 0's export, and scores mu with and trains from round 0's
    # Megatron checkpoint directly (no HF conversion between rounds)
    round_0 = out / "round_0"
    args = {stage: json.loads((out / "round_1" / f"{stage}.done.json").read_text())["args"]
            for stage in ("generate", "score", "train")}
    assert args["generate"][args["generate"].index("--model") + 1] == str(round_0 / "model")
    assert args["score"][args["score"].index("--model") + 1] == str(round_0 / "run")
    assert f"base_model={round_0 / 'run'}" in args["train"]
    # every round is evaluated on GSM8K test questions in training's zero-shot form (eval.zero_shot)
    zero_shot = out / "prompts" / "gsm8k-test-zero-shot.jsonl"
    test_questions = [json.loads(line)["question"] for line in (REPO / "data/benchmarks/gsm8k_test.jsonl").open()]
    assert [json.loads(line)["prompt"] for line in zero_shot.read_text().splitlines()] == [
        f"Question: {question}\nAnswer:" for question in test_questions]
    for directory in ("start", "round_0", "round_1"):
        assert json.loads((out / directory / "eval.json").read_text())["source"] == str(zero_shot)
    for directory in (round_0, out / "round_1"):
        # two data-parallel ranks trained; mu, scored by two ranks, is each sequence's log pi at step 0
        assert sorted(path.name for path in (directory / "run").glob("samples_dp*.jsonl")) == [
            "samples_dp0.jsonl", "samples_dp1.jsonl"]
        assert tensorboard_scalars(directory / "run", "log_ratio_abs_max")[0] == (1, 0.0)

    markers = sorted(out.glob("**/*.done.json"))
    assert len(markers) == 1 + 2 * 6 + 1  # start eval, six stages per round, the plot
    return markers


@pytest.fixture(scope="module")
def scored_by_two_ranks(tmp_path_factory) -> tuple[Path, Path]:
    """(the tiny model, its 12 records scored by the driver's torchrun command line for the
    score stage with nproc_per_node=2 on one node), run as the driver runs it."""
    from nemo_topr.demo import build_graded_records
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("two_ranks")
    model = build_tiny_hf_llama(root / "tiny_llama", build_tiny_tokenizer())
    graded, scored = root / "graded.jsonl", root / "scored.jsonl"
    graded.write_text("".join(json.dumps(record) + "\n" for record in build_graded_records(4)))
    processes.run_command(("score-logprobs", "--model", str(model), "--data", str(graded), "--out", str(scored),
                           "--seq-length", "512", "--device", "cpu"), root / "score.log", processes.Ranks(per_node=2))
    return model, scored


# The whole driver, rounds and rerun, runs across two real Slurm nodes in tests/slurm/test_two_nodes.py;
# these two run its score and train stages as two ranks of one node.
@pytest.mark.slow
@pytest.mark.distributed
def test_the_score_stage_runs_in_two_ranks_under_torchrun(scored_by_two_ranks):
    assert len(load_records(scored_by_two_ranks[1]).records) == 12  # 4 questions, 3 completions each


@pytest.mark.slow
@pytest.mark.distributed
def test_the_train_stage_runs_in_two_ranks_under_torchrun_from_mu_two_ranks_scored(scored_by_two_ranks, tmp_path):
    """Two data-parallel ranks train, and mu, scored by two ranks, is each sequence's log pi at
    step 0."""
    model, scored = scored_by_two_ranks
    run_dir = tmp_path / "run"
    processes.run_command(("train", "--config-name", "tiny_cpu", "dataset.epochs=1", f"base_model={model}",
                           f"run_dir={run_dir}", f"dataset.train_path={scored}", "device=cpu"), tmp_path / "train.log",
                          processes.Ranks(per_node=2))
    assert sorted(path.name for path in run_dir.glob("samples_dp*.jsonl")) == ["samples_dp0.jsonl", "samples_dp1.jsonl"]
    assert tensorboard_scalars(run_dir, "log_ratio_abs_max")[0] == (1, 0.0)
