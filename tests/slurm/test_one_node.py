"""Jobs on a real one-node Slurm 22.05 (scripts/slurm_cluster.sh), not fakes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.slurm.test_scripts import UNFINISHED, _real_job_state, _wait_while_real_job

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slurm

BATCH = """#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=8
#SBATCH --time=00:02:00
srun bash -c 'echo task=$SLURM_PROCID'
"""


@pytest.mark.slow
def test_sbatch_honours_sbatch_lines_and_stand_in_gpus(slurm_cluster, tmp_path):
    """The #SBATCH lines are read (2 tasks) and --gpus-per-node=8 is accepted by the node."""
    script = tmp_path / "job.sbatch"
    script.write_text(BATCH)
    out = tmp_path / "job.out"
    sub = subprocess.run(["sbatch", "--parsable", "--wait", f"--output={out}", str(script)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    assert _real_job_state(job_id) == "COMPLETED"
    assert sorted(out.read_text().split()) == ["task=0", "task=1"]


def _rendered_script(run_dir: Path) -> str:
    from nemo_topr.cluster.submit import ClusterJob

    return ClusterJob(config_name="tiny_cpu", run_dir=run_dir).sbatch_script()


@pytest.mark.slow  # each case waits for Slurm to requeue the job and start it again
@pytest.mark.parametrize("source", ["slurm/llama31_8b.sbatch", "slurm/llama31_70b.sbatch", "nemo-topr submit"])
def test_a_requeued_job_keeps_every_start_in_its_output(slurm_cluster, tmp_path, source):
    """The --output/--open-mode lines of the shipped scripts and of the script `nemo-topr submit`
    renders, in a job that requeues itself once: without --open-mode=append slurmd truncates
    the file at the second start."""
    text = _rendered_script(tmp_path) if source == "nemo-topr submit" else (REPO / source).read_text()
    header = [line for line in text.splitlines() if line.startswith(("#SBATCH --output", "#SBATCH --open-mode"))]
    script = tmp_path / "job.sbatch"
    script.write_text("\n".join(["#!/bin/bash", *header, "#SBATCH --requeue",
                                 'echo "start ${SLURM_RESTART_COUNT:-0}"',
                                 '[ -n "${SLURM_RESTART_COUNT:-}" ] || { scontrol requeue "$SLURM_JOB_ID"; sleep 60; }',
                                 ""]))
    sub = subprocess.run(["sbatch", "--parsable", "--job-name=requeue", str(script)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    assert _wait_while_real_job(job_id, UNFINISHED, timeout=120) == "COMPLETED"
    output = (tmp_path / f"requeue-{job_id}.out").read_text().splitlines()
    assert [line for line in output if line.startswith("start")] == ["start 0", "start 1"], output


def test_submit_shows_sbatchs_error_and_fails(slurm_cluster, tmp_path):
    from nemo_topr.cluster.submit import ClusterJob, submit
    from nemo_topr.errors import UserError

    job = ClusterJob(config_name="tiny_cpu", overrides=[], job_name="bad-partition", run_dir=tmp_path,
                     nodes=1, gpus_per_node=2, time="00:05:00", account=None, partition="no-such-partition",
                     container_image=None, container_mounts=None)
    with pytest.raises(UserError, match="invalid partition specified: no-such-partition"):
        submit(job, job.sbatch_script())


def test_a_job_name_and_run_directory_with_spaces_reach_sbatch_whole(slurm_cluster, tmp_path):
    """`nemo-topr submit --job-name "a b" --run-dir "runs/r b"` wrote `#SBATCH --job-name=a b`,
    which sbatch refuses ("Invalid directive found in batch script: b"); the values are now
    double-quoted, and sbatch reads them whole."""
    from nemo_topr.cluster.submit import ClusterJob

    run_dir = tmp_path / "r b"
    run_dir.mkdir()
    text = ClusterJob(config_name="tiny_cpu", job_name="a b", run_dir=run_dir).sbatch_script()
    header = [line for line in text.splitlines() if line.startswith(("#SBATCH --job-name", "#SBATCH --output"))]
    assert header == ['#SBATCH --job-name="a b"', f'#SBATCH --output="{run_dir}/%x-%j.out"']
    script = tmp_path / "job.sbatch"
    script.write_text("\n".join(["#!/bin/bash", *header, "#SBATCH --time=00:02:00", 'echo "name=$SLURM_JOB_NAME"', ""]))
    sub = subprocess.run(["sbatch", "--parsable", "--wait", str(script)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    assert (run_dir / f"a b-{job_id}.out").read_text() == "name=a b\n"
