"""A TOPR job across two real Slurm 22.05 nodes (scripts/slurm_cluster.sh --two-nodes): each
node a network namespace with its own address, hostname and hosts file, so that the ranks meet
over the network at MASTER_ADDR, the allocation's first host, as on a real cluster."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from conftest import REPO
from test_slurm import _ledger, _real_job_state, _tiny_run_overrides, _wait_for_real_ranks

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def test_a_two_node_job_is_preempted_requeued_and_completes_with_every_sample_once(slurm_two_nodes, demo_inputs,
                                                                                tmp_path, monkeypatch):
    """The checks of the one-node tests, across two nodes: the warning (`scancel --signal=USR1`)
    once both ranks have started, while they import, must end in a checkpoint, a requeue and a
    COMPLETED job, every sample trained once, both starts' logs kept."""
    monkeypatch.setenv("SLURM_CONF", slurm_two_nodes)  # this cluster's clients, here and in the job
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run_dir = tmp_path / "run"
    answer = subprocess.run([sys.executable, "-m", "nemo_topr.cli", "submit", "--config", "tiny_cpu",
                             "--nodes", "2", "--gpus-per-node", "1", "--time", "00:30:00", "--run-dir", str(run_dir),
                             "--venv", sys.prefix, *_tiny_run_overrides(demo_inputs)],
                            cwd=REPO, capture_output=True, text=True)
    assert answer.returncode == 0, answer.stderr
    job_id = re.search(r"Submitted batch job (\d+)", answer.stdout).group(1)
    try:
        _wait_for_real_ranks(job_id, run_dir / "logs" / f"job-{job_id}-start-0")  # one log per node's rank
        subprocess.run(["scancel", "--signal=USR1", job_id], check=True)
        # ~60 s when it works; a rank that cannot resolve MASTER_ADDR retries, it does not fail
        deadline = time.monotonic() + 300
        while (state := _real_job_state(job_id)) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            assert time.monotonic() < deadline, f"job {job_id} still {state}"
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    batch_log = (run_dir / f"topr-tiny_cpu-{job_id}.out").read_text()
    rank_logs = "".join(p.read_text()[-3000:] for p in sorted(run_dir.glob("logs/*/rank-*.log")))
    assert state == "COMPLETED", batch_log + rank_logs
    job = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    assert re.search(r"^\s+NodeList=topr-node\[1-2\]$", job, re.MULTILINE), job
    assert re.search(r"\sRestarts=1\s", job), job
    # one rank per node (srun --nodes=2 --ntasks-per-node=1), meeting at the first node, in each start
    assert batch_log.count(f"[topr_job] job {job_id}: 2 node(s) x 1 rank(s)") == 2, batch_log
    assert len(re.findall(r"^\[topr_job\] rendezvous topr-node1:\d+;", batch_log, re.MULTILINE)) == 2, batch_log
    assert batch_log.count(f"requeueing job {job_id}") == 1, batch_log
    starts = sorted(path.name for path in (run_dir / "logs").iterdir())
    assert starts == [f"job-{job_id}-start-0", f"job-{job_id}-start-1"], starts
    assert all(len(list((run_dir / "logs" / start).glob("rank-*.log"))) == 2 for start in starts)
    assert (run_dir / "COMPLETED").exists()
    assert sorted(p.name for p in run_dir.glob("samples_dp*.jsonl")) == ["samples_dp0.jsonl", "samples_dp1.jsonl"]
    trained = [sample for entry in _ledger(run_dir) for sample in entry["sample_ids"]]
    assert sorted(trained) == list(range(48)), batch_log  # 2 DP ranks, one epoch: every sample once
