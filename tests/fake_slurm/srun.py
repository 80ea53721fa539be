"""Fake `srun` (one node) that behaves like Slurm's where nemo_topr's job script relies on it.

Modelled on SchedMD Slurm, src/srun/libsrun/srun_job.c (`_srun_signal_mgr`) and srun(1):
- SIGTERM or SIGHUP to srun: "forcing job termination" -> launch_g_fwd_signal(SIGKILL) to every
  task. A rank that srun receives TERM for never gets to run a handler.
- SIGINT: the first one reports the tasks' state; a second within one second kills them (SIGKILL).
- any other signal (SIGUSR1, SIGUSR2, SIGCONT, ...): forwarded to every task unchanged.
- --kill-on-bad-exit=1: the first task that ends abnormally (non-zero or by a signal) has srun
  terminate the step with SIG_TERM_KILL (src/plugins/launch/slurm/launch_slurm.c, `_task_finish`),
  which slurmstepd carries out as SIGCONT and SIGTERM to every task, `KillWait` seconds, then
  SIGKILL (src/slurmd/slurmstepd/req.c); so a task that handles SIGTERM ends on its own terms.
  KillWait is $FAKE_SLURM_KILL_WAIT (default 30, slurm.conf's default).
- exit status (`_task_finish`, then fini_srun in src/srun/libsrun/srun_job.c): if any task was
  killed by a signal, 128 + the highest such signal; otherwise the highest exit code.
Source: SchedMD Slurm, tag slurm-22-05-8-1 (Debian 12's slurm-wlm 22.05.8).
- each task's environment: SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NODEID, SLURM_STEP_ID
  (the batch shell's SLURM_PROCID=0 is overridden, as srun does).
- --output=PATTERN with %t (task id), %n (node id) and %j (job id).
The task pids go to $FAKE_SLURM_DIR/step.pids: the job step's processes, which slurmstepd signals
for `sbatch --signal=SIG@TIME` without `B:` (the tests play slurmctld and read that file).
Options the fake does not implement are an error, so the job script cannot rely on them unseen.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    options = {}
    while argv and argv[0].startswith("--"):
        key, _, value = argv.pop(0)[2:].partition("=")
        if key not in ("nodes", "ntasks-per-node", "kill-on-bad-exit", "output"):
            sys.exit(f"fake srun: --{key} is not modelled")
        options[key] = value
    if options.get("nodes", "1") != "1":
        sys.exit("fake srun: one node only")
    return options, argv


def main() -> int:
    options, command = parse(sys.argv[1:])
    ntasks = int(options.get("ntasks-per-node", "1"))
    state = Path(os.environ["FAKE_SLURM_DIR"])
    tasks = []

    def kill_all(reason: str) -> None:
        print(f"srun: {reason}", file=sys.stderr, flush=True)
        for task in tasks:
            if task.poll() is None:
                task.kill()

    last_interrupt = [0.0]

    def on_signal(signum: int, _frame) -> None:
        if signum in (signal.SIGTERM, signal.SIGHUP):
            kill_all("forcing job termination")
        elif signum == signal.SIGINT:
            if time.monotonic() - last_interrupt[0] < 1.0:
                kill_all("interrupt (one more within 1 sec to abort)")
            last_interrupt[0] = time.monotonic()
        else:
            for task in tasks:
                if task.poll() is None:
                    task.send_signal(signum)

    # installed before the tasks start, so a signal that races their start-up is still handled
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, on_signal)
    for task_id in range(ntasks):
        env = {**os.environ, "SLURM_PROCID": str(task_id), "SLURM_LOCALID": str(task_id),
               "SLURM_NTASKS": str(ntasks), "SLURM_NODEID": "0", "SLURM_STEP_ID": "0"}
        output = options.get("output")
        log = open(output.replace("%t", str(task_id)).replace("%n", "0")
                   .replace("%j", os.environ.get("SLURM_JOB_ID", "0")), "w") if output else None
        tasks.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT if log else None))
    (state / "step.pids").write_text("".join(f"{task.pid}\n" for task in tasks))

    kill_on_bad_exit = options.get("kill-on-bad-exit") == "1"
    kill_at = None
    while None in (codes := [task.poll() for task in tasks]):  # poll every task: any() would stop early
        if kill_on_bad_exit and kill_at is None and any(code not in (None, 0) for code in codes):
            print(f"srun: Terminating StepId={os.environ.get('SLURM_JOB_ID', '0')}.0", file=sys.stderr, flush=True)
            for task in tasks:
                if task.poll() is None:
                    task.send_signal(signal.SIGCONT)
                    task.send_signal(signal.SIGTERM)
            kill_at = time.monotonic() + float(os.environ.get("FAKE_SLURM_KILL_WAIT", "30"))
        if kill_at is not None and time.monotonic() >= kill_at:
            kill_all("KillWait over")
        time.sleep(0.05)
    signals = [-code for code in codes if code < 0]
    return 128 + max(signals) if signals else max(codes)


if __name__ == "__main__":
    sys.exit(main())
