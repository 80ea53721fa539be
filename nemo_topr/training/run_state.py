"""What a run directory keeps about the starts of its run, so that a resume is the same run.

- `RunLock`: one training per run directory; RUN_DIR/LOCK names the holder's host and pid. A
  lock left by a process that died on this host is stale and taken over (reported); one held
  from another host cannot be checked from here and refuses, naming the file to remove.
- `check_resume`: RUN_DIR/fingerprint.json holds a hash of the trained data, the config keys
  that decide the sample order and the schedule, the objective and the base model the run began
  from; a resume where any of them differs is refused, naming what changed (Megatron would
  otherwise resume onto other rows silently, or fail in its scheduler's "do not match" assertion;
  a changed objective or base model would be trained, or ignored, without a word).
- `check_queued_start`: the same comparison of settings for a job before it queues
  (`nemo-topr submit`), and a finished run refused, so that neither waits in the queue to fail.
- `save_start_config`: RUN_DIR/configs/start_NNN.yaml, one per accepted start, and
  RUN_DIR/config.yaml, the latest accepted one; written only after the checks above, so a refused
  start leaves them describing the configs that did train.
- `truncate_ledgers`: the sample ledger loses the iterations that the checkpoint it resumes from
  did not keep, so that after any resume it equals the uninterrupted run's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import struct
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nemo_topr.errors import UserError
from nemo_topr.utils.outputs import folders_to_make, remove_if_empty, write_whole
from nemo_topr.training.checkpoints import DamagedCheckpointError, latest_iteration

LOCK_FILE = "LOCK"
FINGERPRINT_FILE = "fingerprint.json"
START_CONFIGS_DIR = "configs"
LEDGER_GLOB = "samples_dp*.jsonl"
COMPLETED_MARKER = "COMPLETED"  # left by `nemo-topr train` when the data is trained to the end
STOPPED_MARKER = "STOPPED"  # left by a stop at the exit signal, for the job script
# What a start of `nemo-topr train` writes into RUN_DIR, besides the LOCK it takes first and the ledgers
RUN_DIR_ENTRIES = ("config.yaml", START_CONFIGS_DIR, "checkpoints", "tensorboard", "data_report.json",
                   COMPLETED_MARKER, STOPPED_MARKER)

# The keys that decide which rows an iteration trains on and at what learning rate: a resume
# with any of them changed would not continue the run it resumes.
ORDER_AND_SCHEDULE_KEYS = (
    "dataset.shuffle_seed", "dataset.epochs", "dataset.packed", "dataset.shared_prefix", "dataset.seq_length",
    "train.global_batch_size", "rng.seed",
    "optimizer.lr", "optimizer.min_lr",
    "scheduler.lr_decay_style", "scheduler.lr_decay_iters", "scheduler.lr_warmup_iters",
    "scheduler.lr_warmup_fraction", "scheduler.lr_warmup_init", "scheduler.lr_wsd_decay_style",
    "scheduler.lr_wsd_decay_iters",
)
# The optimizer's own settings, which its saved state carries: torch restores Adam's betas and eps
# with the state (a resume with optimizer.adam_beta2 changed trained with the old value, while the
# new one was written into config.yaml), and Megatron's scheduler compares the weight decay with
# the checkpoint's.
OPTIMIZER_STATE_KEYS = (
    "optimizer.adam_beta1", "optimizer.adam_beta2", "optimizer.adam_eps", "optimizer.weight_decay",
    "scheduler.start_weight_decay", "scheduler.end_weight_decay", "scheduler.weight_decay_incr_style",
)
RESUME_KEYS = (*ORDER_AND_SCHEDULE_KEYS, *OPTIMIZER_STATE_KEYS)
# What the ConfigContainer holds for a key of these that a config leaves unset (None in the
# record), where that is one fixed value (`config.default_container`: Megatron's OptimizerConfig,
# Bridge's SchedulerConfig): a resume that writes it out, or drops it, changes nothing.
UNSET_MEANS = {"optimizer.adam_beta1": 0.9, "optimizer.adam_beta2": 0.999, "optimizer.adam_eps": 1e-08,
               "scheduler.lr_warmup_init": 0.0, "scheduler.lr_wsd_decay_style": "exponential",
               "scheduler.weight_decay_incr_style": "constant"}


class RunStateError(UserError, RuntimeError):
    """A start that the run directory refuses: another training holds it, or it is not the same run."""


class RunLock:
    """RUN_DIR/LOCK held from `acquire` to `release` by this process (launcher rank 0)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.held = False
        self.made: list[Path] = []  # the folders acquire made, the run directory first

    def acquire(self) -> str | None:
        """Take the lock; returns a message when a stale lock was taken over."""
        self.made = folders_to_make(self.path.parent)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mine = {"host": socket.gethostname(), "pid": os.getpid()}
        replaced = None
        while True:
            try:
                with self.path.open("x") as lock:
                    lock.write(json.dumps(mine) + "\n")
                self.held = True
                return replaced
            except FileExistsError:
                holder = _read_holder(self.path)
                if holder == mine:  # this process's own start before (a process trains one run at a time)
                    self.path.unlink()
                    continue
                if holder and holder.get("host") == mine["host"] and not _pid_alive(holder.get("pid")):
                    self.path.unlink(missing_ok=True)
                    replaced = f"took over {self.path}: its process {holder['pid']} on {holder['host']} is gone"
                    continue
                if holder is None:  # being written by the holder this instant
                    raise RunStateError(f"{self.path} exists but names no process; another training may be "
                                        f"starting in this run directory (remove the file if none is)",
                                        key="run_dir.lock.names_no_process", where="run_dir")
                where = "this host" if holder.get("host") == mine["host"] else f"host {holder.get('host')}"
                raise RunStateError(
                    f"another training holds {self.path.parent}: pid {holder.get('pid')} on {where}. "
                    f"Wait for it, stop it, or use another run_dir"
                    + ("" if holder.get("host") == mine["host"] else
                       f" (if that process is gone, remove {self.path})"),
                    key="run_dir.lock.held", where="run_dir")

    def release(self) -> None:
        """Remove the lock, and the folders acquire made where nothing else was written in them:
        a start refused before it wrote anything (no room for a checkpoint, say) leaves no
        empty run directory behind."""
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
            remove_if_empty(self.made)


def _read_holder(path: Path) -> dict | None:
    try:
        holder = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return holder if isinstance(holder, dict) else None


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def data_fingerprint(table_digest: str, rows_digest: str) -> str:
    """The data part of the fingerprint: sha256 over the digest of every trained sequence (tokens,
    prompt length, reward, behaviour log-prob, baseline, prompt and sample id:
    `SequenceTable.digest`, computed once when a set is prepared) and of the row order of all
    epochs (`sequence_table.rows_digest`)."""
    return hashlib.sha256(f"nemo-topr data 2:{table_digest}:{rows_digest}".encode()).hexdigest()


def data_as_recorded(run_dir: Path, data: str, first_form) -> str:  # noqa: ANN001
    """`data`, or the run's recorded data hash where that is this data's in the first form
    (`first_data_fingerprint`, computed by `first_form()` only then), which fingerprint.json of
    a run begun by nemo-topr releases before the prepared data format holds."""
    path = Path(run_dir) / FINGERPRINT_FILE
    recorded = json.loads(path.read_text()).get("data") if path.is_file() else None
    return recorded if recorded not in (None, data) and recorded == first_form() else data


def first_data_fingerprint(sequences, rows) -> str:  # noqa: ANN001
    """sha256 over every trained sequence (tokens, mask, reward, behaviour log-prob, baseline,
    prompt and sample id) and the row order of all epochs, one sequence at a time."""
    digest = hashlib.sha256()
    for seq in sequences:
        digest.update(struct.pack("<qqddd", seq.sample_id, seq.prompt_id, seq.reward, seq.behavior_logprob,
                                  seq.baseline))
        digest.update(struct.pack(f"<{len(seq.input_ids)}q", *seq.input_ids))
        digest.update(bytes(seq.loss_mask))
    digest.update(json.dumps([list(row) for row in rows]).encode())
    return digest.hexdigest()


def resume_settings(raw: DictConfig, objective: Any, base_model: Any) -> dict[str, Any]:
    """What a resume must keep besides the data: the values of `ORDER_AND_SCHEDULE_KEYS` and
    `OPTIMIZER_STATE_KEYS` in the composed config (None when unset), every field of the objective
    (a dataclass; its defaults included, so that a default written out is no change) and
    `base_model`, as the directory it loaded (a run's iteration). A resume reads only the run's own
    checkpoints, so a changed base model would be ignored silently."""
    settings = {key: OmegaConf.select(raw, key, default=None) for key in RESUME_KEYS}
    settings |= {f"objective.{key}": value for key, value in dataclasses.asdict(objective).items()}
    settings["base_model"] = str(base_model.checkpoint or base_model.path)
    return settings


def check_resume(run_dir: Path, resuming: bool, fingerprint: dict[str, Any]) -> None:
    """Record `fingerprint` ({"data": hash, "config": {key: value}}) on the run's first start;
    on a resume, refuse one whose data or settings (`resume_settings`) differ from the recorded
    ones. A key the record lacks (a run directory from before it was recorded) is not compared."""
    path = Path(run_dir) / FINGERPRINT_FILE
    if not resuming or not path.is_file():
        # a run directory from before fingerprints, or one whose first start never checkpointed
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fingerprint, indent=2, sort_keys=True) + "\n")
        return
    recorded = json.loads(path.read_text())
    if changes := _changes(recorded["data"], recorded["config"], fingerprint):
        raise _not_the_same_run(run_dir, recorded["config"], fingerprint["config"], changes)


def check_resume_from_base(base_model: Any, fingerprint: dict[str, Any], train_iters: int) -> None:
    """`resume_from_base=true` continues the base run's iteration count, schedule and consumed
    samples, which count rows of the data it trained on. On data of another length Megatron's
    scheduler asserted; on other data of the same length the first rows were skipped untrained;
    from a finished base, nothing was trained and the start exited for a requeue, again and again.
    The base run's fingerprint.json (RUN/checkpoints/iter_N -> RUN) shows its data and keys."""
    root = base_model.checkpoint.parent.parent
    what = (f"resume_from_base=true continues the iteration count, schedule and consumed samples of "
            f"{base_model.describe()}")
    fresh = "drop resume_from_base to train from its weights (a fresh optimizer and count)"
    if not (root / FINGERPRINT_FILE).is_file():
        raise RunStateError(f"{what}; {root} has no {FINGERPRINT_FILE} to show the data they count: {fresh}",
                            key="resume_from_base.no_fingerprint", where="resume_from_base")
    recorded = json.loads((root / FINGERPRINT_FILE).read_text())
    kept = {key: value for key, value in recorded["config"].items() if key in RESUME_KEYS}
    if changes := _changes(recorded["data"], kept, fingerprint):
        raise RunStateError(f"{what}, which count the data and order it trained on; this run's differ. Changed: "
                            f"{'; '.join(changes)}. To train on this data, {fresh}",
                            key="resume_from_base.data_or_settings_changed", where="resume_from_base")
    if base_model.iteration >= train_iters:
        raise RunStateError(f"{what}: it is at iteration {base_model.iteration}, the end of this data's "
                            f"{train_iters} iterations, so nothing is left to continue; {fresh}",
                            key="resume_from_base.base_finished", where="resume_from_base")


def check_queued_start(run_dir: Path, settings: dict[str, Any]) -> int | None:
    """What a job queued for RUN_DIR will find when it starts (`nemo-topr submit`, before the
    queue wait): None for a new run, else the iteration it resumes from. Refuses a finished run,
    where the job would train nothing, and settings that differ from the recorded ones, as
    `check_resume` would at the start (the data, which needs the tokenizer, is compared there)."""
    run_dir = Path(run_dir)
    try:
        resume_iteration = latest_iteration(run_dir / "checkpoints")
    except DamagedCheckpointError as error:
        raise RunStateError(f"run_dir={run_dir}: {error}", key="run_dir.checkpoints.damaged", where="run_dir") from None
    if resume_iteration is None:
        return None
    if (run_dir / COMPLETED_MARKER).is_file():
        raise RunStateError(f"run_dir={run_dir} holds a finished run (its {COMPLETED_MARKER} marker; latest checkpoint "
                            f"at iteration {resume_iteration}): a job there would train nothing. Choose another "
                            f"run_dir, with base_model={run_dir} to start from it",
                            key="run_dir.finished", where="run_dir")
    path = run_dir / FINGERPRINT_FILE
    if path.is_file():
        recorded = json.loads(path.read_text())["config"]
        if changes := _setting_changes(recorded, settings):
            raise _not_the_same_run(run_dir, recorded, settings, changes)
    return resume_iteration


def _changes(data_before: str, settings_before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs from a recorded fingerprint: the data first, then each recorded setting."""
    data = [] if data_before == now["data"] else ["the training data (records, their order, tokens or rewards)"]
    return data + _setting_changes(settings_before, now["config"])


def _setting_changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    def meant(key: str, value: Any) -> Any:
        return UNSET_MEANS.get(key) if value is None else value

    return [f"{key}: {before[key]!r} -> {value!r}"
            for key, value in now.items() if key in before and meant(key, before[key]) != meant(key, value)]


def _not_the_same_run(run_dir: Path, before: dict[str, Any], now: dict[str, Any], changes: list[str]) -> RunStateError:
    base_model = now.get("base_model")
    if "base_model" in before and base_model is not None and before["base_model"] != base_model:
        return RunStateError(
            f"{run_dir} holds checkpoints of a run that began from {before['base_model']}; a resume continues "
            f"from those checkpoints and never reads base_model, so {base_model} would not be trained. "
            f"Changed: {'; '.join(changes)}. To train from {base_model}, choose another run_dir; to resume "
            f"this run, restore base_model={before['base_model']}",
            key="run_dir.base_model_changed", where="base_model")
    return RunStateError(
        f"{run_dir} holds checkpoints of a run with other data or settings; a resume would not continue "
        f"it. Changed: {'; '.join(changes)}. Either restore them, or start a new run: another run_dir "
        f"with base_model={run_dir} (weights only, fresh optimizer and schedule); with the same data and order, "
        f"also resume_from_base=true continues its optimizer state and iteration count",
        key="run_dir.data_or_settings_changed", where="run_dir")


def entries_of_others(run_dir: Path) -> list[str]:
    """Names in `run_dir` that a start of `nemo-topr train` writes, where no start wrote them (a
    start leaves configs/start_NNN.yaml, and fingerprint.json just before): a user's own
    config.yaml beside the runs it defines, say, which the start would replace."""
    if (run_dir / FINGERPRINT_FILE).is_file() or any((run_dir / START_CONFIGS_DIR).glob("start_*.yaml")):
        return []
    return ([name for name in RUN_DIR_ENTRIES if (run_dir / name).exists()]
            + sorted(path.name for path in run_dir.glob(LEDGER_GLOB)))


def save_start_config(run_dir: Path, raw: DictConfig) -> Path:
    """Save the composed config of this accepted start as RUN_DIR/configs/start_NNN.yaml and
    RUN_DIR/config.yaml (what identifies a run directory: `nemo_topr.model.source`)."""
    directory = Path(run_dir) / START_CONFIGS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    number = len(list(directory.glob("start_*.yaml"))) + 1
    path = directory / f"start_{number:03d}.yaml"
    OmegaConf.save(raw, path)
    OmegaConf.save(raw, Path(run_dir) / "config.yaml")
    return path


def truncate_ledgers(run_dir: Path, resume_iteration: int) -> int:
    """Drop ledger lines of iterations >= `resume_iteration` (the checkpoint's; 0 when starting
    over) and a partial last line. Returns the number of lines dropped."""
    dropped = 0
    for ledger in Path(run_dir).glob(LEDGER_GLOB):
        kept = []
        lines = ledger.read_text().splitlines(keepends=True)
        for line in lines:
            try:
                complete = line.endswith("\n") and json.loads(line)["iteration"] < resume_iteration
            except (json.JSONDecodeError, KeyError, TypeError):
                complete = False
            if complete:
                kept.append(line)
        if len(kept) < len(lines):  # else left as it is, modification time included
            dropped += len(lines) - len(kept)
            write_whole(ledger, "".join(kept).encode())
    return dropped
