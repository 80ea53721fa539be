"""Room for one more checkpoint (`nemo_topr.training.disk_space`): the estimate against hand
counts, the measured size of a saved iteration, and the messages of a filesystem too full."""

from __future__ import annotations

import os
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from nemo_topr.training import disk_space
from nemo_topr.training.run_state import RunStateError

Usage = namedtuple("Usage", "total used free")


def test_the_estimate_counts_weights_master_copy_and_adam_moments():
    # Llama 3.1 8B in bf16 with Adam: 2 (weights) + 4 (fp32 master) + 4 + 4 (moments) = 14 B
    assert disk_space.estimated_checkpoint_bytes(8_030_261_248, 2, True) == 8_030_261_248 * 14
    # fp32 weights are their own master copy: 4 + 8
    assert disk_space.estimated_checkpoint_bytes(1000, 4, True) == 12_000
    # without the optimizer state, the weights alone; another optimizer keeps one moment
    assert disk_space.estimated_checkpoint_bytes(1000, 2, False) == 2000
    assert disk_space.estimated_checkpoint_bytes(1000, 2, True, adam=False) == 10_000


def _iteration(root: Path, iteration: int, complete: bool = True, payload: int = 1000) -> Path:
    """An iteration directory with the files `checkpoints.is_complete` looks for (or not)."""
    path = root / f"iter_{iteration:07d}"
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"x" * payload)
    if complete:
        (path / ".metadata").write_bytes(b"m" * 10)
        (path / "train_state.pt").write_bytes(b"t" * 5)
        (path / "run_config.yaml").write_text(  # the keys Bridge reads on load
            "model:\n  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n"
            "checkpoint:\n  save_rng: true\n  save_optim: true\n  fully_parallel_save: false\n")
    return path


def test_a_runs_checkpoint_size_is_its_newest_complete_iteration_measured(tmp_path):
    assert disk_space.checkpoint_bytes(tmp_path / "none", 123) == (123, "estimated from the parameter count")
    newest = _iteration(tmp_path, 4, payload=5000)
    _iteration(tmp_path, 2, payload=100)
    _iteration(tmp_path, 6, complete=False, payload=50)  # a save cut short is no measure
    expected = sum(os.path.getsize(os.path.join(newest, name)) for name in os.listdir(newest))
    assert disk_space.checkpoint_bytes(tmp_path, 123) == (expected, "the size of iteration 4")


def test_a_start_is_refused_and_a_failure_explained_where_one_checkpoint_does_not_fit(tmp_path, monkeypatch):
    _iteration(tmp_path, 2)
    free = {"bytes": 3 * 2**20}
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(0, 0, free["bytes"]))
    disk_space.check_room(tmp_path, (3 * 2**20, "the size of iteration 2"))  # exactly enough
    assert disk_space.failure_hint(tmp_path, (3 * 2**20, "the size of iteration 2")) is None
    free["bytes"] = 2**20
    with pytest.raises(RunStateError) as refused:
        disk_space.check_room(tmp_path, (3 * 2**20, "the size of iteration 2"))
    assert refused.value.key == "run_dir.no_room_for_checkpoint"
    assert disk_space.failure_hint(tmp_path, (3 * 2**20, "the size of iteration 2")) == (
        f"{tmp_path}: 1.0 MiB free, less than one checkpoint (3.0 MiB, the size of iteration 2): a save most likely "
        "failed for space. Free space there, then run the same command again: it resumes from iteration 2, the "
        "newest complete checkpoint")


def test_free_space_is_read_where_the_directory_will_be_made(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(shutil, "disk_usage", lambda path: asked.append(Path(path)) or Usage(0, 0, 1))
    disk_space.free_bytes(tmp_path / "run" / "checkpoints")
    assert asked == [tmp_path]
