"""The pre-emption warning and the handler agree: the signal every sbatch script (slurm/*.sbatch
and the one `nemo-topr submit` renders) asks Slurm to send is the one slurm/topr_job.sh tells
the training ranks to checkpoint on (`train.exit_signal`). Fast: the job script runs with a
recording `srun` and `scontrol`; the real-Slurm and fake-srun tests are in tests/slurm/test_scripts.py."""

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from nemo_topr.cluster.submit import ClusterJob

SRUN = """#!/usr/bin/env bash
# records its arguments; the training "finishes" (topr_job.sh then exits 0)
printf '%s\\n' "$@" > "$SRUN_ARGS"
for arg in "$@"; do [[ $arg == run_dir=* ]] && touch "${arg#run_dir=}/COMPLETED"; done
exit 0
"""
SCONTROL = '#!/usr/bin/env bash\n[[ $1 == show ]] && echo localhost\n'


def _warning_signal(script: str) -> str:
    """The signal name of the script's `#SBATCH --signal=[R:]SIG@SECONDS`, which must go to the
    ranks (no `B:`: the batch shell would get it, not the training processes)."""
    found = re.findall(r"^#SBATCH --signal=(\w+:)?(\w+)@\d+$", script, flags=re.MULTILINE)
    assert len(found) == 1, f"one --signal line expected: {found}"
    prefix, name = found[0]
    assert prefix in ("", "R:"), f"--signal={prefix}{name}: the training ranks must receive it"
    return name.removeprefix("SIG")


@pytest.fixture(scope="module")
def exit_signals(tmp_path_factory) -> list[str]:
    """The `train.exit_signal=` arguments topr_job.sh hands srun (for every rank)."""
    tmp_path = tmp_path_factory.mktemp("job")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(stat.S_IRWXU)
    run_dir = tmp_path / "run"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SRUN_ARGS": str(tmp_path / "srun_args"),
           "NEMO_TOPR_ROOT": str(REPO), "NEMO_TOPR_RUN_DIR": str(run_dir), "SLURM_JOB_ID": "7"}
    proc = subprocess.run(["bash", str(REPO / "slurm" / "topr_job.sh"), "tiny_cpu"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "training completed" in proc.stdout, proc.stdout + proc.stderr
    return [arg for arg in (tmp_path / "srun_args").read_text().splitlines() if arg.startswith("train.exit_signal=")]


SCRIPTS = {path.name: path.read_text() for path in sorted((REPO / "slurm").glob("*.sbatch"))}
SCRIPTS["nemo-topr submit"] = ClusterJob("llama31_8b_bf16").sbatch_script()


@pytest.mark.guards_job_script
@pytest.mark.parametrize("name", SCRIPTS)
def test_the_warning_signal_is_the_one_the_ranks_checkpoint_on(name, exit_signals):
    script = SCRIPTS[name]
    assert "slurm/topr_job.sh" in script  # the job body that starts the ranks
    assert exit_signals == [f"train.exit_signal=SIG{_warning_signal(script)}"]


STOP_THEN_REFUSED = """
import os, signal, sys, types
from pathlib import Path
from nemo_topr.training.preemption_warning import hold_the_warning
hold_the_warning()  # as cli.py does for train, before any import
from nemo_topr.model.device import use_device
use_device("cpu", where="device")
from nemo_topr.training import recipe
from nemo_topr.training.run_state import RunStateError

def prepare(run, lock):  # a stop arrives while the data is prepared, then the start is refused
    lock.acquire()
    os.kill(os.getpid(), signal.Signals[sys.argv[2]])
    raise RunStateError("Changed: the training data")

recipe.prepare = prepare
run = types.SimpleNamespace(container=types.SimpleNamespace(train=types.SimpleNamespace(exit_signal=sys.argv[2])),
                            run_dir=Path(sys.argv[1]))
try:
    recipe.train(run)
except RunStateError as error:
    sys.exit(f"nemo-topr train: {error}")
"""


# each case a fresh interpreter importing Bridge (the signal must meet torch's threads); SIGUSR1 is
# the warning cli.py holds until training starts
@pytest.mark.slow
@pytest.mark.parametrize("exit_signal", ["SIGTERM", "SIGUSR1"])
def test_a_stop_during_preparation_then_a_refused_start_says_why_and_leaves_no_lock(exit_signal, tmp_path):
    """The exit signal is held until training starts. It was blocked in the main thread only, so
    it landed on one of torch's threads and its default action killed the process at once, before
    the refusal was printed (exit 143; or 138, which topr_job.sh requeues, to be refused again on
    another node over the LOCK left behind). Now the refusal is the last word, exit 1, no LOCK."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.run([sys.executable, "-c", STOP_THEN_REFUSED, str(run_dir), exit_signal], cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert (proc.returncode, proc.stderr.splitlines()[-1:]) == (1, ["nemo-topr train: Changed: the training data"]), \
        proc.stderr[-3000:]
    assert list(run_dir.iterdir()) == []


WRITER_QUEUE_THEN_KILLED = """
import os, signal
from nemo_topr.model.device import use_device
use_device("cpu", where="device")
from nemo_topr.training.writer_queue import start_checkpoint_writer_queue
start_checkpoint_writer_queue(signal.SIGTERM)
children = [int(pid) for path in os.listdir("/proc/self/task")
            for pid in open(f"/proc/self/task/{path}/children").read().split()]
print("children", *children, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_the_checkpoint_writer_process_ends_with_a_killed_training(tmp_path):
    """A training killed by SIGKILL (an OOM kill, `kill -9`, a signal's default action) left the
    checkpoint-writer queue's manager process (it ignores the exit signal) and multiprocessing's
    resource tracker running for good, holding the job's stdout and stderr: a caller reading them
    waited for EOF until its timeout. They now end with the training process."""
    proc = subprocess.run([sys.executable, "-c", WRITER_QUEUE_THEN_KILLED], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -9, proc.stderr[-3000:]
    children = [int(pid) for line in proc.stdout.splitlines() if line.startswith("children ")
                for pid in line.split()[1:]]
    assert len(children) == 2  # the manager and the resource tracker
    deadline = time.monotonic() + 30
    while alive := [pid for pid in children if _running(pid)]:
        assert time.monotonic() < deadline, f"still running: {alive}"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    """Whether `pid` runs: not gone, and not a zombie its new parent has yet to reap."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


ENDING_SRUN = """#!/usr/bin/env bash
# the ranks end with $SRUN_STATUS; rank 0 left $SRUN_MARKER (none when empty) in the run directory
for arg in "$@"; do [[ $arg == run_dir=* && -n $SRUN_MARKER ]] && echo marked > "${arg#run_dir=}/$SRUN_MARKER"; done
exit "$SRUN_STATUS"
"""
RECORDING_SCONTROL = ('#!/usr/bin/env bash\n'
                      'case $1 in show) echo localhost ;; requeue) echo "$2" >> "$REQUEUED" ;; esac\n')


@pytest.mark.guards_job_script
@pytest.mark.parametrize("srun_status, marker, job_status, requeued", [
    (0, "COMPLETED", 0, False),  # trained to the end
    (75, "STOPPED", 0, True),  # stopped at the warning with a checkpoint saved
    (128 + 10, "", 0, True),  # a rank died of the warning (SIGUSR1) before it could hold it
    (1, "", 1, False),  # a rank failed
    (128 + 15, "", 128 + 15, False),  # a rank died of another signal (--kill-on-bad-exit's SIGTERM)
    (128 + 9, "", 128 + 9, False),  # ... or was killed (the OOM killer)
], ids=["completed", "stopped", "warning-before-held", "failed", "sigterm", "sigkill"])
def test_the_job_requeues_a_stop_or_the_warning_and_fails_with_any_failed_rank(tmp_path, srun_status, marker,
                                                                               job_status, requeued):
    """slurm/topr_job.sh after srun: only a stop with a checkpoint (STOPPED) or the warning itself
    (srun 128 + SIGUSR1) requeues; every other failure ends the job with srun's status."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", ENDING_SRUN), ("scontrol", RECORDING_SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REQUEUED": str(tmp_path / "requeued"),
           "SRUN_STATUS": str(srun_status), "SRUN_MARKER": marker, "NEMO_TOPR_ROOT": str(REPO),
           "NEMO_TOPR_RUN_DIR": str(tmp_path / "run"), "SLURM_JOB_ID": "7"}
    proc = subprocess.run(["bash", str(REPO / "slurm" / "topr_job.sh"), "tiny_cpu"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == job_status, proc.stdout + proc.stderr
    assert (tmp_path / "requeued").exists() == requeued, proc.stdout + proc.stderr
    if requeued:
        assert (tmp_path / "requeued").read_text() == "7\n"
