"""Cluster scripts: shellcheck, `nemo-topr submit`'s pre-flight checks and rendered script, the job
script through fakes of `srun`/`scontrol` that behave like Slurm's (which ranks a warning reaches,
what requeues), and TOPR jobs on a real one-node Slurm (marked `slurm`: a killed rank, a warning
at a random moment, a time limit's own warning: each saves at the iteration after the warning,
requeues and resumes there).

What the fakes model (tests/fake_slurm/srun.py cites SchedMD Slurm's source for srun, and
tests/slurm/test_srun.py checks it against the real srun):
- srun answers SIGTERM/SIGHUP with SIGKILL to every task (src/srun/libsrun/srun_job.c,
  `_srun_signal_mgr`: "forcing job termination" -> launch_g_fwd_signal(SIGKILL)) and forwards
  SIGUSR1/SIGUSR2 to the tasks unchanged; `--kill-on-bad-exit` sends the other tasks SIGTERM,
  then SIGKILL after KillWait.
- `scontrol requeue JOB` puts the job back in the queue with the same id; its next start sees
  SLURM_RESTART_COUNT incremented (the test starts the batch script again, as slurmd would).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, placeholder_hf_model, port_below_ephemeral_range
from tests.cluster.test_plan import MISTYPED_OVERRIDES

from nemo_topr.errors import UserError
from nemo_topr.training.config_error import ConfigError

SCRIPTS = sorted([*REPO.glob("slurm/*.sh"), *REPO.glob("slurm/*.sbatch"), *REPO.glob("launchers/*.sh"),
                  *REPO.glob("scripts/*.sh")])
FAKE_SRUN = REPO / "tests" / "fake_slurm" / "srun.py"

# scontrol(1): `show hostnames LIST` prints one host per line (comma lists only here);
# `requeue ID` is recorded for the test.
FAKE_SCONTROL = """#!/usr/bin/env bash
case $1 in
    show) tr ',' '\\n' <<< "$3" ;;
    requeue) echo "$2" >> "$FAKE_SLURM_DIR/requeued" ;;
    *) echo "fake scontrol: $1 is not modelled" >&2; exit 1 ;;
esac
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = {"scontrol": FAKE_SCONTROL,
             "srun": f'#!/usr/bin/env bash\nexec "{sys.executable}" "{FAKE_SRUN}" "$@"\n'}
    for name, body in fakes.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DIR", str(tmp_path))
    return tmp_path


def test_scripts_pass_bash_n_and_shellcheck():
    assert len(SCRIPTS) >= 5
    for script in SCRIPTS:
        subprocess.run(["bash", "-n", str(script)], check=True)
    shellcheck = Path(sys.executable).parent / "shellcheck"
    result = subprocess.run([str(shellcheck), *map(str, SCRIPTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# ---------------------------------------------------------------------------------------------
# nemo-topr submit: pre-flight and the rendered script


# meta-llama/Llama-3.1-70B's published config.json, the keys the plan reads the architecture from
LLAMA_31_70B = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 80, "hidden_size": 8192,
                "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
                "vocab_size": 128256, "tie_word_embeddings": False}
LLAMA_31_8B = {**LLAMA_31_70B, "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
               "num_attention_heads": 32}


def _submit(capsys, *args: str) -> tuple[int, str, str]:
    """`nemo-topr submit ARGS` in this process, with the CLI's filter of known start-up noise: in
    a worker where this is the first Megatron import, its warnings would otherwise be in `err`."""
    from nemo_topr.cluster.submit import main
    from nemo_topr.model.quiet import quiet_known_noise

    quiet_known_noise()
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.slow
def test_submit_dry_run_renders_a_container_job_with_mounts_from_the_config(tmp_path, capsys):
    models, data = tmp_path / "models", tmp_path / "data dir"
    model = placeholder_hf_model(models / "Llama-3.1-70B", LLAMA_31_70B)
    data.mkdir()
    (data / "scored.jsonl").write_text("{}\n")
    run_dir = tmp_path / "run"
    status, out, err = _submit(
        capsys, "--config", "llama31_70b_bf16", "--nodes", "4", "--account", "acct", "--partition", "batch",
        "--container-image", "nvcr.io/nvidia/pytorch:25.09-py3", "--run-dir", str(run_dir), "--dry-run",
        f"base_model={model}", "objective.baseline=0.2", f"dataset.train_path={data / 'scored.jsonl'}")
    assert status == 0, err
    lines = out.splitlines()
    for line in ("#SBATCH --nodes=4", "#SBATCH --account=acct", "#SBATCH --partition=batch",
                 "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --signal=USR1@900", "#SBATCH --requeue",  # no B: -- the ranks get it
                 f"export NEMO_TOPR_RUN_DIR={run_dir}",
                 "export NEMO_TOPR_CONTAINER_IMAGE=nvcr.io/nvidia/pytorch:25.09-py3"):
        assert line in lines, line
    # the checkout, the run dir, the model and the data's directory, each at its own path
    mounts = next(line for line in lines if line.startswith("export NEMO_TOPR_CONTAINER_MOUNTS="))
    expected = sorted([REPO, run_dir, model, data])
    assert mounts == "export NEMO_TOPR_CONTAINER_MOUNTS=" + repr(",".join(f"{p}:{p}" for p in expected))
    assert lines[-1].endswith(f"llama31_70b_bf16 base_model={model} objective.baseline=0.2 "
                              f"'dataset.train_path={data / 'scored.jsonl'}'")
    assert not run_dir.exists()  # a dry run writes nothing
    # `--config-name`, as train spells it, is the same job (it was "required: --config")
    again = _submit(capsys, "--config-name", "llama31_70b_bf16", "--nodes", "4", "--account", "acct", "--partition",
                    "batch", "--container-image", "nvcr.io/nvidia/pytorch:25.09-py3", "--run-dir", str(run_dir),
                    "--dry-run", f"base_model={model}", "objective.baseline=0.2",
                    f"dataset.train_path={data / 'scored.jsonl'}")
    assert again == (0, out, err)


def test_submit_of_a_users_yaml_passes_it_by_absolute_path_and_mounts_its_directory(tmp_path, capsys,
                                                                                     monkeypatch):
    """`--config my_runs/exp_70b.yaml` (relative to where submit runs): the job script runs train
    from the checkout, so it gets the file's absolute path, and the container sees its directory."""
    model = placeholder_hf_model(tmp_path / "models" / "Llama-3.1-70B", LLAMA_31_70B)
    (tmp_path / "my_runs").mkdir()
    (tmp_path / "my_runs" / "exp_70b.yaml").write_text("defaults:\n  - llama31_70b_bf16\n  - _self_\n"
                                                       "objective:\n  baseline: 0.3\n")
    data = tmp_path / "data" / "scored.jsonl"
    data.parent.mkdir()
    data.write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    status, out, err = _submit(
        capsys, "--config", "my_runs/exp_70b.yaml", "--nodes", "4", "--container-image", "img", "--dry-run",
        "--run-dir", str(tmp_path / "run"), f"base_model={model}", f"dataset.train_path={data}")
    assert status == 0, err
    lines = out.splitlines()
    assert "#SBATCH --job-name=topr-exp_70b" in lines
    mounts = next(line for line in lines if line.startswith("export NEMO_TOPR_CONTAINER_MOUNTS="))
    assert f"{tmp_path}/my_runs:{tmp_path}/my_runs" in mounts, mounts
    assert lines[-1].endswith(f"{tmp_path}/my_runs/exp_70b.yaml base_model={model} dataset.train_path={data}")
    with pytest.raises(ConfigError, match=r"^config my_runs/exp_7b.yaml: no such file$"):
        _submit(capsys, "--config", "my_runs/exp_7b.yaml", "--dry-run")
    # a preset's file named by a path relative to here: the job gets the preset's name
    preset = os.path.relpath(REPO / "conf" / "llama31_70b_bf16.yaml")
    status, out, err = _submit(
        capsys, "--config", preset, "--nodes", "4", "--container-image", "img", "--dry-run",
        "--run-dir", str(tmp_path / "run"), f"base_model={model}", f"dataset.train_path={data}")
    assert status == 0 and "#SBATCH --job-name=topr-llama31_70b_bf16" in out.splitlines(), err
    assert out.splitlines()[-1].endswith(f"/topr_job.sh llama31_70b_bf16 base_model={model} "
                                         f"dataset.train_path={data}"), out.splitlines()[-1]


def _problems(err: str) -> list[str]:
    """The problems of submit's "not queued" list."""
    return [line.removeprefix("  - ") for line in err.splitlines() if line.startswith("  - ")]


def _submit_keyed(capsys, *args: str) -> tuple[int, list[tuple[str, str]], str, str]:
    """`_submit`'s (exit status, the (key, where) of each problem pre-flight found, out, err)."""
    from unittest import mock

    from nemo_topr.cluster import submit

    found = []

    def preflight(job):
        result = real(job)
        found.extend((problem.key, problem.where) for problem in result[0])
        return result

    real = submit.preflight
    with mock.patch.object(submit, "preflight", preflight):
        status, out, err = _submit(capsys, *args)
    return status, found, out, err


def _signal_line(script: str) -> str:
    return next(line for line in script.splitlines() if line.startswith("#SBATCH --signal="))


@pytest.mark.parametrize("config, sbatch, nodes, architecture", [
    ("llama31_70b_fp8", "llama31_70b.sbatch", "4", LLAMA_31_70B),
    ("llama31_70b_bf16", "llama31_70b.sbatch", "4", LLAMA_31_70B),
    ("llama31_8b_fp8", "llama31_8b.sbatch", "1", LLAMA_31_8B),
])
def test_submit_warns_as_early_as_the_presets_own_sbatch_script(config, sbatch, nodes, architecture, tmp_path, capsys):
    """A 70B checkpoint takes longer to write: slurm/llama31_70b.sbatch warns 900 s ahead, and
    `submit` rendered 600 for the same preset."""
    model = placeholder_hf_model(tmp_path / "model", architecture)
    data = tmp_path / "scored.jsonl"
    data.write_text("{}\n")
    status, out, err = _submit(capsys, "--config", config, "--nodes", nodes, "--container-image", "img", "--dry-run",
                               "--run-dir", str(tmp_path / "run"), f"base_model={model}", f"dataset.train_path={data}")
    assert status == 0, err
    assert _signal_line(out) == _signal_line((REPO / "slurm" / sbatch).read_text())


def _venv(root: Path, script: str) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text(f"#!/bin/sh\n{script}\n")
    (root / "bin" / "python").chmod(0o755)
    return root


def test_submit_checks_the_venv_the_ranks_run_before_queueing(tmp_path, capsys):
    """Only bin/python's existence was checked: a vLLM venv (no Megatron), one whose python does
    not run, or an FP8 run in a venv without Transformer Engine queued, and failed at its start."""
    model = placeholder_hf_model(tmp_path / "Llama-3.1-70B", LLAMA_31_70B)
    (tmp_path / "scored.jsonl").write_text("{}\n")

    def problems_and_warnings(venv: Path, config: str = "llama31_70b_bf16", *overrides: str):
        status, problems, _, err = _submit_keyed(
            capsys, "--config", config, "--nodes", "4", "--venv", str(venv), "--dry-run", "--run-dir",
            str(tmp_path / "run"), f"base_model={model}", f"dataset.train_path={tmp_path / 'scored.jsonl'}", *overrides)
        return (status, problems,
                [line.removeprefix("nemo-topr submit: warning: ") for line in err.splitlines() if "warning: " in line],
                err)

    # this checkout's venv finds every package a rank imports (Transformer Engine or not)
    status, problems, warnings, _ = problems_and_warnings(Path(sys.prefix))
    assert status == 0 and not problems and not any("lacks" in w for w in warnings), (problems, warnings)
    # the same interpreter without its site-packages (-S): as a venv made for something else
    bare = _venv(tmp_path / "bare", f'exec {sys.executable} -I -S "$@"')
    status, problems, _, err = problems_and_warnings(bare)
    assert (status, problems) == (1, [("--venv.lacks_rank_packages", "--venv")])
    assert "lacks torch, megatron.core, megatron.bridge, transformers, hydra, omegaconf," in err
    broken = _venv(tmp_path / "broken", 'echo "error while loading shared libraries: libpython3.12.so" >&2; exit 127')
    status, problems, _, err = problems_and_warnings(broken)
    assert (status, problems) == (1, [("--venv.python_does_not_run", "--venv")])
    assert "(error while loading shared libraries: libpython3.12.so)" in err  # the python's own why
    # a venv that has all but Transformer Engine (its finder's answer given): FP8 refused, BF16 warned
    no_te = _venv(tmp_path / "no_te", """echo '["transformer_engine"]'""")
    assert problems_and_warnings(no_te, "llama31_70b_fp8")[1] == [("model.fp8.needs_transformer_engine", "model.fp8")]
    status, problems, warnings, _ = problems_and_warnings(no_te)
    assert status == 0 and warnings == [
        f"--venv {no_te} has no Transformer Engine: the ranks build Megatron's local layers (BF16, no fused kernels), "
        "slower than the presets are sized for; install requirements-gpu.txt there"]
    assert problems_and_warnings(no_te, "llama31_70b_bf16", "device=cpu")[2] == []  # the CPU runtime needs no TE


def test_submit_takes_the_run_dir_a_users_yaml_sets(tmp_path, capsys, monkeypatch):
    """A user's YAML that sets run_dir: the job's run directory, as `train` on that file would use
    it (it was replaced by runs/JOB_NAME without a word); --run-dir and a run_dir= override still
    come first, and a run_dir its presets set is no choice of the user's."""
    model = placeholder_hf_model(tmp_path / "Llama-3.1-70B", LLAMA_31_70B)
    (tmp_path / "scored.jsonl").write_text("{}\n")
    own = tmp_path / "exp.yaml"
    own.write_text(f"defaults:\n  - llama31_70b_bf16\n  - _self_\nrun_dir: {tmp_path / 'mine'}\n")
    inherits = tmp_path / "plain.yaml"
    inherits.write_text("defaults:\n  - llama31_70b_bf16\n  - _self_\n")
    relative = tmp_path / "relative.yaml"  # from the checkout, where the job runs train
    relative.write_text("defaults:\n  - llama31_70b_bf16\n  - _self_\nrun_dir: runs/submit_test_never_made\n")
    monkeypatch.chdir(tmp_path)
    for config, options, run_dir in (
            (own, [], tmp_path / "mine"), (own, ["--run-dir", "cli"], tmp_path / "cli"),
            (own, [f"run_dir={tmp_path / 'override'}"], tmp_path / "override"),
            (inherits, [], REPO.resolve() / "runs" / "topr-plain"),
            (relative, [], REPO.resolve() / "runs" / "submit_test_never_made")):
        status, out, err = _submit(capsys, "--config", str(config), "--nodes", "4", "--container-image", "img",
                                   "--dry-run", f"base_model={model}",
                                   f"dataset.train_path={tmp_path / 'scored.jsonl'}", *options)
        assert status == 0, err
        assert f"export NEMO_TOPR_RUN_DIR={run_dir}" in out.splitlines(), (config.name, options)
    assert not (tmp_path / "mine").exists() and not (REPO / "runs" / "submit_test_never_made").exists()


def test_submit_names_every_unmounted_path_and_missing_input(tmp_path, capsys):
    host_models = tmp_path / "lustre" / "models"
    placeholder_hf_model(host_models / "Llama-3.1-70B", LLAMA_31_70B, tokenizer=False)
    run_dir = tmp_path / "run"
    mounts = f"{REPO}:{REPO},{run_dir.parent}:{run_dir.parent},{host_models}:/models,{tmp_path}/absent:/scratch"
    status, problems, out, err = _submit_keyed(
        capsys, "--config", "llama31_70b_bf16", "--nodes", "4", "--run-dir", str(run_dir), "--dry-run",
        "--container-image", "nvcr.io/nvidia/pytorch:25.09-py3", "--container-mounts", mounts,
        "base_model=/models/Llama-3.1-70B", "dataset.train_path=/data/scored.jsonl")
    assert status == 1 and out == ""
    assert problems == [("--container-mounts.source_missing", "--container-mounts"),
                        ("dataset.train_path.not_mounted", "dataset.train_path"),
                        ("base_model.not_a_model", "base_model")]
    # the model is found through its mount: /models/X is host_models/X on the submit host
    assert f"  - base_model={host_models}/Llama-3.1-70B: no tokenizer" in err


def test_submit_takes_data_as_train_reads_it_and_names_a_typo(tmp_path, capsys):
    """A directory of shards and a glob were refused as "does not exist" (submit asked for a file);
    a hub dataset is no path to mount; a typo is named with the near name, as `train` names it."""
    model = placeholder_hf_model(tmp_path / "models" / "Llama-3.1-70B", LLAMA_31_70B)
    shards, run_dir = tmp_path / "shards", tmp_path / "run"
    shards.mkdir()
    (shards / "part-0.jsonl").write_text("{}\n")
    submit = ("--config", "llama31_70b_bf16", "--nodes", "4", "--container-image", "img", "--dry-run",
              "--run-dir", str(run_dir), f"base_model={model}")
    for data, data_mount in [(shards, [shards]), (shards / "*.jsonl", [shards]), ("hub:someone/graded", [])]:
        status, out, err = _submit(capsys, *submit, f"dataset.train_path={data}")
        assert status == 0, err
        lines = out.splitlines()
        mounts = ",".join(f"{p}:{p}" for p in sorted([REPO, run_dir, model, *data_mount]))
        assert f"export NEMO_TOPR_CONTAINER_MOUNTS={mounts}" in lines
        assert lines[-1].endswith(shlex.quote(f"dataset.train_path={data}")), lines[-1]
    fifo = tmp_path / "graded.jsonl"  # exists, yet is no records file: it passed, and the job failed reading it
    os.mkfifo(fifo)
    for data, problem in [(tmp_path / "shard", f"does not exist; did you mean {shards}?"),
                          (shards / "*.parquet", "pattern matches nothing"),
                          (fifo, "not a regular file or a directory (a FIFO, socket or device): give a .jsonl, "
                                 ".parquet or .arrow file or a directory of them")]:
        status, out, err = _submit(capsys, *submit, f"dataset.train_path={data}")
        assert status == 1 and out == ""
        assert _problems(err) == [f"dataset.train_path={data}: {problem}"]
    # a hub name without its prefix is a path under the checkout there; the hint is train's
    status, out, err = _submit(capsys, *submit, "dataset.train_path=someone/graded")
    assert status == 1 and out == ""
    assert _problems(err) == [
        f"dataset.train_path={REPO / 'someone' / 'graded'}: does not exist (a Hugging Face hub dataset is read only "
        "when named so: hub:someone/graded)"]


def test_submit_rejects_a_layout_that_does_not_divide_the_gpus(tmp_path, capsys):
    model = placeholder_hf_model(tmp_path / "Llama-3.1-70B", LLAMA_31_70B)
    (tmp_path / "scored.jsonl").write_text("{}\n")
    status, _, err = _submit(
        capsys, "--config", "llama31_70b_bf16", "--nodes", "3", "--run-dir", str(tmp_path / "run"), "--dry-run",
        "--container-image", "img", f"base_model={model}", f"dataset.train_path={tmp_path / 'scored.jsonl'}")
    assert status == 1
    # 3 x 8 = 24 GPUs; TP.PP.CP = 8.4.1 = 32 (conf/llama31_70b_bf16.yaml)
    assert "world size = TP·PP·CP·DP: 3 node(s) x 8 GPUs = 24; TP·PP·CP = 8·4·1 = 32" in err
    assert re.search(r"world size = TP·PP·CP·DP: .*--nodes 4\b", err), err  # the fix, from the layout


@pytest.mark.parametrize("override, message", MISTYPED_OVERRIDES)
def test_submit_dry_run_refuses_a_misspelled_mistyped_or_zero_key(override, message, tmp_path, capsys):
    model = placeholder_hf_model(tmp_path / "Llama-3.1-70B", LLAMA_31_70B)
    (tmp_path / "scored.jsonl").write_text("{}\n")
    status, out, err = _submit(
        capsys, "--config", "llama31_70b_bf16", "--nodes", "4", "--run-dir", str(tmp_path / "run"), "--dry-run",
        "--container-image", "img", f"base_model={model}", f"dataset.train_path={tmp_path / 'scored.jsonl'}",
        override)
    assert status == 1 and out == ""
    assert "nemo-topr submit: not queued" in err and re.search(f"run config: {message}", err), err


def test_submit_without_image_needs_an_existing_venv_and_the_inputs(tmp_path, capsys):
    status, problems, _, _ = _submit_keyed(
        capsys, "--config", "llama31_8b_bf16", "--run-dir", str(tmp_path / "run"), "--dry-run",
        "--venv", str(tmp_path / "no-venv"), f"base_model={tmp_path / 'nowhere'}")
    assert status == 1
    assert problems == [("dataset.train_path.not_set", "dataset.train_path"), ("--venv.no_python", "--venv"),
                        ("base_model.not_a_model", "base_model")]


def test_submit_refuses_a_model_as_run_dir_before_writing_its_script_there(tmp_path, capsys):
    """`train` would refuse it on the cluster (`check_run_dir`); submit says so before queueing."""
    model = placeholder_hf_model(tmp_path / "models" / "Llama-3.1-70B", LLAMA_31_70B)
    data = tmp_path / "scored.jsonl"
    data.write_text("{}\n")
    before = sorted(path.name for path in model.iterdir())
    status, problems, _, _ = _submit_keyed(capsys, "--config", "llama31_8b_bf16", "--run-dir", str(model), "--venv",
                                           sys.prefix, "--dry-run", f"base_model={model}", f"dataset.train_path={data}")
    assert (status, problems) == (1, [("run_dir.refused_by_train", "run_dir")])
    assert sorted(path.name for path in model.iterdir()) == before


def test_submit_into_a_run_says_it_resumes_and_refuses_what_train_would_refuse_at_its_start(tmp_path, capsys):
    """A job for a run directory that holds a run resumes it; another objective or base model,
    or a finished run, would be refused only when the job starts, after the queue wait."""
    model = placeholder_hf_model(tmp_path / "models" / "Llama-3.1-70B", LLAMA_31_70B)
    other = shutil.copytree(model, tmp_path / "other" / "Llama-3.1-70B")
    data = tmp_path / "data" / "scored.jsonl"
    data.parent.mkdir()
    data.write_text("{}\n")
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("5")
    recorded = {"optimizer.lr": 5e-7, "objective.baseline": 0.0, "objective.variant": "topr", "base_model": str(model)}
    (run_dir / "fingerprint.json").write_text(json.dumps({"data": "0" * 64, "config": recorded}))

    def submit(*args: str) -> tuple[int, list[str], str]:  # an override before options: they are intermixed
        status, _, err = _submit(capsys, "--config", "llama31_8b_bf16", "--run-dir", str(run_dir), "--dry-run",
                                 f"dataset.train_path={data}", *args)
        return status, _problems(err), err

    status, problems, err = submit("--venv", sys.prefix, f"base_model={model}")
    assert status == 0 and not problems, err
    assert (f"nemo-topr submit: warning: run_dir={run_dir} holds a run with a checkpoint at iteration 5: this job "
            "resumes it (its data is compared with the run's when it starts); for a new run, choose another "
            "--run-dir or --job-name") in err.splitlines()
    status, problems, _ = submit("--venv", sys.prefix, f"base_model={model}", "objective.baseline=0.5")
    assert status == 1 and len(problems) == 1
    assert problems[0].startswith(f"{run_dir} holds checkpoints of a run with other data or settings; a resume would "
                                  "not continue it. Changed: objective.baseline: 0.0 -> 0.5. Either restore them")
    status, problems, _ = submit("--venv", sys.prefix, f"base_model={other}")
    assert status == 1 and len(problems) == 1
    assert problems[0].startswith(f"{run_dir} holds checkpoints of a run that began from {model}; ")
    # in a container, the base model as the job names it, /models/..., is what the run recorded
    mounts = f"{REPO}:{REPO},{run_dir}:{run_dir},{data.parent}:{data.parent},{model.parent}:/models"
    container = ("--container-image", "nvcr.io/nvidia/pytorch:25.09-py3", "--container-mounts", mounts)
    status, problems, err = submit(*container, "base_model=/models/Llama-3.1-70B")
    assert status == 1 and problems[0].startswith(f"{run_dir} holds checkpoints of a run that began from {model}; "
                                                  "a resume continues from those checkpoints and never reads "
                                                  "base_model, so /models/Llama-3.1-70B would not be trained"), err
    (run_dir / "fingerprint.json").write_text(json.dumps(
        {"data": "0" * 64, "config": {**recorded, "base_model": "/models/Llama-3.1-70B"}}))
    status, problems, err = submit(*container, "base_model=/models/Llama-3.1-70B")
    assert status == 0 and not problems, err
    (run_dir / "COMPLETED").write_text("5\n")
    status, problems, _ = submit(*container, "base_model=/models/Llama-3.1-70B")
    assert status == 1 and problems == [
        f"run_dir={run_dir} holds a finished run (its COMPLETED marker; latest checkpoint at iteration 5): a job there "
        f"would train nothing. Choose another run_dir, with base_model={run_dir} to start from it"]


@pytest.mark.parametrize("limit, seconds", [("30", 1800), ("30:15", 1815), ("04:00:00", 14400),
                                            ("2-00", 172800), ("1-02:03", 93780), ("1-02:03:04", 93784)])
def test_time_limit_formats_of_sbatch(limit, seconds):
    from nemo_topr.cluster.submit import time_limit_seconds

    assert time_limit_seconds(limit) == seconds  # sbatch(1), --time


def test_submit_rejects_a_warning_at_or_after_the_time_limit(tmp_path, capsys):
    model = placeholder_hf_model(tmp_path / "Llama-3.1-70B", LLAMA_31_70B)
    (tmp_path / "scored.jsonl").write_text("{}\n")
    status, problems, _, _ = _submit_keyed(
        capsys, "--config", "llama31_70b_bf16", "--nodes", "4", "--run-dir", str(tmp_path / "run"), "--dry-run",
        "--container-image", "img", "--time", "10:00", "--preemption-warning", "600",
        f"base_model={model}", f"dataset.train_path={tmp_path / 'scored.jsonl'}")
    assert (status, problems) == (1, [("--preemption-warning.not_below_time", "--preemption-warning")])


@pytest.mark.parametrize("option, value", [("--nodes", "0"), ("--gpus-per-node", "-1"), ("--preemption-warning", "0")])
def test_submit_refuses_a_count_below_one_before_rendering(option, value, capsys):
    """`--nodes 0` rendered `#SBATCH --nodes=0` and passed every check: TP x PP divides 0 GPUs."""
    from nemo_topr.cluster.submit import main

    with pytest.raises(SystemExit) as stop:
        main(["--config", "llama31_70b_bf16", "--dry-run", option, value])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == ""
    assert err.endswith(f"nemo-topr submit: error: argument {option}: must be at least 1; got {value}\n")


def test_submit_refuses_a_double_quote_an_sbatch_line_cannot_hold(tmp_path, capsys):
    model = placeholder_hf_model(tmp_path / "Llama-3.1-70B", LLAMA_31_70B)
    (tmp_path / "scored.jsonl").write_text("{}\n")
    status, problems, out, _ = _submit_keyed(
        capsys, "--config", "llama31_70b_bf16", "--nodes", "4", "--run-dir", str(tmp_path / "run"), "--dry-run",
        "--container-image", "img", "--job-name", 'my "best" run', f"base_model={model}",
        f"dataset.train_path={tmp_path / 'scored.jsonl'}")
    assert (status, problems, out) == (1, [("--job-name.not_an_sbatch_word", "--job-name")], "")


def _fake_sbatch(tmp_path: Path, monkeypatch) -> Path:
    """An `sbatch` first on PATH that queues nothing: it records its arguments in the file returned."""
    called = tmp_path / "sbatch-called"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sbatch").write_text(f'#!/usr/bin/env bash\necho "$@" >> "{called}"\n'
                                             'echo "Submitted batch job 42"\n')
    (tmp_path / "bin" / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    return called


def _submit_inputs(tmp_path: Path) -> tuple[str, ...]:
    model = placeholder_hf_model(tmp_path / "Llama-3.1-70B", LLAMA_31_70B)
    (tmp_path / "scored.jsonl").write_text("{}\n")
    return ("--config", "llama31_70b_bf16", "--nodes", "4", "--container-image", "img", f"base_model={model}",
            f"dataset.train_path={tmp_path / 'scored.jsonl'}")


def test_a_relative_input_found_only_in_the_working_directory_is_explained(tmp_path, capsys, monkeypatch):
    """`submit` reads a relative path from the checkout, where the job runs (documented), while
    `train` reads it from the working directory: a file beside the user was only "does not exist"."""
    model = placeholder_hf_model(tmp_path / "Llama-3.1-70B", LLAMA_31_70B)
    (tmp_path / "rollouts.jsonl").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    status, _, err = _submit(capsys, "--config", "llama31_70b_bf16", "--nodes", "4", "--container-image", "img",
                             "--run-dir", str(tmp_path / "run"), "--dry-run", "base_model=Llama-3.1-70B",
                             "dataset.train_path=rollouts.jsonl")
    assert status == 1
    for key, name in (("dataset.train_path", "rollouts.jsonl"), ("base_model", "Llama-3.1-70B")):
        line = next(line for line in err.splitlines() if f"{key}={REPO / name}" in line)
        assert line.endswith(f" (a relative path is read from the checkout, {REPO}, where the job runs; "
                             f"{tmp_path / name} exists: give that)"), line


@pytest.mark.parametrize("name", ["../../mine", "../evil", "a/b", "-x", ".", "..", "", "é" * 121],
                         ids=["up-two", "up-one", "subdirectory", "dash", "dot", "dot-dot", "empty", "over-255-bytes"])
def test_submit_refuses_a_job_name_that_is_no_file_name_before_writing_anything(name, tmp_path, capsys, monkeypatch):
    """`--job-name ../../mine` wrote the script to RUN_DIR/submit/../../mine.sbatch, over the user's
    own file there, and queued it; a dry run took it, `a/b`, `-x`, `.` and `..` too. A name of 121
    two-byte letters ended in OSError: [Errno 36] File name too long (255 bytes, less "-JOBID.out")."""
    called = _fake_sbatch(tmp_path, monkeypatch)
    common = _submit_inputs(tmp_path)
    mine = tmp_path / "x" / "mine.sbatch"
    mine.parent.mkdir()
    mine.write_text("mine\n")
    before = sorted(tmp_path.rglob("*"))
    run_dir = tmp_path / "x" / "sj"
    for dry_run in (["--dry-run"], []):
        with pytest.raises(UserError) as stop:
            _submit(capsys, *common, "--run-dir", str(run_dir), f"--job-name={name}", *dry_run)
        assert (stop.value.key, stop.value.where) == ("--job-name.not_a_file_name", "--job-name"), dry_run
        assert capsys.readouterr().out == ""
    assert sorted(tmp_path.rglob("*")) == before and not called.exists()
    assert mine.read_text() == "mine\n"


def test_submit_writes_its_script_in_the_run_dir_and_replaces_it_on_a_resubmit(tmp_path, capsys, monkeypatch):
    """The other side of the refusal above: a plain name is queued from RUN_DIR/submit/NAME.sbatch,
    and a second submit of that name (a job for the same run) replaces the script the first wrote."""
    called = _fake_sbatch(tmp_path, monkeypatch)
    common = _submit_inputs(tmp_path)
    run_dir = tmp_path / "x" / "sj"
    script = run_dir / "submit" / "mine.sbatch"
    for nodes in ("4", "8"):
        status, out, err = _submit(capsys, *common, "--run-dir", str(run_dir), "--job-name=mine", "--nodes", nodes)
        assert (status, out) == (0, "Submitted batch job 42\n"), err
        assert f"#SBATCH --nodes={nodes}" in script.read_text().splitlines()
    assert called.read_text().splitlines() == [str(script)] * 2
    assert sorted(path.name for path in run_dir.rglob("*")) == ["mine.sbatch", "submit"]


def test_submit_and_the_job_script_keep_one_run_dir(tmp_path, capsys):
    """`--run-dir A run_dir=B` wrote the job's logs, script and requeue check in A while train wrote
    B: a pre-emption's STOPPED marker in B was never seen, so the job was not requeued."""
    model = placeholder_hf_model(tmp_path / "Llama-3.1-70B", LLAMA_31_70B)
    (tmp_path / "scored.jsonl").write_text("{}\n")
    common = ("--config", "llama31_70b_bf16", "--nodes", "4", "--container-image", "img", "--dry-run",
              f"base_model={model}", f"dataset.train_path={tmp_path / 'scored.jsonl'}")
    with pytest.raises(UserError) as stop:
        _submit(capsys, *common, "--run-dir", str(tmp_path / "a"), f"run_dir={tmp_path / 'b'}")
    assert stop.value.key == "run_dir.differs_from_option"
    b, in_checkout = tmp_path / "b", REPO.resolve() / "runs" / "submit_test_never_made"
    for run_dir_args, run_dir in (([f"run_dir={b}"], b), (["--run-dir", str(b), f"run_dir={b}"], b),
                                  (["++run_dir=runs/submit_test_never_made"], in_checkout)):  # as the job reads it
        status, out, err = _submit(capsys, *common, *run_dir_args)
        assert status == 0, err
        lines = out.splitlines()
        assert f"export NEMO_TOPR_RUN_DIR={run_dir}" in lines, run_dir_args
        assert "run_dir=" not in lines[-1]  # topr_job.sh passes its own, the one it watches
    assert not in_checkout.exists()  # a dry run
    with pytest.raises(UserError) as stop:  # not the checkout (REPO / "")
        _submit(capsys, *common, "run_dir=")
    assert stop.value.key == "run_dir.empty"
    # the job script refuses one too (the shipped sbatch scripts pass their arguments to it)
    proc = subprocess.run(["bash", str(REPO / "slurm" / "topr_job.sh"), "llama31_8b_bf16", "run_dir=/elsewhere"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "run_dir=/elsewhere: give the run directory as NEMO_TOPR_RUN_DIR" in proc.stderr
    assert list(tmp_path.glob("runs")) == []


# ---------------------------------------------------------------------------------------------
# Real TOPR jobs through the fakes: two ranks (one task per "GPU") over gloo


def _tiny_run_overrides(demo_inputs: tuple[Path, Path]) -> list[str]:
    model_dir, data = demo_inputs
    return [f"hf_model={model_dir}", f"dataset.train_path={data}", "dataset.epochs=1",
            "checkpoint.save_interval=100"]


def _ledger(run_dir: Path, skip: dict[str, int] | None = None) -> list[dict]:
    """Every data-parallel rank's (iteration, sample ids) entries (nemo_topr/training/step.py),
    after the first skip[file name] entries of each rank's file."""
    return [json.loads(line) for path in sorted(run_dir.glob("samples_dp*.jsonl"))
            for line in path.read_text().splitlines()[(skip or {}).get(path.name, 0):]]


def _train_iters(run_dir: Path) -> int:
    """Iterations of one epoch: packed rows (the data report) / global batch 4 (conf/tiny_cpu.yaml)."""
    return json.loads((run_dir / "data_report.json").read_text())["rows"] // 4


def _ledger_lengths(run_dir: Path) -> dict[str, int]:
    return {path.name: len(path.read_text().splitlines()) for path in run_dir.glob("samples_dp*.jsonl")}


def _job_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NAME": "topr", "SLURM_JOB_NODELIST": "localhost",
            "SLURM_SUBMIT_DIR": str(REPO), "SLURM_PROCID": "0",
            "NEMO_TOPR_MASTER_PORT": str(port_below_ephemeral_range()),
            "OMP_NUM_THREADS": "1", **extra}


def _step_processes(fake_slurm: Path) -> list[int]:
    """The job step's processes: the tasks srun started and all their descendants (what
    slurmstepd's process tracking (cgroup) holds and signals)."""
    found, queue = [], [int(pid) for pid in (fake_slurm / "step.pids").read_text().split()]
    while queue:
        pid = queue.pop()
        found.append(pid)
        for thread in Path(f"/proc/{pid}/task").glob("*"):
            children = thread / "children"
            queue += [int(child) for child in children.read_text().split()] if children.exists() else []
    return found


@pytest.mark.guards_preemption
@pytest.mark.slow
def test_warning_during_start_up_is_held_until_training_and_then_saves(tmp_path, demo_inputs):
    """SIGUSR1's default action terminates a process, and Bridge installs its handler only once
    training is set up. A warning that lands while the rank still loads (config.yaml is written
    in prepare(), before Bridge starts) must not kill it: the rank trains one iteration, saves,
    and stops for a requeue."""
    run_dir = tmp_path / "run"
    rank = subprocess.Popen([sys.executable, "-m", "nemo_topr.cli", "train", "--config-name", "tiny_cpu",
                             f"run_dir={run_dir}", "train.exit_signal=SIGUSR1", *_tiny_run_overrides(demo_inputs)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        deadline = time.time() + 300
        while not (run_dir / "config.yaml").exists():
            assert time.time() < deadline and rank.poll() is None
            time.sleep(0.01)
        assert not list(run_dir.glob("checkpoints/iter_*"))  # nothing trained or saved yet
        rank.send_signal(signal.SIGUSR1)
        output, _ = rank.communicate(timeout=300)
    finally:
        if rank.poll() is None:
            os.killpg(rank.pid, signal.SIGKILL)
    assert rank.returncode == 75, output[-3000:]
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert f"stopped at iteration 1 of {_train_iters(run_dir)} " in (run_dir / "STOPPED").read_text()
    assert [entry["iteration"] for entry in _ledger(run_dir)] == [0, 0]  # 4 rows, micro-batch 2


def _venv_of_ranks_that_do_not_hold_the_warning_yet(root: Path, holding_rank: int | None = None) -> Path:
    """A stand-in for NEMO_TOPR_VENV whose `python` is a training rank still starting, before
    nemo_topr/cli.py blocks SIGUSR1 (a window of 0.1 s to seconds, too short to hit on purpose):
    it leaves RUN_DIR/ready-RANK and waits, and a warning kills it by SIGUSR1's default action;
    `holding_rank` is a rank past that line instead: Python holding the warning with the CLI's own
    `hold_the_warning`. Once requeued (SLURM_RESTART_COUNT 1) it ends as a finished run does: rank
    0 leaves RUN_DIR/COMPLETED."""
    python = root / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    holding = ("import pathlib, sys, time; from nemo_topr.training.preemption_warning import hold_the_warning; "
               "hold_the_warning(); pathlib.Path(sys.argv[1]).touch()\nwhile True: time.sleep(0.2)")
    python.write_text(f"""#!/usr/bin/env bash
for arg; do [[ $arg == run_dir=* ]] && run_dir=${{arg#run_dir=}}; done
if ((${{SLURM_RESTART_COUNT:-0}} == 0)); then
    if [[ $SLURM_PROCID == {holding_rank} ]]; then
        PYTHONPATH={REPO} exec {sys.executable} -c {shlex.quote(holding)} "$run_dir/ready-$SLURM_PROCID"
    fi
    touch "$run_dir/ready-$SLURM_PROCID"
    while :; do sleep 0.2; done
fi
if [[ $SLURM_PROCID == 0 ]]; then echo 0 > "$run_dir/COMPLETED"; fi
""")
    python.chmod(0o755)
    return python.parent.parent


def _wait_for_ready_ranks(run_dir: Path, alive) -> None:
    deadline = time.monotonic() + 120
    while not all((run_dir / f"ready-{rank}").exists() for rank in (0, 1)):
        assert time.monotonic() < deadline and alive()
        time.sleep(0.1)


@pytest.mark.guards_job_script
@pytest.mark.parametrize("holding_rank", [None, 1], ids=["no-rank-holds-it", "rank-1-holds-it"])
def test_a_warning_before_the_ranks_hold_it_requeues_even_if_a_rank_held_it(fake_slurm, holding_rank):
    """Ranks killed by the warning itself (srun status 128 + 10) are requeued: it was a warning,
    not a failure. If rank 1 already held it, --kill-on-bad-exit's SIGTERM makes it die of the
    warning it holds (nemo_topr/training/preemption_warning.py), so srun still exits 128 + 10; dying of the
    SIGTERM, srun would exit 128 + 15 and the job fail."""
    run_dir = fake_slurm / "run"
    venv = _venv_of_ranks_that_do_not_hold_the_warning_yet(fake_slurm, holding_rank)
    job = subprocess.Popen(["bash", str(REPO / "slurm" / "topr_job.sh"), "tiny_cpu"], cwd=REPO, text=True,
                           env=_job_env(SLURM_JOB_ID="77", NEMO_TOPR_VENV=str(venv), NEMO_TOPR_RUN_DIR=str(run_dir),
                                        NEMO_TOPR_GPUS_PER_NODE="2"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_ready_ranks(run_dir, lambda: job.poll() is None)
        for pid in _step_processes(fake_slurm):  # slurmstepd, for scancel --signal=USR1
            os.kill(pid, signal.SIGUSR1)
        output, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 0 and (fake_slurm / "requeued").read_text().split() == ["77"], output
    assert "a rank died of the warning (SIGUSR1) before it could hold it (srun status 138); " \
           "requeueing job 77" in output, output


def test_the_job_gives_its_ranks_the_training_environment(fake_slurm):
    """slurm/topr_job.sh sources slurm/environment.sh before srun: every rank sees its variables
    (those iterate's GPU ranks get too), and one the user set wins."""
    from nemo_topr.cluster.environment import training_environment

    run_dir = fake_slurm / "run"
    python = fake_slurm / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/usr/bin/env bash\nenv > "{run_dir}/env-$RANK"\n[[ $RANK != 0 ]] || touch "{run_dir}/COMPLETED"\n')
    python.chmod(0o755)
    env = _job_env(SLURM_JOB_ID="78", NEMO_TOPR_VENV=str(python.parents[1]), NEMO_TOPR_RUN_DIR=str(run_dir),
                   NEMO_TOPR_GPUS_PER_NODE="2", NCCL_DEBUG="INFO")
    env.pop("OMP_NUM_THREADS")
    job = subprocess.run(["bash", str(REPO / "slurm" / "topr_job.sh"), "tiny_cpu"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert job.returncode == 0, job.stdout + job.stderr
    expected = {**training_environment(), "NCCL_DEBUG": "INFO"}
    for rank in (0, 1):
        seen = dict(line.split("=", 1) for line in (run_dir / f"env-{rank}").read_text().splitlines() if "=" in line)
        assert {name: seen.get(name) for name in expected} == expected


def _real_job(job_id: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True).stdout


def _job_state(job: str) -> str:
    """The JobState in `scontrol show job`'s text."""
    return re.search(r"JobState=(\S+)", job).group(1)


def _real_job_state(job_id: str) -> str:
    return _job_state(_real_job(job_id))


def _submit_tiny_real_job(run_dir: Path, demo_inputs: tuple[Path, Path], *options: str,
                          overrides: tuple[str, ...] = (), nodes: int = 1, ranks_per_node: int = 2,
                          config: str = "tiny_cpu") -> str:
    """`nemo-topr submit` of the tiny CPU run (2 ranks: one node, or one each on two) to the real
    Slurm that SLURM_CONF names; returns the job id. `options`: more of submit's options (default
    --time 00:30:00, no pre-emption warning in it); `overrides` come after the tiny run's, so
    they win."""
    answer = subprocess.run([sys.executable, "-m", "nemo_topr.cli", "submit", "--config", config,
                             "--nodes", str(nodes), "--gpus-per-node", str(ranks_per_node), "--run-dir", str(run_dir),
                             "--venv", sys.prefix,  # this one, also from a worktree or a copy without .venv
                             *(options or ("--time", "00:30:00")), *_tiny_run_overrides(demo_inputs), *overrides],
                            cwd=REPO, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert answer.returncode == 0, answer.stderr
    return re.search(r"Submitted batch job (\d+)", answer.stdout).group(1)


def _wait_for_real_ranks(job_id: str, logs: Path) -> None:
    """Until srun has started both ranks of this start (their log files exist)."""
    deadline = time.monotonic() + 120
    while len(list(logs.glob("rank-*.log"))) < 2:
        assert time.monotonic() < deadline and _real_job_state(job_id) in ("PENDING", "RUNNING")
        time.sleep(0.1)


# JobState of a job not yet ended; SIGNALING shows while slurmctld sends the --signal warning.
UNFINISHED = ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "SIGNALING")


def _wait_while_real_job(job_id: str, states: tuple[str, ...], timeout: float = 600) -> str:
    """Polls until the job leaves `states`; returns the state it reached."""
    deadline = time.monotonic() + timeout
    while (state := _real_job_state(job_id)) in states:
        assert time.monotonic() < deadline, f"job {job_id} still {state}"
        time.sleep(1)
    return state


def _wait_for_restart(job_id: str, timeout: float = 300) -> None:
    """Polls until the job has been requeued once (its Restarts count is 1)."""
    deadline = time.monotonic() + timeout
    while not re.search(r"\sRestarts=1\s", job := _real_job(job_id)):
        assert time.monotonic() < deadline and _job_state(job) in UNFINISHED, job
        time.sleep(1)


@contextlib.contextmanager
def _cancelled_at_exit(job_id: str):
    """No job of a failed test keeps the node (the jobs ask for it whole: --exclusive)."""
    try:
        yield
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)


def _real_job_end(job_id: str, batch_output: Path, timeout: float = 600) -> tuple[str, str, str]:
    """Waits for the job to end; returns its JobState, `scontrol show job` and its batch output."""
    state = _wait_while_real_job(job_id, UNFINISHED, timeout)
    return state, _real_job(job_id), batch_output.read_text()


@pytest.mark.slow
@pytest.mark.slurm
def test_a_warning_while_the_ranks_import_requeues_on_real_slurm(slurm_cluster, demo_inputs, tmp_path):
    """`nemo-topr submit` (of a user's YAML file extending tiny_cpu) on a real one-node Slurm 22.05:
    SIGUSR1 to the job step while both ranks are still importing (before train() runs) must end in
    a requeue and a COMPLETED job in which every sample trained once -- not in ranks killed by
    SIGUSR1's default action and a FAILED job."""
    run_dir = tmp_path / "run"
    mine = tmp_path / "my_runs" / "tiny_mine.yaml"  # a user's YAML, named by its path: every start reads it
    mine.parent.mkdir()
    mine.write_text("defaults:\n  - tiny_cpu\n  - _self_\n")
    job_id = _submit_tiny_real_job(run_dir, demo_inputs, config=str(mine))
    with _cancelled_at_exit(job_id):
        _wait_until_ranks_hold_the_warning(job_id)
        subprocess.run(["scancel", "--signal=USR1", job_id], check=True)
        state, _, batch_log = _real_job_end(job_id, run_dir / f"topr-tiny_mine-{job_id}.out")
    assert state == "COMPLETED", batch_log
    assert "requeueing job" in batch_log and (run_dir / "logs" / f"job-{job_id}-start-1").is_dir(), batch_log
    assert (run_dir / "COMPLETED").exists()
    trained = [sample for entry in _ledger(run_dir) for sample in entry["sample_ids"]]
    assert sorted(trained) == list(range(48)), batch_log  # one epoch: every sample exactly once


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.parametrize("holding_rank", [None, 1], ids=["no-rank-holds-it", "rank-1-holds-it"])
def test_a_warning_before_the_ranks_hold_it_requeues_the_real_job(slurm_cluster, tmp_path, holding_rank):
    """The shipped 8B sbatch on real Slurm, with ranks still starting (above) when `scancel
    --signal=USR1` comes: real srun reports them killed by it, and the job script requeues
    instead of failing; the next start completes. Rank 1 holding the warning already: real srun's
    --kill-on-bad-exit SIGTERM makes it die of that warning too, so srun's status is still 138."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()  # for --output: slurmd does not create directories
    venv = _venv_of_ranks_that_do_not_hold_the_warning_yet(tmp_path, holding_rank)
    answer = subprocess.run(["sbatch", "--parsable", "--ntasks-per-node=2", "--gpus-per-node=2",
                             f"--output={run_dir}/%x-%j.out", "slurm/llama31_8b.sbatch"],
                            cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "NEMO_TOPR_CONFIG": "tiny_cpu", "NEMO_TOPR_RUN_DIR": str(run_dir),
                                 "NEMO_TOPR_VENV": str(venv), "NEMO_TOPR_GPUS_PER_NODE": "2"})
    assert answer.returncode == 0, answer.stderr
    job_id = answer.stdout.strip()
    with _cancelled_at_exit(job_id):
        _wait_for_ready_ranks(run_dir, lambda: _real_job_state(job_id) in ("PENDING", "RUNNING"))
        subprocess.run(["scancel", "--signal=USR1", job_id], check=True)
        state, job, batch_log = _real_job_end(job_id, run_dir / f"topr-llama31-8b-{job_id}.out")
    assert state == "COMPLETED" and (run_dir / "COMPLETED").exists(), job + batch_log
    assert re.search(r"srun: error: \S+: tasks? (0-1|1): User defined signal 1", batch_log), batch_log
    assert "a rank died of the warning (SIGUSR1) before it could hold it (srun status 138)" in batch_log
    assert _check_every_start_kept(run_dir, job_id, batch_log, job, "") == 1, batch_log


def _rank_processes(job_id: str, rank: int) -> list[int]:
    """The training processes of one rank of a real job: `nemo_topr.cli train` (and its forks)
    whose environment holds this job's id and that task id (slurmstepd sets both)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            environ = set((proc / "environ").read_bytes().split(b"\0"))
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if (b"nemo_topr.cli" in cmdline and f"SLURM_JOB_ID={job_id}".encode() in environ
                and f"SLURM_PROCID={rank}".encode() in environ):
            found.append(int(proc.name))
    return found


def _blocks_the_warning(pid: int) -> bool:
    """Whether the process holds SIGUSR1 pending (its SigBlk mask in /proc) and catches SIGTERM
    (SigCgt) to die of a held warning (nemo_topr/training/preemption_warning.py)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # gone
        return False
    blocked, caught = (int(re.search(rf"^{field}:\s*([0-9a-f]+)$", status, re.MULTILINE).group(1), 16)
                       for field in ("SigBlk", "SigCgt"))
    return bool(blocked >> (signal.SIGUSR1 - 1) & 1 and caught >> (signal.SIGTERM - 1) & 1)


def _wait_until_ranks_hold_the_warning(job_id: str, ranks: int = 2) -> None:
    """Until every rank's `nemo-topr train` blocks SIGUSR1, which nemo_topr/cli.py does before its
    imports, so that the warning tests the save at an iteration boundary. Earlier, while
    slurm/task.sh or Python itself starts, SIGUSR1 kills the rank and the job requeues without a
    save (test_a_warning_before_the_ranks_hold_it_requeues_the_real_job). Sending it once the rank
    logs exist met that window on 2026-11-27 (the two-node test, on loaded cores)."""
    deadline = time.monotonic() + 120
    while not all(any(map(_blocks_the_warning, _rank_processes(job_id, rank))) for rank in range(ranks)):
        assert time.monotonic() < deadline and _real_job_state(job_id) in ("PENDING", "RUNNING")
        time.sleep(0.1)  # as _wait_for_real_ranks: each poll scans /proc and runs scontrol


@pytest.mark.slow
@pytest.mark.slurm
def test_a_killed_rank_fails_the_real_job_without_a_requeue(slurm_cluster, demo_inputs, tmp_path):
    """Rank 1 killed (SIGKILL, as the OOM killer would) while both ranks run: a failure, not a
    pre-emption. The job must end FAILED, never requeued, and its output must name the rank."""
    run_dir = tmp_path / "run"
    job_id = _submit_tiny_real_job(run_dir, demo_inputs)
    logs = run_dir / "logs" / f"job-{job_id}-start-0"
    with _cancelled_at_exit(job_id):
        _wait_for_real_ranks(job_id, logs)
        deadline = time.monotonic() + 300
        while not (run_dir / "config.yaml").exists() or not (rank_1 := _rank_processes(job_id, 1)):
            assert time.monotonic() < deadline and _real_job_state(job_id) == "RUNNING"
            time.sleep(0.1)
        for pid in rank_1:
            os.kill(pid, signal.SIGKILL)
        # a requeue shows at once as PENDING/REQUEUED: no need to wait for a second start
        state = _wait_while_real_job(job_id, ("RUNNING", "COMPLETING"), timeout=120)
        job = _real_job(job_id)
    batch_log = (run_dir / f"topr-tiny_cpu-{job_id}.out").read_text()
    assert state == "FAILED" and "Restarts=0 " in job, job + batch_log
    assert re.search(r"srun: error: \S+: task 1: Killed", batch_log), batch_log
    # srun exits with the worst task status (here task 0's SIGTERM from --kill-on-bad-exit: 143)
    failed = re.search(rf"training failed \(srun status (\d+)\); not requeued; rank logs: {logs}\n", batch_log)
    assert failed and int(failed.group(1)) > 0 and re.search(rf"\sExitCode={failed.group(1)}:0\s", job), job + batch_log
    assert [path.name for path in (run_dir / "logs").iterdir()] == [logs.name]
    assert not (run_dir / "COMPLETED").exists()


# Seconds from the ranks' holding of SIGUSR1 over which the random warning falls: a tiny run's ranks
# live 25-55 s on 2 shared cores (imports and set-up all but ~3 s of it; six iterations), so most
# draws land in start-up, some in training and some after the ranks are gone (no requeue due).
PREEMPT_WINDOW_S = 40.0


def _check_every_start_kept(run_dir: Path, job_id: str, batch_log: str, job: str, context: str,
                            layout: str = "1 node(s) x 2 rank(s)") -> int:
    """Each start of a requeued job left its rank logs and its lines in the batch output (which
    real slurmd appends to, --open-mode=append); returns the number of restarts."""
    restarts = int(re.search(r"\sRestarts=(\d+)\s", job).group(1))
    starts = [f"job-{job_id}-start-{k}" for k in range(restarts + 1)]
    assert sorted(path.name for path in (run_dir / "logs").iterdir()) == starts, context + batch_log
    assert all(len(list((run_dir / "logs" / start).glob("rank-*.log"))) == 2 for start in starts), context
    assert batch_log.count(f"[topr_job] job {job_id}: {layout}") == restarts + 1, context + batch_log
    assert batch_log.count(f"requeueing job {job_id}") == restarts, context + batch_log
    return restarts


@pytest.mark.slow
@pytest.mark.slurm
def test_the_shipped_8b_sbatch_requeues_after_a_warning_at_a_random_moment(slurm_cluster, demo_inputs, tmp_path):
    """slurm/llama31_8b.sbatch itself, made the tiny 2-rank CPU run the way a user overrides a
    shipped script (sbatch options beat #SBATCH lines; NEMO_TOPR_CONFIG picks the config; the
    script's arguments are the run's overrides). SIGUSR1 to the ranks at a random moment from
    the moment both hold it (their imports and set-up included) on: the job must end COMPLETED,
    requeued once if the warning came before the last iteration, with every sample trained once,
    every start's logs kept and the data tokenized by the first start alone."""
    seed = int(os.environ.get("NEMO_TOPR_TEST_SEED", random.randrange(2**32)))
    delay = random.Random(seed).uniform(0, PREEMPT_WINDOW_S)
    context = f"seed {seed} (NEMO_TOPR_TEST_SEED), warning {delay:.1f} s after both ranks held it\n"
    print(context)
    run_dir = tmp_path / "run"
    run_dir.mkdir()  # for --output: slurmd does not create directories
    answer = subprocess.run(["sbatch", "--parsable", "--ntasks-per-node=2", "--gpus-per-node=2",
                             f"--output={run_dir}/%x-%j.out", "slurm/llama31_8b.sbatch",
                             *_tiny_run_overrides(demo_inputs)],
                            cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "NEMO_TOPR_CONFIG": "tiny_cpu",
                                 "NEMO_TOPR_RUN_DIR": str(run_dir), "NEMO_TOPR_VENV": sys.prefix,
                                 # Slurm 22.05 sets no SLURM_GPUS_ON_NODE in the batch step here
                                 "NEMO_TOPR_GPUS_PER_NODE": "2"})
    assert answer.returncode == 0, answer.stderr
    job_id = answer.stdout.strip()
    with _cancelled_at_exit(job_id):
        _wait_until_ranks_hold_the_warning(job_id)
        time.sleep(delay)
        begun_before = max((entry["iteration"] for entry in _ledger(run_dir)), default=-1)
        # may find no step left to signal (the ranks are gone): then nothing is to be requeued
        scancel = subprocess.run(["scancel", "--signal=USR1", job_id], capture_output=True, text=True)
        context += f"scancel: {scancel.returncode} {scancel.stderr.strip()}\n"
        state, job, batch_log = _real_job_end(job_id, run_dir / f"topr-llama31-8b-{job_id}.out")
    assert state == "COMPLETED" and (run_dir / "COMPLETED").exists(), context + batch_log
    restarts = _check_every_start_kept(run_dir, job_id, batch_log, job, context)
    train_iters = _train_iters(run_dir)
    context += f"iteration {begun_before} had begun (-1: none), {train_iters} in all\n"
    assert restarts <= 1, context + batch_log  # one warning
    if begun_before + 2 < train_iters:  # the ranks were still to begin another iteration
        assert restarts == 1, context + batch_log
        # saved at the first iteration boundary after the warning (Bridge checks after every step;
        # one more iteration may begin between reading the ledger and scancel)
        stopped = int(re.search(rf"stopped at iteration (\d+) of {train_iters} ", batch_log).group(1))
        assert begun_before + 1 <= stopped <= begun_before + 2, context + batch_log
    trained = [sample for entry in _ledger(run_dir) for sample in entry["sample_ids"]]
    assert sorted(trained) == list(range(48)), context + batch_log  # exactly once, across the starts
    assert not (run_dir / "STOPPED").exists()  # the stop's marker goes when a start completes the run
    # the data is prepared once: start 0 (the warning held until its first iteration boundary, after the
    # data) wrote the set beside the run directory, and a requeued start found it and tokenized nothing
    prepared = [_prepared_data_line(run_dir / "logs" / f"job-{job_id}-start-{k}") for k in range(restarts + 1)]
    assert [verb for verb, _ in prepared] == ["wrote"] + ["found"] * restarts, context + batch_log
    assert {Path(path).parent for _, path in prepared} == {tmp_path / "prepared_data"}, context + batch_log
    assert len({path for _, path in prepared}) == 1, context + batch_log


def _prepared_data_line(start_logs: Path) -> tuple[str, str]:
    """("wrote" or "found", the prepared set) of one start, from its rank 0's data lines."""
    said = re.findall(r"^\[nemo-topr\] prepared data: (wrote|found) (\S+)\s", (start_logs / "rank-0.log").read_text(),
                      re.MULTILINE)  # \s: the console wraps long lines at a space
    assert len(said) == 1, start_logs
    return said[0]


@pytest.mark.slow
@pytest.mark.slurm
def test_a_real_time_limit_preempts_with_its_warning_and_the_next_start_resumes(slurm_cluster, demo_inputs,
                                                                               tmp_path):
    """`nemo-topr submit --time 00:02:00 --preemption-warning 45` with no signal sent by the test:
    Slurm's own warning must make the ranks save and requeue the job before the limit kills
    them (a job killed at its limit ends TIMEOUT, never requeued), and the requeued start must
    resume at the iteration saved, none lost or repeated.

    When the warning comes: slurmctld checks time limits every PERIODIC_TIMEOUT = 30 s and sends
    it once `now + 45 + 30 >= end` (send_job_warn_signal, src/slurmctld/job_mgr.c, 22.05), so 45
    to 75 s into each start, leaving the ranks 45 s or more to save: after srun has started the
    ranks (a warning with no step to signal is lost) and, their start-up taking 25-55 s on 2
    loaded cores, mostly while they train, since 250 epochs of the 48 samples take longer than
    one start
    (measured: the first start stopped at iteration 160 of 240 on 2026-11-25, at 9 on 2026-11-27
    while the other xdist worker loaded both cores). Once the second start has trained an
    iteration the test cancels the job: training the rest to COMPLETED took up to 580 s of both
    cores, and a requeued start that completes with every sample trained once is what the other
    real-Slurm tests check (a warning while the ranks import, the shipped 8B sbatch, two nodes)."""
    run_dir, epochs = tmp_path / "run", 250
    job_id = _submit_tiny_real_job(run_dir, demo_inputs, "--time", "00:02:00", "--preemption-warning", "45",
                                   overrides=("train.global_batch_size=24", f"dataset.epochs={epochs}"))
    with _cancelled_at_exit(job_id):
        _wait_for_restart(job_id)
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=00:30:00"], check=True)
        first_start, before = _ledger_lengths(run_dir), _ledger(run_dir)  # final: it ended before the requeue
        deadline = time.monotonic() + 900
        while not _ledger(run_dir, skip=first_start):  # until the second start has trained an iteration
            assert time.monotonic() < deadline and _real_job_state(job_id) in UNFINISHED, _real_job(job_id)
            time.sleep(1)
        subprocess.run(["scancel", job_id], check=True)
        state, job, batch_log = _real_job_end(job_id, run_dir / f"topr-tiny_cpu-{job_id}.out")
    assert state == "CANCELLED", job + batch_log
    assert _check_every_start_kept(run_dir, job_id, batch_log, job, "") == 1, batch_log  # pre-empted once
    first = run_dir / "logs" / f"job-{job_id}-start-0"
    saved = int(re.search(r"\[nemo-topr\] stopped at iteration (\d+) of", (first / "rank-0.log").read_text())[1])
    after = _ledger(run_dir, skip=first_start)
    assert sorted(first_start) == ["samples_dp0.jsonl", "samples_dp1.jsonl"]  # both data-parallel ranks trained
    assert {entry["iteration"] for entry in before} == set(range(saved)), batch_log  # nothing after the save
    assert min(entry["iteration"] for entry in after) == saved, batch_log  # resumed there
    # rank 0 alone reports the data (srun ran the two ranks of slurm/task.sh)
    assert "[nemo-topr] data:" in (first / "rank-0.log").read_text()
    assert "[nemo-topr] data:" not in (first / "rank-1.log").read_text()
