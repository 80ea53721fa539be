"""Resume safety for Bridge checkpoint directories.

Bridge 0.6.2 finishes a save by writing, in order, ``iter_N/train_state.pt``, the two "latest"
trackers (``latest_train_state.pt``, ``latest_checkpointed_iteration.txt``) and then
``iter_N/run_config.yaml`` (bridge/training/checkpointing.py:1460-1468). A job killed between
the trackers and the config leaves "latest" pointing at a checkpoint that cannot be loaded.
Before every run we check the latest checkpoint and, if it is incomplete, point the trackers
back at the newest complete one and set the broken directory aside — reported, never silent.
The repair renames and rewrites shared files, so exactly one process of a job runs it (launcher
rank 0, nemo_topr/training/recipe.py:prepare); the trackers are replaced atomically, so a job
killed during the repair itself leaves either the old or the new tracker, never a truncated one.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import yaml

from nemo_topr.utils.outputs import write_whole

TRACKER = "latest_checkpointed_iteration.txt"
TRAIN_STATE_TRACKER = "latest_train_state.pt"


# What Bridge reads from run_config.yaml when it loads a checkpoint
# (bridge/training/checkpointing.py:2749-2803); a file cut short by a kill lacks some of them.
_RUN_CONFIG_KEYS_READ_ON_LOAD = {
    "model": ("tensor_model_parallel_size", "pipeline_model_parallel_size"),
    "checkpoint": ("save_rng", "save_optim", "fully_parallel_save"),
}


def is_complete(iteration_dir: Path) -> bool:
    """A torch_dist checkpoint whose data, train state and run config were all written."""
    config = iteration_dir / "run_config.yaml"
    if not ((iteration_dir / ".metadata").is_file() and (iteration_dir / "train_state.pt").is_file()
            and config.is_file()):
        return False
    try:
        run_config = yaml.safe_load(config.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(run_config, dict) and all(
        isinstance(run_config.get(section), dict) and all(key in run_config[section] for key in keys)
        for section, keys in _RUN_CONFIG_KEYS_READ_ON_LOAD.items())


def iteration_dir_name(iteration: int) -> str:
    """Bridge's name for an iteration's checkpoint directory (also used for its HF exports)."""
    return f"iter_{iteration:07d}"


def latest_iteration(checkpoint_dir: Path) -> int | None:
    """The iteration the "latest" tracker names; None before the first save. A tracker that names
    none (emptied, or Megatron-LM's "release") is a DamagedCheckpointError naming it, not int()'s
    ValueError traceback in every verb that reads the checkpoint."""
    tracker = checkpoint_dir / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text(errors="replace").strip()
    if not text.isdigit():
        raise DamagedCheckpointError(
            f"{tracker} names no iteration ({text[:40]!r}), where the last complete save writes its number; saved "
            f"iterations: {saved_iterations(Path(checkpoint_dir))}: write the one to load there (or give "
            "RUN@ITERATION, or DIR/iter_NNNNNNN)")
    return int(text)


def _iteration_dirs(checkpoint_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for path in checkpoint_dir.glob("iter_*"):
        suffix = path.name.removeprefix("iter_")
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    return sorted(found)


def saved_iterations(checkpoint_dir: Path) -> list[int]:
    """Iterations with a checkpoint directory, ascending."""
    return [iteration for iteration, _ in _iteration_dirs(checkpoint_dir)]


def ensure_latest_complete(checkpoint_dir: str | Path) -> str | None:
    """Make the trackers name the newest complete checkpoint, and set aside the saves cut short
    before the trackers named them. Returns a message when something was repaired, None when the
    directory was already consistent (or holds no checkpoint)."""
    checkpoint_dir = Path(checkpoint_dir)
    tracker = checkpoint_dir / TRACKER
    latest = latest_iteration(checkpoint_dir)  # an emptied tracker read as 0 restarted from the pretrained model
    cut_short = set_aside_unrecorded_saves(checkpoint_dir, latest)
    if latest is None:
        return cut_short
    latest_dir = checkpoint_dir / iteration_dir_name(latest)
    if is_complete(latest_dir):
        _check_intact(checkpoint_dir, latest, latest_dir)
        return cut_short
    complete = [(it, path) for it, path in _iteration_dirs(checkpoint_dir) if it < latest and is_complete(path)]
    set_aside = _set_aside(latest_dir).name if latest_dir.exists() else None
    earlier = f"{cut_short}; " if cut_short else ""
    if not complete:
        tracker.unlink()
        (checkpoint_dir / TRAIN_STATE_TRACKER).unlink(missing_ok=True)
        return (f"{earlier}checkpoint iter {latest} was incomplete and no earlier one exists: starting from the "
                "pretrained model")
    iteration, path = complete[-1]
    write_whole(checkpoint_dir / TRAIN_STATE_TRACKER, (path / "train_state.pt").read_bytes())
    write_whole(tracker, str(iteration).encode())
    return (f"{earlier}checkpoint iter {latest} was incomplete (set aside as {set_aside}); resuming from iter "
            f"{iteration}")


def set_aside_unrecorded_saves(checkpoint_dir: Path, latest: int | None) -> str | None:
    """Rename to ITER.incomplete each unfinished iteration directory other than the trackers'
    `latest` (repaired by `ensure_latest_complete`): a save stopped before its trackers were written
    (a second Ctrl-C, a kill), at an iteration no later save of the run reaches again, stayed beside
    the complete ones for good, and `export --all-iterations` refused the whole run over it."""
    cut_short = [path for iteration, path in _iteration_dirs(checkpoint_dir)
                 if iteration != latest and not is_complete(path)]
    if not cut_short:
        return None
    names = ", ".join(_set_aside(path).name for path in cut_short)
    what = "saves cut short before they were" if len(cut_short) > 1 else "a save cut short before it was"
    return f"{what} recorded, set aside as {names}"


def _set_aside(iteration_dir: Path) -> Path:
    """Rename an unfinished save to ITER.incomplete (ITER.incomplete.N where that exists): kept for a
    look, never read as a checkpoint."""
    target, number = iteration_dir.with_name(iteration_dir.name + ".incomplete"), 1
    while target.exists():
        target, number = iteration_dir.with_name(f"{iteration_dir.name}.incomplete.{number}"), number + 1
    return iteration_dir.rename(target)


class DamagedCheckpointError(RuntimeError):
    """The latest checkpoint was saved whole but a file of it was cut short since."""


def truncated_files(iteration_dir: Path) -> list[str]:
    """Files of a torch_dist checkpoint shorter than its ``.metadata`` says (a full disk, an
    interrupted copy), as "path (N of M bytes)"; the ``.metadata`` itself when it cannot be read.
    Megatron's loader reports these as a bare ``CheckpointException ... EOFError``."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(iteration_dir)).read_metadata()
    except (EOFError, pickle.UnpicklingError, OSError) as error:
        return [f"{iteration_dir / '.metadata'} ({type(error).__name__}: {error})"]
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    short = []
    for name, size in sorted(needed.items()):
        path = iteration_dir / name
        actual = path.stat().st_size if path.is_file() else 0
        if actual < size:
            short.append(f"{path} ({actual} of {size} bytes)")
    return short


def _check_intact(checkpoint_dir: Path, latest: int, latest_dir: Path) -> None:
    """Raise DamagedCheckpointError naming the cut-short files of the latest checkpoint and the
    newest intact earlier one. Not repaired automatically: unlike a save interrupted by a kill
    (set aside above), this checkpoint was whole once, and only the user knows whether a copy
    of it exists."""
    damaged = truncated_files(latest_dir)
    if not damaged:
        return
    intact = [it for it, path in _iteration_dirs(checkpoint_dir)
              if it < latest and is_complete(path) and not truncated_files(path)]
    aside = f"mv {latest_dir} {latest_dir}.damaged"
    fix = (f"the newest intact checkpoint is iter {intact[-1]}: restore the file(s) from a copy, or set iter {latest} "
           f"aside ({aside}) and rerun to resume from iter {intact[-1]}" if intact else
           f"no earlier intact checkpoint exists: restore the file(s) from a copy, or set iter {latest} aside "
           f"({aside}) and rerun to start again from the base model")
    raise DamagedCheckpointError(f"checkpoint iter {latest} is damaged, cut short: {'; '.join(damaged)}. Its "
                                 f"iteration cannot be resumed; {fix}")
