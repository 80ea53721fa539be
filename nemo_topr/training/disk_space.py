"""Room for one more checkpoint in the run directory.

A save that the filesystem cannot hold fails deep in PyTorch's checkpoint writer, with no word
of space: on a full 7 MB tmpfs, "[enforce fail at inline_container.cc:664] unexpected pos 704 vs
598", then "Worker failure: An error is caught while starting worker 0" on every rank, after the
iterations since the last save were trained. So `nemo-topr train` refuses to start where one
checkpoint cannot fit (`check_room`), and after a failed run says when the filesystem is the
likely cause (`failure_hint`).

One checkpoint's size: the newest saved iteration's when the run has one (measured), else
parameters x bytes per parameter: the weights in their dtype, and with the optimizer state
(checkpoint.save_optim) fp32 master weights where the weights are not fp32, plus Adam's two fp32
moments. The tiny CPU model's iterations measure 12.7 B per parameter against 12 estimated (fp32
weights and Adam): an estimate short by the metadata, so that a refusal is never a false alarm.
Quotas are not seen: only the filesystem's free space.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from nemo_topr.errors import UserError
from nemo_topr.utils.outputs import nearest_existing
from nemo_topr.training.checkpoints import is_complete, iteration_dir_name, saved_iterations
from nemo_topr.training.run_state import RunStateError


def checkpoint_bytes(checkpoint_root: Path, estimate: int) -> tuple[int, str]:
    """(bytes, how they were found) of one checkpoint of this run: its newest complete
    iteration's size, else `estimate`."""
    saved = _complete_iterations(checkpoint_root)
    if not saved:
        return estimate, "estimated from the parameter count"
    newest = checkpoint_root / iteration_dir_name(saved[-1])
    size = sum(path.stat().st_size for path in newest.rglob("*") if path.is_file())
    return size, f"the size of iteration {saved[-1]}"


def estimated_checkpoint_bytes(parameters: int, weight_bytes: int, optimizer_state: bool, adam: bool = True) -> int:
    """Weights in their dtype; with the optimizer state, fp32 master weights unless the weights
    are fp32, and Adam's two fp32 moments (one for another optimizer's momentum)."""
    per_parameter = weight_bytes
    if optimizer_state:
        per_parameter += (0 if weight_bytes == 4 else 4) + (8 if adam else 4)
    return parameters * per_parameter


def free_bytes(path: Path) -> int:
    """Free space of the filesystem that `path` is, or will be made, on."""
    return shutil.disk_usage(nearest_existing(path)).free


def check_room(checkpoint_root: Path, needed: tuple[int, str]) -> None:
    """Refuse a start whose run directory cannot hold one more checkpoint."""
    size, how = needed
    free = free_bytes(checkpoint_root)
    if free < size:
        raise RunStateError(
            f"{checkpoint_root}: {size_text(free)} free, and one checkpoint of this run takes {size_text(size)} "
            f"({how}): its first save would fail, after the iterations before it. Free space there, or choose a "
            "run_dir on another filesystem", key="run_dir.no_room_for_checkpoint", where="run_dir")


class NoRoomError(UserError):
    """A run that failed where the filesystem can no longer hold one checkpoint: a save most likely failed for space."""


def failure_hint(checkpoint_root: Path, needed: tuple[int, str]) -> str | None:
    """After a failed run: a line when the filesystem can no longer hold one checkpoint."""
    size, how = needed
    free = free_bytes(checkpoint_root)
    if free >= size:
        return None
    saved = _complete_iterations(checkpoint_root)
    resume = f"iteration {saved[-1]}, the newest complete checkpoint" if saved else "the start"
    return (f"{checkpoint_root}: {size_text(free)} free, less than one checkpoint ({size_text(size)}, {how}): a "
            f"save most likely failed for space. Free space there, then run the same command again: it resumes "
            f"from {resume}")


def parameter_count(hf_dir: Path) -> int:
    """Parameters of the model whose Hugging Face config.json is in `hf_dir` (Llama family, as
    `nemo-topr plan` counts them)."""
    from nemo_topr.model.architecture import architecture_from_hf_config

    return architecture_from_hf_config(hf_dir / "config.json", hf_dir.name).total_params


def _complete_iterations(checkpoint_root: Path) -> list[int]:
    if not checkpoint_root.is_dir():
        return []
    return [i for i in saved_iterations(checkpoint_root) if is_complete(checkpoint_root / iteration_dir_name(i))]


def size_text(size: int) -> str:
    """A size in MiB, GiB from 1 GiB on, TiB from 1 TiB on."""
    if size >= 2**40:
        return f"{size / 2**40:,.2f} TiB"
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
