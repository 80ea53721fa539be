"""How a Bridge checkpoint directory is laid out, read without loading it.

A checkpoint directory holds ``iter_NNNNNNN/`` directories (torch_dist data, ``.metadata``,
``train_state.pt``, ``run_config.yaml``) and the "latest" tracker naming the iteration to resume.
The model sources (`nemo_topr.model.source`) read it to find what to load; training's resume
repair (`nemo_topr.training.checkpoints`) reads it to decide what to repair.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import yaml

from nemo_topr.errors import UserError

TRACKER = "latest_checkpointed_iteration.txt"

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
            "RUN@ITERATION, or DIR/iter_NNNNNNN)", key="checkpoint.tracker.names_no_iteration", where=str(tracker))
    return int(text)


def iteration_dirs(checkpoint_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for path in checkpoint_dir.glob("iter_*"):
        suffix = path.name.removeprefix("iter_")
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    return sorted(found)


def saved_iterations(checkpoint_dir: Path) -> list[int]:
    """Iterations with a checkpoint directory, ascending."""
    return [iteration for iteration, _ in iteration_dirs(checkpoint_dir)]


class DamagedCheckpointError(UserError, RuntimeError):
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
