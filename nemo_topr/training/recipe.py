"""`nemo-topr train`: one TOPR run on Megatron-Bridge's ``finetune()`` loop.

    nemo-topr train --config-name tiny_cpu optimizer.lr=3e-4 optimizer.min_lr=3e-4 objective.variant=tis

Reads the config (conf/ + overrides), sets up its `device` (cuda, or cpu when the config says
so; a cuda config on a machine without CUDA stops here: `nemo_topr.model.device`), validates,
tokenizes and packs the data, sets the number of iterations to cover the data once per epoch,
saves the resolved config in the run directory, and hands Bridge the TOPR forward step.
Re-running the same command resumes from the run directory's latest checkpoint. The exit signal
(`train.exit_signal`: SIGTERM by default, SIGUSR1 under slurm/topr_job.sh) makes Bridge save a
checkpoint at the next iteration boundary; the command then leaves RUN_DIR/STOPPED and exits
with 75 so that a job script requeues it. The console shows what the run trains, a line per log
interval and a summary; everything else goes to RUN_DIR/logs/ (`nemo_topr.training.console`).

Every rank runs this module, and the first part (`prepare`) runs before torch.distributed
exists, so "rank 0" is the launcher's rank (RANK from torchrun, SLURM_PROCID from srun).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from nemo_topr.utils.arguments import Parser, run_settings
from nemo_topr.training.preemption_warning import release_the_warning
from nemo_topr.data.positives import NO_ADVANTAGE, no_negatives_warning, sign_flipping_baseline
from nemo_topr.model.device import DEVICES, select_device, use_device
from nemo_topr.utils.distributed import (check_local_gpu, check_rendezvous, launcher_rank,
                                   launcher_world_size, local_rendezvous)
from nemo_topr.model.source import write_hf_artifacts
from nemo_topr.training.console import RunConsole, data_lines, layout_lines, summary_lines
from nemo_topr.training.checkpoints import ensure_latest_complete, iteration_dir_name, latest_iteration
from nemo_topr.data.records import SOURCE_OPTIONS, DataError, RecordSet, load_records, require_scored
from nemo_topr.training.config import TrainingRun, build_training_run, compose
from nemo_topr.training.config_error import ConfigError
from nemo_topr.training.validation import check_batch_division, check_config, idle_schedule_warning
from nemo_topr.utils.arguments import CONF_DIR
from nemo_topr.utils.memory import give_back_freed_memory
from nemo_topr.training.disk_space import (NoRoomError, check_room, checkpoint_bytes, estimated_checkpoint_bytes, failure_hint,
                                           parameter_count)
from nemo_topr.training.step import baseline_column, baseline_source
from nemo_topr.training.run_state import (
    COMPLETED_MARKER,
    STOPPED_MARKER,
    RunLock,
    check_resume,
    check_resume_from_base,
    data_as_recorded,
    first_data_fingerprint,
    resume_settings,
    save_start_config,
    truncate_ledgers,
)
from nemo_topr.training.writer_queue import start_checkpoint_writer_queue


def prepare(run: TrainingRun, lock: RunLock | None = None) -> dict:
    """Resolve what depends on the data (iterations), check the checkpoint to resume from,
    and record the run's inputs.

    Runs on every rank before torch.distributed exists. Only launcher rank 0 writes: it takes the
    run directory's `lock`, repairs an interrupted checkpoint, refuses a filesystem without room
    for one checkpoint (`disk_space.check_room`) and a resume onto other data or settings
    (`run_state.check_resume`), truncates the sample ledger to the checkpoint, and saves this
    start's config, the base model's HF artifacts and the data report, after every check: a
    refused new run leaves no directory. The other ranks cannot read the checkpoint directory
    before that repair is done: they first wait for rank 0 in Bridge's process-group rendezvous
    (bridge/training/setup.py:253 initialize_megatron, whose initialize.py:747-756
    init_process_group + barrier), and checkpoints are read only after it (setup.py:397)."""
    rank_zero = _is_rank_zero()
    if rank_zero:
        taken_over = (lock or RunLock(run.run_dir)).acquire()
        if taken_over:
            print(f"[nemo-topr] {taken_over}", flush=True)
        (run.run_dir / STOPPED_MARKER).unlink(missing_ok=True)  # from an earlier stop of this run
        repaired = ensure_latest_complete(run.container.checkpoint.save)
        if repaired:
            print(f"[nemo-topr] WARNING: {repaired}", flush=True)
        print(f"[nemo-topr] base model: {run.base_model.describe()}", flush=True)
        check_room(Path(run.container.checkpoint.save), one_checkpoint(run))
    else:
        run.container.dataset.report_path = None  # rank 0 reports
    train = run.container.train
    prepared = run.container.dataset.prepare(train.global_batch_size)
    check_baseline(run.objective, set(np.unique(prepared.table.rewards).tolist()),
                   record_baselines=prepared.dataset.record_baselines)
    p_tilde = positive_share_in_use(run.objective, prepared)
    if p_tilde is None:  # every c as the step takes it, asymre's group means and the records' own included
        raise ConfigError(f"dataset: {NO_ADVANTAGE}", key="dataset.no_advantage", where="dataset")
    train.train_iters = prepared.num_rows // train.global_batch_size
    if rank_zero:
        idle = idle_schedule_warning(run.container.scheduler, run.container.optimizer.min_lr, train.train_iters)
        if idle:
            print(f"[nemo-topr] WARNING: {idle}", flush=True)
        resume_iteration = latest_iteration(Path(run.container.checkpoint.save))
        data = data_as_recorded(run.run_dir, prepared.data_fingerprint(),
                                lambda: first_data_fingerprint(prepared.dataset.sequences, prepared.rows))
        fingerprint = {"data": data, "config": resume_settings(run.raw, run.objective, run.base_model)}
        if resume_iteration is None and run.raw.get("resume_from_base"):  # loads the base run's state
            check_resume_from_base(run.base_model, fingerprint, train.train_iters)
        check_resume(run.run_dir, resume_iteration is not None, fingerprint)
        dropped = truncate_ledgers(run.run_dir, resume_iteration or 0)
        if dropped:
            print(f"[nemo-topr] sample ledger: dropped {dropped} entries of iterations after the checkpoint "
                  f"resumed from (iteration {resume_iteration or 0})", flush=True)
        # a rerun of a finished run trains nothing (NothingLeftToTrain): configs/ keeps the starts that trained
        if resume_iteration is None or resume_iteration < train.train_iters:
            save_start_config(run.run_dir, run.raw)
        write_hf_artifacts(run.base_model, Path(run.container.checkpoint.save))
    summary = {**prepared.summary(), "baselines": baseline_in_use(run.objective, prepared.dataset.record_baselines),
               "p_tilde": p_tilde,
               "train_iters": train.train_iters, "global_batch_size": train.global_batch_size}
    give_back_freed_memory()  # the checks above made arrays as long as the data set, freed now
    if rank_zero and run.container.dataset.report_path:
        report = Path(run.container.dataset.report_path)
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(summary, indent=2) + "\n")
    if rank_zero:
        print(f"data report: {json.dumps(summary)}", flush=True)  # the log's copy (`console`)
        for line in data_lines(summary, run.container.dataset.seq_length):
            print(line, flush=True)
    return summary


def baseline_in_use(objective, record_baselines: bool) -> str:
    """What c is in this run, for the data report (`nemo_topr.training.step.baseline_source`)."""
    source = baseline_source(objective.variant, record_baselines)
    delta_v = f" + objective.asymre_delta_v ({objective.asymre_delta_v})" if objective.variant == "asymre" else ""
    if source == "records":
        return f"the records' own baseline field{delta_v}"
    if source == "group_means":
        return f"the whole-group mean reward of the records used{delta_v}"
    return f"objective.baseline ({objective.baseline}) for every record"


def positive_share_in_use(objective, prepared) -> float | None:
    """p~ of the data trained, with each sequence's c as the step takes it: the step's per-batch
    `effective_positive_share` over the whole dataset, on the batch columns the step reads
    (4 decimals; None when every R - c is 0)."""
    from nemo_topr.objective import dataset_positive_share

    columns = prepared.table.columns()
    column = baseline_column(objective.variant, prepared.dataset.record_baselines)
    share = dataset_positive_share(columns["rewards"], objective, None if column is None else columns[column])
    return None if share is None else round(share, 4)


def one_checkpoint(run: TrainingRun) -> tuple[int, str]:
    """(bytes, how they were found) of one checkpoint of `run` (`nemo_topr.training.disk_space`)."""
    container = run.container
    estimate = estimated_checkpoint_bytes(parameter_count(run.base_model.hf_dir), container.model.params_dtype.itemsize,
                                          container.checkpoint.save_optim, container.optimizer.optimizer == "adam")
    return checkpoint_bytes(Path(container.checkpoint.save), estimate)


def check_baseline(objective, rewards: set[float], *, warn: bool = True, record_baselines: bool = False) -> None:
    """A baseline at or beyond the rewards' range is refused: every record's advantage would take
    one sign (with +-1 rewards, c >= 1 pushes the correct answers down). 0/1 grades with c at or
    above 0 are warned of (`nemo_topr.data.positives`) unless not `warn` (`main`'s early call,
    before Megatron's import; `prepare` warns), and where c is not what the records get (asymre's
    group means, the records' own baselines) or negatives are dropped by design (sft_positive).
    Rewards all equal to a scalar c are refused too: nothing would train (`prepare` checks any c)."""
    scalar_baseline = (baseline_source(objective.variant, record_baselines) == "scalar"
                       and objective.variant != "sft_positive")
    if warn and scalar_baseline and (warning := no_negatives_warning(rewards, objective.baseline,
                                                                     objective.negative_rule)):
        print(f"[nemo-topr] WARNING: {warning}", flush=True)
    if baseline_source(objective.variant, record_baselines) == "scalar" and rewards == {objective.baseline}:
        raise ConfigError(f"objective.baseline={objective.baseline}: {NO_ADVANTAGE}",  # before Megatron's import
                          key="objective.baseline.equals_every_reward", where="objective.baseline")
    if problem := sign_flipping_baseline(rewards, objective.baseline):
        raise ConfigError(f"objective.baseline={objective.baseline}: {problem}; choose a baseline between the "
                          f"smallest and the largest reward (baseline_for_share(p, target) computes c for a "
                          "target positive share with +-1 rewards)",
                          key="objective.baseline.flips_signs", where="objective.baseline")


# Exit status of a run stopped early by a signal with a checkpoint saved: EX_TEMPFAIL. 0 means
# the data was trained to the end. Job scripts requeue on the STOPPED marker rather than on the
# status: srun reports 128+9 when --kill-on-bad-exit kills the ranks that had not exited yet.
EXIT_REQUEUE = 75


def resolve_exit_signal(train_config) -> signal.Signals:
    """`train.exit_signal` as a signal; YAML and overrides give its name (SIGUSR1, SIGTERM)."""
    value = train_config.exit_signal
    try:
        exit_signal = signal.Signals[value] if isinstance(value, str) else signal.Signals(value)
    except (KeyError, ValueError):
        raise ConfigError(f"train.exit_signal={value!r} is not a signal name such as SIGUSR1 or SIGTERM",
                          key="train.exit_signal.not_a_signal", where="train.exit_signal") from None
    train_config.exit_signal = exit_signal
    return exit_signal


def train(run: TrainingRun) -> int:
    """Run (or resume) training; returns 0 when done, EXIT_REQUEUE when stopped by the exit signal
    (`train.exit_signal`) after saving a checkpoint."""
    from megatron.bridge.training.callbacks import Callback

    from nemo_topr.training.iteration_line import print_iteration_lines
    from nemo_topr.training.nonfinite import stop_on_non_finite
    from nemo_topr.training.start_ratio import warn_if_far_from_start

    exit_signal = resolve_exit_signal(run.container.train)
    if exit_signal != signal.SIGUSR1:  # held by `nemo-topr train` (cli.py) for Slurm's warning
        release_the_warning()

    held: list[int] = []  # the exit signal, come while this rank prepared (or later: `stopped_by`)

    class ReleaseExitSignal(Callback):
        def on_train_start(self, context) -> None:  # Bridge's handler is installed by now
            bridge_handler = signal.getsignal(exit_signal)
            # noted for the summary, then Bridge's handler (bridge/training/utils/sig_utils.py:129)
            if callable(bridge_handler):
                signal.signal(exit_signal, lambda signum, frame: (held.append(signum), bridge_handler(signum, frame)))
            release_the_warning()  # a SIGUSR1 pending since cli.py goes to it
            if held:  # to Bridge's handler: the rank saves after its first iteration
                os.kill(os.getpid(), exit_signal)

    console = RunConsole()

    class OpenLog(Callback):
        def on_train_start(self, context) -> None:  # the other ranks: rank 0 has made the run directory
            if console.log_path is None:
                console.open_log(run.run_dir, launcher_rank())

    class NothingLeftToTrain(Callback):
        def on_data_init_start(self, context) -> None:  # on every rank, after the checkpoint is loaded
            # A rerun of a finished run: Bridge's sampler would stop every rank with "no samples
            # left to consume" (bridge/data/samplers.py). Stop as a signal-triggered stop does, with a
            # clean SystemExit, caught below.
            step, total = context.state.train_state.step, run.container.train.train_iters
            if step >= total:
                if _is_rank_zero():
                    print(f"[nemo-topr] {run.run_dir} is finished (iteration {step} of {total}): nothing to train",
                          flush=True)
                raise SystemExit(0)

    # A stop that arrives while this rank still loads (Slurm sends its warning at pre-emption time
    # with PreemptParameters=send_user_signal) would kill it: the signal's default action is to
    # terminate. It is kept until training starts, where Bridge's handler gets it. Blocking it here
    # held it in this thread only: torch's threads, started at import, took it and the process died
    # (exit 143). A handler is the process's, whichever thread the signal lands on.
    start_checkpoint_writer_queue(exit_signal)
    previous_handler = signal.signal(exit_signal, lambda signum, frame: held.append(signum))
    ctrl_c: list[int] = []
    previous_sigint = _ctrl_c_as(exit_signal, ctrl_c)
    lines = print_iteration_lines()
    pretrain_log = logging.getLogger("megatron.bridge.training.pretrain")
    pretrain_log.addFilter(_not_a_clean_stop)
    lock = RunLock(run.run_dir)
    with console:
        code = _train_in(run, console, lock, forward_callbacks=lambda forward_step: [
            OpenLog(), ReleaseExitSignal(), NothingLeftToTrain(), stop_on_non_finite(forward_step), lines,
            warn_if_far_from_start(run.objective.weights_use_ratio)],
                         restore=lambda: _restore(exit_signal, previous_sigint, previous_handler, pretrain_log))
        reached, total = _latest_checkpoint_iteration(run), run.container.train.train_iters
        started = lines.started_at
        trained = f"iterations {started + 1}-{reached} of {total}" if started is not None and started < reached else \
            "no iteration"
        trained += (" (the run is complete)" if code == 0 else
                    f"; stopped {_stopped_by(ctrl_c, held, exit_signal)} with a checkpoint saved: rerun the "
                    f"same command to resume")
        checkpoint = f"{run.container.checkpoint.save}/{iteration_dir_name(reached)}" if reached else None
        if _is_rank_zero() or lines.last_metrics:
            for line in summary_lines(trained=f"trained {trained}", metrics=lines.last_metrics,
                                      checkpoint=checkpoint if _is_rank_zero() else None,
                                      log_path=console.log_path, warnings=console.warnings):
                print(line, flush=True)
    return code


def _stopped_by(ctrl_c: list[int], received: list[int], exit_signal: signal.Signals) -> str:
    if ctrl_c:
        return "by Ctrl-C"
    if received:
        return f"by {exit_signal.name}"
    return "at train.exit_interval, train.exit_duration_in_mins or another rank's exit signal"


def _restore(exit_signal, previous_sigint, previous_handler, pretrain_log) -> None:  # noqa: ANN001
    # A stop held while this rank prepared, then an error (a refused resume): the run ends on
    # the error. Delivered after it by the default action, the stop ended the process before the
    # error was printed (exit 143, or 138, which topr_job.sh requeues) and left LOCK. So a
    # SIGUSR1 still pending goes to `held` (released before its handler is put back), and the
    # handlers return in the reverse order of their setting (exit_signal=SIGINT sets both).
    release_the_warning()
    signal.signal(signal.SIGINT, previous_sigint)
    signal.signal(exit_signal, previous_handler)
    pretrain_log.removeFilter(_not_a_clean_stop)


def _train_in(run: TrainingRun, console: RunConsole, lock: RunLock, forward_callbacks, restore) -> int:  # noqa: ANN001
    """`train`'s body inside its console: prepare, the start's lines, Bridge's finetune()."""
    from megatron.bridge.training.finetune import finetune

    from nemo_topr.training.step import ToprForwardStep

    try:
        prepare(run, lock)
        if _is_rank_zero():
            console.open_log(run.run_dir, 0)
            for line in layout_lines(run.container, launcher_world_size(), latest_iteration(
                    Path(run.container.checkpoint.save))):
                print(line, flush=True)
            print(f"[nemo-topr] full log: {console.log_path} (--verbose shows it here)", flush=True)
        forward_step = ToprForwardStep(run.objective, sample_log_dir=run.run_dir)
        if "WORLD_SIZE" not in os.environ:  # a plain single process
            local_rendezvous()
        try:
            finetune(run.container, forward_step, callbacks=forward_callbacks(forward_step))
        # A save the filesystem could not hold names no cause (`disk_space`): the last line says
        # it, below Bridge's logged traceback. torch's CheckpointException is a BaseException.
        except BaseException as error:
            if (not isinstance(error, (SystemExit, KeyboardInterrupt)) and _is_rank_zero()
                    and (hint := failure_hint(Path(run.container.checkpoint.save), one_checkpoint(run)))):
                raise NoRoomError(hint, key="run_dir.no_room_after_failure", where="run_dir") from error
            raise
    except SystemExit as stop:  # Bridge exits this way after a signal-triggered checkpoint
        if not _clean_stop(stop):
            raise
    finally:
        lock.release()
        restore()
    reached = _latest_checkpoint_iteration(run)
    if reached < run.container.train.train_iters:
        message = (f"stopped at iteration {reached} of {run.container.train.train_iters} with a checkpoint "
                   f"saved; rerun the same command to resume (exit {EXIT_REQUEUE})")
        if _is_rank_zero():
            (run.run_dir / STOPPED_MARKER).write_text(message + "\n")
            print(f"[nemo-topr] {message}", flush=True)
        else:
            wait_for_marker(run.run_dir / STOPPED_MARKER)
        return EXIT_REQUEUE
    if _is_rank_zero():
        (run.run_dir / COMPLETED_MARKER).write_text(f"{reached}\n")
    return 0


def wait_for_marker(marker: Path, timeout: float = 120.0) -> bool:
    """Whether rank 0 has left `marker`, waiting up to `timeout` seconds. A rank that exits 75
    first would have srun's --kill-on-bad-exit SIGTERM rank 0 (seen on real Slurm: "task 1: Exited
    with exit code 75", then "task 0: Terminated"), and without the marker the job script reads a
    failure and does not requeue."""
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if time.monotonic() >= deadline:
            print(f"[nemo-topr] {marker} not written by rank 0 within {timeout:.0f} s", file=sys.stderr, flush=True)
            return False
        time.sleep(0.05)
    return True


def _ctrl_c_as(exit_signal: signal.Signals, pressed: list[int]):
    """Ctrl-C (SIGINT) stops like the exit signal: a checkpoint at the next iteration boundary and
    exit 75, not a KeyboardInterrupt traceback that loses the iterations since the last save. A
    second Ctrl-C interrupts at once. Returns the handler it replaces; `pressed` gets SIGINT."""
    def stop_at_next_iteration(signum, frame) -> None:  # noqa: ANN001
        pressed.append(signum)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if _is_rank_zero():
            print("[nemo-topr] Ctrl-C: saving a checkpoint at the next iteration boundary, then stopping "
                  "(Ctrl-C again to abort without one)", file=sys.stderr, flush=True)
        os.kill(os.getpid(), exit_signal)  # pending until Bridge's handler is installed

    if exit_signal == signal.SIGINT:
        return signal.getsignal(signal.SIGINT)
    return signal.signal(signal.SIGINT, stop_at_next_iteration)


def _clean_stop(stop: BaseException) -> bool:
    return isinstance(stop, SystemExit) and stop.code in (0, None)


def _not_a_clean_stop(record: logging.LogRecord) -> bool:
    """Bridge logs every exception leaving pretrain() as "Pretrain failed ... " with a traceback
    (bridge/training/pretrain.py), its own SystemExit(0) after a signal-triggered save included,
    and a second Ctrl-C's KeyboardInterrupt: 38 lines of where it landed, above the one line that
    says it (`nemo-topr train: interrupted`)."""
    stop = record.exc_info[1] if record.exc_info else None
    return not (_clean_stop(stop) or isinstance(stop, KeyboardInterrupt))


def _latest_checkpoint_iteration(run: TrainingRun) -> int:
    return latest_iteration(Path(run.container.checkpoint.save)) or 0


def _is_rank_zero() -> bool:
    return launcher_rank() == 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="nemo-topr train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                    settings=run_settings)
    parser.add_argument("--config-name", default="topr",
                        help="a config in the config dir (tiny_cpu, llama31_8b_bf16), or the path of your own YAML "
                             "file, whose defaults list may name those presets")
    parser.add_argument("--config-path", default=str(CONF_DIR), help="config directory (default: %(default)s)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (OmegaConf dotted keys)")
    args = parser.parse_intermixed_args(argv)  # --config-name before or after the overrides
    # `plan` takes its config as a word, `train` by --config-name: `train tiny_cpu` said only
    # "overrides must be key=value"
    named = [word for word in args.overrides if "=" not in word
             and (word.endswith(".yaml") or (Path(args.config_path) / f"{word}.yaml").is_file())]
    if named:
        parser.error(f"{named[0]} is a config, not a key=value override: choose it with --config-name {named[0]}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # Config and data errors are one message, and come before Megatron's ~25 s of imports
    # (`check_config`, `load_records`) wherever they can: only Bridge's own sections need those.
    raw = compose(args.config_name, args.overrides, args.config_path)
    # the config's `device` (cuda in the GPU presets): CPU only when chosen
    device = select_device(raw.get("device"), where="device", choices=DEVICES)
    values, _, objective = check_config(raw)
    check_batch_division(values, launcher_world_size())
    found = _prepared_set_of(raw)  # a requeued start reads no record: the set holds what is checked here
    if found is None:
        records = _records_of(raw)
        require_scored(records)  # before Megatron's import and before the run directory is made
        rewards = {record.reward for record in records.records}
        record_baselines = any(record.baseline is not None for record in records.records)
    else:
        rewards, record_baselines = set(np.unique(found.table.rewards).tolist()), found.record_baselines
    check_baseline(objective, rewards, warn=False, record_baselines=record_baselines)
    check_rendezvous()
    if device == "cuda":
        check_local_gpu()
    use_device(raw.get("device"), where="device", choices=DEVICES)  # imports Megatron
    run = build_training_run(raw)
    if found is None:
        run.container.dataset.use_records(records)
    else:
        run.container.dataset.use_prepared_set(found)
    return train(run)


def _prepared_set_of(raw):  # noqa: ANN001
    """The prepared set of `dataset:` when one is written already, else None."""
    from nemo_topr.training.prepare import spec_of_config
    from nemo_topr.data.prepared import find_prepared
    from nemo_topr.data.sources import HUB_PREFIX

    if str((raw.get("dataset") or {}).get("train_path") or "").startswith(HUB_PREFIX):
        return None  # read as it streams, never prepared
    try:
        return find_prepared(*spec_of_config(raw))
    except DataError:  # no local files: reading the records says what is wrong with the path
        return None


def _records_of(raw) -> RecordSet:  # noqa: ANN001
    """The validated records of `dataset:` (defaults as in ToprDatasetConfig)."""
    dataset = raw.get("dataset") or {}
    if not dataset.get("train_path"):
        raise ConfigError("dataset.train_path is not set", key="dataset.train_path.unset", where="dataset.train_path")
    options = {name: OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
               for name in SOURCE_OPTIONS if (value := dataset.get(name)) is not None}
    return load_records(dataset.train_path, strict=dataset.get("strict", True), **options)
