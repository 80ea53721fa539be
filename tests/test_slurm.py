"""Cluster scripts without a cluster: shellcheck, the rendered sbatch script, and a real TOPR
run through fake `sbatch`/`srun`/`scontrol` — including a pre-emption warning that must leave
a checkpoint, requeue the job, and resume from it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO

SCRIPTS = sorted([*REPO.glob("slurm/*.sh"), *REPO.glob("slurm/*.sbatch"), *REPO.glob("launchers/*.sh")])

FAKE_SBATCH = """#!/usr/bin/env bash
# fake sbatch: runs the batch script at once on this machine, as job 4242 on one node
script=${@: -1}
export SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=1 SLURM_JOB_NODELIST=localhost SLURM_SUBMIT_DIR=$PWD
export SLURM_JOB_NAME=$(sed -n 's/^#SBATCH --job-name=//p' "$script")
bash "$script" > "$FAKE_SLURM_DIR/batch.out" 2>&1
echo "Submitted batch job $SLURM_JOB_ID"
"""

FAKE_SRUN = """#!/usr/bin/env bash
# fake srun: one task (one node); honours --output with %n -> 0, ignores the other options
output=/dev/stdout
while [[ $1 == --* ]]; do
    case $1 in --output=*) output=${1#--output=}; output=${output//%n/0} ;; esac
    shift
done
echo "$*" >> "$FAKE_SLURM_DIR/srun_commands"
"$@" > "$output" 2>&1 &
task=$!
trap 'kill -TERM $task' TERM
while true; do
    wait "$task" && status=0 || status=$?
    kill -0 "$task" 2>/dev/null || break
done
exit "$status"
"""

FAKE_SCONTROL = """#!/usr/bin/env bash
case $1 in
    show) echo localhost ;;
    requeue) echo "$2" >> "$FAKE_SLURM_DIR/requeued" ;;
esac
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("sbatch", FAKE_SBATCH), ("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
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


def test_submit_dry_run_renders_the_job(tmp_path):
    from nemo_topr.cluster.submit import main

    out = subprocess.run([sys.executable, "-m", "nemo_topr.cli", "submit", "--config", "llama31_70b_bf16",
                          "--nodes", "4", "--account", "acct", "--partition", "batch",
                          "--container-image", "nvcr.io/nvidia/pytorch:25.09-py3", "--run-dir", str(tmp_path),
                          "--dry-run", "hf_model=/models/L70", "objective.baseline=0.2", "dataset.train_path=a b"],
                         capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert callable(main)
    for line in ("#SBATCH --nodes=4", "#SBATCH --account=acct", "#SBATCH --partition=batch",
                 "#SBATCH --signal=B:USR1@600", "#SBATCH --requeue", "#SBATCH --gpus-per-node=8",
                 f"export NEMO_TOPR_RUN_DIR={tmp_path}",
                 "export NEMO_TOPR_CONTAINER_IMAGE=nvcr.io/nvidia/pytorch:25.09-py3"):
        assert line in out.splitlines(), line
    assert out.splitlines()[-1].endswith("llama31_70b_bf16 hf_model=/models/L70 objective.baseline=0.2 "
                                         "'dataset.train_path=a b'")
    assert not (tmp_path / "submit").exists()  # dry run writes nothing


def _tiny_run_overrides(demo_inputs: tuple[Path, Path]) -> list[str]:
    model_dir, data = demo_inputs
    return [f"hf_model={model_dir}", f"dataset.train_path={data}", "dataset.epochs=1",
            "checkpoint.save_interval=100"]


@pytest.fixture(scope="module")
def demo_inputs(tmp_path_factory):
    """A tiny HF Llama and a scored dataset (the demo's first three stages)."""
    from nemo_topr.demo import build_graded_records
    from nemo_topr.model import build_tiny_hf_llama
    from nemo_topr.tiny_tokenizer import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("slurm_inputs")
    model_dir = build_tiny_hf_llama(root / "tiny", build_tiny_tokenizer())
    graded = root / "graded.jsonl"
    graded.write_text("".join(json.dumps(r) + "\n" for r in build_graded_records(16)))
    subprocess.run([sys.executable, "-m", "nemo_topr.cli", "score-logprobs", "--model", str(model_dir),
                    "--data", str(graded), "--out", str(root / "scored.jsonl"), "--seq-length", "512"],
                   cwd=REPO, check=True, capture_output=True)
    return model_dir, root / "scored.jsonl"


@pytest.mark.slow
@pytest.mark.distributed
def test_submit_runs_a_tiny_topr_job_through_fake_slurm(fake_slurm, demo_inputs):
    run_dir = fake_slurm / "run"
    answer = subprocess.run([sys.executable, "-m", "nemo_topr.cli", "submit", "--config", "tiny_cpu",
                             "--gpus-per-node", "1", "--run-dir", str(run_dir), *_tiny_run_overrides(demo_inputs)],
                            cwd=REPO, capture_output=True, text=True)
    batch_log = (fake_slurm / "batch.out").read_text() if (fake_slurm / "batch.out").exists() else ""
    assert answer.returncode == 0 and "Submitted batch job 4242" in answer.stdout, answer.stderr + batch_log
    assert (run_dir / "COMPLETED").exists(), batch_log
    # srun ran the real per-node command: torchrun -> nemo_topr.cli train, one rank
    srun_command = (fake_slurm / "srun_commands").read_text()
    assert "slurm/node.sh" in srun_command and "--config-name tiny_cpu" in srun_command
    node_log = (run_dir / "logs" / "job-4242" / "node-0.log").read_text()
    assert "iteration" in node_log and not (fake_slurm / "requeued").exists()


@pytest.mark.slow
@pytest.mark.distributed
def test_preemption_warning_checkpoints_requeues_and_resumes(fake_slurm, demo_inputs):
    run_dir = fake_slurm / "run"
    script = subprocess.run([sys.executable, "-m", "nemo_topr.cli", "submit", "--config", "tiny_cpu",
                             "--gpus-per-node", "1", "--run-dir", str(run_dir), "--dry-run",
                             *_tiny_run_overrides(demo_inputs)],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    (fake_slurm / "job.sbatch").write_text(script)
    job_env = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NAME": "topr",
               "SLURM_JOB_NODELIST": "localhost", "SLURM_SUBMIT_DIR": str(REPO)}
    ledger = run_dir / "samples_dp0.jsonl"

    job = subprocess.Popen(["bash", str(fake_slurm / "job.sbatch")], env=job_env, cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while (not ledger.exists() or len(ledger.read_text().splitlines()) < 4) and job.poll() is None:
        assert time.time() < deadline
        time.sleep(0.05)
    job.send_signal(signal.SIGUSR1)  # what `#SBATCH --signal=B:USR1@600` delivers
    output, _ = job.communicate(timeout=300)
    assert job.returncode == 0, output
    assert (fake_slurm / "requeued").read_text().split() == ["77"], output
    assert not (run_dir / "COMPLETED").exists()
    stopped_at = int((run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    assert stopped_at >= 2  # save_interval=100: this checkpoint exists only because of the signal

    first_job = [json.loads(line) for line in ledger.read_text().splitlines()]
    requeued = subprocess.run(["bash", str(fake_slurm / "job.sbatch")], env=job_env, cwd=REPO,
                              capture_output=True, text=True, timeout=600)
    assert requeued.returncode == 0 and (run_dir / "COMPLETED").exists(), requeued.stdout[-3000:]
    second_job = [json.loads(line) for line in ledger.read_text().splitlines()][len(first_job):]
    assert max(e["iteration"] for e in first_job) == stopped_at - 1  # stopped right after the signal
    assert second_job[0]["iteration"] == stopped_at  # the requeued job resumed from that checkpoint
    trained = [sample for entry in first_job + second_job for sample in entry["sample_ids"]]
    assert sorted(trained) == list(range(48))  # every sample exactly once across the two jobs
