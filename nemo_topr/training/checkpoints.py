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

from pathlib import Path

# the layout's names are training's too (disk_space, run_state, recipe, export read them from here)
from nemo_topr.model.checkpoint_layout import (
    TRACKER, DamagedCheckpointError, is_complete, iteration_dir_name, iteration_dirs, latest_iteration,
    saved_iterations, truncated_files,
)
from nemo_topr.utils.outputs import write_whole

TRAIN_STATE_TRACKER = "latest_train_state.pt"


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
    complete = [(it, path) for it, path in iteration_dirs(checkpoint_dir) if it < latest and is_complete(path)]
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
    cut_short = [path for iteration, path in iteration_dirs(checkpoint_dir)
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


def _check_intact(checkpoint_dir: Path, latest: int, latest_dir: Path) -> None:
    """Raise DamagedCheckpointError naming the cut-short files of the latest checkpoint and the
    newest intact earlier one. Not repaired automatically: unlike a save interrupted by a kill
    (set aside above), this checkpoint was whole once, and only the user knows whether a copy
    of it exists."""
    damaged = truncated_files(latest_dir)
    if not damaged:
        return
    intact = [it for it, path in iteration_dirs(checkpoint_dir)
              if it < latest and is_complete(path) and not truncated_files(path)]
    aside = f"mv {latest_dir} {latest_dir}.damaged"
    fix = (f"the newest intact checkpoint is iter {intact[-1]}: restore the file(s) from a copy, or set iter {latest} "
           f"aside ({aside}) and rerun to resume from iter {intact[-1]}" if intact else
           f"no earlier intact checkpoint exists: restore the file(s) from a copy, or set iter {latest} aside "
           f"({aside}) and rerun to start again from the base model")
    raise DamagedCheckpointError(f"checkpoint iter {latest} is damaged, cut short: {'; '.join(damaged)}. Its "
                                 f"iteration cannot be resumed; {fix}", key="checkpoint.latest.cut_short",
                                 where=str(latest_dir))
