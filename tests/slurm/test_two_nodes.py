"""A TOPR job across two real Slurm 22.05 nodes (scripts/slurm_cluster.sh --two-nodes): each
node a network namespace with its own address, hostname and hosts file, so that the ranks meet
over the network at MASTER_ADDR, the allocation's first host, as on a real cluster."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.slurm.test_scripts import (_cancelled_at_exit, _check_every_start_kept, _ledger, _real_job_end, _submit_tiny_real_job,
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


def test_iterate_scores_and_trains_across_two_nodes_and_a_rerun_redoes_nothing(slurm_two_nodes, tmp_path,
                                                                               monkeypatch, capsys):
    """`nemo-topr iterate ... nodes=2` in a two-node job: score and train under srun, one rank on
    each node, meeting at the first; the other stages on the driver's node. The same rounds as the
    one-node, two-rank test; the job then runs the driver again, which must redo nothing."""
    from tests.iterate.test_iterate import check_two_rounds

    from nemo_topr import iterate
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    monkeypatch.setenv("SLURM_CONF", slurm_two_nodes)
    model = build_tiny_hf_llama(tmp_path / "tiny_llama", build_tiny_tokenizer())
    out, rerun_at = tmp_path / "iterate", tmp_path / "rerun_started"
    driver = shlex.join([sys.executable, "-m", "nemo_topr.cli", "iterate", "iterate_tiny_cpu", f"base_model={model}",
                         f"out={out}", "nodes=2"])
    script = tmp_path / "iterate.sbatch"
    script.write_text("\n".join(["#!/bin/bash", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                                 "#SBATCH --time=00:20:00", "set -euo pipefail", f"cd {shlex.quote(str(REPO))}",
                                 driver, f"date +%s.%N > {shlex.quote(str(rerun_at))}", "echo RERUN", driver, ""]))
    batch_log = tmp_path / "job.out"
    # polled, not `sbatch --wait`: its sleeps grow to 32 s (src/sbatch/sbatch.c, _job_wait)
    submitted = subprocess.run(["sbatch", "--parsable", f"--output={batch_log}", str(script)], capture_output=True,
                               text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    job_id = submitted.stdout.strip().split(";")[0]
    with _cancelled_at_exit(job_id):
        state, job, logs = _real_job_end(job_id, batch_log, timeout=1200)
    assert state == "COMPLETED", job + logs[-6000:]
    markers = check_two_rounds(out)
    for stage in ("score", "train"):  # srun --label: both ranks' lines, one rank on each node
        lines = (out / "round_0" / "logs" / f"{stage}.log").read_text().splitlines()
        assert {line.split(":")[0].strip() for line in lines if re.match(r"^\s*[01]: ", line)} == {"0", "1"}
    first, rerun = logs.split("RERUN\n")
    assert "running: srun --nodes=2 --ntasks-per-node=1 " in first
    # the rerun ran no stage: every stage listed as done, no marker rewritten since
    assert sum(line.endswith(": done") for line in rerun.splitlines()) == len(markers), rerun
    assert "running:" not in rerun
    started = float(rerun_at.read_text())
    assert all(marker.stat().st_mtime < started for marker in markers)
    # a dry run (here, outside the allocation) lists them all as done
    capsys.readouterr()
    assert iterate.main(["iterate_tiny_cpu", f"base_model={model}", f"out={out}", "nodes=2", "--dry-run"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == len(markers) and all(line.endswith(": done") for line in listed)


# The real ip, except that a look at toprv0 while topr-node1's namespace is deleted but still held
# is followed at once by the holder's exit and the kernel's teardown of that namespace's links
# (net/core/net_namespace.c, cleanup_net): the moment CI's stop met by chance ("Cannot find
# device toprv0"), made certain.
_IP_WITH_A_VANISHING_LINK = r"""#!/bin/bash
"$REAL_IP" "$@"; rc=$?
if [[ "$*" == "link show toprv0" && ! -e /run/netns/topr-node1 && -s $HOLDER ]]; then
    kill "$(cat "$HOLDER")"; : >"$HOLDER"
    for _ in $(seq 100); do "$REAL_IP" link show toprv0 >/dev/null 2>&1 || break; sleep 0.05; done
fi
exit $rc
"""

# In a network and mount namespace of its own (the running two-node cluster is untouched): the
# bridge, both nodes' namespaces and veth pairs as `start` makes them, topr-node1's namespace held
# by a process (a job step still exiting), then `stop`, then what is left.
_STOP_IN_A_PRIVATE_NETWORK = r"""set -e
mount -t tmpfs tmpfs /run
ip link add toprbr0 type bridge
for i in 0 1; do
    node=topr-node$((i + 1))
    ip netns add $node
    ip link add toprv$i type veth peer name eth0 netns $node
    ip link set toprv$i master toprbr0 up
    mkdir -p "$SLURM_CLUSTER_STATE/netns/$node" && : >"$SLURM_CLUSTER_STATE/netns/$node/hosts"
done
nsenter --net=/run/netns/topr-node1 sleep 600 >/dev/null 2>&1 &
echo $! >"$HOLDER"
if [[ $CUT_SHORT == 1 ]]; then ip netns del topr-node1; fi  # an earlier stop got this far
set +e
PATH=$SHIM:$PATH "$SCRIPT" --two-nodes stop
echo "stop rc=$?"
if [[ -s $HOLDER ]]; then kill "$(cat "$HOLDER")"; fi
echo "links left: $(ip -o link show | grep -o 'topr[a-z0-9-]*' | sort -u | xargs)"
echo "namespaces left: $(ls -A /run/netns | xargs)"
"""


@pytest.mark.parametrize("cut_short", [False, True], ids=["namespace_held", "after_a_stop_cut_short"])
def test_stop_removes_a_nodes_network_while_its_namespace_is_torn_down(slurm_two_nodes, tmp_path, cut_short):
    """`--two-nodes stop` when a node's namespace outlives `ip netns del` (a process still inside)
    and its veth then vanishes between stop's look and its delete, which failed CI's teardown: the
    stop succeeds and leaves no link, namespace or hosts file. (The fixture brings root and ip.)"""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "ip").write_text(_IP_WITH_A_VANISHING_LINK)
    (shim / "ip").chmod(0o755)
    state = tmp_path / "state"  # no pid files: stop stops no daemon
    env = {**os.environ, "REAL_IP": shutil.which("ip"), "SHIM": str(shim), "HOLDER": str(tmp_path / "holder.pid"),
           "SLURM_CLUSTER_STATE": str(state), "SCRIPT": str(REPO / "scripts" / "slurm_cluster.sh"),
           "CUT_SHORT": str(int(cut_short))}
    done = subprocess.run(["unshare", "--net", "--mount", "bash", "-c", _STOP_IN_A_PRIVATE_NETWORK], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-3:] == ["stop rc=0", "links left: ", "namespaces left: "], done.stdout + done.stderr
    assert not (state / "netns").exists()
