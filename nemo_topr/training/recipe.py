"""`nemo-topr train`: one TOPR run on Megatron-Bridge's ``finetune()`` loop.

    nemo-topr train --config-name tiny_cpu optimizer.lr=3e-4 objective.variant=tis

Reads the config (conf/ + overrides), validates, tokenizes and packs the data, sets the number
of iterations to cover the data once per epoch, saves the resolved config in the run
directory, and hands Bridge the TOPR forward step. Re-running the same command resumes from
the run directory's latest checkpoint. SIGTERM (pre-emption) makes Bridge save a checkpoint at
the next iteration boundary; the command then exits with 75 so that a job script requeues it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from omegaconf import OmegaConf

from nemo_topr import cpu_runtime
from nemo_topr.distributed import free_port
from nemo_topr.model_source import write_hf_artifacts
from nemo_topr.training.checkpoints import ensure_latest_complete, latest_iteration
from nemo_topr.training.config import CONF_DIR, ConfigError, TrainingRun, build_training_run, compose


def prepare(run: TrainingRun) -> dict:
    """Resolve what depends on the data (iterations), check the checkpoint to resume from,
    and record the run's inputs."""
    repaired = ensure_latest_complete(run.container.checkpoint.save)
    if repaired and _is_rank_zero():
        print(f"[nemo-topr] WARNING: {repaired}", flush=True)
    if _is_rank_zero():
        print(f"[nemo-topr] base model: {run.base_model.describe()}", flush=True)
        write_hf_artifacts(run.base_model, Path(run.container.checkpoint.save))
    train = run.container.train
    prepared = run.container.dataset.prepare(train.global_batch_size)
    check_baseline(run.objective, {seq.reward for seq in prepared.dataset.sequences})
    train.train_iters = prepared.num_rows // train.global_batch_size
    run.run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(run.raw, run.run_dir / "config.yaml")
    summary = {**prepared.summary(), "train_iters": train.train_iters,
               "global_batch_size": train.global_batch_size}
    return summary


def check_baseline(objective, rewards: set[float]) -> None:
    """With +-1 rewards a baseline outside (-1, 1) gives one side a zero or sign-flipped
    advantage (c = 1: positives get no signal; c > 1: they are pushed down)."""
    if rewards <= {-1.0, 1.0} and objective.variant != "asymre" and not -1.0 < objective.baseline < 1.0:
        raise ConfigError(f"objective.baseline={objective.baseline} is outside (-1, 1) for +-1 rewards: "
                          "one side would get a zero or sign-flipped advantage (use -1 < c < 1; "
                          "baseline_for_share(p, target) computes c for a target positive share)")


# Exit status of a run stopped early by a signal with a checkpoint saved: EX_TEMPFAIL, which
# the sbatch scripts in slurm/ requeue. 0 means the data was trained to the end.
EXIT_REQUEUE = 75
COMPLETED_MARKER = "COMPLETED"


def train(run: TrainingRun) -> int:
    """Run (or resume) training; returns 0 when done, EXIT_REQUEUE when stopped by a signal
    (SIGTERM by default, `train.exit_signal`) after saving a checkpoint."""
    from megatron.bridge.training.finetune import finetune

    from nemo_topr.training.step import ToprForwardStep

    summary = prepare(run)
    if _is_rank_zero():
        print(f"[nemo-topr] data: {json.dumps(summary)}", flush=True)
    try:
        finetune(run.container, ToprForwardStep(run.objective, sample_log_dir=run.run_dir))
    except SystemExit as stop:  # Bridge exits this way after a signal-triggered checkpoint
        if stop.code not in (0, None):
            raise
    reached = _latest_checkpoint_iteration(run)
    if reached < run.container.train.train_iters:
        if _is_rank_zero():
            print(f"[nemo-topr] stopped at iteration {reached} of {run.container.train.train_iters} with a "
                  f"checkpoint saved; rerun the same command to resume (exit {EXIT_REQUEUE})", flush=True)
        return EXIT_REQUEUE
    if _is_rank_zero():
        (run.run_dir / COMPLETED_MARKER).write_text(f"{reached}\n")
    return 0


def _latest_checkpoint_iteration(run: TrainingRun) -> int:
    return latest_iteration(Path(run.container.checkpoint.save)) or 0


def _is_rank_zero() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nemo-topr train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-name", default="topr", help="YAML file in the config dir, without .yaml")
    parser.add_argument("--config-path", default=str(CONF_DIR), help="config directory (default: %(default)s)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (OmegaConf dotted keys)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if "WORLD_SIZE" not in os.environ:  # a plain single process: Bridge would default to port 29500
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    cpu_runtime.enable_cpu_runtime()  # no-op on GPU machines
    run = build_training_run(compose(args.config_name, args.overrides, args.config_path))
    return train(run)
