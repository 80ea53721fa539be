"""Process control: the processes a stage's `nemo-topr` command runs in (`Ranks`: one, torchrun on
this node, or srun across the driver's Slurm allocation), what they need to start, running one with
its output in a log, and a stop of the driver (Ctrl-C, SIGTERM) passed on to it (`Stopped`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nemo_topr.iterate.config import IterateConfig, IterateError
from nemo_topr.utils.distributed import standalone_torchrun

TASK_SCRIPT = Path(__file__).resolve().parents[2] / "slurm" / "task.sh"  # one rank under srun


@dataclass(frozen=True)
class Ranks:
    """The processes of a stage: one; `per_node` under torchrun on this node; or, on several
    nodes, `per_node` on each under srun in the driver's Slurm allocation (as slurm/topr_job.sh
    starts training)."""

    per_node: int = 1
    nodes: int = 1
    cuda: bool = False  # GPU ranks: they get the training job's environment

    @classmethod
    def of(cls, config: IterateConfig) -> Ranks:
        """The score and train stages' ranks."""
        return cls(config.nproc_per_node, config.nodes, cuda=config.device == "cuda")

    @property
    def total(self) -> int:
        return self.per_node * self.nodes

    def command(self, python: str = sys.executable) -> list[str]:
        """The command line that runs `nemo-topr` in these processes."""
        if self.nodes > 1:
            return ["srun", f"--nodes={self.nodes}", f"--ntasks-per-node={self.per_node}", "--kill-on-bad-exit=1",
                    "--label", str(TASK_SCRIPT), python]
        torchrun = standalone_torchrun(self.per_node) if self.per_node > 1 else []
        return [python, *torchrun, "-m", "nemo_topr.cli"]

    def environment(self, environ=os.environ) -> dict[str, str]:  # noqa: B008 - the process environment
        """What these ranks' environment adds to the driver's: on GPUs, a Slurm training job's
        (slurm/environment.sh; a variable set already is kept); under srun, where they meet
        (torchrun makes its own): the allocation's first node, at slurm/topr_job.sh's port
        (NEMO_TOPR_MASTER_PORT, else 29500 + job id mod 10000)."""
        from nemo_topr.cluster.environment import training_environment

        added = {}
        if self.cuda:
            added = {name: value for name, value in training_environment().items() if name not in environ}
        if self.nodes > 1:
            hosts = subprocess.run(["scontrol", "show", "hostnames", environ["SLURM_JOB_NODELIST"]],
                                   capture_output=True, text=True, check=True).stdout.split()
            port = environ.get("NEMO_TOPR_MASTER_PORT") or str(29500 + int(environ["SLURM_JOB_ID"]) % 10000)
            added.update(MASTER_ADDR=hosts[0], MASTER_PORT=port, LOCAL_WORLD_SIZE=str(self.per_node))
        return added


def check_launch(config: IterateConfig, environ=os.environ) -> None:  # noqa: B008 - the process environment
    """What score and train need to start, checked before the start's evaluation and generation
    (not in a `--dry-run`, which may run on a login node): on cuda, a GPU of this node per rank
    (the other nodes are assumed alike); one driver, not several srun tasks; with nodes > 1, a
    Slurm allocation of that many nodes, the driver its batch script (not under srun)."""
    import torch

    gpus = torch.cuda.device_count()
    if config.device == "cuda" and config.nproc_per_node > gpus:
        raise IterateError(f"nproc_per_node={config.nproc_per_node}, but torch sees {gpus} GPU(s) on this node: "
                           "score and train run one rank per GPU", key="nproc_per_node.above_gpus",
                           where="nproc_per_node")
    tasks = int(environ.get("SLURM_STEP_NUM_TASKS", "1"))
    if tasks > 1:
        raise IterateError(f"this driver is one of the {tasks} tasks of an srun step, each of which would run every "
                           "stage into the same out: run it once, as the batch script (not under srun) or in a shell",
                           key="driver.under_srun_tasks", where="SLURM_STEP_NUM_TASKS")
    if config.nodes == 1:
        return
    if "SLURM_STEP_ID" in environ:  # the stages' srun would wait for this step's own resources
        raise IterateError(f"nodes={config.nodes} runs score and train as srun steps of the allocation, and this driver "
                           f"runs under srun itself (step {environ['SLURM_STEP_ID']}), whose resources those steps "
                           "would wait for: run it as the batch script", key="nodes.driver_in_srun_step",
                           where="SLURM_STEP_ID")
    allocated = environ.get("SLURM_JOB_NUM_NODES")
    if "SLURM_JOB_ID" not in environ or allocated is None:
        raise IterateError(f"nodes={config.nodes} runs score and train under srun across a Slurm allocation, and "
                           "this driver is not in one (no SLURM_JOB_ID): run it in an sbatch script of "
                           f"#SBATCH --nodes={config.nodes} (docs/verifier_iterate.md)", key="nodes.not_in_allocation",
                           where="nodes")
    if int(allocated) < config.nodes:
        raise IterateError(f"nodes={config.nodes}, but this Slurm allocation (job {environ['SLURM_JOB_ID']}) has "
                           f"{allocated} node(s)", key="nodes.above_allocation", where="nodes")
    if not TASK_SCRIPT.is_file():
        raise IterateError(f"nodes={config.nodes} starts each rank with {TASK_SCRIPT}, which is missing: run the "
                           "driver from a checkout of nemo_topr", key="nodes.task_script_missing", where="nodes")


class Stopped(IterateError):
    """The driver was told to stop (Ctrl-C, SIGTERM) while a stage ran; the stage's processes were
    told the same and have ended (`code`: their exit status, Popen's -N for a signal N), or had
    finished their work first (0: marked done)."""

    def __init__(self, signum: int, verb: str, code: int):
        self.signum = signum
        ended = ("it finished first and is marked done: the same command goes on after it" if code == 0 else
                 f"it was stopped too ({f'killed by {signal.Signals(-code).name}' if code < 0 else f'exit {code}'}) "
                 "and is not marked done: the same command resumes")
        super().__init__(f"stopped by {signal.Signals(signum).name} while `nemo-topr {verb}` ran; {ended}",
                         key="stage.stopped", where=verb)

    @property
    def exit_code(self) -> int:
        """The shell's status for a command stopped by the signal."""
        return 128 + self.signum


@contextlib.contextmanager
def forwarding_stops(process: subprocess.Popen) -> Iterator[list[int]]:
    """While `process` runs: Ctrl-C or SIGTERM to the driver goes to its processes' group too, and
    the driver waits for them to end (train saves a checkpoint first). The process has a group of
    its own, so the terminal's Ctrl-C comes once, through here (left to `subprocess.run`, SIGTERM
    would kill the driver alone, its stage running on, and Ctrl-C SIGKILL train 0.25 s later). A
    signal the driver was started ignoring (SIGINT in a background job) stays ignored, as the
    stage inherits it. Yields the signals received."""
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_command(args: tuple[str, ...], log: Path, ranks: Ranks) -> list[int]:
    """`nemo-topr ARGS` in `ranks`' processes, their output in `log`; raises IterateError when it
    fails, Stopped when it did as the driver was told to stop (`forwarding_stops`). Returns the
    stop signals received while it still succeeded."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:
        process = subprocess.Popen([*ranks.command(), *args], stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, **ranks.environment()}, start_new_session=True)
        with forwarding_stops(process) as received:
            code = process.wait()
    if received and code != 0:
        raise Stopped(received[0], args[0], code)
    if code != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
        raise IterateError(f"`nemo-topr {args[0]}` failed (exit {code}); full log: {log}\n{tail}",
                           key="stage.failed", where=str(log))
    return received
