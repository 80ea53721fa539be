"""A TOPR job across two real Slurm 22.05 nodes (scripts/slurm_cluster.sh --two-nodes): each
node a network namespace with its own address, hostname and hosts file, so that the ranks meet
over the network at MASTER_ADDR, the allocation's first host, as on a real cluster."""

from __future__ import annotations

import re
import subprocess

import pytest

from test_slurm import (_cancelled_at_exit, _check_every_start_kept, _ledger, _real_job_end, _submit_tiny_real_job,
                        _wait_until_ranks_hold_the_warning)

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def test_a_two_node_job_is_preempted_requeued_and_completes_with_every_sample_once(slurm_two_nodes, demo_inputs,
                                                                                tmp_path, monkeypatch):
    """The checks of the one-node tests, across two nodes: the warning (`scancel --signal=USR1`)
    once both ranks hold it, while they import, must end in a checkpoint, a requeue and a
    COMPLETED job, every sample trained once, both starts' logs kept."""
    monkeypatch.setenv("SLURM_CONF", slurm_two_nodes)  # this cluster's clients, here and in the job
    run_dir = tmp_path / "run"
    job_id = _submit_tiny_real_job(run_dir, demo_inputs, nodes=2, ranks_per_node=1)
    with _cancelled_at_exit(job_id):
        _wait_until_ranks_hold_the_warning(job_id)  # one rank per node
        subprocess.run(["scancel", "--signal=USR1", job_id], check=True)
        # ~60 s when it works; a rank that cannot resolve MASTER_ADDR fails at once (check_rendezvous)
        state, job, batch_log = _real_job_end(job_id, run_dir / f"topr-tiny_cpu-{job_id}.out")
    rank_logs = "".join(p.read_text()[-3000:] for p in sorted(run_dir.glob("logs/*/rank-*.log")))
    assert state == "COMPLETED", batch_log + rank_logs
    assert re.search(r"^\s+NodeList=topr-node\[1-2\]$", job, re.MULTILINE), job
    # both starts' logs and batch-output lines; one rank per node (srun --nodes=2 --ntasks-per-node=1)
    assert _check_every_start_kept(run_dir, job_id, batch_log, job, "", layout="2 node(s) x 1 rank(s)") == 1
    # meeting at the first node in each start
    assert len(re.findall(r"^\[topr_job\] rendezvous topr-node1:\d+;", batch_log, re.MULTILINE)) == 2, batch_log
    assert (run_dir / "COMPLETED").exists()
    assert sorted(p.name for p in run_dir.glob("samples_dp*.jsonl")) == ["samples_dp0.jsonl", "samples_dp1.jsonl"]
    trained = [sample for entry in _ledger(run_dir) for sample in entry["sample_ids"]]
    assert sorted(trained) == list(range(48)), batch_log  # 2 DP ranks, one epoch: every sample once
