"""Checkpoint repair with several earlier checkpoints: the trackers go back to the newest complete
one, never an older one, and an iteration without train_state.pt is not complete."""

import pytest
import torch

from nemo_topr.training.checkpoints import ensure_latest_complete, is_complete
from tests.training.test_checkpoints import _checkpoint, _point_latest


@pytest.mark.guards_resume
def test_repair_resumes_from_the_newest_complete_of_several(tmp_path):
    for iteration in (2, 4, 6):
        _checkpoint(tmp_path, iteration)
    _checkpoint(tmp_path, 8, config="")  # killed before run_config.yaml
    _point_latest(tmp_path, 8)
    message = ensure_latest_complete(tmp_path)
    assert message.endswith("resuming from iter 6"), message
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "6"
    assert torch.load(tmp_path / "latest_train_state.pt") == {"step": 6}
    assert all(is_complete(tmp_path / f"iter_{it:07d}") for it in (2, 4, 6))  # the earlier ones untouched


@pytest.mark.guards_resume
def test_an_iteration_without_train_state_is_not_complete(tmp_path):
    for iteration in (2, 4, 6):
        _checkpoint(tmp_path, iteration)
    (tmp_path / "iter_0000006" / "train_state.pt").unlink()  # data and config, but no train state
    assert not is_complete(tmp_path / "iter_0000006")
    _checkpoint(tmp_path, 8, config="")
    _point_latest(tmp_path, 8)
    assert ensure_latest_complete(tmp_path).endswith("resuming from iter 4")
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "4"
    assert torch.load(tmp_path / "latest_train_state.pt") == {"step": 4}


def test_latest_without_train_state_is_repaired(tmp_path):
    _checkpoint(tmp_path, 3)
    (_checkpoint(tmp_path, 5) / "train_state.pt").unlink()
    _point_latest(tmp_path, 5)
    assert ensure_latest_complete(tmp_path).endswith("resuming from iter 3")
    assert (tmp_path / "iter_0000005.incomplete").is_dir()


def test_saves_cut_short_before_they_were_recorded_are_set_aside(tmp_path):
    """A second Ctrl-C stopped a save at iteration 4 before its trackers were written; the rerun
    started over and saved 5 and 10, but iter_0000004 stayed for good, and `export
    --all-iterations` refused the whole run over it. Each start's repair now sets such a save aside,
    whether or not the trackers name a checkpoint yet, and never a complete one."""
    (tmp_path / "iter_0000004").mkdir()
    (tmp_path / "iter_0000004" / "__0_0.distcp").write_bytes(b"partial")
    assert ensure_latest_complete(tmp_path) == ("a save cut short before it was recorded, set aside as "
                                                "iter_0000004.incomplete")
    for iteration in (5, 10):
        _checkpoint(tmp_path, iteration)
    _point_latest(tmp_path, 10)
    (tmp_path / "iter_0000004").mkdir()  # cut short once more, below a recorded checkpoint this time
    (_checkpoint(tmp_path, 12) / "train_state.pt").unlink()  # and past it
    assert ensure_latest_complete(tmp_path) == ("saves cut short before they were recorded, set aside as "
                                                "iter_0000004.incomplete.1, iter_0000012.incomplete")
    assert (tmp_path / "iter_0000004.incomplete" / "__0_0.distcp").read_bytes() == b"partial"  # kept, not replaced
    assert sorted(p.name for p in tmp_path.glob("iter_*") if is_complete(p)) == ["iter_0000005", "iter_0000010"]
    assert ensure_latest_complete(tmp_path) is None
