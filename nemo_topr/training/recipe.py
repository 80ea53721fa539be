"""`nemo-topr train`: one TOPR run on Megatron-Bridge's ``finetune()`` loop.

    nemo-topr train --config-name tiny_cpu optimizer.lr=3e-4 objective.variant=tis

Reads the config (conf/ + overrides), sets up its `device` (cuda, or cpu when the config says
so; a cuda config on a machine without CUDA stops here: `nemo_topr.device`), validates,
tokenizes and packs the data, sets the number of iterations to cover the data once per epoch,
saves the resolved config in the run directory, and hands Bridge the TOPR forward step.
Re-running the same command resumes from the run directory's latest checkpoint. The exit signal
(`train.exit_signal`: SIGTERM by default, SIGUSR1 under slurm/topr_job.sh) makes Bridge save a
checkpoint at the next iteration boundary; the command then leaves RUN_DIR/STOPPED and exits
with 75 so that a job script requeues it.

Every rank runs this module, and the first part (`prepare`) runs before torch.distributed
exists, so "rank 0" is the launcher's rank (RANK from torchrun, SLURM_PROCID from srun).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

from omegaconf import OmegaConf

from nemo_topr.device import DEVICES, DeviceError, use_device
from nemo_topr.distributed import free_port, launcher_rank
from nemo_topr.model_source import write_hf_artifacts
from nemo_topr.training.checkpoints import ensure_latest_complete, latest_iteration
from nemo_topr.training.config import CONF_DIR, ConfigError, TrainingRun, build_training_run, compose


def prepare(run: TrainingRun) -> dict:
    """Resolve what depends on the data (iterations), check the checkpoint to resume from,
    and record the run's inputs.

    Runs on every rank before torch.distributed exists. Only launcher rank 0 writes: it repairs an
    interrupted checkpoint and saves config.yaml, the data report and the base model's HF
    artifacts. The other ranks cannot read the checkpoint directory before that repair is done:
    they first wait for rank 0 in Bridge's process-group rendezvous (bridge/training/setup.py:253
    initialize_megatron, whose initialize.py:747-756 init_process_group + barrier), and
    checkpoints are read only after it (setup.py:397)."""
    rank_zero = _is_rank_zero()
    if rank_zero:
        (run.run_dir / STOPPED_MARKER).unlink(missing_ok=True)  # from an earlier stop of this run
        repaired = ensure_latest_complete(run.container.checkpoint.save)
        if repaired:
            print(f"[nemo-topr] WARNING: {repaired}", flush=True)
        print(f"[nemo-topr] base model: {run.base_model.describe()}", flush=True)
        write_hf_artifacts(run.base_model, Path(run.container.checkpoint.save))
    else:
        run.container.dataset.report_path = None  # every rank tokenizes; rank 0 reports
    train = run.container.train
    prepared = run.container.dataset.prepare(train.global_batch_size)
    check_baseline(run.objective, {seq.reward for seq in prepared.dataset.sequences})
    train.train_iters = prepared.num_rows // train.global_batch_size
    if rank_zero:
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


# Exit status of a run stopped early by a signal with a checkpoint saved: EX_TEMPFAIL. 0 means
# the data was trained to the end. Job scripts requeue on the STOPPED marker rather than on the
# status: srun reports 128+9 when --kill-on-bad-exit kills the ranks that had not exited yet.
EXIT_REQUEUE = 75
COMPLETED_MARKER = "COMPLETED"
STOPPED_MARKER = "STOPPED"


def resolve_exit_signal(train_config) -> signal.Signals:
    """`train.exit_signal` as a signal; YAML and overrides give its name (SIGUSR1, SIGTERM)."""
    value = train_config.exit_signal
    try:
        exit_signal = signal.Signals[value] if isinstance(value, str) else signal.Signals(value)
    except (KeyError, ValueError):
        raise ConfigError(f"train.exit_signal={value!r} is not a signal name such as SIGUSR1 or SIGTERM") from None
    train_config.exit_signal = exit_signal
    return exit_signal


def train(run: TrainingRun) -> int:
    """Run (or resume) training; returns 0 when done, EXIT_REQUEUE when stopped by the exit signal
    (`train.exit_signal`) after saving a checkpoint."""
    from megatron.bridge.training.callbacks import Callback
    from megatron.bridge.training.finetune import finetune

    from nemo_topr.training.step import ToprForwardStep

    exit_signal = resolve_exit_signal(run.container.train)
    if exit_signal != signal.SIGUSR1:  # blocked by `nemo-topr train` (cli.py) for Slurm's warning
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})

    class ReleaseExitSignal(Callback):
        def on_train_start(self, context) -> None:  # Bridge's handler is installed by now
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {exit_signal})

    # A warning that arrives while this rank still loads (Slurm sends it at pre-emption time with
    # PreemptParameters=send_user_signal) would kill it: SIGUSR1's default action is to terminate.
    # Keep it pending until training starts; Bridge's handler then takes it and the rank saves
    # after its first iteration.
    signal.pthread_sigmask(signal.SIG_BLOCK, {exit_signal})
    try:
        summary = prepare(run)
        if _is_rank_zero():
            print(f"[nemo-topr] data: {json.dumps(summary)}", flush=True)
        finetune(run.container, ToprForwardStep(run.objective, sample_log_dir=run.run_dir),
                 callbacks=[ReleaseExitSignal()])
    except SystemExit as stop:  # Bridge exits this way after a signal-triggered checkpoint
        if stop.code not in (0, None):
            raise
    finally:  # already released when training started; not left blocked by a failure before that
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {exit_signal})
    reached = _latest_checkpoint_iteration(run)
    if reached < run.container.train.train_iters:
        message = (f"stopped at iteration {reached} of {run.container.train.train_iters} with a checkpoint "
                   f"saved; rerun the same command to resume (exit {EXIT_REQUEUE})")
        if _is_rank_zero():
            (run.run_dir / STOPPED_MARKER).write_text(message + "\n")
            print(f"[nemo-topr] {message}", flush=True)
        return EXIT_REQUEUE
    if _is_rank_zero():
        (run.run_dir / COMPLETED_MARKER).write_text(f"{reached}\n")
    return 0


def _latest_checkpoint_iteration(run: TrainingRun) -> int:
    return latest_iteration(Path(run.container.checkpoint.save)) or 0


def _is_rank_zero() -> bool:
    return launcher_rank() == 0


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
    raw = compose(args.config_name, args.overrides, args.config_path)
    try:  # the config's `device` (cuda in the GPU presets): CPU only when chosen
        use_device(raw.get("device"), where="device", choices=DEVICES)
    except DeviceError as error:
        raise SystemExit(f"nemo-topr train: {error}") from None
    return train(build_training_run(raw))
