"""srun's signal and exit semantics, as the job script relies on them: the fake srun
(tests/fake_slurm/srun.py, which cites Slurm's source) and the real one of a one-node Slurm
22.05 (scripts/slurm_cluster.sh) run the same tasks and must agree.

The fake stays because the fake-Slurm tests of tests/slurm/test_scripts.py run the job script in a
few seconds without root; these tests keep it honest against the real program."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

FAKE_SRUN = REPO / "tests" / "fake_slurm" / "srun.py"


class Launcher:
    def __init__(self, kind: str, kill_wait: float):
        self.kind, self.kill_wait = kind, kill_wait

    def start(self, cwd: Path, tasks: int, body: str, *options: str) -> subprocess.Popen:
        """srun --ntasks-per-node=TASKS OPTIONS bash -c BODY, started in CWD; returns once every
        task has written ready-RANK."""
        command = ["srun", f"--ntasks-per-node={tasks}", *options, "bash", "-c", body]
        env = dict(os.environ)
        if self.kind == "fake":
            command[0:1] = [sys.executable, str(FAKE_SRUN)]
            env.update(FAKE_SLURM_DIR=str(cwd), FAKE_SLURM_KILL_WAIT=str(self.kill_wait))
        proc = subprocess.Popen(command, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while len(list(cwd.glob("ready-*"))) < tasks:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.02)
        return proc


@pytest.fixture(params=["fake", pytest.param("real", marks=[pytest.mark.slurm, pytest.mark.slow])])
def srun(request):
    if request.param == "fake":
        return Launcher("fake", kill_wait=2)
    request.getfixturevalue("slurm_cluster")
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    return Launcher("real", kill_wait=float(re.search(r"^KillWait\s*=\s*(\d+)", config, re.M).group(1)))


def _record(signal_name: str, then: str) -> str:
    return f'trap "echo {signal_name} >> got-\\$SLURM_PROCID; {then}" {signal_name}; '


LOOP = "touch ready-$SLURM_PROCID; while :; do sleep 0.2; done"


def test_sigterm_to_srun_kills_every_task_without_running_its_handler(srun, tmp_path):
    """srun_job.c `_srun_signal_mgr`: SIGTERM -> launch_g_fwd_signal(SIGKILL); srun exits 128 + 9."""
    proc = srun.start(tmp_path, 2, _record("TERM", "exit 0") + LOOP)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGKILL
    assert not list(tmp_path.glob("got-*"))


def test_sigusr1_to_srun_reaches_every_task(srun, tmp_path):
    proc = srun.start(tmp_path, 2, _record("USR1", "exit 0") + LOOP)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=60) == 0
    assert [(tmp_path / f"got-{rank}").read_text() for rank in (0, 1)] == ["USR1\n", "USR1\n"]


FAILING_RANK_1 = 'if [ "$SLURM_PROCID" = 1 ]; then until [ -e ready-0 ]; do sleep 0.05; done; touch ready-1; exit 75; fi; '


def test_kill_on_bad_exit_sends_sigterm_and_srun_exits_with_the_failing_status(srun, tmp_path):
    """A rank that handles SIGTERM (as a training rank saves and exits) ends on its own terms:
    srun's status is the failing task's 75, not 128 + 9."""
    proc = srun.start(tmp_path, 2, FAILING_RANK_1 + _record("TERM", "exit 0") + LOOP, "--kill-on-bad-exit=1")
    assert proc.wait(timeout=60) == 75
    assert (tmp_path / "got-0").read_text() == "TERM\n"


def test_kill_on_bad_exit_sends_sigkill_killwait_seconds_after_sigterm(srun, tmp_path):
    proc = srun.start(tmp_path, 2, FAILING_RANK_1 + _record("TERM", "true") + LOOP, "--kill-on-bad-exit=1")
    proc.wait(timeout=60 + srun.kill_wait)
    term_at = (tmp_path / "got-0").stat().st_mtime
    assert (tmp_path / "got-0").read_text() == "TERM\n"
    assert proc.returncode == 128 + signal.SIGKILL
    assert time.time() - term_at >= srun.kill_wait - 0.5  # SIGKILL came KillWait after SIGTERM


def test_tasks_killed_by_sigusr1_make_srun_exit_128_plus_10(srun, tmp_path):
    """What slurm/topr_job.sh requeues on: ranks that took the warning before they could hold it
    die of SIGUSR1's default action, and srun exits 128 + 10."""
    proc = srun.start(tmp_path, 2, LOOP, "--kill-on-bad-exit=1")
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=60) == 128 + signal.SIGUSR1


def test_a_task_terminated_after_another_died_of_sigusr1_makes_srun_exit_128_plus_15(srun, tmp_path):
    """The case topr_job.sh still fails: rank 0 dies of SIGUSR1 while rank 1 holds it (ignores it
    here), and --kill-on-bad-exit's SIGTERM kills rank 1; srun takes the higher signal."""
    body = 'if [ "$SLURM_PROCID" = 1 ]; then trap "" USR1; fi; ' + LOOP
    proc = srun.start(tmp_path, 2, body, "--kill-on-bad-exit=1")
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
