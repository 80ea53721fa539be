"""`nemo-topr submit`: render an sbatch script for a TOPR run and submit it (or print it).

    nemo-topr submit --config llama31_70b_bf16 --account ACC --partition batch --nodes 4 \\
        --time 12:00:00 --container-image nvcr.io/nvidia/pytorch:25.09-py3 --dry-run \\
        hf_model=/models/Llama-3.1-70B-Instruct dataset.train_path=/data/scored.jsonl

The script is the same shape as slurm/*.sbatch: an #SBATCH header, the job's environment and
`exec slurm/topr_job.sh CONFIG overrides...`, which runs srun -> slurm/node.sh -> torchrun.
Without --dry-run it is written to RUN_DIR/submit/JOB_NAME.sbatch and passed to `sbatch`.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class ClusterJob:
    config_name: str
    overrides: list[str] = field(default_factory=list)
    job_name: str = "topr"
    run_dir: Path = REPO / "runs" / "topr"
    nodes: int = 1
    gpus_per_node: int = 8
    time: str = "04:00:00"
    account: str | None = None
    partition: str | None = None
    container_image: str | None = None
    container_mounts: str | None = None
    preemption_warning_s: int = 600

    def sbatch_script(self) -> str:
        header = {
            "job-name": self.job_name,
            "account": self.account,
            "partition": self.partition,
            "nodes": self.nodes,
            "ntasks-per-node": 1,
            "gpus-per-node": self.gpus_per_node,
            "exclusive": "",
            "time": self.time,
            "signal": f"B:USR1@{self.preemption_warning_s}",
            "requeue": "",
            "output": f"{self.run_dir}/%x-%j.out",
        }
        lines = ["#!/usr/bin/env bash", f"# rendered by nemo-topr submit for config {self.config_name}"]
        lines += [f"#SBATCH --{key}" + (f"={value}" if value != "" else "")
                  for key, value in header.items() if value is not None]
        environment = {
            "NEMO_TOPR_ROOT": str(REPO),
            "NEMO_TOPR_RUN_DIR": str(self.run_dir),
            "NEMO_TOPR_GPUS_PER_NODE": str(self.gpus_per_node),
            "NEMO_TOPR_CONTAINER_IMAGE": self.container_image,
            "NEMO_TOPR_CONTAINER_MOUNTS": self.container_mounts,
        }
        lines += ["set -euo pipefail"]
        lines += [f"export {name}={shlex.quote(value)}" for name, value in environment.items() if value]
        command = [str(REPO / "slurm" / "topr_job.sh"), self.config_name, *self.overrides]
        lines += ["exec " + " ".join(shlex.quote(part) for part in command)]
        return "\n".join(lines) + "\n"


def submit(job: ClusterJob) -> str:
    """Write the script under the run directory, run `sbatch` on it, return sbatch's answer."""
    script = job.run_dir / "submit" / f"{job.job_name}.sbatch"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(job.sbatch_script())
    script.chmod(0o755)
    answer = subprocess.run(["sbatch", str(script)], check=True, capture_output=True, text=True)
    return answer.stdout.strip()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nemo-topr submit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="config name in conf/ (e.g. llama31_8b_bf16)")
    parser.add_argument("--job-name", help="default: topr-CONFIG")
    parser.add_argument("--run-dir", type=Path, help="default: runs/JOB_NAME")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--time", default="04:00:00")
    parser.add_argument("--account")
    parser.add_argument("--partition")
    parser.add_argument("--container-image", help="pyxis/enroot image; omit for the checkout's .venv")
    parser.add_argument("--container-mounts")
    parser.add_argument("--preemption-warning", type=int, default=600, dest="preemption_warning_s",
                        help="seconds before the time limit at which the job checkpoints and requeues")
    parser.add_argument("--dry-run", action="store_true", help="print the sbatch script instead of submitting")
    parser.add_argument("overrides", nargs="*", help="key=value overrides passed to nemo-topr train")
    args = parser.parse_args(argv)
    job_name = args.job_name or f"topr-{args.config}"
    job = ClusterJob(config_name=args.config, overrides=args.overrides, job_name=job_name,
                     run_dir=(args.run_dir or REPO / "runs" / job_name).resolve(), nodes=args.nodes,
                     gpus_per_node=args.gpus_per_node, time=args.time, account=args.account,
                     partition=args.partition, container_image=args.container_image,
                     container_mounts=args.container_mounts, preemption_warning_s=args.preemption_warning_s)
    if args.dry_run:
        sys.stdout.write(job.sbatch_script())
    else:
        print(submit(job))
    return 0
