"""Resume safety: a checkpoint interrupted mid-commit is set aside, "latest" points back."""

from pathlib import Path

import torch

from nemo_topr.training.checkpoints import ensure_latest_complete, is_complete


FULL_CONFIG = ("model:\n  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n"
               "checkpoint:\n  save_rng: true\n  save_optim: true\n  fully_parallel_save: false\n")


def _checkpoint(root: Path, iteration: int, *, config: str = FULL_CONFIG) -> Path:
    path = root / f"iter_{iteration:07d}"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"x")
    torch.save({"step": iteration}, path / "train_state.pt")
    (path / "run_config.yaml").write_text(config)
    return path


def _point_latest(root: Path, iteration: int) -> None:
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    torch.save({"step": iteration}, root / "latest_train_state.pt")


def test_consistent_directory_is_left_alone(tmp_path):
    _checkpoint(tmp_path, 5)
    _point_latest(tmp_path, 5)
    assert ensure_latest_complete(tmp_path) is None
    assert ensure_latest_complete(tmp_path / "missing") is None
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "5"


def test_killed_between_tracker_and_run_config_falls_back_to_previous(tmp_path):
    _checkpoint(tmp_path, 5)
    _checkpoint(tmp_path, 10, config="")  # the kill landed before run_config.yaml was written
    _point_latest(tmp_path, 10)
    assert not is_complete(tmp_path / "iter_0000010")
    message = ensure_latest_complete(tmp_path)
    assert "iter 10" in message and "resuming from iter 5" in message
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "5"
    assert torch.load(tmp_path / "latest_train_state.pt") == {"step": 5}
    assert (tmp_path / "iter_0000010.incomplete").is_dir() and not (tmp_path / "iter_0000010").exists()


def test_incomplete_first_checkpoint_restarts_from_the_pretrained_model(tmp_path):
    path = _checkpoint(tmp_path, 3)
    (path / ".metadata").unlink()  # the tensor data itself was never finalised
    _point_latest(tmp_path, 3)
    assert "no earlier one" in ensure_latest_complete(tmp_path)
    assert not (tmp_path / "latest_checkpointed_iteration.txt").exists()
    assert not (tmp_path / "latest_train_state.pt").exists()


def test_run_config_cut_short_counts_as_incomplete(tmp_path):
    cut = FULL_CONFIG[: FULL_CONFIG.index("checkpoint:")]  # still valid YAML, missing what load reads
    assert not is_complete(_checkpoint(tmp_path, 7, config=cut))
    assert is_complete(_checkpoint(tmp_path, 8))
