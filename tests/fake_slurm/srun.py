"""Fake `srun` (one node) that behaves like Slurm's where nemo_topr's job script relies on it.

Modelled on SchedMD Slurm, src/srun/libsrun/srun_job.c (`_srun_signal_mgr`) and srun(1):
- SIGTERM or SIGHUP to srun: "forcing job termination" -> launch_g_fwd_signal(SIGKILL) to every
  task. A rank that srun receives TERM for never gets to run a handler.
- SIGINT: the first one reports the tasks' state; a second within one second kills them (SIGKILL).
- any other signal (SIGUSR1, SIGUSR2, SIGCONT, ...): forwarded to every task unchanged.
- --kill-on-bad-exit=1: a task that exits non-zero gets the others SIGKILLed.
- exit status: the highest task exit code, or 128+N when a task was killed by signal N.
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
    (state / "srun_commands").open("a").write(" ".join(command) + "\n")
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
    while any(task.poll() is None for task in tasks):
        if kill_on_bad_exit and any(task.returncode not in (None, 0) for task in tasks):
            kill_all("error: task exited with a non-zero status; terminating the step (--kill-on-bad-exit)")
        time.sleep(0.05)
    return max(code if code >= 0 else 128 - code for code in (task.returncode for task in tasks))


if __name__ == "__main__":
    sys.exit(main())
