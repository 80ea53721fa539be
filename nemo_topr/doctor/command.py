"""`nemo-topr doctor`: check a new node (or container) end to end before a real job.

    nemo-topr doctor [--device cuda|cpu|auto] [--json PATH] [--work-dir DIR] [--timeout SECONDS]

Builds a small Llama-shaped model and a graded dataset in code, then runs the user-facing verbs
on them, each in its own process with its own time limit, and prints one pass/fail table:

    versions          torch, CUDA, cuDNN, NCCL, Transformer Engine, Apex, Megatron-Core, Bridge; fails
                      when torch loaded a cuDNN other than its own
    te attention      TE's attention forward and backward on packed THD, as the step calls it (TE only)
    score             `score-logprobs` on the device
    score vs cpu      the same scores on the CPU; per-token agreement within the precision's bound
    train             `train` through Bridge's finetune() (BF16 on cuda, fp32 on cpu), stopped after
                      iteration 1 with a checkpoint (train.exit_interval); |log rho| at step 0 (the
                      model scored its own data) and a finite loss
    resume            the same command again: resumes from the checkpoint and finishes
    train fp8         mu scored in FP8 (`--train-config`), then one FP8 iteration: a finite loss;
                      |log rho| at step 0 and FP8 - BF16 scores recorded (Transformer Engine only)
    export            `export` to Hugging Face, reloaded with transformers: same tensors, finite logits
    packed parity     Transformer Engine's THD attention against local layers on packed rows: per-token
                      cross-entropy, per-sequence log pi, TOPR gradients (TE only)

A step whose prerequisite failed is skipped, naming it; a failure names what to fix; no failure
stops the others. Exit status 0 when nothing failed. `--json` writes the same table, rewritten after
every check, so that a doctor killed from outside (a job's time limit) still leaves what it found.

On CPU it runs in the test suite, with TE absent and with it installed. On cuda it ran on one H200
without Transformer Engine (every check passed; train fp8 and packed parity skipped,
bench/results/gpu_verbs_h200_2026-11-26_0e4bf37.json) and with TE 2.17.1 (every check passed:
bench/results/gpu_verbs_h200_2026-11-26_f0673b4_te.json, before packed parity compared gradients,
which it did since with TE's unfused attention only; docs/cluster.md says what ran where).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nemo_topr.doctor.checks import diagnose
from nemo_topr.errors import Problems, UserError, refuse
from nemo_topr.doctor.runner import Check, Doctor
from nemo_topr.doctor.versions import versions
from nemo_topr.model.device import add_device_argument, resolve_device
from nemo_topr.utils.arguments import Parser, positive_seconds
from nemo_topr.utils.outputs import (
    OutputError, add_overwrite_argument, check_fresh_output_dir, fresh_output_dir, writable_output_file, write_whole,
)


def table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"{'check':<{width}}  status   seconds  detail"]
    for c in checks:
        lines.append(f"{c.name:<{width}}  {c.status:<7}  {c.seconds:>7}  {c.detail}")
        if c.fix:
            lines.append(f"{'':<{width}}  {'':<7}  {'':>7}  fix: {c.fix}")
    return "\n".join(lines)


def report(doctor: Doctor, finished: bool) -> dict:
    """The table as JSON; `passed` only once every check has run and none failed."""
    failed = any(c.status == "fail" for c in doctor.checks)
    return {"device": doctor.device, "finished": finished, "passed": finished and not failed,
            "versions": versions(), "checks": [asdict(c) for c in doctor.checks]}


def write_json(path: Path, content: dict) -> None:
    """Replace path atomically: a reader (or a kill) never sees half a table."""
    write_whole(path, (json.dumps(content, indent=2) + "\n").encode())


def json_outside_work_dir(json_path: Path, work_dir: Path) -> None:
    """Refuse a --json that is --work-dir, holds it or lies in it: the doctor makes that directory
    (the table's write then fails after the first check), fills it with its own files and folders
    and empties it when rerun (the table would be deleted)."""
    table, work = json_path.resolve(), work_dir.resolve()
    if table == work:
        raise OutputError(f"--json {json_path} is --work-dir, a directory the doctor makes; give another file",
                          key="--json.is_work_dir", where="--json")
    if work.is_relative_to(table):
        raise OutputError(f"--json {json_path} holds --work-dir {work_dir}, a directory the doctor makes; "
                          "give another file", key="--json.holds_work_dir", where="--json")
    if table.is_relative_to(work):
        raise OutputError(f"--json {json_path} is inside --work-dir {work_dir}, which the doctor fills with its own "
                          "files and empties when rerun; give a file outside it",
                          key="--json.inside_work_dir", where="--json")


COMMAND = "nemo-topr doctor"


@dataclass(frozen=True)
class DoctorSpec:
    """What `nemo-topr doctor` will do: its checks on `device` (as given: cuda, cpu or auto), each within
    `timeout` seconds, in `work_dir` (None: a temporary directory), the table also written to `json`."""

    device: str
    json: Path | None
    overwrite: bool
    work_dir: Path | None
    timeout: float

    @classmethod
    def of(cls, args: argparse.Namespace) -> DoctorSpec:
        return cls(args.device, args.json, args.overwrite, args.work_dir, args.timeout)


@contextlib.contextmanager
def work_dir_named() -> Iterator[None]:
    """A --work-dir refused by `nemo_topr.utils.outputs`, whose error names the directory, not the option."""
    try:
        yield
    except OutputError as error:
        raise OutputError(f"--work-dir {error}", key="--work-dir.unusable", where="--work-dir") from None


def validate(spec: DoctorSpec) -> list[UserError]:
    """Every problem of `spec` before a check runs, nothing written: the device (cuda where this machine
    has none), --json (a writable file that is not --work-dir, nor holds or lies in it), --work-dir (new,
    empty or an earlier doctor's)."""
    problems = Problems()
    with problems.check():
        resolve_device(spec.device, cuda_available=torch.cuda.is_available(), where="--device")
    with problems.check():
        if spec.json and spec.work_dir:
            json_outside_work_dir(spec.json, spec.work_dir)
        if spec.json:
            writable_output_file(spec.json, "--json", overwrite=spec.overwrite)
    if spec.work_dir:
        with problems.check(), work_dir_named():
            check_fresh_output_dir(spec.work_dir, COMMAND)
    return problems


def main(argv: list[str]) -> int:
    parser = Parser(prog="nemo-topr doctor", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_argument(parser)
    parser.add_argument("--json", type=Path, help="also write the table (and versions) as JSON here")
    add_overwrite_argument(parser)
    parser.add_argument("--work-dir", type=Path, help="keep the model, data, runs and logs here: a new or empty "
                        "directory, or an earlier doctor's, emptied first (default: a temporary directory, removed "
                        "when every check passed)")
    parser.add_argument("--timeout", type=positive_seconds, default=600,
                        help="seconds per check (default: %(default)s)")
    spec = DoctorSpec.of(parser.parse_args(argv))
    refuse(validate(spec), key="doctor.several_problems")
    return run(spec)


def run(spec: DoctorSpec) -> int:
    """Run the checks of `spec` (`validate`d) and report them; 1 when one failed."""
    device = resolve_device(spec.device, cuda_available=torch.cuda.is_available(), where="--device")
    with work_dir_named():  # a rerun in the same --work-dir starts from nothing, as the first run did
        work = fresh_output_dir(spec.work_dir, COMMAND) if spec.work_dir else \
            Path(tempfile.mkdtemp(prefix="nemo-topr-doctor-"))
    progress = (lambda so_far: write_json(spec.json, report(so_far, False))) if spec.json else None
    doctor = diagnose(device, work.resolve(), spec.timeout, after_check=progress)
    failed = [c.name for c in doctor.checks if c.status == "fail"]
    print(f"\nnemo-topr doctor --device {device}: {'FAILED: ' + ', '.join(failed) if failed else 'all passed'}")
    print(table(doctor.checks))
    if spec.json:
        write_json(spec.json, report(doctor, True))
    if spec.work_dir is None and not failed:
        shutil.rmtree(work, ignore_errors=True)
    elif failed:
        print(f"logs: {work}")
    return 1 if failed else 0
