"""Jobs on a real one-node Slurm 22.05 (scripts/slurm_cluster.sh), not fakes."""

from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.slurm

BATCH = """#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=8
#SBATCH --time=00:02:00
srun bash -c 'echo task=$SLURM_PROCID'
"""


def _job_state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True)
    return next(f.split("=", 1)[1] for f in out.stdout.split() if f.startswith("JobState="))


def test_sbatch_honours_sbatch_lines_and_stand_in_gpus(slurm_cluster, tmp_path):
    """The #SBATCH lines are read (2 tasks) and --gpus-per-node=8 is accepted by the node."""
    script = tmp_path / "job.sbatch"
    script.write_text(BATCH)
    out = tmp_path / "job.out"
    sub = subprocess.run(["sbatch", "--parsable", "--wait", f"--output={out}", str(script)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    assert _job_state(job_id) == "COMPLETED"
    assert sorted(out.read_text().split()) == ["task=0", "task=1"]
