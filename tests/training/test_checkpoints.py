"""Resume safety: a checkpoint interrupted mid-commit is set aside, "latest" points back --
by exactly one of the job's ranks."""

import json
import time
from pathlib import Path

import pytest
import torch

from tests import forked
from tests.conftest import REPO, WORKERS, checkout_env
from nemo_topr.training.checkpoints import ensure_latest_complete, is_complete


FULL_CONFIG = ("model:\n  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n"
               "checkpoint:\n  save_rng: true\n  save_optim: true\n  fully_parallel_save: false\n")


def _checkpoint(root: Path, iteration: int, *, config: str = FULL_CONFIG) -> Path:
    """A torch_dist checkpoint (torch.distributed.checkpoint, as Megatron writes it) with Bridge's
    train state and run config."""
    from torch.distributed.checkpoint import save

    path = root / f"iter_{iteration:07d}"
    save({"weight": torch.arange(4096, dtype=torch.float32)}, checkpoint_id=str(path), no_dist=True)
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


@pytest.mark.guards_resume
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


@pytest.mark.parametrize("tracker", ["", "release\n"], ids=["emptied", "megatron-lm-release"])
def test_a_tracker_naming_no_iteration_is_named_not_read_as_iteration_zero(tmp_path, tracker):
    """Bridge writes the tracker in place (open "w", then the number): a full disk can leave it
    empty. Read as 0, the start's repair found no iteration 0, removed the tracker and started the
    run over from the pretrained model; now it is refused, naming the file and the saved iterations,
    and nothing is moved. The verbs that read it ended in int()'s ValueError traceback."""
    from nemo_topr.training.checkpoints import DamagedCheckpointError, latest_iteration
    from nemo_topr.training.run_state import RunStateError, check_queued_start

    for iteration in (1, 2):
        _checkpoint(tmp_path / "checkpoints", iteration)
    _point_latest(tmp_path / "checkpoints", 2)
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(tracker)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    named = ("checkpoint.tracker.names_no_iteration", f"{tmp_path}/checkpoints/latest_checkpointed_iteration.txt")
    for read in (latest_iteration, ensure_latest_complete):
        with pytest.raises(DamagedCheckpointError) as refused:
            read(tmp_path / "checkpoints")
        assert (refused.value.key, refused.value.where) == named
    with pytest.raises(RunStateError) as queued:  # `submit`'s look before the queue
        check_queued_start(tmp_path, {})
    assert (queued.value.key, queued.value.where) == ("run_dir.checkpoints.damaged", "run_dir")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.guards_resume
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


@pytest.mark.slow
def test_ranks_preparing_one_run_directory_repair_once_and_write_once(tmp_path):
    """Three launcher ranks (RANK=0..2, as torchrun or slurm/task.sh set it) enter prepare() at
    the same moment on one run directory whose latest checkpoint was cut short. prepare() runs
    before torch.distributed exists, so nothing but the launcher's rank can keep the others out:
    rank 0 alone sets iter 10 aside, points the trackers at iter 5 and writes config.yaml and the
    data report; ranks 1 and 2 change nothing (an audit hook lists every write, rename, removal)."""
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    model = build_tiny_hf_llama(tmp_path / "tiny", build_tiny_tokenizer())
    run_dir, ready, start = tmp_path / "run", tmp_path / "ready", tmp_path / "start"
    checkpoints = run_dir / "checkpoints"
    _checkpoint(checkpoints, 5)
    _checkpoint(checkpoints, 10, config="")  # killed before run_config.yaml
    _point_latest(checkpoints, 10)
    (run_dir / "configs").mkdir()  # the first start's record, as train leaves it before any checkpoint
    (run_dir / "configs" / "start_001.yaml").write_text("{}\n")
    ready.mkdir()
    data = REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl"
    ranks = [forked.start([str(WORKERS / "prepare_rank.py"), str(run_dir), str(ready), str(start),
                           f"hf_model={model}", f"dataset.train_path={data}", "train.global_batch_size=2",
                           "train.micro_batch_size=1"], tmp_path / f"rank{rank}.out",
                          env=checkout_env(RANK=str(rank), WORLD_SIZE="3", OMP_NUM_THREADS="1"))
             for rank in range(3)]
    deadline = time.time() + 300
    while len(list(ready.iterdir())) < 3:
        assert time.time() < deadline and all(rank.exitcode is None for rank in ranks), [r.exitcode for r in ranks]
        time.sleep(0.05)
    start.touch()
    for rank in ranks:
        rank.join(300)
    outputs = [(tmp_path / f"rank{rank}.out").read_text() for rank in range(3)]
    assert [rank.exitcode for rank in ranks] == [0, 0, 0], "\n".join(out[-2000:] for out in outputs)
    changes = [json.loads(out.strip().splitlines()[-1]) for out in outputs]

    assert changes[1] == changes[2] == []
    assert ["rename", "checkpoints/iter_0000010"] in changes[0]
    written = {name for kind, name in changes[0] if kind == "write"}
    assert {"config.yaml", "data_report.json", "checkpoints/latest_checkpointed_iteration.txt.partial",
            "checkpoints/latest_train_state.pt.partial"} <= written
    warnings = [line for out in outputs for line in out.splitlines() if "WARNING" in line and "iter 10" in line]
    assert len(warnings) == 1 and warnings[0] in outputs[0]
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "5"
    assert torch.load(checkpoints / "latest_train_state.pt") == {"step": 5}
    # hf_artifacts/: the base model's HF config and tokenizer, written by rank 0 for later starts
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "hf_artifacts", "iter_0000005", "iter_0000010.incomplete", "latest_checkpointed_iteration.txt",
        "latest_train_state.pt"]


def test_a_truncated_shard_names_the_file_and_the_newest_intact_iteration(tmp_path):
    from nemo_topr.training.checkpoints import DamagedCheckpointError

    _checkpoint(tmp_path, 3)
    cut_earlier = _checkpoint(tmp_path, 6)
    latest = _checkpoint(tmp_path, 9)
    _point_latest(tmp_path, 9)
    assert ensure_latest_complete(tmp_path) is None  # whole: nothing to say
    for saved in (cut_earlier, latest):
        shard = next(saved.glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(DamagedCheckpointError) as damaged:
        ensure_latest_complete(tmp_path)
    assert (damaged.value.key, damaged.value.where) == ("checkpoint.latest.cut_short", str(latest))
    message = str(damaged.value)
    # the fix offered is iter 3 (iter 6 is cut short too), never the broken iteration
    assert "resume from iter 3" in message and "from iter 6" not in message and "from iter 9" not in message
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "9"  # nothing changed behind the user
    (latest / ".metadata").write_bytes((latest / ".metadata").read_bytes()[:10])
    with pytest.raises(DamagedCheckpointError) as unreadable_metadata:
        ensure_latest_complete(tmp_path)
    assert (unreadable_metadata.value.key, unreadable_metadata.value.where) == ("checkpoint.latest.cut_short", str(latest))
